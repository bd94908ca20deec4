#!/usr/bin/env bash
# Writes the kernel makes itself (FUSE passthrough) against the cache disk, with nothing else
# going on: one root mount with --passthrough writes and --write-back-delay 1h (no upload runs
# meanwhile), and PAIRS pairs of the same dd, onto the cache disk and then onto the mount, one
# right after the other, each from the same start (nothing dirty, only the source cached). Until dd returns (its close included). Prints the medians and the median ratio,
# and the daemon's CPU seconds per GiB written. close_bench.sh measures the same rows with
# uploads between them, and the default mount beside them.
#
#   PAIRS=5 SIZE_MIB=1024 SMALL_MIB=256 bash tests/bench/write_passthrough_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PAIRS=${PAIRS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
SMALL_MIB=${SMALL_MIB:-256}

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-ptw-bench.XXXX")
MNT=$WORK/mnt
mkdir -p "$MNT" "$WORK/gcs" "$WORK/local"
cleanup() {
  mountpoint -q "$MNT" && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
head -c $((SMALL_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src-small"

"$BD" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
  --log-file "$WORK/bd.log" --write-back-delay 1h --passthrough writes
PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
grep -q "reads and writes files being written" "$WORK/bd.log" \
  || { echo "passthrough for writes is not on:" >&2; cat "$WORK/bd.log" >&2; exit 1; }
for i in $(seq "$PAIRS"); do
  echo "pair $i/$PAIRS" >&2
  for row in big small; do
    src=$WORK/src; bs=1M
    [ "$row" = small ] && { src=$WORK/src-small; bs=4k; }
    l=$(timed_dd "$src" "$WORK/local/f" "$bs"); rm -f "$WORK/local/f"
    c0=$(cpu_s "$PID")
    b=$(timed_dd "$src" "$MNT/$row$i" "$bs")
    c1=$(cpu_s "$PID")
    cmp -s "$src" "$MNT/$row$i" || { echo "$row$i reads back wrong" >&2; exit 1; }
    add "${row}_local" "$l"; add "$row" "$b"
    add "${row}_r" "$(awk -v a="$b" -v b="$l" 'BEGIN { printf "%.2f", a / b }')"
    [ "$row" = big ] && add cpu "$(awk -v a="$c0" -v b="$c1" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }')"
  done
done
"$BD" unmount "$MNT" --no-wait >/dev/null 2>&1 || true
echo
echo "Until dd returns; root mount, --passthrough writes; medians of $PAIRS pairs; seconds"
echo
echo "| workload | local dd on the cache disk | bucketdrive | ÷ local (median of pairs) |"
echo "|---|---:|---:|---:|"
echo "| $SIZE_MIB MiB dd bs=1M | $(med big_local) | $(med big) | $(med big_r) |"
echo "| $SMALL_MIB MiB dd bs=4k | $(med small_local) | $(med small) | $(med small_r) |"
echo
echo "daemon CPU per GiB written (dd bs=1M): $(med cpu) s"
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
