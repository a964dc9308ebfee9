#!/usr/bin/env bash
# Runs every test: starts the metadata database and the simulated cluster when they are not running,
# and stops only what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow-env.sh

started=()
cleanup() {
  for service in "${started[@]}"; do
    case $service in
      postgres) scripts/postgres.sh stop ;;
      sim) sim/down.sh ;;
    esac
  done
}
trap cleanup EXIT

if scripts/postgres.sh start | tee /dev/stderr | grep -q '^started'; then started+=(postgres); fi
airflow db migrate >/dev/null
if ! sim/status.sh >/dev/null 2>&1; then
  sim/up.sh
  started+=(sim)
fi
python -m pytest "$@"
