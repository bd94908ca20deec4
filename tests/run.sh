#!/usr/bin/env bash
# Runs every test: unit and property tests (MemoryStore) and the end-to-end suites (real GCS
# client -> fake-gcs-server, through a real FUSE mount). Needs root and /dev/fuse for the mounts.
# Installs the emulator into ./.venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

source tests/emulator.sh
export FAKE_GCS_SERVER

cargo build --workspace --quiet
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace "$@"
