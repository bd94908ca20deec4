#!/usr/bin/env bash
# Write benchmark through a shaped link. Prints one table from one run.
#
#   bash tests/bench/write_bench.sh    # RUNS=3 SIZE_MIB=1024 FILES=10000 RATE=40M LATENCY=20ms
#
# RCLONE=0 skips the rclone rows (they take most of the time and do not change with
# bucketdrive); the baselines still run.
#
# fake-gcs-server (filesystem backend) sits behind tests/proxy (link-proxy), which caps every
# connection at RATE in both directions and delays each request by LATENCY. Every figure is the
# median of RUNS runs, each on a fresh mount with default options:
#   1. one SIZE_MIB sequential write (dd bs=1M), then again with conv=fsync. Time until dd
#      returns (close) and until the object is in the bucket, against dd onto the cache disk,
#      against direct-upload (the same file sent straight to the bucket with the GCS client,
#      parts at the same concurrency), and against rclone mount --vfs-cache-mode writes;
#   2. FILES files of 10 KiB (one dd, then split), cp -r into the mount: time until cp returns
#      and until every object is in the bucket, against rclone;
#   3. fio 4 KiB random writes into a 256 MiB file, against the same job on the cache disk.
# Every object written is checked in the bucket (sha256 or count) before its time is counted.
# Needs root, /dev/fuse, fio, and about 4 GiB of free disk under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-10000}
RATE=${RATE:-40M}
LATENCY=${LATENCY:-20ms}
RCLONE=${RCLONE:-1}
SIZE=$((SIZE_MIB * 1024 * 1024))

source tests/emulator.sh
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
target/release/link-proxy --upstream "${EMU_URL#http://}" --rate "$RATE" --up-rate "$RATE" \
  --latency "$LATENCY" > "$WORK/proxy.out" &
PROXY_PID=$!
for _ in $(seq 50); do [ -s "$WORK/proxy.out" ] && break; sleep 0.1; done
PROXY=$(awk '{print $2}' "$WORK/proxy.out")

echo "preparing the sources..." >&2
SRC=$WORK/src.bin
head -c "$SIZE" /dev/urandom > "$SRC"
SRC_SHA=$(sha256sum "$SRC" | cut -d' ' -f1)
SMALL=$WORK/small
mkdir -p "$SMALL"
head -c $((FILES * 10240)) /dev/urandom | (cd "$SMALL" && split -b 10240 -a 5 -d - f)
SMALL_LAST=$(ls "$SMALL" | tail -n 1)
SMALL_SHA=$(sha256sum "$SMALL/$SMALL_LAST" | cut -d' ' -f1)

now() { date +%s.%N; }
secs() { awk -v s="$1" -v e="$2" 'BEGIN { printf "%.2f", e - s }'; }
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# The object's sha256, fetched from the emulator directly (not through the proxy or a mount).
object_sha() { curl -sf "$EMU_URL/storage/v1/b/bench/o/$1?alt=media" | sha256sum | cut -d' ' -f1; }
object_size() {
  curl -sf "$EMU_URL/storage/v1/b/bench/o/$1" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])' 2>/dev/null || echo -1
}
# Number of objects under a prefix.
count_under() {
  python3 - "$EMU_URL" "$1" <<'EOF'
import json, sys, urllib.parse, urllib.request
url, prefix, token, n = sys.argv[1], sys.argv[2], None, 0
while True:
    q = {"prefix": prefix, "maxResults": "1000", "fields": "items(name),nextPageToken"}
    if token:
        q["pageToken"] = token
    with urllib.request.urlopen(f"{url}/storage/v1/b/bench/o?{urllib.parse.urlencode(q)}") as r:
        page = json.load(r)
    n += len(page.get("items", []))
    token = page.get("nextPageToken")
    if not token:
        break
print(n)
EOF
}
delete_under() {
  python3 - "$EMU_URL" "$1" <<'EOF'
import json, sys, urllib.parse, urllib.request
url, prefix = sys.argv[1], sys.argv[2]
while True:
    q = urllib.parse.urlencode({"prefix": prefix, "maxResults": "1000"})
    with urllib.request.urlopen(f"{url}/storage/v1/b/bench/o?{q}") as r:
        items = json.load(r).get("items", [])
    if not items:
        break
    for it in items:
        name = urllib.parse.quote(it["name"], safe="")
        urllib.request.urlopen(urllib.request.Request(f"{url}/storage/v1/b/bench/o/{name}", method="DELETE"))
EOF
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

# fake-gcs-server's first compose of a big object runs about twice as slow as later ones (its
# heap grows); one unmeasured upload first, so no row pays for that.
echo "warming up the emulator..." >&2
target/release/direct-upload --endpoint "http://$PROXY" --bucket bench --key warm-up --file "$SRC" >/dev/null
delete_under warm-up

declare -A R
add() { R[$1]="${R[$1]:-} $2"; }
med() { [ -n "${R[$1]:-}" ] && printf '%s\n' ${R[$1]} | median; }

for r in $(seq "$RUNS"); do
  for sync in "" "conv=fsync"; do
    tag=${sync:+f}
    echo "run $r/$RUNS: 1 GiB ${sync:-no fsync}: local dd" >&2
    rm -f "$WORK/local/big"; sync
    s=$(now); dd if="$SRC" of="$WORK/local/big" bs=1M $sync status=none; e=$(now)
    add "local$tag" "$(secs "$s" "$e")"
    rm -f "$WORK/local/big"

    echo "run $r/$RUNS: 1 GiB ${sync:-no fsync}: bucketdrive" >&2
    bd_mount
    s=$(now); dd if="$SRC" of="$MNT/big-bd" bs=1M $sync status=none; c=$(now)
    "$BD" status --wait "$MNT" >/dev/null; b=$(now)
    check_sha big-bd "$SRC_SHA"
    add "bd_close$tag" "$(secs "$s" "$c")"; add "bd_bucket$tag" "$(secs "$s" "$b")"
    add "bd_upload$tag" "$(secs "$c" "$b")"
    bd_unmount
    delete_under big-bd

    [ "$RCLONE" = 1 ] || continue
    echo "run $r/$RUNS: 1 GiB ${sync:-no fsync}: rclone" >&2
    rc_mount
    s=$(now); dd if="$SRC" of="$MNT/big-rc" bs=1M $sync status=none; c=$(now)
    wait_size big-rc "$SIZE"; b=$(now)
    check_sha big-rc "$SRC_SHA"
    add "rc_close$tag" "$(secs "$s" "$c")"; add "rc_bucket$tag" "$(secs "$s" "$b")"
    add "rc_upload$tag" "$(secs "$c" "$b")"
    rc_unmount
    delete_under big-rc
  done

  echo "run $r/$RUNS: direct-upload" >&2
  add direct "$(target/release/direct-upload --endpoint "http://$PROXY" --bucket bench --key big-direct --file "$SRC")"
  check_sha big-direct "$SRC_SHA"
  delete_under big-direct

  echo "run $r/$RUNS: $FILES small files: bucketdrive" >&2
  bd_mount
  s=$(now); cp -r "$SMALL" "$MNT/small-bd"; c=$(now)
  "$BD" status --wait "$MNT" >/dev/null; b=$(now)
  [ "$(count_under small-bd/)" = "$FILES" ] || { echo "bucketdrive: small files missing" >&2; exit 1; }
  check_sha "small-bd%2F$SMALL_LAST" "$SMALL_SHA"
  add small_bd_cp "$(secs "$s" "$c")"; add small_bd_bucket "$(secs "$s" "$b")"
  bd_unmount
  delete_under small-bd

  if [ "$RCLONE" = 1 ]; then
    echo "run $r/$RUNS: $FILES small files: rclone" >&2
    rc_mount
    s=$(now); cp -r "$SMALL" "$MNT/small-rc"; c=$(now)
    wait_count small-rc/ "$FILES"; b=$(now)
    check_sha "small-rc%2F$SMALL_LAST" "$SMALL_SHA"
    add small_rc_cp "$(secs "$s" "$c")"; add small_rc_bucket "$(secs "$s" "$b")"
    rc_unmount
    delete_under small-rc
  fi

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

echo
echo "Writes through link-proxy ($RATE B/s per connection each way, $LATENCY per request); median of $RUNS runs; seconds unless noted"
echo
echo "| workload | baseline | bucketdrive | rclone (vfs writes) | bucketdrive ÷ baseline | rclone ÷ bucketdrive |"
echo "|---|---:|---:|---:|---:|---:|"
for tag in "" f; do
  name="$SIZE_MIB MiB dd bs=1M${tag:+ conv=fsync}"
  echo "| $name: until close | $(med local$tag) (local dd) | $(med bd_close$tag) | $(med rc_close$tag) | $(ratio "$(med bd_close$tag)" "$(med local$tag)") | $(ratio "$(med rc_close$tag)" "$(med bd_close$tag)") |"
  echo "| $name: close to in the bucket | $(med direct) (direct-upload) | $(med bd_upload$tag) | $(med rc_upload$tag) | $(ratio "$(med bd_upload$tag)" "$(med direct)") | $(ratio "$(med rc_upload$tag)" "$(med bd_upload$tag)") |"
  echo "| $name: start to in the bucket | | $(med bd_bucket$tag) | $(med rc_bucket$tag) | | $(ratio "$(med rc_bucket$tag)" "$(med bd_bucket$tag)") |"
done
echo "| $FILES × 10 KiB, cp -r: until cp returns | | $(med small_bd_cp) | $(med small_rc_cp) | | $(ratio "$(med small_rc_cp)" "$(med small_bd_cp)") |"
echo "| $FILES × 10 KiB, cp -r: until all in the bucket | | $(med small_bd_bucket) | $(med small_rc_bucket) | | $(ratio "$(med small_rc_bucket)" "$(med small_bd_bucket)") |"
echo "| fio 4 KiB random writes, 256 MiB file (IOPS) | $(med fio_local) (cache disk) | $(med fio_bd) | | $(ratio "$(med fio_bd)" "$(med fio_local)") | |"
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
