#!/usr/bin/env bash
# Write benchmark through a shaped link. Prints one table from one run.
#
#   bash tests/bench/write_bench.sh    # RUNS=3 SIZE_MIB=1024 FILES="2000 10000" RATE=40M LATENCY=20ms
#
# RCLONE=0 skips the rclone rows; the baselines still run. BIG=0 skips the big file and FIO=0
# the fio job (their rows stay empty). RCLONE_BIG_UPLOAD=1 also waits for
# rclone's upload of the big file (about two minutes each), for its "in the bucket" rows; by
# default only its time to close is measured and its upload is abandoned.
#
# fake-gcs-server (filesystem backend) sits behind tests/proxy (link-proxy), which caps every
# connection at RATE in both directions and delays each request by LATENCY. Every figure is the
# median of RUNS runs, each on a fresh mount with default options:
#   1. one SIZE_MIB sequential write (dd bs=1M): time until dd returns (close), against dd
#      conv=fsync onto the cache disk (the same bytes made durable there) and rclone mount
#      --vfs-cache-mode writes; then until the object is in the bucket, against direct-upload
#      (the same file sent straight to the bucket with the GCS client, parts at the same
#      concurrency); and with conv=fsync, whose fsync waits for the bucket;
#   2. for each count in FILES, that many files of 10 KiB, cp -r into the mount: time until cp
#      returns (against the same with --sync-on-close, where every close waits for its
#      fdatasyncs) and until every object is in the bucket, against rclone, and against
#      direct-upload --dir (the same objects put straight to the bucket, 32 at a time);
#   3. fio 4 KiB random writes into a 256 MiB file, against the same job on the cache disk.
# Every object written through bucketdrive is checked in the bucket (sha256 or count) before
# its time is counted. Needs root, /dev/fuse, fio, and about 4 GiB of free disk under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-2000 10000}
RATE=${RATE:-40M}
LATENCY=${LATENCY:-20ms}
RCLONE=${RCLONE:-1}
RCLONE_BIG_UPLOAD=${RCLONE_BIG_UPLOAD:-0}
BIG=${BIG:-1}
FIO=${FIO:-1}
SIZE=$((SIZE_MIB * 1024 * 1024))

source tests/emulator.sh
source tests/bench/common.sh
command -v rclone >/dev/null && command -v fusermount3 >/dev/null || _apt_install rclone fuse3

cargo build --release --quiet -p fs-linux -p bucketdrive-tests
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-wbench.XXXX")
MNT=$WORK/mnt
mkdir -p "$MNT" "$WORK/gcs" "$WORK/local"
PROXY_PID=
cleanup() {
  if mountpoint -q "$MNT"; then
    fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null || umount -l "$MNT"
  fi
  [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
start_proxy --rate "$RATE" --up-rate "$RATE" --latency "$LATENCY"

echo "preparing the sources..." >&2
SRC=$WORK/src.bin
head -c "$SIZE" /dev/urandom > "$SRC"
SRC_SHA=$(sha256sum "$SRC" | cut -d' ' -f1)
for n in $FILES; do
  mkdir -p "$WORK/small-$n"
  head -c $((n * 10240)) /dev/urandom | (cd "$WORK/small-$n" && split -b 10240 -a 5 -d - f)
done
secs() { awk -v s="$1" -v e="$2" 'BEGIN { printf "%.2f", e - s }'; }

# The object's sha256, fetched from the emulator directly (not through the proxy or a mount).
object_sha() { curl -sf "$EMU_URL/storage/v1/b/bench/o/$1?alt=media" | sha256sum | cut -d' ' -f1; }
object_size() {
  curl -sf "$EMU_URL/storage/v1/b/bench/o/$1" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])' 2>/dev/null || echo -1
}
wait_size() {  # KEY SIZE
  while [ "$(object_size "$1")" != "$2" ]; do sleep 0.05; done
}
wait_count() {  # PREFIX N
  while [ "$(count_under "$1")" -lt "$2" ]; do sleep 0.2; done
}
check_sha() {  # KEY SHA
  local got
  got=$(object_sha "$1")
  [ "$got" = "$2" ] || { echo "object $1 has the wrong bytes in the bucket" >&2; exit 1; }
}

bd_mount() {
  rm -rf "$WORK/cache"
  "$BD" mount bench "$MNT" --endpoint "http://$PROXY" --anonymous --cache-dir "$WORK/cache" "$@"
}
bd_unmount() { "$BD" unmount "$MNT"; for _ in $(seq 100); do mountpoint -q "$MNT" || return 0; sleep 0.1; done; }
rc_mount() {
  rm -rf "$WORK/rcache"
  rclone mount :gcs:bench "$MNT" --gcs-endpoint "http://$PROXY/storage/v1/" --gcs-anonymous \
    --vfs-cache-mode writes --cache-dir "$WORK/rcache" --daemon 2>/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" && return 0; sleep 0.1; done
  echo "rclone did not mount" >&2; exit 1
}
rc_unmount() { fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT"; for _ in $(seq 100); do mountpoint -q "$MNT" || return 0; sleep 0.1; done; }
# Unmounts rclone without waiting for its uploads, and stops it (by its process id).
rc_abandon() {
  local pid
  pid=$(pgrep -f "^rclone mount :gcs:bench $MNT " || true)
  rc_unmount
  [ -n "$pid" ] && kill $pid 2>/dev/null || true
  for _ in $(seq 50); do [ -n "$pid" ] && kill -0 $pid 2>/dev/null || return 0; sleep 0.1; done
}

# fake-gcs-server's first compose of a big object runs about twice as slow as later ones (its
# heap grows); one unmeasured upload first, so no row pays for that.
echo "warming up the emulator..." >&2
target/release/direct-upload --endpoint "http://$PROXY" --bucket bench --key warm-up --file "$SRC" >/dev/null
delete_under warm-up


for r in $(seq "$RUNS"); do
  if [ "$BIG" = 1 ]; then
    echo "run $r/$RUNS: 1 GiB: local dd" >&2
    for sync in "" "conv=fsync"; do
      rm -f "$WORK/local/big"; sync
      s=$(now); dd if="$SRC" of="$WORK/local/big" bs=1M $sync status=none; e=$(now)
      add "local${sync:+f}" "$(secs "$s" "$e")"
      rm -f "$WORK/local/big"
    done

    for sync in "" "conv=fsync"; do
      tag=${sync:+f}
      echo "run $r/$RUNS: 1 GiB ${sync:-no fsync}: bucketdrive" >&2
      bd_mount
      s=$(now); dd if="$SRC" of="$MNT/big-bd" bs=1M $sync status=none; c=$(now)
      "$BD" status --wait "$MNT" >/dev/null; b=$(now)
      check_sha big-bd "$SRC_SHA"
      add "bd_close$tag" "$(secs "$s" "$c")"; add "bd_bucket$tag" "$(secs "$s" "$b")"
      add "bd_upload$tag" "$(secs "$c" "$b")"
      bd_unmount
      delete_under big-bd
    done

    if [ "$RCLONE" = 1 ]; then
      echo "run $r/$RUNS: 1 GiB: rclone" >&2
      rc_mount
      s=$(now); dd if="$SRC" of="$MNT/big-rc" bs=1M status=none; c=$(now)
      add rc_close "$(secs "$s" "$c")"
      if [ "$RCLONE_BIG_UPLOAD" = 1 ]; then
        wait_size big-rc "$SIZE"; b=$(now)
        check_sha big-rc "$SRC_SHA"
        add rc_bucket "$(secs "$s" "$b")"; add rc_upload "$(secs "$c" "$b")"
        rc_unmount
      else
        rc_abandon
      fi
      delete_under big-rc
  fi

  echo "run $r/$RUNS: direct-upload" >&2
  add direct "$(target/release/direct-upload --endpoint "http://$PROXY" --bucket bench --key big-direct --file "$SRC")"
  check_sha big-direct "$SRC_SHA"
  delete_under big-direct
  fi

  for n in $FILES; do
    small=$WORK/small-$n
    last=$(ls "$small" | tail -n 1)
    last_sha=$(sha256sum "$small/$last" | cut -d' ' -f1)

    echo "run $r/$RUNS: $n small files: 32 parallel uploads" >&2
    add "small_direct_$n" "$(target/release/direct-upload --endpoint "http://$PROXY" --bucket bench --key small-direct --dir "$small")"
    [ "$(count_under small-direct/)" = "$n" ] || { echo "direct-upload: small files missing" >&2; exit 1; }
    delete_under small-direct

    echo "run $r/$RUNS: $n small files: bucketdrive" >&2
    bd_mount
    s=$(now); cp -r "$small" "$MNT/small-bd"; c=$(now)
    "$BD" status --wait "$MNT" >/dev/null; b=$(now)
    [ "$(count_under small-bd/)" = "$n" ] || { echo "bucketdrive: small files missing" >&2; exit 1; }
    check_sha "small-bd%2F$last" "$last_sha"
    add "small_bd_cp_$n" "$(secs "$s" "$c")"; add "small_bd_bucket_$n" "$(secs "$s" "$b")"
    bd_unmount
    delete_under small-bd

    echo "run $r/$RUNS: $n small files: bucketdrive --sync-on-close" >&2
    bd_mount --sync-on-close
    s=$(now); cp -r "$small" "$MNT/small-bds"; c=$(now)
    "$BD" status --wait "$MNT" >/dev/null
    [ "$(count_under small-bds/)" = "$n" ] || { echo "bucketdrive --sync-on-close: small files missing" >&2; exit 1; }
    check_sha "small-bds%2F$last" "$last_sha"
    add "small_bds_cp_$n" "$(secs "$s" "$c")"
    bd_unmount
    delete_under small-bds

    if [ "$RCLONE" = 1 ]; then
      echo "run $r/$RUNS: $n small files: rclone" >&2
      rc_mount
      s=$(now); cp -r "$small" "$MNT/small-rc"; c=$(now)
      wait_count small-rc/ "$n"; b=$(now)
      check_sha "small-rc%2F$last" "$last_sha"
      add "small_rc_cp_$n" "$(secs "$s" "$c")"; add "small_rc_bucket_$n" "$(secs "$s" "$b")"
      rc_unmount
      delete_under small-rc
    fi
  done

  [ "$FIO" = 1 ] || continue
  echo "run $r/$RUNS: fio" >&2
  job=(--name=randwrite --rw=randwrite --bs=4k --size=256m --ioengine=psync --output-format=json)
  iops() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'; }
  # fio leaves a verify state file in its working directory: run it in $WORK, which goes away.
  fio_in_work() { (cd "$WORK" && fio "$@"); }
  rm -f "$WORK/local/fio.dat"
  add fio_local "$(fio_in_work "${job[@]}" --filename="$WORK/local/fio.dat" | iops)"
  rm -f "$WORK/local/fio.dat"
  bd_mount
  add fio_bd "$(fio_in_work "${job[@]}" --filename="$MNT/fio.dat" | iops)"
  "$BD" status --wait "$MNT" >/dev/null
  bd_unmount
  delete_under fio.dat
done

row() {  # NAME BASELINE BASELINE-LABEL BD RC
  local base=${2:+$2 ($3)}
  echo "| $1 | $base | $4 | $5 | $(ratio "$4" "$2") | $(ratio "$5" "$4") |"
}
echo
echo "Writes through link-proxy ($RATE B/s per connection each way, $LATENCY per request); median of $RUNS runs; seconds unless noted"
echo
echo "| workload | baseline | bucketdrive | rclone (vfs writes) | bucketdrive ÷ baseline | rclone ÷ bucketdrive |"
echo "|---|---:|---:|---:|---:|---:|"
big="$SIZE_MIB MiB dd bs=1M"
row "$big: until close" "$(med localf)" "local dd conv=fsync" "$(med bd_close)" "$(med rc_close)"
row "$big: close to in the bucket" "$(med direct)" "direct-upload" "$(med bd_upload)" "$(med rc_upload)"
row "$big: start to in the bucket" "" "" "$(med bd_bucket)" "$(med rc_bucket)"
row "$big conv=fsync: until close (fsync waits for the bucket)" "" "" "$(med bd_closef)" ""
for n in $FILES; do
  row "$n × 10 KiB, cp -r: until cp returns" "$(med small_bds_cp_$n)" "bucketdrive --sync-on-close" "$(med small_bd_cp_$n)" "$(med small_rc_cp_$n)"
  row "$n × 10 KiB, cp -r: until all in the bucket" "$(med small_direct_$n)" "32 parallel uploads" "$(med small_bd_bucket_$n)" "$(med small_rc_bucket_$n)"
done
row "fio 4 KiB random writes, 256 MiB file (IOPS)" "$(med fio_local)" "cache disk" "$(med fio_bd)" ""
echo
echo "local dd without fsync (page cache only): $(med local) s"
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
