#!/usr/bin/env bash
# FUSE passthrough (--passthrough): reads of a file wholly in the disk read cache, served by
# the kernel from the cache file, beside the same reads through the daemon and beside the cache
# file read directly. Prints one table from one run (medians of RUNS).
#
#   bash tests/bench/passthrough_bench.sh      # RUNS=3 SIZE_MIB=1024 WRITE_MIB=256
#
# Release build, root mount, the emulator (filesystem backend) on loopback. One SIZE_MIB object
# is read once through a --read-only mount with a --read-cache-dir (filling it), then each
# mount below is a fresh one on that cache:
#   - passthrough (the default of a --read-only root mount with a read cache): the first open
#     starts the mount's check of the file (timed: once per mount, in the background), the
#     reads are timed once it passed;
#   - --passthrough off: the same reads through the daemon, from the cache's checked blocks;
#   - the cache's data file itself, read directly: the baseline.
# Rows: dd bs=1M with the host's page cache dropped first (cold) and without (warm); dd bs=4k,
# cold; fio 4 KiB random reads, 4 jobs, 10 s, from a cold page cache; the daemon's
# CPU seconds per GiB during the cold dd bs=1M. Then what passthrough costs a writable mount
# (--passthrough on: no kernel write-back cache for the whole mount) beside --passthrough off:
# WRITE_MIB with dd bs=4k until close, and a 4 KiB edit in the middle of an existing SIZE_MIB
# object, until close. Every passthrough read's bytes are checked against the object's sha256.
# Needs root, /dev/fuse, Linux 6.9+, fio, and about 3 × SIZE_MIB of free disk under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
WRITE_MIB=${WRITE_MIB:-256}
SIZE=$((SIZE_MIB * 1024 * 1024))

source tests/emulator.sh
source tests/bench/common.sh
command -v fio >/dev/null || { echo "needs fio" >&2; exit 1; }
cargo build --release --quiet -p fs-linux
BD=target/release/bucketdrive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-pthru-bench.XXXX")
MNT=$WORK/mnt
mkdir -p "$MNT" "$WORK/gcs"
cleanup() {
  mountpoint -q "$MNT" && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
bd_mount() {  # extra flags...
  # A port of its own: the last mount's daemon may still be finishing.
  PORT=$(free_port)
  "$BD" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/wcache" \
    --read-cache-dir "$WORK/rc" --log-file "$WORK/bd.log" --metrics-addr "127.0.0.1:$PORT" "$@"
  PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
}
bd_unmount() {
  "$BD" unmount "$MNT" >/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" || return 0; sleep 0.1; done
}
dd_mbps() {  # file bs
  local s e
  s=$(now); dd if="$1" of=/dev/null bs="$2" status=none; e=$(now)
  mbps "$SIZE" "$s" "$e"
}
fio_iops() {  # file
  fio --name=r --filename="$1" --rw=randread --bs=4k --numjobs=4 --size="${SIZE_MIB}M" \
    --runtime=10 --time_based --ioengine=psync --group_reporting --output-format=terse \
    --invalidate=1 2>/dev/null | awk -F';' '{ print $8 }'
}


# Fill the read cache: read until a whole read downloads nothing (a first read on loopback
# outruns the cache's writer, which then skips what it cannot take).
for pass in 1 2 3 4 5; do
  bd_mount --read-only --passthrough off
  dd if="$MNT/obj" of=/dev/null bs=1M status=none
  fetched=$(metric bucketdrive_fetched_bytes_total)
  bd_unmount
  [ "$fetched" = 0 ] && [ "$pass" -gt 1 ] && break
done
sync
DATA=$(ls "$WORK"/rc/bucketdrive-read-cache/objects/*.data)
[ "$(stat -c %s "$DATA")" = "$SIZE" ] || { echo "the cache does not hold the object whole" >&2; exit 1; }

reads() {  # label: through or daemon; the mount is up
  local c0 c1
  cold
  c0=$(cpu_s "$PID")
  add "${1}_1m_cold" "$(dd_mbps "$MNT/obj" 1M)"
  c1=$(cpu_s "$PID")
  add "${1}_cpu" "$(awk -v a="$c0" -v b="$c1" -v s="$SIZE" 'BEGIN { printf "%.3f", (b - a) / (s / 1073741824) }')"
  add "${1}_1m_warm" "$(dd_mbps "$MNT/obj" 1M)"
  cold
  add "${1}_4k_cold" "$(dd_mbps "$MNT/obj" 4k)"
  # Cold too: fio drops the pages of the file it opens, which for a passthrough file are
  # not the backing file's.
  cold
  add "${1}_fio" "$(fio_iops "$MNT/obj")"
}

for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS" >&2
  # Passthrough: the first open starts the check; wait for it, then time the reads.
  bd_mount --read-only
  s=$(now)
  head -c 1 "$MNT/obj" >/dev/null
  until [ "$(metric bucketdrive_passthrough_opens_total)" != 0 ]; do
    sleep 0.05
    head -c 1 "$MNT/obj" >/dev/null
  done
  add check "$(awk -v s="$s" -v e="$(now)" 'BEGIN { printf "%.2f", e - s }')"
  opens=$(metric bucketdrive_passthrough_opens_total)
  served=$(metric bucketdrive_read_bytes_total)
  reads through
  [ "$(sha256sum "$MNT/obj" | cut -d' ' -f1)" = "$SHA" ] || { echo "passthrough read wrong bytes" >&2; exit 1; }
  [ "$(metric bucketdrive_read_bytes_total)" = "$served" ] || echo "warning: the daemon served passthrough reads" >&2
  [ "$(metric bucketdrive_passthrough_opens_total)" -gt "$opens" ] || echo "warning: no passthrough" >&2
  bd_unmount
  bd_mount --read-only --passthrough off
  reads daemon
  bd_unmount
  # The cache file itself.
  cold
  add local_1m_cold "$(dd_mbps "$DATA" 1M)"
  add local_1m_warm "$(dd_mbps "$DATA" 1M)"
  cold
  add local_4k_cold "$(dd_mbps "$DATA" 4k)"
  cold
  add local_fio "$(fio_iops "$DATA")"
  # A writable mount: what losing the write-back cache costs writes through the daemon.
  for mode in on off; do
    rm -rf "$WORK/wcache"
    bd_mount --passthrough "$mode"
    s=$(now)
    dd if=/dev/zero of="$MNT/w.bin" bs=4k count=$((WRITE_MIB * 256)) status=none
    e=$(now)
    add "write4k_$mode" "$(mbps $((WRITE_MIB * 1048576)) "$s" "$e")"
    s=$(now)
    printf 'edited' | dd of="$MNT/obj" bs=4k seek=$((SIZE / 8192)) conv=notrunc status=none
    e=$(now)
    add "edit_$mode" "$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }')"
    rm -f "$MNT/w.bin"
    "$BD" unmount "$MNT" --no-wait >/dev/null || bd_unmount
    for _ in $(seq 100); do mountpoint -q "$MNT" || break; sleep 0.1; done
    # The daemon leaves its cache directory a moment after the unmount: wait for it before
    # the directory is removed under it.
    wait_gone "$PID"
  done
  # The edits were left staged (--no-wait), never uploaded: the object stays as it was.
  rm -rf "$WORK/wcache"
done

row() {  # label key_through key_daemon key_local unit
  local t d l
  t=$(med "$2"); d=$(med "$3"); l=$(med "$4")
  echo "| $1 | $t | $d | $l | $(ratio "$t" "$l") | $(ratio "$d" "$l") |"
}
echo
echo "Re-read of a $SIZE_MIB MiB object wholly in the read cache, fresh --read-only root mount; median of $RUNS runs"
echo
echo "| read | passthrough | through the daemon (--passthrough off) | the cache file itself | passthrough ÷ file | daemon ÷ file |"
echo "|---|---:|---:|---:|---:|---:|"
row "dd bs=1M, cold page cache (MB/s)" through_1m_cold daemon_1m_cold local_1m_cold
row "dd bs=1M, warm page cache (MB/s)" through_1m_warm daemon_1m_warm local_1m_warm
row "dd bs=4k, cold page cache (MB/s)" through_4k_cold daemon_4k_cold local_4k_cold
row "fio 4 KiB random reads, 4 jobs (IOPS)" through_fio daemon_fio local_fio
echo
echo "daemon CPU seconds per GiB, cold dd bs=1M: passthrough $(med through_cpu), through the daemon $(med daemon_cpu)"
echo "the mount's check of the file before its first passthrough open (once per mount): $(med check) s (runs:${R[check]})"
echo
echo "| writable mount, until close | --passthrough on (no write-back cache) | --passthrough off | on ÷ off |"
echo "|---|---:|---:|---:|"
echo "| dd bs=4k of $WRITE_MIB MiB (MB/s) | $(med write4k_on) | $(med write4k_off) | $(ratio "$(med write4k_on)" "$(med write4k_off)") |"
echo "| 4 KiB edit in the middle of the $SIZE_MIB MiB object (s) | $(med edit_on) | $(med edit_off) | $(ratio "$(med edit_on)" "$(med edit_off)") |"
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
