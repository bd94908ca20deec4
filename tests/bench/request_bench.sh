#!/usr/bin/env bash
# What a request through the daemon costs: workloads made of many FUSE requests, this build
# beside the build at BASE (a git revision), alternated, in the same run.
#
#   BASE=<rev> bash tests/bench/request_bench.sh    # RUNS=5 SIZE_MIB=1024 FILES=2000 EDIT_MIB=64
#
# MOUNT_OPTS adds mount options to rows 1 and 2 (for example "--passthrough writes
# --write-back-delay 0s": new files written by the kernel, uploads ending while cp writes).
#
# Root mount, release builds, the emulator (filesystem backend) on loopback, so the daemon's
# CPU and the kernel's hand-offs are the limit. Each run, on a fresh mount of each build:
#   1. SIZE_MIB written with dd bs=1M, until dd returns (close included), and the daemon's CPU
#      seconds per GiB until then (default options: the kernel's write-back cache batches the
#      writes into 1 MiB requests);
#   2. cp -r of FILES files of 10 KiB, until cp returns (a lookup, create, write, flush and
#      release per file), and the daemon's CPU meanwhile;
#   3. the SIZE_MIB object read back after a remount with dd bs=1M (MB/s, and CPU per GiB);
#   4. with --passthrough writes (no kernel write-back cache on such a mount): the first half of
#      a 2 × EDIT_MIB object whose bytes are not local written over with dd bs=4k conv=notrunc,
#      one request per write, until dd returns, and the daemon's CPU meanwhile (which includes
#      fetching the object's other half into the staging file, as any edit does).
# Every object written is checked in the bucket (sha256), and the read back is checked too.
# Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${BASE:?BASE=<git revision> to compare with}
RUNS=${RUNS:-5}
SIZE_MIB=${SIZE_MIB:-1024}
FILES=${FILES:-2000}
EDIT_MIB=${EDIT_MIB:-64}

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux
bench_work bd-request
mkdir -p "$WORK/this" "$WORK/tree"
build_base "$WORK/base"
install -m 0755 target/release/bucketdrive "$WORK/this/bucketdrive"

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
head -c $((EDIT_MIB * 1024 * 1024)) /dev/urandom > "$WORK/edit"
head -c $((2 * EDIT_MIB * 1024 * 1024)) /dev/urandom > "$WORK/edit-target"
EDIT_SHA=$( { cat "$WORK/edit"; tail -c +$((EDIT_MIB * 1024 * 1024 + 1)) "$WORK/edit-target"; } | sha256sum | cut -d' ' -f1)
for i in $(seq "$FILES"); do head -c 10240 /dev/urandom > "$WORK/tree/f$i"; done
F1_SHA=$(sha256sum < "$WORK/tree/f1" | cut -d' ' -f1)
FN_SHA=$(sha256sum < "$WORK/tree/f$FILES" | cut -d' ' -f1)

object_sha() { curl -sf "$EMU_URL/storage/v1/b/bench/o/$1?alt=media" | sha256sum | cut -d' ' -f1; }
check() {  # OBJECT SHA
  [ "$(object_sha "$1")" = "$2" ] || { echo "object $1 has the wrong bytes in the bucket" >&2; exit 1; }
}
per_gib() { awk -v a="$1" -v b="$2" -v m="$3" 'BEGIN { printf "%.2f", (b - a) * 1024 / m }'; }
secs() { awk -v s="$1" -v e="$2" 'BEGIN { printf "%.3f", e - s }'; }
mount_bd() {  # BUILD [mount options...]
  local bd=$WORK/$1/bucketdrive
  shift
  rm -rf "$WORK/cache"
  "$bd" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
    --log-file "$WORK/bd.log" "$@"
  PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
}
unmount_bd() {  # BUILD
  "$WORK/$1/bucketdrive" status --wait "$MNT" >/dev/null
  "$WORK/$1/bucketdrive" unmount "$MNT" >/dev/null
  for _ in $(seq 100); do mountpoint -q "$MNT" || return 0; sleep 0.1; done
}

one() {  # BUILD
  local b=$1 c0 c1 s e
  # shellcheck disable=SC2086
  mount_bd "$b" ${MOUNT_OPTS:-}
  c0=$(cpu_s "$PID")
  add "${b}_dd" "$(timed_dd "$WORK/src" "$MNT/big" 1M)"
  c1=$(cpu_s "$PID")
  add "${b}_dd_cpu" "$(per_gib "$c0" "$c1" "$SIZE_MIB")"
  sync; echo 1 > /proc/sys/vm/drop_caches; sleep 1
  c0=$(cpu_s "$PID"); s=$(now)
  cp -r "$WORK/tree" "$MNT/tree"
  e=$(now); c1=$(cpu_s "$PID")
  add "${b}_cp" "$(secs "$s" "$e")"
  add "${b}_cp_cpu" "$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')"
  unmount_bd "$b"
  check big "$SHA"
  check "tree%2Ff1" "$F1_SHA"
  check "tree%2Ff$FILES" "$FN_SHA"

  mount_bd "$b"
  sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
  c0=$(cpu_s "$PID"); s=$(now)
  got=$(dd if="$MNT/big" bs=1M status=none | tee >(sha256sum | cut -d' ' -f1 > "$WORK/read.sha") | wc -c)
  e=$(now); c1=$(cpu_s "$PID")
  [ "$got" = $((SIZE_MIB * 1024 * 1024)) ] && [ "$(cat "$WORK/read.sha")" = "$SHA" ] ||
    { echo "the read back has the wrong bytes" >&2; exit 1; }
  add "${b}_read" "$(mbps "$got" "$s" "$e")"
  add "${b}_read_cpu" "$(per_gib "$c0" "$c1" "$SIZE_MIB")"
  rm -rf "$MNT/tree"
  unmount_bd "$b"

  put_object bench edit "$WORK/edit-target"
  mount_bd "$b" --passthrough writes
  sync; echo 1 > /proc/sys/vm/drop_caches; cat "$WORK/edit" > /dev/null; sleep 1
  c0=$(cpu_s "$PID"); s=$(now)
  dd if="$WORK/edit" of="$MNT/edit" bs=4k conv=notrunc status=none
  e=$(now); c1=$(cpu_s "$PID")
  add "${b}_edit" "$(secs "$s" "$e")"
  add "${b}_edit_cpu" "$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')"
  unmount_bd "$b"
  check edit "$EDIT_SHA"
  curl -sf -X DELETE "$EMU_URL/storage/v1/b/bench/o/big" >/dev/null
}

for r in $(seq "$RUNS"); do
  echo "run $r/$RUNS" >&2
  # Alternated, the order swapped every run: the disk's drift falls on both.
  for b in $( ((r % 2)) && echo "base this" || echo "this base"); do one "$b"; done
done

row() {  # LABEL KEY
  echo "| $1 | $(med "base_$2") | $(med "this_$2") | $(ratio "$(med "this_$2")" "$(med "base_$2")") |"
}
echo
echo "Requests through the daemon, root mount, emulator on loopback; medians of $RUNS runs, base"
echo "$(git rev-parse --short "$BASE") alternated with this build${MOUNT_OPTS:+; rows 1 and 2 with $MOUNT_OPTS}"
echo
echo "| workload | base | this | this ÷ base |"
echo "|---|---:|---:|---:|"
row "$SIZE_MIB MiB dd bs=1M, until close (s)" dd
row "  daemon CPU s per GiB, until close" dd_cpu
row "cp -r of $FILES × 10 KiB, until it returns (s)" cp
row "  daemon CPU s meanwhile" cp_cpu
row "$SIZE_MIB MiB read back, dd bs=1M (MB/s)" read
row "  daemon CPU s per GiB read" read_cpu
row "$EDIT_MIB MiB dd bs=4k conv=notrunc over $((2 * EDIT_MIB)) MiB not local, --passthrough writes (s)" edit
row "  daemon CPU s meanwhile" edit_cpu
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
