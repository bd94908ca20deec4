#!/usr/bin/env bash
# What this build does on a mount by an ordinary user (no passthrough there: it needs
# CAP_SYS_ADMIN) beside the build at BASE (a git revision), alternated, in the same run. Prints
# one table (medians of RUNS).
#
#   BASE=<rev> bash tests/bench/nonroot_bench.sh    # RUNS=3 SIZE_MIB=1024 SMALL_MIB=256 FILES=2000
#
# Both release builds mount the emulator's bucket (filesystem backend, loopback) as the user
# BENCH_USER (made if missing) through fusermount3, with default options, and that user runs:
#   - dd bs=1M of SIZE_MIB, until dd returns (its close included);
#   - dd bs=4k of SMALL_MIB, until dd returns;
#   - cp -r of FILES files of 10 KiB, until cp returns;
# each from a dropped page cache, every object then checked in the bucket. Needs root (to
# drop caches and run as the user), /dev/fuse, fusermount3, and the revision's build tools.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${BASE:?BASE=<git revision> to compare with}
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
SMALL_MIB=${SMALL_MIB:-256}
FILES=${FILES:-2000}
BENCH_USER=${BENCH_USER:-bdbench}

source tests/emulator.sh
source tests/bench/common.sh
cargo build --release --quiet -p fs-linux
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bd-nonroot-bench.XXXX")
cleanup() {
  for m in "$WORK"/mnt-*; do
    mountpoint -q "$m" 2>/dev/null && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m"; }
  done
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
# fusermount3 opens /dev/fuse as the user: Debian's udev rules give it mode 0666, a bare
# container may not (as the end-to-end tests do).
chmod 0666 /dev/fuse
id "$BENCH_USER" >/dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin "$BENCH_USER"

build_base "$WORK/base"
install -m 0755 "$WORK/base/bucketdrive" "$WORK/bd-base"
install -m 0755 target/release/bucketdrive "$WORK/bd-this"

start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
mkdir -p "$WORK/src-files" "$WORK/home"
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
head -c $((SMALL_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src-small"
for i in $(seq "$FILES"); do head -c 10240 /dev/urandom > "$WORK/src-files/f$i"; done
SHA=$(sha256sum "$WORK/src" | cut -d' ' -f1)
SMALL_SHA=$(sha256sum "$WORK/src-small" | cut -d' ' -f1)
chown -R "$BENCH_USER" "$WORK"
chmod 755 "$WORK"

as_user() { runuser -u "$BENCH_USER" -- env HOME="$WORK/home" "$@"; }
object_sha() { curl -sf "$EMU_URL/storage/v1/b/bench/o/$1?alt=media" | sha256sum | cut -d' ' -f1; }
check() {  # KEY SHA
  [ "$(object_sha "$1")" = "$2" ] || { echo "object $1 has the wrong bytes in the bucket" >&2; exit 1; }
}
user_dd() {  # SRC DST BS: seconds until the user's dd returns
  local s e
  sync; echo 1 > /proc/sys/vm/drop_caches; cat "$1" > /dev/null; sleep 1
  s=$(now); as_user dd if="$1" of="$2" bs="$3" status=none; e=$(now)
  awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }'
}

one_run() {  # BUILD (base|this)
  local b=$1 mnt=$WORK/mnt-$1 t s e
  mkdir -p "$mnt"; chown "$BENCH_USER" "$mnt"
  rm -rf "$WORK/cache-$b"
  as_user "$WORK/bd-$b" mount bench "$mnt" --endpoint "$EMU_URL" --anonymous \
    --cache-dir "$WORK/cache-$b" --log-file "$WORK/bd-$b.log"
  t=$(user_dd "$WORK/src" "$mnt/big" 1M); add "${b}_big" "$t"
  t=$(user_dd "$WORK/src-small" "$mnt/small" 4k); add "${b}_small" "$t"
  sync; echo 1 > /proc/sys/vm/drop_caches; sleep 1
  s=$(now); as_user cp -r "$WORK/src-files" "$mnt/files"; e=$(now)
  add "${b}_cp" "$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }')"
  as_user "$WORK/bd-$b" status --wait "$mnt" >/dev/null
  as_user fusermount3 -u "$mnt"
  check big "$SHA"; check small "$SMALL_SHA"
  [ "$(count_under files/)" = "$FILES" ] || { echo "files: not all in the bucket" >&2; exit 1; }
  delete_under ""
}

for r in $(seq "$RUNS"); do
  # Alternated, and which goes first alternates too.
  order="base this"; [ $((r % 2)) = 0 ] && order="this base"
  for b in $order; do
    echo "run $r/$RUNS: $b" >&2
    one_run "$b"
  done
done

row() {  # NAME KEY
  echo "| $1 | $(med "base_$2") | $(med "this_$2") | $(ratio "$(med "this_$2")" "$(med "base_$2")") |"
}
echo
echo "Mount by an ordinary user (fusermount3), defaults, emulator on loopback; until the command"
echo "returns; seconds, medians of $RUNS runs, alternated; base $(git rev-parse --short "$BASE")"
echo
echo "| workload | base | this build | this ÷ base |"
echo "|---|---:|---:|---:|"
row "$SIZE_MIB MiB dd bs=1M" big
row "$SMALL_MIB MiB dd bs=4k" small
row "cp -r of $FILES × 10 KiB" cp
echo
echo "runs:"
for k in $(printf '%s\n' "${!R[@]}" | sort); do echo "  $k:${R[$k]}"; done
