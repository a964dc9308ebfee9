#!/usr/bin/env bash
# A local Airflow laid out as Cloud Composer 3 and docker-compose.yaml run it: CeleryExecutor with a Redis broker
# (Debian's redis-server), two Celery workers that share nothing but the DAGs and the logs folder (each its own
# HOME, temporary directory, working directory and Airflow home, as two machines), two schedulers, two
# triggerers, the DAG processor and the API server, on a PostgreSQL database of its own (its server must run:
# `postgres start`). Airflow's settings are docker-compose.yaml's own (scripts/compose_env.py), so that file is what
# the end-to-end tests prove.
#   start [COMPONENT...]: starts what is not running (idempotent), or only the components named; stop [COMPONENT...]: stops what start started (or the
#   components named), stop --kill COMPONENT...: SIGKILL, as a machine that dies; pause COMPONENT... and
#   resume COMPONENT...: SIGSTOP and SIGCONT to the component's processes, as a machine that stalls (a long GC
#   pause, CPU throttling, a network cut) and comes back; status; url; cli ARGS: the
#   Airflow CLI on the stack's database; exec CMD...: a command in the stack's environment (e.g. a component
#   started otherwise, as tests/e2e does to a triggerer); celery ARGS: Celery's CLI on the stack's broker; state: the
#   folder of its pid files and component logs; redis-port; db: its database's name; db-url: its SQLAlchemy URL;
#   postgres start|stop: its PostgreSQL server (scripts/postgres.sh on the stack's port).
# Connections come from the environment (source .sim/airflow.env first to aim it at the simulation).
# TPU_RL_STACK picks the stack: main (default; Airflow 3.3.2 of .venv) or af31, the same layout on Airflow 3.1.7,
# Composer 3's main line (.venv-af31: scripts/test-compat.sh --install-only), which runs beside the main one with
# its own Airflow home, ports, broker, log bucket and database, on a PostgreSQL server of its own: a fault campaign
# restarts it while the main stack and the tests on the default server go on.
set -euo pipefail
cd "$(dirname "$0")/.."
case ${TPU_RL_STACK:-main} in
  main)
    # Its own database: test processes run dag.test() on the main one, and a scheduler would pick those runs up.
    DB=airflow_stack
    WORKER="airflow celery worker"
    PORT=${TPU_RL_AIRFLOW_PORT:-18080}
    REDIS_PORT=${TPU_RL_REDIS_PORT:-16379}
    HEALTH_PORTS=(8974 8975)  # the schedulers' health checks
    LOG_PORTS=(8793 8794)     # the log servers of worker-a and of the triggerer
    LOG_BUCKET=${TPU_RL_STACK_LOG_BUCKET:-tpu-rl-composer-env}
    ;;
  af31)
    export AIRFLOW_HOME=$PWD/.airflow-af31 TPU_RL_VENV=$PWD/.venv-af31
    DB=airflow_stack_af31 PORT=18090 REDIS_PORT=16380 HEALTH_PORTS=(8976 8977) LOG_PORTS=(8795 8796)
    LOG_BUCKET=tpu-rl-composer-env-af31
    export TPU_RL_PG_PORT=55434
    WORKER="python $PWD/scripts/celery_worker_af31.py"  # Composer's celery provider, with airflow#59707 fixed
    export TPU_RL_ENVIRONMENT=local-af31  # its runs' marks: neither stack's reaper nor leases take the other's runs for lost
    ;;
  *) echo "TPU_RL_STACK: '$TPU_RL_STACK' is not a stack; use main or af31" >&2; exit 2 ;;
esac
source scripts/airflow-env.sh
STATE=$AIRFLOW_HOME/stack
COMPONENTS=(redis api-server scheduler scheduler-2 dag-processor triggerer triggerer-2 worker-a worker-b)
WORKERS=(worker-a worker-b)
mkdir -p "$STATE"

# Shared by every component: tasks authenticate to the api-server with tokens signed by it.
if [ ! -f "$STATE/jwt_secret" ]; then head -c 32 /dev/urandom | base64 > "$STATE/jwt_secret"; fi
# The compose file's settings, exported to every component; among them TPU_RL_ENVIRONMENT, the name the stack's
# runs mark what they create with: the caller's TPU_RL_ENVIRONMENT, else "local" (docker-compose.yaml's default).
eval "$(python scripts/compose_env.py --postgres "$(scripts/postgres.sh url $DB)" --redis-port "$REDIS_PORT" \
  --api-url "http://127.0.0.1:$PORT" --jwt-secret-file "$STATE/jwt_secret")"

export AIRFLOW__API__BASE_URL=http://127.0.0.1:$PORT
export AIRFLOW__API__PORT=$PORT
export AIRFLOW__API__HOST=127.0.0.1
# Local only: everyone is admin, so the UI needs no login (never do this on a shared host).
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
# Each scheduler sends at most 8 tasks at once; each worker runs 6 (the e2e scenarios run several DAG runs at
# once, and most of their tasks defer).
export AIRFLOW__CORE__PARALLELISM=8
export AIRFLOW__CELERY__WORKER_CONCURRENCY=6
# Each re-parse of the three DAG files costs a few CPU seconds, on two cores shared with the simulation and
# the tasks: every 2 minutes (Airflow's default, 30 s, was a tenth of a core here). New files are found
# within 10 s; an edited file is seen within 2 minutes.
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=120
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=10
export AIRFLOW__TRIGGERER__CAPACITY=100
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=${LOG_PORTS[0]} AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=${LOG_PORTS[1]}
# How soon the survivors notice a component that died (Airflow's defaults: a task's heartbeat 300 s, orphaned
# tasks checked every 300 s): short enough for a test to wait for, long enough for a busy 2-core machine.
export AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=90
export AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL=60
# The logs folder is shared by every component, as docker-compose.yaml mounts ./logs into each container
# (on Composer: the environment's bucket). One log server answers for the host: worker-a's and triggerer's.
export AIRFLOW__LOGGING__BASE_LOG_FOLDER=$AIRFLOW_HOME/logs
# Remote logging as Composer sets it (its environment's bucket, under logs/), when the stack is aimed at the
# simulation's Cloud Storage: a worker uploads a task's log when its part of the task ends, a triggerer a trigger's
# log when the trigger ends (one that dies uploads nothing), and the UI reads a finished task's log from there only.
if [ -n "${STORAGE_EMULATOR_HOST:-}" ]; then
  export AIRFLOW__LOGGING__REMOTE_LOGGING=True
  export AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER=gs://$LOG_BUCKET/logs
  export AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID=google_cloud_default
fi

running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

# The command line of a component.
command_of() {
  case $1 in
    redis) echo "redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --dir $STATE" ;;
    api-server | dag-processor | triggerer) echo "airflow $1" ;;
    triggerer-2) echo "airflow triggerer --skip-serve-logs" ;;
    # Each scheduler's health check on a port of its own.
    scheduler) echo "env AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT=${HEALTH_PORTS[0]} airflow scheduler --skip-serve-logs" ;;
    scheduler-2) echo "env AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT=${HEALTH_PORTS[1]} airflow scheduler --skip-serve-logs" ;;
    worker-a) echo "$WORKER --celery-hostname worker-a@%h" ;;
    worker-b) echo "$WORKER --celery-hostname worker-b@%h --skip-serve-logs" ;;
  esac
}

start_component() {
  local c=$1 dir=$STATE/$1
  # Airflow records a job's user (getpass: LOGNAME): on one host, the jobs API then tells the components apart.
  export LOGNAME=$c USER=$c
  if [[ " ${WORKERS[*]} " == *" $c "* ]]; then
    # A machine of its own: nothing a task leaves in HOME, /tmp, its working directory or AIRFLOW_HOME is
    # seen by a task on the other worker.
    mkdir -p "$dir/home" "$dir/tmp" "$dir/work" "$dir/airflow/empty-plugins"
    (
      cd "$dir/work"
      HOME=$dir/home TMPDIR=$dir/tmp AIRFLOW_HOME=$dir/airflow AIRFLOW__CORE__PLUGINS_FOLDER=$dir/airflow/empty-plugins \
        setsid bash -c "exec $(command_of "$c")" >> "$STATE/$c.log" 2>&1 &
      echo $! > "$STATE/$c.pid"
    )
  else
    setsid bash -c "exec $(command_of "$c")" >> "$STATE/$c.log" 2>&1 &
    echo $! > "$STATE/$c.pid"
  fi
  echo "started $c (pid $(cat "$STATE/$c.pid"), log $STATE/$c.log)"
}

stop_component() {
  local c=$1 signal=$2 pid
  if running "$c"; then
    pid=$(cat "$STATE/$c.pid")
    kill "-$signal" -- "-$pid" 2>/dev/null || kill "-$signal" "$pid"
    kill -CONT -- "-$pid" 2>/dev/null || true  # a paused component takes its SIGTERM once resumed
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "stopped $c"
  fi
  rm -f "$STATE/$c.pid"
}

case "${1:-}" in
  start)
    command -v redis-server >/dev/null || {
      echo "installing Redis from Debian's packages"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    }
    shift
    # The stack's setup, when it starts as a whole; a component (re)started alone joins the stack as it is (a test
    # that kills one: a wheel check, a migration and a bucket lookup there took ten minutes on a loaded machine).
    if [ $# -eq 0 ]; then
      # The 3.1.7 stack runs the checkout's wheel (make wheel), as the main one runs make venv's.
      if [ "${TPU_RL_STACK:-main}" = af31 ]; then scripts/test-compat.sh --install-wheel; fi
      scripts/postgres.sh ensure-db $DB
      airflow db migrate >/dev/null
      if [ -n "${STORAGE_EMULATOR_HOST:-}" ]; then
        python -c "from sim.clients import gcs_client; import sys; c = gcs_client(sys.argv[1]); c.lookup_bucket(sys.argv[2]) or c.create_bucket(sys.argv[2])" \
          "$STORAGE_EMULATOR_HOST" "$LOG_BUCKET"
      fi
    fi
    for c in "${@:-${COMPONENTS[@]}}"; do
      if running "$c"; then echo "$c already running (pid $(cat "$STATE/$c.pid"))"; continue; fi
      start_component "$c"
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
    signal=TERM
    if [ "${1:-}" = --kill ]; then signal=KILL; shift; fi
    if [ $# -gt 0 ]; then targets=("$@"); else
      # Workers first (a warm shutdown finishes what they run), the broker last.
      targets=(); for ((i=${#COMPONENTS[@]}-1; i>=0; i--)); do targets+=("${COMPONENTS[i]}"); done
    fi
    for c in "${targets[@]}"; do stop_component "$c" "$signal"; done
    ;;
  # A stalled component: every process of its group stops where it is (its heartbeat lapses, its connections stay
  # open) until resumed.
  pause | resume)
    verb=$1 signal=STOP
    [ "$verb" = resume ] && signal=CONT
    shift
    for c in "$@"; do
      running "$c" || { echo "$c is not running" >&2; exit 1; }
      kill "-$signal" -- "-$(cat "$STATE/$c.pid")"
      echo "${verb}d $c"
    done
    ;;
  status)
    rc=0
    for c in "${COMPONENTS[@]}"; do
      if running "$c"; then echo "$c: running (pid $(cat "$STATE/$c.pid"))"; else echo "$c: stopped"; rc=1; fi
    done
    exit $rc
    ;;
  url) echo "http://127.0.0.1:$PORT" ;;
  state) echo "$STATE" ;;
  redis-port) echo "$REDIS_PORT" ;;
  db) echo "$DB" ;;
  db-url) scripts/postgres.sh url "$DB" ;;
  postgres) shift; exec scripts/postgres.sh "$@" ;;
  pid) cat "$STATE/${2:?usage: $0 pid COMPONENT}.pid" ;;
  # The Airflow CLI on the stack's database, e.g. `scripts/airflow-stack.sh cli backfill create --dag-id ...`.
  cli) shift; exec airflow "$@" ;;
  celery) shift; exec celery --app airflow.providers.celery.executors.celery_executor.app "$@" ;;
  exec) shift; exec "$@" ;;
  *) echo "usage: $0 start [component...]|stop [--kill] [component...]|pause|resume component...|status|url|state|redis-port|db|db-url|postgres start|stop|pid COMPONENT|cli <airflow arguments>|celery <arguments>|exec <command>" >&2; exit 2 ;;
esac
