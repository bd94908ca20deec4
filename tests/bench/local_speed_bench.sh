#!/usr/bin/env bash
# Local-disk speed through the mount, every row of it in one run: the scripts below one after
# the other, each printing its table beside its baselines.
#
#   BASE=<rev> bash tests/bench/local_speed_bench.sh
#
#   - close_bench.sh: 1 GiB dd bs=1M until close (and with --sync-on-close), 256 MiB dd bs=4k,
#     an edit of a file whose bytes are not local; the default mount and --passthrough writes,
#     each beside the same dd on the cache disk; daemon CPU per GiB written;
#   - passthrough_bench.sh: re-reads of a 1 GiB object wholly in the read cache (cold and warm
#     page cache, dd bs=1M and bs=4k, fio 4 KiB random reads with 4 jobs), beside the cache
#     file itself; daemon CPU per GiB read;
#   - write_bench.sh: cp -r of 2,000 and 10,000 files of 10 KiB through the shaped link,
#     beside rclone mount --vfs-cache-mode writes;
#   - nonroot_bench.sh: the same kinds of rows on a mount by an ordinary user, this build
#     beside BASE.
# Needs what each of them needs (root, /dev/fuse, fio, rclone, fusermount3).
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${BASE:?BASE=<git revision> for the non-root rows}
echo "== close_bench.sh (RUNS=1)"
RUNS=1 bash tests/bench/close_bench.sh
echo "== passthrough_bench.sh (RUNS=3)"
RUNS=3 bash tests/bench/passthrough_bench.sh
echo "== write_bench.sh (cp -r rows, RUNS=1)"
RUNS=1 BIG=0 FIO=0 FILES="2000 10000" bash tests/bench/write_bench.sh
echo "== nonroot_bench.sh (RUNS=3, base $BASE)"
RUNS=3 BASE=$BASE bash tests/bench/nonroot_bench.sh
