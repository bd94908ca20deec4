#!/usr/bin/env bash
# Where the daemon's CPU goes for a GiB read from the bucket: perf (cpu-clock samples; this VM
# has no hardware counters) on the daemon while a reader reads a SIZE_MIB object through a
# fresh root mount. Prints the daemon's CPU seconds per GiB, the samples grouped by what they
# are spent on, and the top symbols.
#
#   bash tests/bench/read_profile.sh [mount options...]   # SIZE_MIB=1024
#   READER=cp bash tests/bench/read_profile.sh             # cp to the local disk, not dd bs=1M
#   TLS=1 bash tests/bench/read_profile.sh                 # over HTTPS (a test CA, SSL_CERT_FILE)
#   BASE=<rev> bash tests/bench/read_profile.sh ...        # the same of the build at BASE
#   PERF_DATA=<file> ...                                   # keeps perf.data there
#   RCLONE=1 ...                                           # rclone mount beside it, same read
# Beside it, the same reader on a local file of the same bytes, from a cold page cache.
# Every measured read is preceded by warm_memory (tests/bench/common.sh; WARM_GIB=0 skips it).
#
# Release build (symbols are kept), the emulator (filesystem backend) on loopback, no link
# shaping, no read cache: every byte comes over HTTP. The bytes read are checked (sha256).
# Beside it, the floor: the same reader on a FUSE server that answers from memory and does
# nothing else (tests/bench/fuse_floor.rs), its CPU seconds per GiB.
# Needs root, /dev/fuse and perf (linux-perf).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_MIB=${SIZE_MIB:-1024}
source tests/emulator.sh
source tests/bench/common.sh
bench_work bd-read-profile
bench_binary
cargo build --release --quiet -p bucketdrive-tests --bin fuse-floor
start_bench_emulator
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
put_object bench big "$WORK/src"
"${ENDPOINT_ENV[@]}" "$BD" mount bench "$MNT" --endpoint "$ENDPOINT" --anonymous --cache-dir "$WORK/cache" \
  --log-file "$WORK/bd.log" "$@"
PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; warm_memory
perf record -q -e cpu-clock -g -p "$PID" -o "$WORK/perf.data" -- sleep 600 &
PERF=$!
sleep 0.5
c0=$(cpu_s "$PID"); s=$(now)
read_big() {  # FROM
  if [ "${READER:-dd}" = cp ]; then
    cp "$1/big" "$WORK/copy"
  else
    dd if="$1/big" of="$WORK/copy" bs=1M status=none
  fi
}
read_big "$MNT"
e=$(now); c1=$(cpu_s "$PID")
kill -INT "$PERF"; wait "$PERF" || true
[ -z "${PERF_DATA:-}" ] || cp "$WORK/perf.data" "$PERF_DATA"
[ "$(sha256sum "$WORK/copy" | cut -d' ' -f1)" = "$SHA" ] || { echo "the read has the wrong bytes" >&2; exit 1; }
echo "read $SIZE_MIB MiB with ${READER:-dd} over $(case "${TLS:-0}" in 1) echo HTTPS;; *) echo HTTP;; esac): $(mbps $((SIZE_MIB * 1048576)) "$s" "$e") MB/s," \
  "daemon CPU $(awk -v a="$c0" -v b="$c1" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }') s per GiB"
# The same reader on a local file of the same bytes, from the same cold start (nothing in the
# page cache): what the read would take if the object were a file on this disk.
mkdir -p "$WORK/local"; ln -f "$WORK/src" "$WORK/local/big"
rm -f "$WORK/copy"; sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; warm_memory
ls=$(now); read_big "$WORK/local"; le=$(now)
echo "the same read of a local file: $(mbps $((SIZE_MIB * 1048576)) "$ls" "$le") MB/s;" \
  "bucketdrive ÷ local: $(awk -v a="$s" -v b="$e" -v c="$ls" -v d="$le" 'BEGIN { printf "%.2f", (d - c) / (b - a) }')"
# The floor, read the same way: alone, and while the emulator streams the same object to curl
# (over the mount's scheme) on a loop, as it streams it to the daemon during the read above. On
# these two cores the kernel's copy of each reply costs several times more while the emulator,
# the loopback socket and their copies run beside it; the second figure is the floor under the
# load our read itself brings. FLOOR_RUNS (3) of each, alternated; medians.
mkdir -p "$WORK/floor"
FLOOR_SHA=$(target/release/fuse-floor --emit "$SIZE_MIB" | sha256sum | cut -d' ' -f1)
floor_read() {  # prints "MB/s CPU-s-per-GiB"
  target/release/fuse-floor "$WORK/floor" "$SIZE_MIB" &
  local floor=$!
  for _ in $(seq 100); do mountpoint -q "$WORK/floor" && break; sleep 0.1; done
  # bucketdrive's default kernel read-ahead (--kernel-read-ahead 4MiB).
  echo 4096 > "/sys/class/bdi/$(mountpoint -d "$WORK/floor")/read_ahead_kb"
  echo 3 > /proc/sys/vm/drop_caches; rm -f "$WORK/copy"; sleep 1; warm_memory
  local f0 f1 fs fe
  f0=$(cpu_s "$floor"); fs=$(now)
  read_big "$WORK/floor"
  fe=$(now); f1=$(cpu_s "$floor")
  umount "$WORK/floor"; wait "$floor" || true
  [ "$(sha256sum < "$WORK/copy" | cut -d' ' -f1)" = "$FLOOR_SHA" ] ||
    { echo "the floor's read has the wrong bytes" >&2; exit 1; }
  echo "$(mbps $((SIZE_MIB * 1048576)) "$fs" "$fe") $(awk -v a="$f0" -v b="$f1" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }')"
}
LOAD_CURL=(curl -sf -o /dev/null)
[ "${TLS:-0}" = 1 ] && LOAD_CURL+=(--cacert "$WORK/ca.pem")
for _ in $(seq "${FLOOR_RUNS:-3}"); do
  read -r m c < <(floor_read); add floor_mbps "$m"; add floor_cpu "$c"
  ( while "${LOAD_CURL[@]}" "$ENDPOINT/storage/v1/b/bench/o/big?alt=media"; do :; done ) &
  LOAD=$!
  sleep 1
  read -r m c < <(floor_read); add load_mbps "$m"; add load_cpu "$c"
  kill "$LOAD" 2>/dev/null; pkill -P "$LOAD" 2>/dev/null || true
  wait "$LOAD" 2>/dev/null || true
done
echo "the floor (a FUSE server answering from memory), the same read: $(med floor_mbps) MB/s," \
  "server CPU $(med floor_cpu) s per GiB (runs:${R[floor_cpu]})"
echo "the floor while the emulator streams the object to curl: $(med load_mbps) MB/s," \
  "server CPU $(med load_cpu) s per GiB (runs:${R[load_cpu]})"
if [ "${RCLONE:-0}" = 1 ]; then
  # rclone mount (Debian's, default options) on the same endpoint, trusting the same CA.
  command -v rclone >/dev/null || _apt_install rclone
  "$BD" unmount "$MNT" >/dev/null
  "${ENDPOINT_ENV[@]}" rclone mount :gcs:bench "$MNT" --gcs-endpoint "$ENDPOINT/storage/v1/" \
    --gcs-anonymous --daemon 2>"$WORK/rclone.log"
  for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
  RPID=$(pgrep -f "rclone mount :gcs:bench $MNT" | head -n 1)
  echo 3 > /proc/sys/vm/drop_caches; rm -f "$WORK/copy"; sleep 1; warm_memory
  r0=$(cpu_s "$RPID"); rs=$(now)
  read_big "$MNT"
  re=$(now); r1=$(cpu_s "$RPID")
  fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT"
  [ "$(sha256sum "$WORK/copy" | cut -d' ' -f1)" = "$SHA" ] || { echo "rclone's read has the wrong bytes" >&2; exit 1; }
  echo "rclone mount, the same read: $(mbps $((SIZE_MIB * 1048576)) "$rs" "$re") MB/s," \
    "rclone CPU $(awk -v a="$r0" -v b="$r1" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }') s per GiB"
  "${ENDPOINT_ENV[@]}" "$BD" mount bench "$MNT" --endpoint "$ENDPOINT" --anonymous \
    --cache-dir "$WORK/cache" --log-file "$WORK/bd.log" "$@"
fi
perf report -i "$WORK/perf.data" --stdio --no-children --sort sym -g none 2>/dev/null |
  grep -E '^ +[0-9.]+%' > "$WORK/syms" || true
echo
echo "| where | share of the daemon's samples |"
echo "|---|---:|"
# Each symbol falls in the first group whose pattern it matches.
awk '
  { pct = $1; sub(/%/, "", pct); sym = $0; sub(/^ +[0-9.]+% +/, "", sym)
    g = "other"
    if (sym ~ /crc32c|crc_u64/) g = "CRC32C"
    else if (sym ~ /memmove|memcpy|copy_user|copy_to_iter|copy_from_iter|copy_page|fuse_copy|copy_folio|rep_movs/) g = "copies between buffers"
    else if (sym ~ /fuse_/) g = "the kernel FUSE side"
    else if (sym ~ /tcp_|ip_|skb|sock|netif|inet|__dev_queue|loopback|napi|net_rx|dst_|nf_/) g = "the kernel network stack"
    else if (sym ~ /aes|gcm|ghash|chacha|poly1305|ring_core/) g = "TLS: the cipher"
    else if (sym ~ /hyper|http|reqwest|h2::|rustls|ring::|aws_lc|tls/) g = "HTTP and TLS"
    else if (sym ~ /schedule|task_switch|wake_up|futex|epoll|eventfd|_raw_spin_unlock_irq|ttwu|enqueue|dequeue|pick_next|idle/) g = "scheduler and wake-ups"
    else if (sym ~ /tokio|mio::/) g = "the tokio runtime"
    else if (sym ~ /parking_lot|[Mm]utex|rwlock|RawRwLock/) g = "locks"
    else if (sym ~ /malloc|free|alloc|realloc|page_fault|clear_page|mmap|munmap|folio|lru|memcg|zap_/) g = "memory: allocation and page faults"
    else if (sym ~ /syscall|entry_SYSCALL|do_syscall|fdget|__x64_sys|read$|write$|writev|readv/) g = "system call entry"
    s[g] += pct }
  END { for (g in s) printf "| %s | %.1f%% |\n", g, s[g] }' "$WORK/syms" | sort -t'|' -k3 -rn
echo
echo "top symbols:"
head -25 "$WORK/syms"
"$BD" unmount "$MNT" >/dev/null
