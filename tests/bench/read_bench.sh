#!/usr/bin/env bash
# Sequential-read benchmark through a shaped link. Prints one table from one run.
#
#   bash tests/bench/read_bench.sh            # RUNS=3 SIZE_MIB=1024 RATE=40M LATENCY=20ms
#
# fake-gcs-server (filesystem backend, so 8 GiB of objects do not sit in its memory) sits behind
# tests/proxy (link-proxy), which caps each connection at RATE and delays each request by
# LATENCY, as a real link to GCS does. Rows, each the median of RUNS runs on a fresh mount:
#   1. curl: one GET of the whole object: the single-stream baseline;
#   2. raw ×8 and ×16: curl fetching the object in 8 MiB ranged GETs, 8 or 16 at a time (what
#      parallel reads can reach on this link);
#   3. rclone mount (Debian's rclone, default options): dd bs=1M;
#   4. bucketdrive (default options: streams found per file): dd bs=1M;
#   5. bucketdrive --read-concurrency 8 (the earlier fixed default): dd bs=1M;
# then the peak RSS and aggregate rate of bucketdrive while 8 readers each stream a different
# object, with the defaults and with the earlier fixed 8 streams.
# Needs root, /dev/fuse, and about 9 GiB of free disk under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
RATE=${RATE:-40M}
LATENCY=${LATENCY:-20ms}
READERS=8
SIZE=$((SIZE_MIB * 1024 * 1024))

source tests/emulator.sh
source tests/bench/common.sh
command -v rclone >/dev/null && command -v fusermount3 >/dev/null || _apt_install rclone fuse3

cargo build --release --quiet -p fs-linux -p bucketdrive-tests
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-bench.XXXX")
MNT=$WORK/mnt
mkdir -p "$MNT" "$WORK/gcs"
PROXY_PID=
cleanup() {
  mountpoint -q "$MNT" && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
  [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
echo "preparing $READERS objects of $SIZE_MIB MiB..." >&2
for i in $(seq 0 $((READERS - 1))); do
  head -c "$SIZE" /dev/urandom > "$WORK/obj"
  put_object bench "f$i" "$WORK/obj"
done
SHA0=$(sha256sum "$WORK/obj" | cut -d' ' -f1)   # of f$((READERS-1)), checked below
rm -f "$WORK/obj"

start_proxy --rate "$RATE" --latency "$LATENCY"


bd_mount() { "$BD" mount bench "$MNT" --endpoint "http://$PROXY" --anonymous "$@"; }
bd_unmount() { "$BD" unmount "$MNT"; for _ in $(seq 50); do mountpoint -q "$MNT" || return 0; sleep 0.1; done; }

# Fetches f0 in 8 MiB ranged GETs, $1 at a time, with curl; prints MB/s.
PART=$((8 * 1024 * 1024))
raw_parallel() {
  local s e
  s=$(now)
  seq 0 $(((SIZE + PART - 1) / PART - 1)) | xargs -P "$1" -I{} bash -c \
    'curl -sf -o /dev/null -r $(({} * '"$PART"'))-$(({} * '"$PART"' + '"$PART"' - 1)) "'"http://$PROXY/storage/v1/b/bench/o/f0?alt=media"'"'
  e=$(now)
  mbps "$SIZE" "$s" "$e"
}

curl_runs=(); raw8_runs=(); raw16_runs=(); rclone_runs=(); bd_runs=(); bd8_runs=()
for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS: curl" >&2
  bps=$(curl -sf -o /dev/null -w '%{speed_download}' "http://$PROXY/storage/v1/b/bench/o/f0?alt=media")
  curl_runs+=("$(awk -v b="$bps" 'BEGIN { printf "%.1f", b / 1e6 }')")
  echo "run $r/$RUNS: raw x8, x16" >&2
  raw8_runs+=("$(raw_parallel 8)")
  raw16_runs+=("$(raw_parallel 16)")

  echo "run $r/$RUNS: rclone mount" >&2
  rclone mount :gcs:bench "$MNT" --gcs-endpoint "http://$PROXY/storage/v1/" --gcs-anonymous --daemon 2>/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
  s=$(now); dd if="$MNT/f0" of=/dev/null bs=1M status=none; e=$(now)
  rclone_runs+=("$(mbps "$SIZE" "$s" "$e")")
  fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT"

  echo "run $r/$RUNS: bucketdrive" >&2
  bd_mount
  s=$(now); dd if="$MNT/f0" of=/dev/null bs=1M status=none; e=$(now)
  bd_runs+=("$(mbps "$SIZE" "$s" "$e")")
  bd_unmount

  echo "run $r/$RUNS: bucketdrive --read-concurrency 8" >&2
  bd_mount --read-concurrency 8
  s=$(now); dd if="$MNT/f0" of=/dev/null bs=1M status=none; e=$(now)
  bd8_runs+=("$(mbps "$SIZE" "$s" "$e")")
  bd_unmount
done

curl_med=$(printf '%s\n' "${curl_runs[@]}" | median)
rclone_med=$(printf '%s\n' "${rclone_runs[@]}" | median)
bd_med=$(printf '%s\n' "${bd_runs[@]}" | median)
bd8_med=$(printf '%s\n' "${bd8_runs[@]}" | median)
raw8_med=$(printf '%s\n' "${raw8_runs[@]}" | median)
raw16_med=$(printf '%s\n' "${raw16_runs[@]}" | median)

# Peak RSS with 8 concurrent readers, at the default budget and at a small one.
rss_run() {
  local budget=$1
  shift
  bd_mount --max-read-memory "$budget" "$@"
  local pid
  pid=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
  local s e pids=() ok=1
  s=$(now)
  for i in $(seq 0 $((READERS - 1))); do
    if [ "$i" = $((READERS - 1)) ]; then
      (sha256sum "$MNT/f$i" | cut -d' ' -f1 > "$WORK/sha") & pids+=($!)
    else
      dd if="$MNT/f$i" of=/dev/null bs=1M status=none & pids+=($!)
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  e=$(now)
  local hwm
  hwm=$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status")
  bd_unmount
  [ "$ok" = 1 ] && [ "$(cat "$WORK/sha")" = "$SHA0" ] || { echo "a concurrent reader failed or read wrong bytes" >&2; exit 1; }
  echo "$hwm $(mbps $((SIZE * READERS)) "$s" "$e")"
}
# The default and the fixed 8 streams alternate, RUNS times each, so neither row always runs
# first (or on a warmer machine); each figure is the median.
rss_d=() agg_d=() rss_f=() agg_f=()
for r in $(seq "$RUNS"); do
  echo "rss run $r/$RUNS: 8 readers, default budget" >&2
  read -r a b < <(rss_run 1GiB); rss_d+=("$a"); agg_d+=("$b")
  echo "rss run $r/$RUNS: 8 readers, default budget, --read-concurrency 8" >&2
  read -r a b < <(rss_run 1GiB --read-concurrency 8); rss_f+=("$a"); agg_f+=("$b")
done
rss_default=$(printf '%s\n' "${rss_d[@]}" | median); agg_default=$(printf '%s\n' "${agg_d[@]}" | median)
rss_fixed=$(printf '%s\n' "${rss_f[@]}" | median); agg_fixed=$(printf '%s\n' "${agg_f[@]}" | median)
echo "rss: 8 readers, 256 MiB budget" >&2
read -r rss_small agg_small < <(rss_run 256MiB)

echo
echo "Sequential read of a $SIZE_MIB MiB object through link-proxy ($RATE B/s per connection, $LATENCY per request); median of $RUNS runs"
echo
echo "| reader | MB/s (median) | runs | × curl |"
echo "|---|---:|---|---:|"
echo "| curl, one GET (baseline) | $curl_med | ${curl_runs[*]} | 1.00 |"
echo "| raw: curl, 8 MiB ranged GETs ×8 | $raw8_med | ${raw8_runs[*]} | $(ratio "$raw8_med" "$curl_med") |"
echo "| raw: curl, 8 MiB ranged GETs ×16 | $raw16_med | ${raw16_runs[*]} | $(ratio "$raw16_med" "$curl_med") |"
echo "| rclone mount, defaults, dd bs=1M | $rclone_med | ${rclone_runs[*]} | $(ratio "$rclone_med" "$curl_med") |"
echo "| bucketdrive, defaults, dd bs=1M | $bd_med | ${bd_runs[*]} | $(ratio "$bd_med" "$curl_med") |"
echo "| bucketdrive --read-concurrency 8, dd bs=1M | $bd8_med | ${bd8_runs[*]} | $(ratio "$bd8_med" "$curl_med") |"
echo
echo "bucketdrive (defaults) vs rclone mount: $(ratio "$bd_med" "$rclone_med")×; vs raw ×16: $(ratio "$bd_med" "$raw16_med"); vs --read-concurrency 8: $(ratio "$bd_med" "$bd8_med")×"
echo
echo "| 8 readers, different objects | peak RSS (MiB) | limit: budget + 150 MiB | aggregate MB/s |"
echo "|---|---:|---:|---:|"
echo "| --max-read-memory 1GiB (default) | $rss_default | 1174 | $agg_default (${agg_d[*]}) |"
echo "| --max-read-memory 256MiB | $rss_small | 406 | $agg_small |"
echo "| --max-read-memory 1GiB --read-concurrency 8 (earlier default) | $rss_fixed | 1174 | $agg_fixed (${agg_f[*]}) |"
