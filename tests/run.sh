#!/usr/bin/env bash
# Runs every test: unit and property tests (MemoryStore) and the end-to-end suites (real GCS
# client -> fake-gcs-server, through a real FUSE mount). Needs root and /dev/fuse for the mounts.
# Installs the emulator into ./.venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

source tests/emulator.sh
export FAKE_GCS_SERVER

# fs-windows is an empty library off Windows; tests/windows_check.sh type-checks it for Windows.
cargo build --workspace --quiet
cargo clippy --workspace --all-targets --quiet -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The seeded simulation and soak run on their own below, so that their seeds, counts and
# injected faults are printed even when they pass.
cargo test --workspace "$@" -- --skip sim_seeds --skip sim_shared_seeds \
  --skip soak_random_operations_with_faults_and_daemon_kills \
  --skip soak_two_mounts_and_a_direct_writer 2>&1 | tee "$log"
# Root mounts pass files being written through to the kernel by default; the write, shared
# and fault suites run once more with `--passthrough off`, so the daemon's write path (ordinary
# users' mounts, --cache-size, edits of files not local) keeps its end-to-end coverage.
E2E_PASSTHROUGH=off cargo test -p bucketdrive-tests "$@" --test write --test shared --test faults \
  -- --skip soak_ 2>&1 | tee -a "$log"
cargo test -p fs-core --test sim sim_seeds -- --nocapture 2>&1 | tee -a "$log"
cargo test -p fs-core --test sim sim_shared_seeds -- --nocapture 2>&1 | tee -a "$log"
cargo test -p bucketdrive-tests --test faults soak_random_operations_with_faults_and_daemon_kills \
  -- --nocapture --test-threads 1 2>&1 | grep -v '^link-proxy: ' | tee -a "$log"
cargo test -p bucketdrive-tests --test faults soak_two_mounts_and_a_direct_writer \
  -- --nocapture --test-threads 1 2>&1 | grep -v '^link-proxy: ' | tee -a "$log"
# One closing line for the whole workspace (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6 } END { printf "\n%d passed, %d failed\n", p, f }' "$log"
