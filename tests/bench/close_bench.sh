#!/usr/bin/env bash
# What a writer waits for at close(): the --commit-interval contract beside the cache disk.
# Prints one table from one run (medians of RUNS).
#
#   bash tests/bench/close_bench.sh      # RUNS=3 SIZE_MIB=1024 SMALL_MIB=256
#
# Release build, root mount with default options, the emulator (filesystem backend) on
# loopback. Each figure is the time until dd returns (its close included), beside the same dd
# onto the cache disk with the same durability at close, each dd from a dropped page cache:
#   - SIZE_MIB with dd bs=1M: bucketdrive (close returns with the bytes and the journal line
#     written, a commit within 1 s) against local dd (page cache only);
#   - the same with --sync-on-close (close returns with both fdatasync'd) against local dd
#     conv=fsync;
#   - SMALL_MIB with dd bs=4k: bucketdrive against local dd bs=4k;
#   - half of SMALL_MIB rewritten with dd bs=4k conv=notrunc over the object after a remount
#     (its bytes not local, so never passed through): what passthrough costs the writes it
#     does not take, which then go without the kernel's write-back cache.
# Each with default options (on a root mount: the kernel writing new and rewritten files straight
# into their staged copies, FUSE passthrough) and with --passthrough off (every write through the
# daemon, batched by the kernel's write-back cache). Also the daemon's CPU seconds per GiB written (bs=1M). Every object is
# checked in the bucket (sha256) once uploaded. The CPU is sampled as dd returns (until close)
# and again once the file is in the bucket (its CRC32C pass and upload included). Needs root, /dev/fuse, and about
# 3 × SIZE_MIB of free disk under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
SMALL_MIB=${SMALL_MIB:-256}

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux
BD=target/release/bucketdrive
bench_work bd-close-bench
mkdir -p "$WORK/local"

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
head -c $((SMALL_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src-small"
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
SMALL_SHA=$(sha256sum "$WORK/src-small" | cut -d' ' -f1)
# The edit: the first half of the small file rewritten, 4 KiB at a time.
head -c $((SMALL_MIB * 512 * 1024)) /dev/urandom > "$WORK/src-edit"
EDIT_SHA=$( { cat "$WORK/src-edit"; tail -c +$((SMALL_MIB * 512 * 1024 + 1)) "$WORK/src-small"; } | sha256sum | cut -d' ' -f1)

object_sha() { curl -sf "$EMU_URL/storage/v1/b/bench/o/$1?alt=media" | sha256sum | cut -d' ' -f1; }
delete_object() { curl -sf -X DELETE "$EMU_URL/storage/v1/b/bench/o/$1" >/dev/null || true; }
check() {  # KEY SHA
  [ "$(object_sha "$1")" = "$2" ] || { echo "object $1 has the wrong bytes in the bucket" >&2; exit 1; }
}
bd_mount() {
  rm -rf "$WORK/cache"
  "$BD" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
    --log-file "$WORK/bd.log" "$@"
  PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
  grep -o "FUSE passthrough: [a-z]* ([^)]*)" "$WORK/bd.log" | tail -n 1 >&2 || true
}
bd_unmount() {
  "$BD" unmount "$MNT" >/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" || return 0; sleep 0.1; done
}

# Times one dd onto the cache disk and then the same onto the mount, one right after the other
# (this disk's speed drifts from minute to minute, so each figure is compared with its own
# baseline): records both and their ratio.
pair() {  # KEY LOCAL-TARGET MOUNT-TARGET SRC BS [dd flags...]; LOCAL_FLAGS: the local dd's own
  local key=$1 lt=$2 mt=$3 src=$4 bs=$5 l b
  shift 5
  # shellcheck disable=SC2086
  l=$(timed_dd "$src" "$lt" "$bs" "$@" ${LOCAL_FLAGS:-})
  b=$(timed_dd "$src" "$mt" "$bs" "$@")
  # The daemon's CPU as dd returns: what it spent until close. The CRC32C pass of a file the
  # kernel wrote starts at the last release, just after, and is counted in the "until in the
  # bucket" figure.
  AT_CLOSE=$(cpu_s "$PID")
  add "${key}_local" "$l"; add "$key" "$b"; add "${key}_r" "$(ratio "$b" "$l")"
}

# CPU seconds between two samples, per GiB of SIZE_MIB.
per_gib() { awk -v a="$1" -v b="$2" -v m="$SIZE_MIB" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }'; }

# One mount's rows: dd bs=1M (with its daemon CPU), dd bs=4k, and dd bs=4k over an object
# whose bytes are not local (a fresh cache, conv=notrunc: the edit of an existing file).
bd_rows() {  # PREFIX [mount options...]
  local p=$1 c0 c1
  shift
  bd_mount "$@"
  # Three pairs in one mount: the disk's drift shows in the spread. Each dd starts with
  # nothing in flight (the last one's upload would compete with it).
  for i in 1 2 3; do
    c0=$(cpu_s "$PID")
    pair "${p}" "$WORK/local/f" "$MNT/big$i" "$WORK/src" 1M; rm -f "$WORK/local/f"
    c1=$AT_CLOSE
    "$BD" status --wait "$MNT" >/dev/null
    c2=$(cpu_s "$PID")
    add "${p}_cpu" "$(per_gib "$c0" "$c1")"
    add "${p}_cpu_all" "$(per_gib "$c0" "$c2")"
    check "big$i" "$SHA"
  done
  pair "${p}_4k" "$WORK/local/f" "$MNT/small" "$WORK/src-small" 4k; rm -f "$WORK/local/f"
  "$BD" status --wait "$MNT" >/dev/null
  check small "$SMALL_SHA"
  bd_unmount
  bd_mount "$@"
  cp "$WORK/src-small" "$WORK/local/f"
  pair "${p}_edit" "$WORK/local/f" "$MNT/small" "$WORK/src-edit" 4k conv=notrunc
  rm -f "$WORK/local/f"
  "$BD" status --wait "$MNT" >/dev/null
  check small "$EDIT_SHA"
  bd_unmount
  delete_object big1; delete_object big2; delete_object big3; delete_object small
}

for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS: bucketdrive" >&2
  bd_rows bd
  echo "run $r/$RUNS: bucketdrive --passthrough off" >&2
  bd_rows pt --passthrough off
  for opt in "" "--passthrough off"; do
    echo "run $r/$RUNS: bucketdrive --sync-on-close $opt" >&2
    # shellcheck disable=SC2086
    bd_mount --sync-on-close $opt
    # The same durability at close: the local dd syncs its file before it closes it.
    for i in 1 2 3; do
      LOCAL_FLAGS=conv=fsync pair "sync${opt:+_pt}" "$WORK/local/f" "$MNT/big$i" "$WORK/src" 1M
      rm -f "$WORK/local/f"
      "$BD" status --wait "$MNT" >/dev/null
      check "big$i" "$SHA"
    done
    bd_unmount
    delete_object big1; delete_object big2; delete_object big3
  done
done

row() {  # NAME BASELINE-LABEL DEFAULT-KEY PASSTHROUGH-KEY
  echo "| $1 | $(med "${3}_local") ($2) | $(med "$3") | $(med "${3}_r") | $(med "${4}_local") | $(med "$4") | $(med "${4}_r") |"
}
echo
echo "Until close() returns, root mount, emulator on loopback; seconds, medians of $RUNS runs (3 pairs"
echo "each for bs=1M); each"
echo "bucketdrive dd right after the same dd onto the cache disk, and ÷ the median of those pairs' ratios"
echo
echo "| workload | baseline | default | ÷ baseline | baseline | --passthrough off | ÷ baseline |"
echo "|---|---:|---:|---:|---:|---:|---:|"
row "$SIZE_MIB MiB dd bs=1M" "local dd" bd pt
row "$SIZE_MIB MiB dd bs=1M; mounts with --sync-on-close" "local dd conv=fsync" sync sync_pt
row "$SMALL_MIB MiB dd bs=4k" "local dd bs=4k" bd_4k pt_4k
row "$((SMALL_MIB / 2)) MiB dd bs=4k conv=notrunc over the object, bytes not local" "local dd, same" bd_edit pt_edit
echo
echo "daemon CPU s per GiB written (dd bs=1M): until close, default $(med bd_cpu), --passthrough off $(med pt_cpu);"
echo "  until it is in the bucket (the commit, a passthrough file's CRC32C pass, the upload), default $(med bd_cpu_all), --passthrough off $(med pt_cpu_all)"
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
