#!/usr/bin/env bash
# Builds the Debian package (packaging/build-deb.sh, installing cargo-deb first if missing) and
# checks what it holds: the binary, the man pages, bash/zsh/fish completions, the systemd unit,
# the docs, and the dependency on fuse3; that the man page renders and the packaged binary
# runs. Lists every miss and exits non-zero if there was one.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deb --version >/dev/null 2>&1; then
  echo "deb_check: installing cargo-deb" >&2
  start=$(date +%s)
  cargo install cargo-deb --locked --quiet
  echo "deb_check: cargo install cargo-deb took $(($(date +%s) - start)) s" >&2
fi

start=$(date +%s)
bash packaging/build-deb.sh --quiet
echo "deb_check: build-deb.sh took $(($(date +%s) - start)) s" >&2

target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
version=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "fs-linux"))')
deb=$(ls "$target_dir"/debian/bucketdrive_"$version"-*.deb)
echo "deb_check: $deb" >&2

missing=0
miss() { echo "deb_check: MISSING: $*" >&2; missing=1; }

contents=$(dpkg-deb -c "$deb" | awk '{ print $NF }')
for path in \
  ./usr/bin/bucketdrive \
  ./usr/share/man/man1/bucketdrive.1.gz \
  ./usr/share/man/man1/bucketdrive-mount.1.gz \
  ./usr/share/man/man1/bucketdrive-unmount.1.gz \
  ./usr/share/man/man1/bucketdrive-status.1.gz \
  ./usr/share/man/man1/bucketdrive-perfdiag.1.gz \
  ./usr/share/bash-completion/completions/bucketdrive \
  ./usr/share/zsh/vendor-completions/_bucketdrive \
  ./usr/share/fish/vendor_completions.d/bucketdrive.fish \
  './lib/systemd/system/bucketdrive@.service' \
  ./usr/share/doc/bucketdrive/mounting.md \
  ./usr/share/doc/bucketdrive/logging.md \
  ./usr/share/doc/bucketdrive/metrics.md \
  ./usr/share/doc/bucketdrive/perfdiag.md \
  ./usr/share/doc/bucketdrive/copyright; do
  grep -qxF -- "$path" <<<"$contents" || miss "$path"
done

depends=$(dpkg-deb -f "$deb" Depends)
grep -qE '(^|, )fuse3(,|$| )' <<<"$depends" || miss "Depends: fuse3 (have: $depends)"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
zcat "$root/usr/share/man/man1/bucketdrive.1.gz" | grep -q '^\.TH' || miss "man page .TH"
if command -v man >/dev/null; then
  man -l "$root/usr/share/man/man1/bucketdrive-mount.1.gz" 2>/dev/null | grep -q -- '--read-only' \
    || miss "man -l bucketdrive-mount.1.gz rendering --read-only"
fi
"$root/usr/bin/bucketdrive" --version | grep -qxF "bucketdrive $version" || miss "bucketdrive --version"
grep -q 'complete -F' "$root/usr/share/bash-completion/completions/bucketdrive" \
  || miss "bash completion script"
# The unit, as systemd reads it, for an instance with a dash (escaped as \x2d), when
# systemd-analyze is there: pointed at the packaged binary and man pages, nothing installed.
if command -v systemd-analyze >/dev/null; then
  unit="$root/unit/bucketdrive@my\x2dbucket.service"
  mkdir -p "$root/unit"
  sed "s#/usr/bin/bucketdrive#$root/usr/bin/bucketdrive#" \
    "$root/lib/systemd/system/bucketdrive@.service" > "$unit"
  MANPATH="$root/usr/share/man" systemd-analyze verify "$unit" || miss "systemd-analyze verify"
  # The hardening, as systemd scores it (docs/mounting.md records the figure).
  exposure=$(systemd-analyze security --offline=true "$unit" 2>/dev/null \
    | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
  echo "deb_check: systemd-analyze security exposure of the unit: ${exposure:-unknown}"
  if [ -z "$exposure" ] || ! awk -v e="$exposure" 'BEGIN { exit !(e <= 5.0) }'; then
    miss "a unit exposure of at most 5.0 (systemd-analyze security)"
  fi
fi

if [ $missing -ne 0 ]; then
  dpkg-deb -c "$deb" >&2
  exit 1
fi
echo "deb_check: $(basename "$deb") holds the binary, man pages, completions, unit and docs; Depends: $depends"
