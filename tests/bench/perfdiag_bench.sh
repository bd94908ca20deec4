#!/usr/bin/env bash
# bucketdrive perfdiag against curl on the same shaped link, in the same run. Prints one table.
#
#   bash tests/bench/perfdiag_bench.sh       # RUNS=3 SIZE_MIB=128 RATE=40M LATENCY=20ms
#
# fake-gcs-server (filesystem backend) sits behind tests/proxy (link-proxy), which caps every
# connection at RATE in both directions and delays every request by LATENCY (--request-gap 0:
# also a request that follows a quick answer on a kept-alive connection). Each run measures,
# through the proxy:
#   1. curl: 20 GETs of a 10 KiB object, one after the other on one connection: the median
#      first-byte time (time_starttransfer);
#   2. curl: one upload of a SIZE_MIB object in one request, multipart/related as GCS clients
#      (and bucketdrive) send it: single-stream write; and for reference the same bytes as a
#      media upload, which the emulator takes faster;
#   3. curl: one GET of that object: single-stream read;
#   4. curl: 8, then 16 curl processes at once (xargs -P), each GETting 16 8 MiB ranges of it
#      one after the other on its connection, as perfdiag's workers do: parallel read;
#   5. bucketdrive perfdiag --json with its defaults, timed from start to exit (deleting its
#      objects included), and checked to leave no object behind.
# Every figure is the median of RUNS runs. Needs no root and no FUSE.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-128}
RATE=${RATE:-40M}
LATENCY=${LATENCY:-20ms}
PART=$((8 * 1024 * 1024))
SIZE=$((SIZE_MIB * 1024 * 1024))

source tests/emulator.sh
source tests/bench/common.sh

cargo build --release --quiet -p fs-linux -p bucketdrive-tests
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-pdbench.XXXX")
mkdir -p "$WORK/gcs"
PROXY_PID=
cleanup() {
  [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c 10240 /dev/urandom > "$WORK/small"
put_object bench small "$WORK/small"
head -c "$SIZE" /dev/urandom > "$WORK/obj"
{
  printf -- '--bdbench\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{"name":"curl-obj"}\r\n'
  printf -- '--bdbench\r\nContent-Type: application/octet-stream\r\n\r\n'
  cat "$WORK/obj"
  printf -- '\r\n--bdbench--\r\n'
} > "$WORK/multipart"

start_proxy --rate "$RATE" --up-rate "$RATE" --latency "$LATENCY" --request-gap 0
BASE="http://$PROXY/storage/v1/b/bench/o"

# The median of the arguments that are numbers; nothing when there are none.
med() {
  local v
  v=$(printf '%s\n' "$@" | grep -E '^[0-9.]+$' || true)
  [ -z "$v" ] || printf '%s\n' "$v" | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "") printf "%.2f", a / b; else print "n/a" }'; }
# A field of the perfdiag report: a dotted path, or read@N for the ranged-read curve at N.
field() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
path = sys.argv[2]
if path.startswith("read@"):
    c = int(path[5:])
    v = next((p["rate"] for p in r["read_parallel_curve"]["points"] if p["concurrency"] == c), None)
else:
    v = r
    for k in path.split("."):
        v = v[k]
print("" if v is None else (f"{v:.1f}" if isinstance(v, float) else v))
EOF
}

# c curl processes at once, each GETting 16 different 8 MiB ranges one after the other on its
# connection (--next keeps it).
par_read() {
  local c=$1 s e
  s=$(now)
  seq 0 $((c - 1)) | SLOTS=$((SIZE / PART)) PART=$PART URL="$BASE/curl-obj?alt=media" \
    xargs -P "$c" -I{} sh -c 'set -f; args=""
      for r in $(seq 0 15); do
        off=$(( (({} * 16 + r) % SLOTS) * PART ))
        [ -z "$args" ] || args="$args --next"
        args="$args -sf -o /dev/null -r $off-$((off + PART - 1)) $URL"
      done
      exec curl $args'
  e=$(now)
  mbps $((c * 16 * PART)) "$s" "$e"
}

# One upload request of $WORK/obj as multipart/related (metadata, then the bytes), as the GCS
# JSON API's one-request upload is sent; prints MB/s.
upload_multipart() {
  local s e
  s=$(now)
  curl -sf -o /dev/null -X POST -T "$WORK/multipart" -H 'Expect:' \
    -H 'Content-Type: multipart/related; boundary=bdbench' \
    "http://$PROXY/upload/storage/v1/b/bench/o?uploadType=multipart"
  e=$(now)
  mbps "$SIZE" "$s" "$e"
}

declare -A curl perfdiag
keys=(latency write read par8 par16)
for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS: curl" >&2
  set -f
  ttfb=$(curl -sf -w '%{time_starttransfer}\n' $(for _ in $(seq 20); do
    echo "-o /dev/null $BASE/small?alt=media"; done) | median)
  set +f
  curl[latency]+="$(awk -v t="$ttfb" 'BEGIN { printf "%.1f", t * 1000 }') "
  bps=$(curl -sf -o /dev/null -w '%{speed_upload}' -X POST -T "$WORK/obj" -H 'Expect:' \
    -H 'Content-Type: application/octet-stream' \
    "http://$PROXY/upload/storage/v1/b/bench/o?uploadType=media&name=curl-media")
  curl[media]+="$(awk -v b="$bps" 'BEGIN { printf "%.1f", b / 1e6 }') "
  curl[write]+="$(upload_multipart) "
  bps=$(curl -sf -o /dev/null -w '%{speed_download}' "$BASE/curl-obj?alt=media")
  curl[read]+="$(awk -v b="$bps" 'BEGIN { printf "%.1f", b / 1e6 }') "
  curl[par8]+="$(par_read 8) "
  curl[par16]+="$(par_read 16) "

  echo "run $r/$RUNS: bucketdrive perfdiag (defaults)" >&2
  s=$(now)
  "$BD" perfdiag bench/perfdiag --endpoint "http://$PROXY" --anonymous --json > "$WORK/report.json"
  e=$(now)
  perfdiag[runtime]+="$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.0f", e - s }') "
  perfdiag[latency]+="$(field "$WORK/report.json" latency_ms.p50) "
  perfdiag[write]+="$(field "$WORK/report.json" write_single_stream_mbps) "
  perfdiag[read]+="$(field "$WORK/report.json" read_single_stream_mbps) "
  perfdiag[par8]+="$(field "$WORK/report.json" read@8) "
  perfdiag[par16]+="$(field "$WORK/report.json" read@16) "
  left=$(curl -sf "$EMU_URL/storage/v1/b/bench/o?prefix=perfdiag/" | grep -c '"name"' || true)
  [ "$left" = 0 ] || { echo "perfdiag left $left objects behind" >&2; exit 1; }
done

declare -A label=(
  [latency]="first-byte latency p50, ms"
  [write]="single-stream write, MB/s"
  [read]="single-stream read, MB/s"
  [par8]="parallel ranged read ×8, MB/s"
  [par16]="parallel ranged read ×16, MB/s"
)
echo
echo "perfdiag against curl through link-proxy ($RATE B/s per connection each way, $LATENCY per request), $SIZE_MIB MiB object, 8 MiB ranges; median of $RUNS runs"
echo
echo "| figure | curl | perfdiag | perfdiag ÷ curl | runs: curl / perfdiag |"
echo "|---|---:|---:|---:|---|"
for k in "${keys[@]}"; do
  c=$(med ${curl[$k]})
  p=$(med ${perfdiag[$k]:-})
  echo "| ${label[$k]} | $c | ${p:-n/a} | $(ratio "$p" "$c") | ${curl[$k]}/ ${perfdiag[$k]:-} |"
done
echo "| for reference: curl media upload (uploadType=media), MB/s | $(med ${curl[media]}) | | | ${curl[media]}|"
echo
echo "perfdiag runtime (defaults, connect to exit): median $(med ${perfdiag[runtime]}) s (runs: ${perfdiag[runtime]}); limit 180 s"
echo "knees and recommendation of the last run: read ×$(field "$WORK/report.json" read_parallel_curve.knee), composite write ×$(field "$WORK/report.json" write_parallel_curve.knee): $(field "$WORK/report.json" recommended.flags)"
