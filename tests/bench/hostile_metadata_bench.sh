#!/usr/bin/env bash
# Memory a hostile bucket can make a mount use: OBJECTS objects that each carry META_KIB KiB of
# custom metadata (a bucket writer's choice, up to GCS's 8 KiB), listed with `ls -l`, beside the
# same number of objects without any, in one run.
#
#   bash tests/bench/hostile_metadata_bench.sh      # OBJECTS=100000 META_KIB=8
#
# For each bucket: a fresh mount (release build), `ls -l` of the directory holding the objects
# (a listing with attributes: what fills the stat cache, the inodes and the last known state),
# then the daemon's resident memory (VmRSS) and peak (VmHWM) from /proc. Prints both side by
# side and the difference per object. BD_BEFORE=path/to/bucketdrive (an earlier build) adds its
# rows for the same buckets, as the baseline of a change. Needs root and /dev/fuse.
#
# SERVER=emulator fills fake-gcs-server; SERVER=generated serves the same objects from
# tests/bench/listing_server.py, which makes them up as they are listed. The emulator cannot
# hold 100,000 such objects in reasonable time (each upload scans the bucket), so generated is
# the default above 20,000 objects; at 20,000 both can be run to compare them.
set -euo pipefail
cd "$(dirname "$0")/../.."
OBJECTS=${OBJECTS:-100000}
META_KIB=${META_KIB:-8}
if [ "$OBJECTS" -gt 20000 ]; then SERVER=${SERVER:-generated}; else SERVER=${SERVER:-emulator}; fi

source tests/emulator.sh
# BD=path/to/bucketdrive measures another build (an earlier commit's, say) instead.
if [ -z "${BD:-}" ]; then
  cargo build --release --quiet -p fs-linux
  BD=target/release/bucketdrive
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-hostile.XXXX")
MNT=$WORK/mnt
mkdir -p "$MNT"
cleanup() {
  mountpoint -q "$MNT" && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
  kill "${EMU_PID:-}" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$SERVER" = generated ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  python3 tests/bench/listing_server.py "$port" "$OBJECTS" "$META_KIB" &
  EMU_PID=$!
  EMU_URL="http://127.0.0.1:$port"
  until curl -sf "$EMU_URL/storage/v1/b/plain" >/dev/null; do sleep 0.1; done
else
  start_emulator
fi
fill() {  # bucket, metadata KiB
  create_bucket "$1"
  python3 - "$EMU_URL" "$1" "$OBJECTS" "$2" <<'PY'
import http.client, json, sys, threading, urllib.parse
url, bucket, n, kib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
host = urllib.parse.urlparse(url).netloc
meta = {}
if kib:
    # Several keys, as tools attach them, together META_KIB KiB.
    for i in range(8):
        meta[f"x-note-{i}"] = "n" * (kib * 1024 // 8 - 16)
B = "bd-bench-boundary"
def worker(start, step):
    c = http.client.HTTPConnection(host)
    for i in range(start, n, step):
        res = json.dumps({"name": f"d/obj-{i:07d}", "metadata": meta})
        body = (f"--{B}\r\ncontent-type: application/json\r\n\r\n{res}\r\n--{B}\r\n"
                f"content-type: application/octet-stream\r\n\r\nx\r\n--{B}--\r\n").encode()
        c.request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body,
                  {"content-type": f"multipart/related; boundary={B}"})
        r = c.getresponse(); r.read()
        if r.status != 200:
            sys.exit(f"upload {i}: {r.status}")
ts = [threading.Thread(target=worker, args=(k, 16)) for k in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
}

measure() {  # bucket [binary] -> "rss_kib hwm_kib seconds"
  rm -rf "$WORK/cache"
  "${2:-$BD}" mount "$1" "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
    --log-file "$WORK/bd.log" --foreground &
  local pid=$!
  while ! mountpoint -q "$MNT"; do sleep 0.05; done
  local t0 n
  t0=$(date +%s.%N)
  n=$(ls -l "$MNT/d" | wc -l)
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  [ "$n" -gt "$OBJECTS" ] || { echo "listed $n lines, want $OBJECTS" >&2; exit 1; }
  local rss hwm
  rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
  hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status")
  umount "$MNT"
  wait "$pid" || true
  echo "$rss $hwm $secs"
}

if [ "$SERVER" = generated ]; then
  echo "== generated buckets: $OBJECTS objects without metadata, $OBJECTS with $META_KIB KiB each"
else
  echo "== filling the emulator: $OBJECTS objects without metadata, $OBJECTS with $META_KIB KiB each"
  fill plain 0
  fill hostile "$META_KIB"
fi
row() { awk -v l="$1" -v r="$2" -v h="$3" -v s="$4" 'BEGIN { printf "%-40s %12.1f %12.1f %8s\n", l, r / 1024, h / 1024, s }'; }
printf '%-40s %12s %12s %8s\n' "bucket ($OBJECTS objects, ls -l)" "VmRSS MiB" "VmHWM MiB" "ls s"
for build in ${BD_BEFORE:+before} this; do
  bin=$BD
  [ "$build" = before ] && bin=$BD_BEFORE
  read -r p_rss p_hwm p_s < <(measure plain "$bin")
  read -r h_rss h_hwm h_s < <(measure hostile "$bin")
  row "$build: no custom metadata (baseline)" "$p_rss" "$p_hwm" "$p_s"
  row "$build: $META_KIB KiB of metadata each" "$h_rss" "$h_hwm" "$h_s"
  awk -v a="$p_rss" -v b="$h_rss" -v n="$OBJECTS" -v l="$build" \
    'BEGIN { printf "%s: %.1f MiB more resident, %.0f bytes per object\n", l, (b - a) / 1024, (b - a) * 1024 / n }'
done
