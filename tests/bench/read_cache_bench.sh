#!/usr/bin/env bash
# The disk read cache (--read-cache-dir) through a shaped link. Prints one table from one run.
#
#   bash tests/bench/read_cache_bench.sh      # RUNS=3 SIZE_MIB=512 RATE=40M LATENCY=20ms
#
# The setup of read_bench.sh: fake-gcs-server (filesystem backend) behind tests/proxy
# (link-proxy), which caps each connection at RATE and delays each request by LATENCY. Each run
# reads one SIZE_MIB object with dd bs=1M, always on a fresh mount (no page cache of the mount
# carries over):
#   1. first read without a read cache;
#   2. first read with --read-cache-dir on an empty cache: filling it must not slow the read;
#   3. unmount, mount again on the same cache, re-read: from the local disk, no download (after
#      a sync, so the filling's write-back does not run during it);
#   4. the same, after the cache files were dropped from the host's page cache
#      (posix_fadvise DONTNEED through dd iflag=nocache): the disk itself, not memory;
#   5. for scale, the mount reading straight from the emulator, without the proxy: what FUSE,
#      the mount and dd manage on this machine with a link that is never the limit.
# Rows 1 and 2 take turns going first. Every re-read's bytes are checked against the source's
# sha256 in a second, untimed pass; what it downloaded (bucketdrive_fetched_bytes_total) is
# printed: 0 unless the first read had to skip blocks because the cache's writer fell behind.
# Needs root (or fusermount3) and /dev/fuse, and about 2 × SIZE_MIB of free disk under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-512}
RATE=${RATE:-40M}
LATENCY=${LATENCY:-20ms}
SIZE=$((SIZE_MIB * 1024 * 1024))

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux -p bucketdrive-tests
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-rcache-bench.XXXX")
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
echo "preparing a $SIZE_MIB MiB object..." >&2
head -c "$SIZE" /dev/urandom > "$WORK/obj"
put_object bench obj "$WORK/obj"
SHA=$(sha256sum "$WORK/obj" | cut -d' ' -f1)
rm -f "$WORK/obj"

start_proxy --rate "$RATE" --latency "$LATENCY"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }

bd_mount() {  # extra flags...
  "$BD" mount bench "$MNT" --endpoint "${ENDPOINT:-http://$PROXY}" --anonymous --cache-dir "$WORK/wcache" \
    --log-file "$WORK/bd.log" --metrics-addr "127.0.0.1:$PORT" "$@"
}
bd_unmount() {
  "$BD" unmount "$MNT" >/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" || return 0; sleep 0.1; done
}
timed_read() {  # prints MB/s of one dd of the object
  local s e
  s=$(now); dd if="$MNT/obj" of=/dev/null bs=1M status=none; e=$(now)
  mbps "$SIZE" "$s" "$e"
}


first_plain() {
  bd_mount
  add plain "$(timed_read)"
  bd_unmount
}
first_cached() {
  rm -rf "$WORK/rcache"
  bd_mount --read-cache-dir "$WORK/rcache"
  add fill "$(timed_read)"
  add skipped "$(metric bucketdrive_read_cache_skipped_bytes_total)"
  bd_unmount
}
reread() {  # label: warm or cold
  # What the filling mount wrote is flushed first, so its write-back does not run during the
  # re-read (a later remount finds it on disk).
  sync
  if [ "$1" = cold ]; then
    for f in "$WORK"/rcache/bucketdrive-read-cache/objects/*.data "$WORK"/rcache/bucketdrive-read-cache/objects/*.index; do
      dd if="$f" iflag=nocache count=0 status=none
    done
  fi
  bd_mount --read-cache-dir "$WORK/rcache"
  add "$1" "$(timed_read)"
  local fetched
  fetched=$(metric bucketdrive_fetched_bytes_total)
  [ "$(sha256sum "$MNT/obj" | cut -d' ' -f1)" = "$SHA" ] || { echo "re-read returned wrong bytes" >&2; exit 1; }
  bd_unmount
  add "dl_$1" "$(awk -v b="$fetched" 'BEGIN { printf "%.0f", b / 1048576 }')"
}

for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS" >&2
  if [ $((r % 2)) = 1 ]; then first_plain; first_cached; else first_cached; first_plain; fi
  DISK_KIB=$(du -sk "$WORK/rcache/bucketdrive-read-cache" | cut -f1)
  reread warm
  reread cold
  ENDPOINT=$EMU_URL bd_mount
  add direct "$(timed_read)"
  bd_unmount
done

plain=$(med plain); fill=$(med fill); warm=$(med warm); cold=$(med cold); direct=$(med direct)
echo
echo "Read of a $SIZE_MIB MiB object through link-proxy ($RATE B/s per connection, $LATENCY per request); median of $RUNS runs, fresh mount each"
echo
echo "| read | MB/s (median) | runs | × first read |"
echo "|---|---:|---|---:|"
echo "| first read, no read cache | $plain | ${R[plain]# } | 1.00 |"
echo "| first read, filling an empty --read-cache-dir | $fill | ${R[fill]# } | $(ratio "$fill" "$plain") |"
echo "| re-read after remount, cache files in the page cache | $warm | ${R[warm]# } | $(ratio "$warm" "$plain") |"
echo "| re-read after remount, cache files read from disk | $cold | ${R[cold]# } | $(ratio "$cold" "$plain") |"
echo "| for scale: no proxy, the emulator on loopback, no read cache | $direct | ${R[direct]# } | $(ratio "$direct" "$plain") |"
echo
echo "MiB downloaded by the re-reads: ${R[dl_warm]# } (page cache), ${R[dl_cold]# } (disk)"
echo
echo "re-read vs first read with the cache: $(ratio "$warm" "$fill")× (page cache), $(ratio "$cold" "$fill")× (disk)"
echo "re-read vs one connection of the link ($RATE B/s): $(ratio "$warm" "$(awk -v r="${RATE%M}" 'BEGIN { print r }')")×"
echo "bytes not cached by the first reads (writer behind):${R[skipped]}; cache on disk after one read: $((DISK_KIB / 1024)) MiB"
