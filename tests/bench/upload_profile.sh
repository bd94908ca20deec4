#!/usr/bin/env bash
# Where the daemon's CPU goes for a GiB written, from the write until it is in the bucket: perf
# (cpu-clock samples, this VM has no hardware counters) on the daemon while dd writes SIZE_MIB
# (in BS blocks, 1M unless set) onto a root mount and the file uploads. Prints the top symbols and the samples' total.
#
#   bash tests/bench/upload_profile.sh [mount options...]    # SIZE_MIB=1024; e.g. --passthrough writes
#   BASE=<rev> bash tests/bench/upload_profile.sh ...         # the same of the build at BASE
#   UNTIL=close bash tests/bench/upload_profile.sh ...        # only until dd returns (close)
#   PERF_DATA=<file> ...                                      # keeps perf.data there
#
# Release build (symbols are kept), the emulator (filesystem backend) on loopback. One file is
# written and uploaded first, so the mount is warm. Needs root, /dev/fuse and perf (linux-perf).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_MIB=${SIZE_MIB:-1024}
source tests/emulator.sh
source tests/bench/common.sh
bench_work bd-upload-profile
bench_binary
start_emulator -backend filesystem -filesystem-root "$WORK/gcs"
create_bucket bench
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom > "$WORK/src"
"$BD" mount bench "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$WORK/cache" \
  --log-file "$WORK/bd.log" "$@"
PID=$(pgrep -f "bucketdrive mount bench $MNT" | head -n 1)
timed_dd "$WORK/src" "$MNT/warm" 1M >/dev/null
"$BD" status --wait "$MNT" >/dev/null
sync; echo 1 > /proc/sys/vm/drop_caches; cat "$WORK/src" > /dev/null
perf record -q -e cpu-clock -g -p "$PID" -o "$WORK/perf.data" -- sleep 600 &
PERF=$!
sleep 0.5
dd if="$WORK/src" of="$MNT/big" bs="${BS:-1M}" status=none
[ "${UNTIL:-bucket}" = close ] || "$BD" status --wait "$MNT" >/dev/null
kill -INT "$PERF"; wait "$PERF" || true
[ -z "${PERF_DATA:-}" ] || cp "$WORK/perf.data" "$PERF_DATA"
"$BD" status --wait "$MNT" >/dev/null
[ "$(curl -sf "$EMU_URL/storage/v1/b/bench/o/big?alt=media" | sha256sum | cut -d' ' -f1)" = \
  "$(sha256sum "$WORK/src" | cut -d' ' -f1)" ] || { echo "object big has the wrong bytes" >&2; exit 1; }
perf report -i "$WORK/perf.data" --stdio --no-children --sort sym 2>/dev/null |
  grep -E '^# (Samples|Event count)|^ +[0-9.]+%' | head -25 || true
"$BD" unmount "$MNT" >/dev/null
