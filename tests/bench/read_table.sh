#!/usr/bin/env bash
# Every row of the network-read table in one run, each beside its ceiling: the ramp on a
# shaped link (raw ranged GETs ×32, a fixed 32 streams, defaults, and 8 readers at once), then
# the daemon's CPU per GiB on loopback over plain HTTP and over HTTPS (each beside the FUSE
# floor, alone and under the emulator's load, and beside rclone), then `cp` of the object
# beside a local `cp`. It runs the scripts that measure each, one after the other, prints
# what each printed, and ends with the summary table.
#
#   bash tests/bench/read_table.sh              # RUNS=5 (ramp), PROFILE_RUNS=3 (loopback)
#   BASE=<rev> bash tests/bench/read_table.sh   # the ramp also runs the build at BASE
#
# Needs root, /dev/fuse, perf (linux-perf) and about 12 GiB free under TMPDIR. Nothing else
# should run meanwhile: these two cores are the ceiling.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/common.sh
OUT=$(mktemp -d "${TMPDIR:-/tmp}/bd-read-table.XXXX")
trap 'rm -rf "$OUT"' EXIT
PROFILE_RUNS=${PROFILE_RUNS:-3}

echo "== the ramp (tests/bench/ramp_bench.sh)"
RUNS=${RUNS:-5} READERS=8 bash tests/bench/ramp_bench.sh | tee "$OUT/ramp"
for i in $(seq "$PROFILE_RUNS"); do
  echo "== loopback, plain HTTP, run $i (tests/bench/read_profile.sh)"
  RCLONE=1 FLOOR_RUNS=1 bash tests/bench/read_profile.sh | tee "$OUT/http.$i"
  echo "== loopback, HTTPS, run $i"
  TLS=1 RCLONE=1 FLOOR_RUNS=1 bash tests/bench/read_profile.sh | tee "$OUT/https.$i"
  echo "== loopback, cp to the local disk, run $i"
  READER=cp FLOOR_RUNS=1 bash tests/bench/read_profile.sh | tee "$OUT/cp.$i"
done

# The figure after LABEL on the line matching PATTERN, from each run's file of KIND.
pick() {  # KIND PATTERN LABEL-REGEX
  for f in "$OUT/$1".*; do
    grep -E "$2" "$f" | head -n 1 | sed -E "s/.*$3 ([0-9.]+).*/\1/"
  done | median
}
cell() {  # ramp row name -> its median MB/s
  grep -F "| $1 |" "$OUT/ramp" | head -n 1 | awk -F'|' '{ gsub(/ /, "", $3); print $3 }'
}
raw=$(cell "raw: curl, 8 MiB ranged GETs ×32")
fixed=$(cell "bucketdrive --read-concurrency 32")
fixed_cmp=$(cell "bucketdrive --read-concurrency 32, the reader comparing the bytes (cmp)")
defaults=$(cell "bucketdrive, defaults")
eight=$(grep -F "| bucketdrive |" "$OUT/ramp" | tail -n 1)
rss=$(echo "$eight" | awk -F'|' '{ gsub(/ /, "", $3); print $3 }')
agg=$(echo "$eight" | awk -F'|' '{ gsub(/ /, "", $5); print $5 }')
for k in http https; do
  eval "${k}_cpu=\$(pick $k '^read 1024' 'daemon CPU')"
  eval "${k}_mbps=\$(pick $k '^read 1024' ':')"
  eval "${k}_floor=\$(pick $k '^the floor \\(' 'server CPU')"
  eval "${k}_load=\$(pick $k '^the floor while' 'server CPU')"
  eval "${k}_rclone_cpu=\$(pick $k '^rclone mount' 'rclone CPU')"
  eval "${k}_rclone_mbps=\$(pick $k '^rclone mount' 'read:')"
done
cp_mbps=$(pick cp '^read 1024' ':')
cp_local=$(pick cp '^the same read of a local file' 'file:')
cp_floor=$(pick cp '^the floor \(' 'read:')
cp_floor_load=$(pick cp '^the floor while' 'curl:')

echo
echo "## Network reads, one run ($(date -u +%Y-%m-%d), $(git rev-parse --short HEAD))"
echo
echo "Ramp: medians of ${RUNS:-5} alternated runs; loopback rows: medians of $PROFILE_RUNS."
echo
echo "| row | ceiling or baseline | bucketdrive | ÷ | target |"
echo "|---|---:|---:|---:|---|"
echo "| 1 GiB, shaped link, fixed 32 (MB/s) | curl ×32: $raw | $fixed | $(ratio "$fixed" "$raw") | ≥ 0.95 |"
echo "| the same, the reader comparing the bytes with the source as it reads (\`dd\` into \`cmp\`) | curl ×32: $raw | $fixed_cmp | $(ratio "$fixed_cmp" "$raw") | |"
echo "| 1 GiB, shaped link, defaults (MB/s) | fixed 32: $fixed | $defaults | $(ratio "$defaults" "$fixed") | ≥ 0.97 |"
echo "| daemon CPU s per GiB, loopback, HTTP | floor $http_floor (under load $http_load); rclone $http_rclone_cpu | $http_cpu | $(ratio "$http_cpu" "$http_floor") × floor | ≤ 0.5, or ≤ 1.5 × floor |"
echo "| MB/s, loopback, HTTP | rclone $http_rclone_mbps | $http_mbps | $(ratio "$http_mbps" "$http_rclone_mbps") | |"
echo "| daemon CPU s per GiB, loopback, HTTPS | floor $https_floor (under load $https_load); rclone $https_rclone_cpu | $https_cpu | $(ratio "$https_cpu" "$https_floor") × floor | ≤ 1.0 |"
echo "| MB/s, loopback, HTTPS | rclone $https_rclone_mbps | $https_mbps | $(ratio "$https_mbps" "$https_rclone_mbps") | |"
echo "| \`cp\` of the object to the local disk (MB/s) | local \`cp\`: $cp_local | $cp_mbps | $(ratio "$cp_mbps" "$cp_local") | ≥ 0.85 |"
echo "| \`cp\` of the floor's file (a FUSE server answering from memory): alone / while the emulator streams (MB/s) | local \`cp\`: $cp_local | $cp_floor / $cp_floor_load | $(ratio "$cp_floor" "$cp_local") / $(ratio "$cp_floor_load" "$cp_local") | |"
echo "| 8 readers, 1 GiB budget: peak RSS MiB / aggregate MB/s | | $rss / $agg | | no regression |"
