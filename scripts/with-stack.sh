#!/usr/bin/env bash
# scripts/with-stack.sh COMMAND...: COMMAND with the simulated cluster and the local Airflow stack
# (scripts/airflow-stack.sh) running and aimed at it, each started if it was not; stops what it started,
# unless KEEP_UI=1. make demo and make chaos run through it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow-env.sh

started=()
cleanup() {
  if [ "${KEEP_UI:-0}" = 1 ]; then
    echo "KEEP_UI=1: leaving running: ${started[*]:-nothing new}; the UI is at $(scripts/airflow-stack.sh url)"
    echo "stop with: scripts/airflow-stack.sh stop; sim/down.sh; scripts/postgres.sh stop"
    return
  fi
  for ((i=${#started[@]}-1; i>=0; i--)); do
    case ${started[i]} in
      airflow) scripts/airflow-stack.sh stop ;;
      sim) sim/down.sh ;;
      postgres) scripts/postgres.sh stop ;;
    esac
  done
}
trap cleanup EXIT

out=$(scripts/postgres.sh start); echo "$out"
[[ $out == started* ]] && started+=(postgres)
if ! sim/status.sh >/dev/null 2>&1; then sim/up.sh; started+=(sim); fi
source .sim/airflow.env
if ! scripts/airflow-stack.sh status >/dev/null 2>&1; then started+=(airflow); fi
scripts/airflow-stack.sh start
"$@"
