#!/usr/bin/env bash
# Installs what the tests need, runs the linter, then every test: starts the metadata database and the simulated
# cluster when they are not running (the e2e fixture starts the local Airflow stack), runs pytest on Airflow 3.3.2
# (the tests that need only PostgreSQL in a second pytest beside the others), with the Composer-compatibility run on
# Airflow 3.1.7 beside them. Stops only what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow-env.sh

started=()
build=""
cleanup() {
  for job in $build ${compat_install:-}; do kill "$job" 2>/dev/null || true; done
  for ((i=${#started[@]}-1; i>=0; i--)); do
    case ${started[i]} in
      postgres) scripts/postgres.sh stop ;;
      sim) sim/down.sh ;;
    esac
  done
}
trap cleanup EXIT

# The installs go on side by side, each mostly on one core: the simulation's Go build (from nothing only), the
# Composer-compatibility run's virtualenv (installed here, not beside the end-to-end scenarios, whose timing the
# load would strain) and .venv, both by uv (made first, so that they do not both make it), then the browser's.
begin=$SECONDS
scripts/uv.sh --version
build_log=$(mktemp)
bash sim/build.sh >"$build_log" 2>&1 &
build=$!
compat_install=""
if [ -z "${TPU_RL_SKIP_COMPAT:-}" ]; then
  compat_install_log=$(mktemp)
  scripts/test-compat.sh --install-only >"$compat_install_log" 2>&1 &
  compat_install=$!
fi
make -s venv
echo "installed .venv at $((SECONDS - begin)) s"
ruff check . && ruff format --check .  # linter and formatter first: a style slip fails in seconds, not after the suite
scripts/install-browser.sh
if [ -n "$compat_install" ]; then
  wait "$compat_install" || { cat "$compat_install_log"; echo "the .venv-af31 install failed" >&2; exit 1; }
  compat_install=""
  cat "$compat_install_log"; rm -f "$compat_install_log"
fi
wait "$build" || { cat "$build_log"; echo "sim/build.sh failed" >&2; exit 1; }
build=""
grep -v '^go: downloading' "$build_log" || true
rm -f "$build_log"
echo "installs done at $((SECONDS - begin)) s"
out=$(scripts/postgres.sh start); echo "$out"
[[ $out == started* ]] && started+=(postgres)
airflow db migrate >/dev/null
if ! sim/status.sh >/dev/null 2>&1; then
  sim/up.sh
  started+=(sim)
fi
status=0
UNIT="not jobset and not checkpoints and not sim and not gke and not e2e"
# The Composer-compatibility run (Airflow 3.1.7, tests/unit) needs only PostgreSQL: it goes on beside the main
# run, at a lower priority, in the time the end-to-end scenarios spend waiting; its output follows the main run's.
if [ -z "${TPU_RL_SKIP_COMPAT:-}" ]; then
  compat_log=$(mktemp)
  nice -n 10 scripts/test-compat.sh > "$compat_log" 2>&1 &
  compat=$!
fi
# The tests that need only PostgreSQL (as `make unit`) go on beside the ones that drive the simulation, which
# mostly wait; with arguments, pytest runs just those.
if [ $# -eq 0 ]; then
  unit_log=$(mktemp)
  nice -n 5 python -m pytest -p no:cacheprovider -m "$UNIT" > "$unit_log" 2>&1 &
  unit=$!
  python -m pytest --durations=20 -m "not ($UNIT)" || status=$?  # the slowest, to plan the next overlap
  wait "$unit" || status=$?
  cat "$unit_log"; rm -f "$unit_log"
else
  python -m pytest "$@" || status=$?
fi
if [ -n "${compat:-}" ]; then
  wait "$compat" || status=$?
  cat "$compat_log"; rm -f "$compat_log"
fi
exit $status
