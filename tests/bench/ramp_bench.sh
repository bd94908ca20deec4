#!/usr/bin/env bash
# The read ramp on a shaped link: a sequential 1 GiB read with the default streams (found by
# probing, up to 32) beside a fixed 32 and beside raw parallel ranged GETs ×32 (curl), each
# median of RUNS runs, alternated so that no row always runs first.
#
#   bash tests/bench/ramp_bench.sh          # RUNS=5 SIZE_MIB=1024 RATE=40M LATENCY=10ms
#   BASE=<rev> bash tests/bench/ramp_bench.sh   # adds the build at BASE (defaults) as a row
#   READERS=8 ...    # then 8 readers at once, each its own object: aggregate MB/s, peak RSS
#
# fake-gcs-server (filesystem backend) behind tests/proxy (link-proxy: RATE per connection,
# LATENCY per request); a fresh root mount per read, no read cache; every read's bytes are
# checked. A single read goes to /dev/null, as curl's do: its check is the daemon's own
# whole-object CRC32C against the object's, which must be in its log (a mismatch fails the
# read). The row "the reader comparing the bytes" pipes the same read into cmp against the
# source, as the eight readers do: the reader's own work on the same two cores. The stream
# levels each default read went through are printed from the daemon's log. Every read is preceded by warm_memory (tests/bench/common.sh; WARM_GIB=0 skips
# it). Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
RATE=${RATE:-40M}
LATENCY=${LATENCY:-10ms}
SIZE=$((SIZE_MIB * 1024 * 1024))
source tests/emulator.sh
source tests/bench/common.sh
bench_work bd-ramp
cargo build --release --quiet -p fs-linux -p bucketdrive-tests
BD=target/release/bucketdrive
BASE_BD=
if [ -n "${BASE:-}" ]; then
  build_base "$WORK/base"
  BASE_BD=$WORK/base/bucketdrive
fi
trap 'kill "${PROXY_PID:-}" 2>/dev/null || true; bench_cleanup' EXIT
start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c "$SIZE" /dev/urandom > "$WORK/obj"
put_object bench big "$WORK/obj"
READERS=${READERS:-0}
EIGHT_MIB=${EIGHT_MIB:-512}
for i in $(seq 0 $((READERS - 1))); do
  head -c $((EIGHT_MIB * 1048576)) /dev/urandom > "$WORK/r$i"
  put_object bench "r$i" "$WORK/r$i"
done
start_proxy --rate "$RATE" --latency "$LATENCY"

PART=$((8 * 1024 * 1024))
raw32() {
  local s e j0
  warm_memory
  j0=$(cpu_jiffies); s=$(now)
  seq 0 $(((SIZE + PART - 1) / PART - 1)) | xargs -P 32 -I{} bash -c \
    'curl -sf -o /dev/null -r $(({} * '"$PART"'))-$(({} * '"$PART"' + '"$PART"' - 1)) "'"http://$PROXY/storage/v1/b/bench/o/big?alt=media"'"'
  e=$(now); busy_pct "$j0" "$(cpu_jiffies)" > "$WORK/busy"
  mbps "$SIZE" "$s" "$e"
}
# One read through a fresh mount of binary $1 with options $2...; prints MB/s.
bd_read() {
  local bin=$1 s e j0
  shift
  rm -f "$WORK/bd.log"
  # Debug lines of the prefetcher alone: its stream level changes, a few per read.
  RUST_LOG=info,fs_core::read::prefetch=debug "$bin" mount bench "$MNT" --endpoint "http://$PROXY" \
    --anonymous --cache-dir "$WORK/cache" --log-file "$WORK/bd.log" "$@"
  warm_memory
  j0=$(cpu_jiffies); s=$(now)
  local same=1
  if [ "$SINK" = cmp ]; then
    # Checked against the source byte for byte as it is read (cmp costs far less CPU than a
    # hash, which would share the two cores with the daemon).
    dd if="$MNT/big" bs=1M status=none | cmp -s - "$WORK/obj" || same=0
  else
    dd if="$MNT/big" of=/dev/null bs=1M status=none || same=0
  fi
  e=$(now); busy_pct "$j0" "$(cpu_jiffies)" > "$WORK/busy"
  "$bin" unmount "$MNT" >/dev/null
  for _ in $(seq 50); do mountpoint -q "$MNT" || break; sleep 0.1; done
  # The daemon compared the CRC32C of every byte it served, in order, with the object's.
  [ "$SINK" = cmp ] || grep -q 'whole-object CRC32C verified' "$WORK/bd.log" || same=0
  [ "$same" = 1 ] || { echo "a read through the mount has the wrong bytes" >&2; exit 1; }
  mbps "$SIZE" "$s" "$e"
}
# Eight readers at once through a fresh mount of binary $1, each its own object, bytes
# compared; prints the daemon's peak RSS (MiB) and the aggregate MB/s.
eight() {
  local bin=$1 s e pids=() ok=1 pid hwm
  "$bin" mount bench "$MNT" --endpoint "http://$PROXY" --anonymous --cache-dir "$WORK/cache"
  pid=$(pgrep -f "mount bench $MNT" | head -n 1)
  warm_memory
  s=$(now)
  for i in $(seq 0 $((READERS - 1))); do
    (dd if="$MNT/r$i" bs=1M status=none | cmp -s - "$WORK/r$i") & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  e=$(now)
  hwm=$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status")
  "$bin" unmount "$MNT" >/dev/null
  for _ in $(seq 50); do mountpoint -q "$MNT" || break; sleep 0.1; done
  [ "$ok" = 1 ] || { echo "a concurrent reader read wrong bytes" >&2; exit 1; }
  echo "$hwm $(mbps $((EIGHT_MIB * 1048576 * READERS)) "$s" "$e")"
}
levels() { grep -o 'streams=[0-9]*' "$WORK/bd.log" 2>/dev/null | cut -d= -f2 | tr '\n' ' '; }

for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS" >&2
  add raw "$(raw32)"; add raw_busy "$(cat "$WORK/busy")"
  add fixed "$(SINK=null bd_read "$BD" --read-concurrency 32)"; add fixed_busy "$(cat "$WORK/busy")"
  add fixed_cmp "$(SINK=cmp bd_read "$BD" --read-concurrency 32)"; add fixed_cmp_busy "$(cat "$WORK/busy")"
  add defaults "$(SINK=null bd_read "$BD")"; add defaults_busy "$(cat "$WORK/busy")"
  echo "  the default read's stream level changes: $(levels)" >&2
  [ -z "$BASE_BD" ] || add base "$(SINK=null bd_read "$BASE_BD")"
  if [ "$READERS" -gt 0 ]; then
    read -r a b < <(eight "$BD"); add rss "$a"; add agg "$b"
    [ -z "$BASE_BD" ] || { read -r a b < <(eight "$BASE_BD"); add base_rss "$a"; add base_agg "$b"; }
  fi
done

echo
echo "Sequential read of $SIZE_MIB MiB through link-proxy ($RATE B/s per connection, $LATENCY per request); medians of $RUNS runs, alternated"
echo
echo "| reader | MB/s (median) | runs | ÷ raw ×32 | ÷ fixed 32 | machine CPU busy % (median) |"
echo "|---|---:|---|---:|---:|---:|"
row() { echo "| $1 | $(med "$2") | ${R[$2]} | $(ratio "$(med "$2")" "$(med raw)") | $(ratio "$(med "$2")" "$(med fixed)") | $(med "$2_busy") |"; }
row "raw: curl, 8 MiB ranged GETs ×32" raw
row "bucketdrive --read-concurrency 32" fixed
row "bucketdrive --read-concurrency 32, the reader comparing the bytes (cmp)" fixed_cmp
row "bucketdrive, defaults" defaults
[ -z "$BASE_BD" ] || row "bucketdrive at $BASE, defaults" base
if [ "$READERS" -gt 0 ]; then
  echo
  echo "| $READERS readers at once, $EIGHT_MIB MiB each, default budget | peak RSS MiB (median) | runs | aggregate MB/s (median) | runs |"
  echo "|---|---:|---|---:|---|"
  echo "| bucketdrive | $(med rss) | ${R[rss]} | $(med agg) | ${R[agg]} |"
  [ -z "$BASE_BD" ] || echo "| bucketdrive at $BASE | $(med base_rss) | ${R[base_rss]} | $(med base_agg) | ${R[base_agg]} |"
fi
