#!/usr/bin/env bash
# Cargo's runner for x86_64-pc-windows-gnu (CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER): runs a
# Windows executable under Wine, with the bcryptprimitives.dll shim (tests/windows/
# bcryptprimitives.c, which Wine 8 lacks) beside it. tests/windows_run.sh sets it up.
set -euo pipefail
exe=$1
shift
: "${BD_WINE_SHIM:?set by tests/windows_run.sh: the built bcryptprimitives.dll}"
dir=$(dirname "$exe")
if ! cmp -s "$BD_WINE_SHIM" "$dir/bcryptprimitives.dll"; then
  cp "$BD_WINE_SHIM" "$dir/bcryptprimitives.dll"
fi
exec /usr/lib/wine/wine64 "$exe" "$@"
