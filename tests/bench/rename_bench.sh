#!/usr/bin/env bash
# What a directory rename costs: `mv` of a directory of FILES small objects through the mount,
# this build beside the build at BASE (a git revision), alternated, in the same run.
#
#   BASE=<rev> bash tests/bench/rename_bench.sh    # RUNS=5 FILES=200 LATENCY=10ms
#
# A directory rename is object by object: each copy, then each delete, one request after the
# other. fake-gcs-server (memory backend) sits behind tests/proxy (link-proxy), which delays
# every request by LATENCY, so the figure is mostly round trips. Each run puts FILES objects of
# 1 KiB under a fresh prefix straight into the bucket, mounts each build afresh, lists the
# directory (as a shell would), and times `mv` until it returns. Afterwards the bucket must
# hold every object under the new name, with its bytes, and nothing under the old one. Prints
# the median seconds and milliseconds per object of each build, and their ratio. Needs root
# and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${BASE:?BASE=<git revision> to compare with}
RUNS=${RUNS:-5}
FILES=${FILES:-200}
LATENCY=${LATENCY:-10ms}

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux -p bucketdrive-tests
bench_work bd-rename
mkdir -p "$WORK/this"
build_base "$WORK/base"
install -m 0755 target/release/bucketdrive "$WORK/this/bucketdrive"
PROXY_PID=
trap 'kill "${PROXY_PID:-}" 2>/dev/null || true; bench_cleanup' EXIT

start_emulator
create_bucket bench
start_proxy --latency "$LATENCY" --request-gap 0
head -c 1024 /dev/urandom > "$WORK/obj"
SHA=$(sha256sum < "$WORK/obj" | cut -d' ' -f1)

put() {  # KEY
  curl -sf -X POST "$EMU_URL/upload/storage/v1/b/bench/o?uploadType=media&name=$1" \
    --data-binary @"$WORK/obj" > /dev/null
}
keys() {  # PREFIX: the names of the files under it (directory markers left out), one per line
  curl -sf "$EMU_URL/storage/v1/b/bench/o?prefix=$1&maxResults=5000" |
    python3 -c 'import json,sys; [print(o["name"]) for o in json.load(sys.stdin).get("items", []) if not o["name"].endswith("/")]'
}

one() {  # BUILD RUN
  local b=$1 r=$2 s e bd=$WORK/$1/bucketdrive
  for i in $(seq "$FILES"); do put "src-$b-$r/f$i"; done
  rm -rf "$WORK/cache"
  "$bd" mount bench "$MNT" --endpoint "http://$PROXY" --anonymous --cache-dir "$WORK/cache" \
    --log-file "$WORK/bd.log"
  ls "$MNT/src-$b-$r" > /dev/null
  s=$(now)
  mv "$MNT/src-$b-$r" "$MNT/dst-$b-$r"
  e=$(now)
  "$bd" unmount "$MNT" > /dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" || break; sleep 0.1; done
  [ "$(keys "dst-$b-$r/" | wc -l)" -eq "$FILES" ] || { echo "$b: objects missing after mv" >&2; exit 1; }
  [ -z "$(keys "src-$b-$r/")" ] || { echo "$b: objects left under the old name" >&2; exit 1; }
  [ "$(curl -sf "$EMU_URL/storage/v1/b/bench/o/dst-$b-$r%2Ff$FILES?alt=media" | sha256sum | cut -d' ' -f1)" = "$SHA" ] ||
    { echo "$b: a moved object has the wrong bytes" >&2; exit 1; }
  add "${b}_s" "$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }')"
}

for r in $(seq "$RUNS"); do
  one base "$r"
  one this "$r"
done

per() { awk -v s="$1" -v n="$FILES" 'BEGIN { printf "%.1f", s * 1000 / n }'; }
B=$(med base_s)
T=$(med this_s)
echo
echo "mv of a directory of $FILES objects, latency $LATENCY per request, median of $RUNS runs"
printf '%-28s %10s %12s\n' "build" "seconds" "ms/object"
printf '%-28s %10s %12s\n' "base $(git rev-parse --short "$BASE")" "$B" "$(per "$B")"
printf '%-28s %10s %12s\n' "this $(git rev-parse --short HEAD)" "$T" "$(per "$T")"
echo "this / base: $(ratio "$T" "$B")"
