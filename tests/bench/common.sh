# Shared by the benchmark scripts (sourced after tests/emulator.sh, with WORK set): timing and
# median helpers, and the shaped link in front of the emulator.

now() { date +%s.%N; }
# MB/s for $1 bytes between times $2 and $3.
mbps() { awk -v b="$1" -v s="$2" -v e="$3" 'BEGIN { printf "%.1f", b / 1e6 / (e - s) }'; }
# The median of the numbers on standard input.
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# Starts link-proxy (tests/proxy) in front of the emulator at EMU_URL, with the given shaping
# options (--rate, --up-rate, --latency, ...); sets PROXY_PID and PROXY (its host:port).
start_proxy() {
  target/release/link-proxy --upstream "${EMU_URL#http://}" "$@" > "$WORK/proxy.out" &
  PROXY_PID=$!
  for _ in $(seq 50); do [ -s "$WORK/proxy.out" ] && break; sleep 0.1; done
  PROXY=$(awk '{print $2}' "$WORK/proxy.out")
}

# Figures by name, for medians: `add KEY VALUE` records one, `med KEY` prints their median
# (nothing when there is none).
declare -A R
add() { R[$1]="${R[$1]:-} $2"; }
med() { [ -n "${R[$1]:-}" ] && printf '%s\n' ${R[$1]} | median; }
# $1 ÷ $2 to two places; nothing when either is missing.
ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b }'; }
# CPU seconds (user and system) process $1 has used.
# This VM hands memory that stays free back to its host (virtio-balloon free page reporting),
# and the first touch of such a page then faults on the host: microseconds per 4 KiB page,
# charged to whatever copy touches the page first. For a read through FUSE that is the
# kernel's copy of each reply into fresh page cache, and it cost more than all of the
# daemon's own work (benchmarks.md, "Memory the host took back"). Before a measured read,
# touch and let go of WARM_GIB (6) GiB so that the pages the read takes are backed again;
# WARM_GIB=0 measures the machine as it is.
warm_memory() {
  [ "${WARM_GIB:-6}" -gt 0 ] || return 0
  python3 -c "b = bytearray(b'\\x01') * (${WARM_GIB:-6} << 30)"
}

# The machine's CPU time so far, busy and in all (jiffies, every CPU, from /proc/stat): two
# marks give the share of the machine a span kept busy (busy_pct), which says whether a rate
# was bound by these cores or by something else.
cpu_jiffies() { awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
busy_pct() {  # MARK-BEFORE MARK-AFTER
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); if (y[2] > x[2]) printf "%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2]) }'
}

cpu_s() { awk '{ printf "%.3f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
# Seconds until `dd if=SRC of=DST bs=BS [flags...]` returns (its close included), from the same
# start every time: nothing dirty, and only the source in the page cache (these machines
# throttle writes once their page cache fills, whichever file filled it), and memory warmed
# (warm_memory above). Needs root.
timed_dd() {
  local src=$1 dst=$2 bs=$3 s e
  shift 3
  sync; echo 1 > /proc/sys/vm/drop_caches; cat "$src" > /dev/null; sleep 1; warm_memory
  s=$(now); dd if="$src" of="$dst" bs="$bs" status=none "$@"; e=$(now)
  awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }'
}

# Builds BASE (a git revision) in a worktree of its own, kept under target/ (a second run of
# the same base builds nothing), with a target directory of its own (one shared by two
# revisions can keep the other's binary: cargo takes the same crates at another path for
# fresh); installs its binary as $1/bucketdrive.
build_base() {  # DEST-DIR
  local rev src
  rev=$(git rev-parse "$BASE")
  src=target/bench-base/src-$rev
  [ -d "$src" ] || { git worktree prune; git worktree add --detach --quiet "$src" "$rev"; }
  CARGO_TARGET_DIR="$(pwd)/target/bench-base/target-$rev" cargo build --release --quiet \
    --manifest-path "$src/Cargo.toml" -p fs-linux
  mkdir -p "$1"
  install -m 0755 "target/bench-base/target-$rev/release/bucketdrive" "$1/bucketdrive"
}

# Sets BD to the binary a profile measures: the build at BASE when set (see build_base), else
# this tree's release build. Needs WORK.
bench_binary() {
  if [ -n "${BASE:-}" ]; then
    build_base "$WORK/base"
    BD=$WORK/base/bucketdrive
  else
    cargo build --release --quiet -p fs-linux
    BD=target/release/bucketdrive
  fi
}

# Makes WORK, a fresh directory under TMPDIR named after $1, with MNT and gcs/ in it, and a trap
# that unmounts MNT, stops the emulator and removes WORK on exit.
bench_work() {  # NAME
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXX")
  MNT=$WORK/mnt
  mkdir -p "$MNT" "$WORK/gcs"
  trap bench_cleanup EXIT
}
bench_cleanup() {
  mountpoint -q "$MNT" && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
  kill "${EMU_PID:-}" 2>/dev/null || true
  rm -rf "$WORK"
}

# Waits up to 30 s for process $1 to exit (a daemon leaves its cache directory a moment after
# its unmount).
wait_gone() { for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; }

# The objects of the emulator's bucket "bench" (at EMU_URL), listed and deleted in one
# process each (a curl per object takes minutes for thousands).

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
# Deletes every object under a prefix ("" for all).
delete_under() {
  python3 - "$EMU_URL" "$1" <<'EOF'
import json, sys, urllib.error, urllib.parse, urllib.request
url, prefix = sys.argv[1], sys.argv[2]
while True:
    q = urllib.parse.urlencode({"prefix": prefix, "maxResults": "1000"})
    with urllib.request.urlopen(f"{url}/storage/v1/b/bench/o?{q}") as r:
        items = json.load(r).get("items", [])
    if not items:
        break
    for it in items:
        name = urllib.parse.quote(it["name"], safe="")
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/storage/v1/b/bench/o/{name}", method="DELETE"))
        except urllib.error.HTTPError as e:
            if e.code != 404:  # gone meanwhile (a temporary part the mount removed)
                raise
EOF
}

# start_emulator_tls: the emulator over HTTPS for the mount, with a certificate from a CA made
# here and trusted by the daemon alone (SSL_CERT_FILE), plain HTTP beside it for the script's
# own requests. Filesystem backend under $WORK/gcs. Sets EMU_PID, EMU_URL (the plain side),
# ENDPOINT (the HTTPS side) and ENDPOINT_ENV (the command prefix that trusts the CA).
start_emulator_tls() {
  (cd "$WORK" &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.pem \
      -subj "/CN=bucketdrive bench CA" 2>/dev/null &&
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null &&
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -out server.pem -extfile server.ext 2>/dev/null)
  local free_port='import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
  local http_port https_port
  http_port=$(python3 -c "$free_port"); https_port=$(python3 -c "$free_port")
  "$FAKE_GCS_SERVER" -scheme both -host 127.0.0.1 -port "$https_port" -port-http "$http_port" \
    -cert-location "$WORK/server.pem" -private-key-location "$WORK/server.key" \
    -public-host "127.0.0.1:$https_port" -external-url "https://127.0.0.1:$https_port" \
    -backend filesystem -filesystem-root "$WORK/gcs" -log-level error >/dev/null 2>&1 &
  EMU_PID=$!
  EMU_URL="http://127.0.0.1:$http_port"
  for _ in $(seq 100); do curl -sf "$EMU_URL/storage/v1/b" >/dev/null 2>&1 && break; sleep 0.1; done
  ENDPOINT="https://127.0.0.1:$https_port"
  ENDPOINT_ENV=(env "SSL_CERT_FILE=$WORK/ca.pem")
}

# start_bench_emulator: the emulator (filesystem backend under $WORK/gcs) for a benchmark's
# mount, over HTTPS with TLS=1 (start_emulator_tls), else plain HTTP. Sets EMU_URL (for the
# script's own requests), ENDPOINT (the mount's) and ENDPOINT_ENV (the mount's command prefix).
start_bench_emulator() {
  ENDPOINT_ENV=()
  if [ "${TLS:-0}" = 1 ]; then
    start_emulator_tls
  else
    start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
    ENDPOINT=$EMU_URL
  fi
}
