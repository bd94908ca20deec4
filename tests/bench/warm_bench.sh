#!/usr/bin/env bash
# What this VM's memory costs a read: the same 1 GiB read from the bucket through one mount,
# RUNS (3) times each way, alternated: as the machine is (memory left free has been handed back
# to the host, and each page's first touch faults there), and right after warm_memory
# (tests/bench/common.sh) touched and let go of WARM_GIB (6) GiB. Prints MB/s and the daemon's
# CPU seconds per GiB for each run, and their medians. The bytes read are checked (sha256).
#
#   bash tests/bench/warm_bench.sh
#
# Release build, the emulator (filesystem backend) on loopback, no link shaping, no read
# cache, `dd bs=1M`. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
source tests/emulator.sh
source tests/bench/common.sh
bench_work bd-warm
bench_binary
start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c $((1024 * 1024 * 1024)) /dev/urandom > "$WORK/src"
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
put_object bench big "$WORK/src"
"$BD" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" --log-file "$WORK/bd.log"
PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
one() {  # cold|warm
  rm -f "$WORK/copy"; sync; echo 3 > /proc/sys/vm/drop_caches
  # Long enough for what was just freed to be handed back too.
  sleep 6
  [ "$1" = cold ] || warm_memory
  local c0 c1 s e
  c0=$(cpu_s "$PID"); s=$(now)
  dd if="$MNT/big" of="$WORK/copy" bs=1M status=none
  e=$(now); c1=$(cpu_s "$PID")
  [ "$(sha256sum "$WORK/copy" | cut -d' ' -f1)" = "$SHA" ] || { echo "the read has the wrong bytes" >&2; exit 1; }
  local m c
  m=$(mbps $((1 << 30)) "$s" "$e")
  c=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')
  echo "$1: $m MB/s, daemon CPU $c s per GiB" >&2
  add "$1_mbps" "$m"; add "$1_cpu" "$c"
}
for _ in $(seq "$RUNS"); do one cold; one warm; done
echo
echo "| 1 GiB \`dd\`, loopback, medians of $RUNS alternated | MB/s | runs | daemon CPU s per GiB | runs |"
echo "|---|---:|---|---:|---|"
echo "| as the machine is | $(med cold_mbps) | ${R[cold_mbps]} | $(med cold_cpu) | ${R[cold_cpu]} |"
echo "| after warm_memory (${WARM_GIB:-6} GiB) | $(med warm_mbps) | ${R[warm_mbps]} | $(med warm_cpu) | ${R[warm_cpu]} |"
"$BD" unmount "$MNT" >/dev/null
