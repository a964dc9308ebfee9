#!/usr/bin/env bash
# The Airflow metadata database for tests and the demo: a PostgreSQL cluster on 127.0.0.1.
# Its data lives under /tmp, keyed by the checkout's path: the postgres user may not be able to enter
# the checkout (a clone in a private temporary folder), and two checkouts must not share a database.
# TPU_RL_PG_PORT picks another cluster of the checkout (default 55432), with data of its own: the 3.1.7 stack's,
# which a fault campaign restarts while the other sessions go on with theirs.
# start: creates and starts it if it does not run (prints "started" only then); stop: stops it;
# ensure-db NAME: creates a database; url [DB]: its SQLAlchemy URL (default database: airflow).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${TPU_RL_PG_PORT:-55432}
PGROOT=/tmp/tpu-rl-pg-$(printf %s "$PWD" | cksum | cut -d' ' -f1)
if [ "$PORT" != 55432 ]; then PGROOT=$PGROOT-$PORT; fi
PGDATA=$PGROOT/data
# The newest installed PostgreSQL's binaries; empty before it is installed (ls fails then: hence `|| true` under pipefail).
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true; }
PGBIN=$(pg_bin)
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

install_if_missing() {
  [ -n "$PGBIN" ] && return
  echo "installing PostgreSQL from Debian's packages" >&2  # (stdout says only whether it started: callers read it)
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  PGBIN=$(pg_bin)
}

ensure_db() {
  if ! as_postgres "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc "select 1 from pg_database where datname='$1'" | grep -q 1; then
    as_postgres "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qc "create database \"$1\""
  fi
}

case "${1:-}" in
  start)
    install_if_missing
    mkdir -p "$PGROOT" && if [ "$(id -u)" = 0 ]; then chown postgres "$PGROOT"; fi
    if [ ! -f "$PGDATA/PG_VERSION" ]; then
      as_postgres "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust >/dev/null
    fi
    if as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
      echo "PostgreSQL already running on 127.0.0.1:$PORT"
      exit 0
    fi
    if ! as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w \
      -o "-c listen_addresses=127.0.0.1 -p $PORT -k $PGDATA -c fsync=off -c max_connections=200" start >/dev/null; then
      # The server's own words (a port another checkout's server holds, a data directory it refuses).
      echo "PostgreSQL did not start on 127.0.0.1:$PORT; the end of $PGDATA/server.log:" >&2
      tail -n 8 "$PGDATA/server.log" >&2 || true
      exit 1
    fi
    ensure_db airflow
    echo "started PostgreSQL on 127.0.0.1:$PORT"
    ;;
  ensure-db)
    ensure_db "${2:?usage: $0 ensure-db NAME}"
    ;;
  stop)
    [ -n "$PGBIN" ] && [ -f "$PGDATA/PG_VERSION" ] && as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" -m fast stop >/dev/null 2>&1 || true
    ;;
  url)
    echo "postgresql+psycopg2://postgres@127.0.0.1:$PORT/${2:-airflow}"
    ;;
  *) echo "usage: $0 start|stop|ensure-db NAME|url [DB]" >&2; exit 2 ;;
esac
