#!/usr/bin/env bash
# Runs bucketdrive on Windows semantics, under Wine, on this Linux machine:
#
# - fs-core's tests (unit, Volume, reference model, journal, staging pool, read cache, the
#   deterministic simulation with its default bounded seeds) and fs-windows' descriptor test,
#   cross-compiled for x86_64-pc-windows-gnu with mingw-w64 and run by Wine (the target
#   runner is tests/windows/wine-runner.sh);
# - bucketdrive.exe, built for the same target without WinFsp (winfsp-sys builds only for
#   MSVC): `perfdiag` end to end against the emulator on loopback (the GCS client and sockets
#   on Windows), and the one-line failures of `mount` (no WinFsp in this build), `status` and
#   `unmount` (no mount).
#
# Wine 8 lacks bcryptprimitives.dll, which Rust's standard library imports; a ten-line shim
# (tests/windows/bcryptprimitives.c) is built here and put beside the executables. Real
# Windows has its own; nothing shipped carries the shim. Prints one closing line,
# `windows (Wine): N passed, N failed`, and fails if anything did.
#
# Needs: wine64, gcc-mingw-w64-x86-64 (apt), `rustup target add x86_64-pc-windows-gnu`.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-pc-windows-gnu
shim_dir=target/$target/wine-shim
mkdir -p "$shim_dir"
x86_64-w64-mingw32-gcc -O2 -shared -o "$shim_dir/bcryptprimitives.dll" \
  tests/windows/bcryptprimitives.c -ladvapi32
export BD_WINE_SHIM=$PWD/$shim_dir/bcryptprimitives.dll
export WINEPREFIX=$PWD/target/wine WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=$PWD/tests/windows/wine-runner.sh

log=$(mktemp)
work=$(mktemp -d)
cleanup() {
  kill "${EMU_PID:-}" 2>/dev/null || true
  wineserver -k 2>/dev/null || true
  rm -rf "$log" "$work"
}
trap cleanup EXIT

# The tests and the Windows-only code paths they run, linted for this target too.
cargo clippy --quiet -p fs-core -p fs-windows --target "$target" --no-default-features \
  --all-targets -- -D warnings

status=0
cargo test -p fs-core --target "$target" -- --nocapture 2>&1 | tee "$log" || status=1
cargo test -p fs-windows --target "$target" --no-default-features 2>&1 | tee -a "$log" || status=1

# bucketdrive.exe, as shipped but for WinFsp.
cargo build --quiet -p fs-windows --target "$target" --no-default-features --features exe
exe=target/$target/debug/bucketdrive.exe
run_exe() { "$CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER" "$exe" "$@"; }
passed=0
failed=0
check() {  # name, then a command that must succeed
  local name=$1
  shift
  if "$@"; then
    echo "exe: $name ... ok"
    passed=$((passed + 1))
  else
    echo "exe: $name ... FAILED"
    failed=$((failed + 1))
  fi
}
# One line on stderr, containing $2, and a non-zero exit, from `bucketdrive.exe $3...`.
fails_in_one_line() {
  local want=$1
  shift
  if run_exe "$@" >"$work/out" 2>"$work/err"; then
    echo "  exited 0: $(cat "$work/err")"
    return 1
  fi
  [ "$(wc -l <"$work/err")" -eq 1 ] && grep -qF "$want" "$work/err" \
    || { echo "  stderr: $(cat "$work/err")"; return 1; }
}
check "mount says this build has no WinFsp" \
  fails_in_one_line "built without WinFsp" mount winbench X:
check "status with no mount is one line" \
  fails_in_one_line "no bucketdrive mount answers" status X:
check "unmount with no mount is one line" \
  fails_in_one_line "no bucketdrive mount answers" unmount X:

source tests/emulator.sh
start_emulator
create_bucket winbench
# Something of the user's in the bucket, which perfdiag must leave exactly as it was.
curl -sf -X POST --data-binary 'keep me' -H 'content-type: text/plain' \
  "$EMU_URL/upload/storage/v1/b/winbench/o?uploadType=media&name=mine.txt" >/dev/null
perfdiag_runs() {
  run_exe perfdiag winbench --endpoint "$EMU_URL" --anonymous --json \
    --object-size 8MiB --part-size 1MiB --step-time 1s --max-concurrency 4 \
    --latency-samples 3 --small-objects 20 >"$work/perf.json" 2>"$work/perf.err" \
    || { echo "  $(tail -3 "$work/perf.err")"; return 1; }
  python3 - "$work/perf.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["deleted_objects"] > 0 and not r["cut_short"], r
PY
  local left
  left=$(curl -sf "$EMU_URL/storage/v1/b/winbench/o" \
    | python3 -c 'import json,sys; print(" ".join(o["name"] for o in json.load(sys.stdin).get("items", [])))')
  [ "$left" = "mine.txt" ] || { echo "  left in the bucket: $left"; return 1; }
  [ "$(curl -sf "$EMU_URL/storage/v1/b/winbench/o/mine.txt?alt=media")" = "keep me" ]
}
check "perfdiag runs end to end and deletes its objects" perfdiag_runs

echo "exe: $passed passed, $failed failed" | tee -a "$log"
awk '/^test result:/ { p += $4; f += $6 } /^exe: [0-9]+ passed/ { p += $2; f += $4 }
  END { printf "\nwindows (Wine): %d passed, %d failed\n", p, f }' "$log"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
