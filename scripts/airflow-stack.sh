#!/usr/bin/env bash
# A local Airflow like a deployment's: api-server (UI and REST API), scheduler, dag-processor and
# triggerer on a PostgreSQL metadata database of its own (scripts/postgres.sh must run), LocalExecutor.
#   start: starts what is not running (idempotent); stop [COMPONENT...]: stops what start started (or the
#   components named); status; cli ARGS: the Airflow CLI on the stack's database; exec CMD...: a command in the
#   stack's environment (e.g. a component started otherwise, as tests/e2e does to a triggerer).
# Connections come from the environment (source .sim/airflow.env first to aim it at the simulation).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow-env.sh
STATE=$AIRFLOW_HOME/stack
# Its own database: test processes run dag.test() on the main one, and a scheduler would pick those runs up.
DB=airflow_stack
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=$(scripts/postgres.sh url $DB)
PORT=${TPU_RL_AIRFLOW_PORT:-18080}
COMPONENTS=(api-server scheduler dag-processor triggerer)
mkdir -p "$STATE"

export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM=8
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$PORT/execution/
export AIRFLOW__API__BASE_URL=http://127.0.0.1:$PORT
export AIRFLOW__API__PORT=$PORT
export AIRFLOW__API__HOST=127.0.0.1
# Local only: everyone is admin, so the UI needs no login (never do this on a shared host).
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
# Shared by every component: tasks authenticate to the api-server with tokens signed by it.
if [ ! -f "$STATE/jwt_secret" ]; then head -c 32 /dev/urandom | base64 > "$STATE/jwt_secret"; fi
export AIRFLOW__API_AUTH__JWT_SECRET=$(cat "$STATE/jwt_secret")
# Each re-parse of the three DAG files costs a few CPU seconds, on two cores shared with the simulation and
# the tasks: every 2 minutes (Airflow's default, 30 s, was a tenth of a core here). New files are found
# within 10 s; an edited file is seen within 2 minutes.
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=120
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=10
export AIRFLOW__TRIGGERER__CAPACITY=100

running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

case "${1:-}" in
  start)
    scripts/postgres.sh ensure-db $DB
    airflow db migrate >/dev/null
    for c in "${COMPONENTS[@]}"; do
      if running "$c"; then echo "airflow $c already running (pid $(cat "$STATE/$c.pid"))"; continue; fi
      setsid airflow "$c" > "$STATE/$c.log" 2>&1 &
      echo $! > "$STATE/$c.pid"
      echo "started airflow $c (pid $!, log $STATE/$c.log)"
    done
    for _ in $(seq 120); do
      curl -sf "http://127.0.0.1:$PORT/api/v2/version" >/dev/null && break
      sleep 1
    done
    curl -sf "http://127.0.0.1:$PORT/api/v2/version" >/dev/null || { echo "api-server did not answer; see $STATE/api-server.log" >&2; exit 1; }
    echo "Airflow UI: http://127.0.0.1:$PORT"
    ;;
  stop)
    shift
    for c in "${@:-${COMPONENTS[@]}}"; do
      if running "$c"; then
        pid=$(cat "$STATE/$c.pid")
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        echo "stopped airflow $c"
      fi
      rm -f "$STATE/$c.pid"
    done
    ;;
  status)
    rc=0
    for c in "${COMPONENTS[@]}"; do
      if running "$c"; then echo "airflow $c: running (pid $(cat "$STATE/$c.pid"))"; else echo "airflow $c: stopped"; rc=1; fi
    done
    exit $rc
    ;;
  url) echo "http://127.0.0.1:$PORT" ;;
  # The Airflow CLI on the stack's database, e.g. `scripts/airflow-stack.sh cli backfill create --dag-id ...`.
  cli) shift; exec airflow "$@" ;;
  exec) shift; exec "$@" ;;
  *) echo "usage: $0 start|stop [component...]|status|url|cli <airflow arguments>|exec <command>" >&2; exit 2 ;;
esac
