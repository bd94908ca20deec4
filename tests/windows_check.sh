#!/usr/bin/env bash
# Type-checks and lints the Windows adapter (fs-windows, with fs-core), library and binary
# (`exe`), for x86_64-pc-windows-msvc on a Linux host. `cross-check` uses WinFsp's pre-generated
# bindings and skips the delay-load link step; C dependencies get a stub compiler since nothing
# is linked.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-pc-windows-msvc
export CC_x86_64_pc_windows_msvc="$PWD/tests/windows/stub-cc"
export AR_x86_64_pc_windows_msvc="$PWD/tests/windows/stub-cc"
cargo check -p fs-windows --target "$target" --features cross-check,exe --quiet
cargo clippy -p fs-windows --target "$target" --features cross-check,exe --tests --quiet -- -D warnings
echo "fs-windows: check and clippy clean for $target"
