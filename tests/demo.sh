#!/usr/bin/env bash
# Mounts a demo bucket served by a local emulator and shows that it works: browse, read,
# compare checksums with the source, and write a file that lands in the bucket. Stays mounted until Enter or Ctrl-C on a terminal; exits
# right away otherwise. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/emulator.sh

cargo build --quiet -p fs-linux
BIN=target/debug/bucketdrive
MNT=$(mktemp -d /tmp/bucketdrive-demo.XXXX)
SRC=$(mktemp -d /tmp/bucketdrive-src.XXXX)
cleanup() {
  "$BIN" unmount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
  kill "$EMU_PID" 2>/dev/null || true
  rm -rf "$SRC"; rmdir "$MNT" 2>/dev/null || true
}
trap cleanup EXIT

start_emulator
create_bucket demo
echo "hello from bucketdrive" > "$SRC/hello.txt"
head -c 50000000 /dev/urandom > "$SRC/big.bin"
put_object demo hello.txt "$SRC/hello.txt"
put_object demo photos/2026/big.bin "$SRC/big.bin"
put_object demo docs/ /dev/null

echo "== bucketdrive mount demo $MNT --endpoint $EMU_URL"
"$BIN" mount demo "$MNT" --endpoint "$EMU_URL" --anonymous --cache-dir "$SRC/cache"
echo "== ls -lR"
ls -lR "$MNT"
echo "== cat hello.txt"
cat "$MNT/hello.txt"
echo "== sha256: source vs. mount"
(cd "$SRC" && sha256sum big.bin)
sha256sum "$MNT/photos/2026/big.bin"
if cmp -s "$SRC/big.bin" "$MNT/photos/2026/big.bin"; then echo "OK: contents match"; else echo "MISMATCH"; exit 1; fi
echo "== write through the mount, then read the object straight from the bucket"
mkdir "$MNT/notes"
echo "written through bucketdrive" > "$MNT/notes/hello.txt"
for _ in $(seq 100); do
  got=$(curl -sf "$EMU_URL/storage/v1/b/demo/o/notes%2Fhello.txt?alt=media" || true)
  [ -n "$got" ] && break
  sleep 0.1
done
echo "bucket has notes/hello.txt: $got"
[ "$got" = "written through bucketdrive" ] || { echo "MISMATCH"; exit 1; }
if [ -t 0 ]; then
  read -r -p "Mounted at $MNT. Press Enter to unmount... " _
fi
