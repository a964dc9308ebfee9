#!/usr/bin/env bash
# uv, the installer of .venv and .venv-af31 (pip takes minutes to install what uv installs in seconds; the
# constraints files pin every version, so both install the same packages). Callers pass --compile-bytecode, as
# pip compiles on install: without it, where PYTHONDONTWRITEBYTECODE is set, every Airflow task process compiles
# Airflow's sources again (it made the end-to-end suite several times slower). Its own small venv (.venv-uv), made
# on first use with pip from PyPI; arguments go to uv: scripts/uv.sh pip install --python .venv/bin/python ...
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
VENV=.venv-uv
if [ ! -x $VENV/bin/uv ] || [ "$($VENV/bin/uv --version | cut -d' ' -f2)" != $UV_VERSION ]; then
  "${PYTHON:-python3}" -m venv --clear $VENV
  $VENV/bin/pip install -q "uv==$UV_VERSION"
fi
exec $VENV/bin/uv "$@"
