#!/usr/bin/env bash
# What metrics cost: the same work on a mount without and with --metrics-addr, in one run.
#
#   bash tests/bench/metrics_bench.sh            # RUNS=5 SIZE_MIB=1024 FILES=2000
#
# No link shaping: fake-gcs-server on loopback, so the mount's own CPU is what limits it and any
# cost of counting shows. Each run alternates the two mounts (fresh mount each time):
#   1. sequential read of a SIZE_MIB object with dd bs=1M (MB/s): one counter update per read
#      request, plus the store and prefetch counters;
#   2. FILES files of 4 KiB written and closed, then all uploaded (files/s): the write path's
#      gauges and the store's request counters and histogram.
# The two mounts take turns going first, and each run deletes its small files again, so neither
# side always meets a fuller bucket (the emulator slows down as objects pile up). Prints each
# run's figures, then medians side by side, the ratio, and a scrape's size. Needs root and
# /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-2000}

source tests/emulator.sh
cargo build --release --quiet -p fs-linux
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-metrics.XXXX")
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
  mountpoint -q "$MNT" && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

start_emulator
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/big"
put_object bench big "$WORK/big"
rm -f "$WORK/big"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

mount_bd() {  # extra flags...
  rm -rf "$WORK/cache"
  "$BD" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
    --write-back-delay 0s --log-file "$WORK/bd.log" "$@"
}
unmount_bd() {
  "$BD" unmount "$MNT" >/dev/null
  while mountpoint -q "$MNT"; do sleep 0.05; done
}

declare -A R
add() { R[$1]="${R[$1]:-} $2"; }
med() { tr ' ' '\n' <<<"${R[$1]}" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
now() { date +%s.%N; }

one_run() {  # label, extra flags...
  local label=$1; shift
  mount_bd "$@"
  local t0 t1
  t0=$(now)
  dd if="$MNT/big" of=/dev/null bs=1M status=none
  t1=$(now)
  add "read_$label" "$(awk -v s="$SIZE_MIB" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", s * 1.048576 / (b - a) }')"
  mkdir "$MNT/small-$label-$r"
  head -c 4096 /dev/urandom > "$WORK/4k"
  t0=$(now)
  for i in $(seq "$FILES"); do cp "$WORK/4k" "$MNT/small-$label-$r/f$i"; done
  "$BD" status "$MNT" --wait >/dev/null
  t1=$(now)
  add "small_$label" "$(awk -v n="$FILES" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')"
  if [ "$label" = on ]; then
    SCRAPE_BYTES=$(curl -s "http://127.0.0.1:$PORT/metrics" | wc -c)
  fi
  rm -rf "$MNT/small-$label-$r"
  "$BD" status "$MNT" --wait >/dev/null
  unmount_bd
}

for r in $(seq "$RUNS"); do
  if [ $((r % 2)) = 1 ]; then
    one_run off
    one_run on --metrics-addr "127.0.0.1:$PORT"
  else
    one_run on --metrics-addr "127.0.0.1:$PORT"
    one_run off
  fi
  echo "run $r/$RUNS: read MB/s off/on $(awk '{print $NF}' <<<"${R[read_off]}")/$(awk '{print $NF}' <<<"${R[read_on]}"), files/s off/on $(awk '{print $NF}' <<<"${R[small_off]}")/$(awk '{print $NF}' <<<"${R[small_on]}")" >&2
done

echo
echo "| metrics cost, median of $RUNS | without --metrics-addr | with | with / without |"
echo "|---|---|---|---|"
echo "| sequential read, ${SIZE_MIB} MiB, dd bs=1M (MB/s) | $(med read_off) | $(med read_on) | $(ratio "$(med read_on)" "$(med read_off)") |"
echo "| $FILES × 4 KiB written and uploaded (files/s) | $(med small_off) | $(med small_on) | $(ratio "$(med small_on)" "$(med small_off)") |"
echo
echo "one scrape of /metrics: ${SCRAPE_BYTES:-?} bytes"
