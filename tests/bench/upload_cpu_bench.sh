#!/usr/bin/env bash
# What the daemon spends on a GiB written, from the write until it is in the bucket: this build
# beside the build at BASE (a git revision), alternated, in the same run.
#
#   BASE=<rev> bash tests/bench/upload_cpu_bench.sh    # RUNS=5 SIZE_MIB=1024; PT=0: defaults only
#
# Root mount, release builds, the emulator (filesystem backend) on loopback. Each run writes
# SIZE_MIB with dd bs=1M onto a mount of each build, with default options and with
# --passthrough writes, and samples the daemon's CPU seconds when dd returns and again once
# the file is in the bucket (the commit, a passthrough file's CRC32C pass and the upload), and
# the seconds dd took (close included) and from its return until then. Every object is checked
# in the bucket (sha256).
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${BASE:?BASE=<git revision> to compare with}
RUNS=${RUNS:-5}
SIZE_MIB=${SIZE_MIB:-1024}

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux
bench_work bd-upload-cpu
mkdir -p "$WORK/this"
build_base "$WORK/base"
install -m 0755 target/release/bucketdrive "$WORK/this/bucketdrive"

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
per_gib() { awk -v a="$1" -v b="$2" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }'; }

one() {  # BUILD KEY [mount options...]
  local bd=$WORK/$1/bucketdrive key=$2 pid c0 c1 c2 e u
  shift 2
  rm -rf "$WORK/cache"
  "$bd" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
    --log-file "$WORK/bd.log" "$@"
  pid=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
  c0=$(cpu_s "$pid")
  add "${key}_dd" "$(timed_dd "$WORK/src" "$MNT/big" 1M)"
  c1=$(cpu_s "$pid"); e=$(now)
  "$bd" status --wait "$MNT" >/dev/null
  c2=$(cpu_s "$pid"); u=$(now)
  add "${key}_close" "$(per_gib "$c0" "$c1")"
  add "${key}_all" "$(per_gib "$c0" "$c2")"
  add "${key}_up" "$(awk -v s="$e" -v e="$u" 'BEGIN { printf "%.2f", e - s }')"
  [ "$(curl -sf "$EMU_URL/storage/v1/b/bench/o/big?alt=media" | sha256sum | cut -d' ' -f1)" = "$SHA" ] ||
    { echo "object big has the wrong bytes in the bucket ($1 $*)" >&2; exit 1; }
  "$bd" unmount "$MNT" >/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" || break; sleep 0.1; done
  curl -sf -X DELETE "$EMU_URL/storage/v1/b/bench/o/big" >/dev/null
}

for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS" >&2
  # Alternated, the order swapped every run: the disk's drift falls on both.
  for b in $( ((r % 2)) && echo "base this" || echo "this base"); do
    one "$b" "${b}_bd"
    [ "${PT:-1}" = 0 ] || one "$b" "${b}_pt" --passthrough writes
  done
done

row() {  # LABEL KEY
  [ -n "${R[base_${2}_close]:-}" ] || return 0
  echo "| $1 | $(med "base_${2}_close") | $(med "this_${2}_close") | $(med "base_${2}_all") | $(med "this_${2}_all") | $(ratio "$(med "this_${2}_all")" "$(med "base_${2}_all")") | $(med "base_${2}_dd") | $(med "this_${2}_dd") | $(med "base_${2}_up") | $(med "this_${2}_up") |"
}
echo
echo "Daemon CPU seconds per GiB written ($SIZE_MIB MiB dd bs=1M), medians of $RUNS runs, base $(git rev-parse --short "$BASE")"
echo "alternated with this build; the seconds dd took (close included), and from its return until"
echo "the file is in the bucket"
echo
echo "| mount | CPU until close, base | this | CPU until in the bucket, base | this | ÷ | dd s, base | this | upload s, base | this |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
row "default" bd
row "--passthrough writes" pt
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
