#!/usr/bin/env bash
# Builds target/debian/bucketdrive_VERSION-1_ARCH.deb with cargo-deb: the release binary, then
# the man pages and shell completions generated from it (cargo-deb's assets must exist before
# it runs), then the package itself from fs-linux's [package.metadata.deb].
# Needs cargo-deb (`cargo install cargo-deb --locked`).
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cargo build --release --locked -p fs-linux

bin="$target_dir/release/bucketdrive"
out="$target_dir/release/packaging"
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$bin" manpages "$out/man"
# Debian wants man pages gzipped; cargo-deb compresses only assets it did not build itself.
gzip -9n "$out"/man/*.1
"$bin" completions bash > "$out/completions/bucketdrive.bash"
"$bin" completions zsh > "$out/completions/_bucketdrive"
"$bin" completions fish > "$out/completions/bucketdrive.fish"

cargo deb -p fs-linux --no-build "$@"
