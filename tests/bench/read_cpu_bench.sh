#!/usr/bin/env bash
# The daemon's CPU seconds and page faults per GiB read from the bucket, this build beside the
# build at BASE, alternated: a fresh root mount per read (no read cache), the emulator on
# loopback, `dd bs=1M` of a SIZE_MIB object from a dropped page cache, memory warmed before
# every read (warm_memory). Medians of RUNS. Every read's bytes are checked (sha256).
#
#   BASE=<rev> [RUNS=5] [SIZE_MIB=1024] bash tests/bench/read_cpu_bench.sh [mount options...]
#   TLS=1 ...    # over HTTPS (start_emulator_tls: a test CA the daemon alone trusts)
#
# The page faults (minor faults of the daemon, /proc/PID/stat) are what a change to how the
# daemon's buffers are backed moves; they vary far less from run to run than CPU time does on
# these two shared cores. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${BASE:?set BASE to the revision to compare with}"
RUNS=${RUNS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
source tests/emulator.sh
source tests/bench/common.sh
bench_work bd-read-cpu
cargo build --release --quiet -p fs-linux
build_base "$WORK/base"
start_bench_emulator
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
put_object bench big "$WORK/src"
rm -f "$WORK/src"

faults() { awk '{ print $10 }' "/proc/$1/stat"; }
read_once() {  # BINARY → "MB/s CPU-s-per-GiB faults-per-GiB"
  rm -rf "$WORK/cache"
  "${ENDPOINT_ENV[@]}" "$1" mount bench "$MNT" --endpoint "$ENDPOINT" --anonymous --cache-dir "$WORK/cache" \
    --log-file "$WORK/bd.log" "${@:2}"
  local pid c0 c1 f0 f1 s e
  pid=$(pgrep -f "$1 mount bench $MNT" | head -n 1)
  sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; warm_memory
  c0=$(cpu_s "$pid"); f0=$(faults "$pid"); s=$(now)
  dd if="$MNT/big" of=/dev/stdout bs=1M status=none | sha256sum | cut -d' ' -f1 > "$WORK/sum"
  e=$(now); c1=$(cpu_s "$pid"); f1=$(faults "$pid")
  "$1" unmount "$MNT" >/dev/null
  wait_gone "$pid"
  [ "$(cat "$WORK/sum")" = "$SHA" ] || { echo "the read has the wrong bytes" >&2; exit 1; }
  echo "$(mbps $((SIZE_MIB * 1048576)) "$s" "$e")" \
    "$(awk -v a="$c0" -v b="$c1" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }')" \
    "$(awk -v a="$f0" -v b="$f1" -v m="$SIZE_MIB" 'BEGIN { printf "%d", (b - a) * 1024 / m }')"
}
for i in $(seq "$RUNS"); do
  for who in base this; do
    bin=$WORK/base/bucketdrive
    [ "$who" = this ] && bin=$(pwd)/target/release/bucketdrive
    read -r m c f < <(read_once "$bin" "$@")
    echo "run $i, $who: $m MB/s, $c CPU s per GiB, $f page faults per GiB"
    add "$who.mbps" "$m"; add "$who.cpu" "$c"; add "$who.faults" "$f"
  done
done
echo
echo "| medians of $RUNS, $SIZE_MIB MiB, dd bs=1M, loopback$([ "${TLS:-0}" = 1 ] && echo ', HTTPS') | base $(git rev-parse --short "$BASE") | this | this ÷ base |"
echo "|---|---:|---:|---:|"
for k in "MB/s:mbps" "daemon CPU s per GiB:cpu" "daemon page faults per GiB:faults"; do
  b=$(med "base.${k#*:}"); t=$(med "this.${k#*:}")
  echo "| ${k%%:*} | $b | $t | $(ratio "$t" "$b") |"
done
