#!/usr/bin/env bash
# Installs what the tests need, runs the linter and builds the docs site, then every test: starts the metadata
# database, the simulated cluster and the local Airflow stacks when they are not running; runs side by side, on
# Airflow 3.3.2, the end-to-end scenarios, the tests that drive the simulation directly and the tests that need only
# PostgreSQL, and on Airflow 3.1.7 the main end-to-end scenarios on a stack of its own and the unit tests; then the
# fault campaign alone. Stops only what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow-env.sh

started=()
build=""
cleanup() {
  for job in $build ${compat_install:-} ${af31:-} ${sim_driven:-}; do kill "$job" 2>/dev/null || true; done
  for ((i=${#started[@]}-1; i>=0; i--)); do
    case ${started[i]} in
      postgres) scripts/postgres.sh stop ;;
      postgres-af31) TPU_RL_STACK=af31 scripts/airflow-stack.sh postgres stop ;;
      sim) sim/down.sh ;;
      stack) scripts/airflow-stack.sh stop ;;
      stack-af31) TPU_RL_STACK=af31 scripts/airflow-stack.sh stop ;;
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
mkdocs build --strict --quiet --site-dir "$(mktemp -d)"  # the docs site: a broken link or anchor fails here
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
# The main session is two pytest runs side by side on Airflow 3.3.2: the end-to-end scenarios on the local stack,
# and the tests that drive the simulation directly (checkpoints, gke, jobset, sim; no Airflow stack). In one run,
# the second's 16 minutes came after the first's scenarios had ended, at a load average of about 1 (46 min 31 s in
# all on 2026-12-06, 38 min 3 s split, on this 2-core machine).
SIM_DRIVEN="(jobset or checkpoints or sim or gke) and not e2e"
# Beside them, on Airflow 3.1.7 (Composer 3's main line), the same stack layout (scripts/airflow-stack.sh,
# TPU_RL_STACK=af31; its own PostgreSQL server, broker and ports) runs the scenarios that matter most there: the
# pipeline (one run and the crashed run cleared and resumed), a Spot preemption resumed from its last checkpoint,
# the component losses (kill and pause) and the Training tab in a browser. Their fixtures start only the runs the
# selected tests read; the other scenarios run on the main session only. Their trainings take the standing slice
# in turn with the main session's; their stack stops as soon as they end. TPU_RL_SKIP_COMPAT skips everything on
# Airflow 3.1.7.
AF31_E2E="tests/e2e/test_pipeline.py::test_happy_path
  tests/e2e/test_pipeline.py::test_training_failure_fails_the_run_tears_down_and_clearing_resumes
  tests/e2e/test_component_loss.py tests/e2e/test_run_view_e2e.py
  tests/e2e/test_preemption.py::test_a_spot_preemption_at_step_30_resumes_from_the_last_checkpoint_and_the_run_succeeds"
af31_e2e=""
af31_stack_started=""
if [ $# -eq 0 ] && [ -z "${TPU_RL_SKIP_COMPAT:-}" ]; then
  af31_e2e=1
  out=$(TPU_RL_STACK=af31 scripts/airflow-stack.sh postgres start); echo "$out"
  [[ $out == started* ]] && started+=(postgres-af31)
  if ! TPU_RL_STACK=af31 scripts/airflow-stack.sh status >/dev/null 2>&1; then
    started+=(stack-af31)  # started below, in the background; stopping it is idempotent
    af31_stack_started=1
  fi
fi
# The Composer-compatibility run (Airflow 3.1.7, tests/unit) needs only PostgreSQL: it goes on beside the main
# run, at a lower priority, in the time the end-to-end scenarios spend waiting; its output follows the main run's.
if [ -z "${TPU_RL_SKIP_COMPAT:-}" ]; then
  compat_log=$(mktemp)
  nice -n 10 scripts/test-compat.sh > "$compat_log" 2>&1 &
  compat=$!
fi
wait_for_compat() {
  if [ -n "${compat:-}" ]; then
    wait "$compat" || status=$?
    cat "$compat_log"; rm -f "$compat_log"
    compat=""
  fi
}
# The tests that need only PostgreSQL (as `make unit`) go on beside the others, which mostly wait; with arguments,
# pytest runs just those.
if [ $# -eq 0 ]; then
  unit_log=$(mktemp)
  nice -n 5 python -m pytest -p no:cacheprovider -m "$UNIT" > "$unit_log" 2>&1 &
  unit=$!
  sim_log=$(mktemp)
  python -m pytest -p no:cacheprovider --durations=10 -m "$SIM_DRIVEN" > "$sim_log" 2>&1 &
  sim_driven=$!
  # The local Airflow stack, aimed at the simulation, for both e2e sessions below (the e2e fixture reuses it).
  if ! scripts/airflow-stack.sh status >/dev/null 2>&1; then
    (set -a; source .sim/airflow.env; scripts/airflow-stack.sh start)
    started+=(stack)
  fi
  if [ -n "$af31_e2e" ]; then
    af31_log=$(mktemp)
    (
      if [ -n "$af31_stack_started" ]; then
        (set -a; source .sim/airflow.env; TPU_RL_STACK=af31 scripts/airflow-stack.sh start) || exit 1
      fi
      af31_status=0
      # shellcheck disable=SC2086
      TPU_RL_STACK=af31 python -m pytest -p no:cacheprovider --durations=10 $AF31_E2E || af31_status=$?
      # Idle, its stack would take CPU from the main session for the rest of the run.
      if [ -n "$af31_stack_started" ]; then TPU_RL_STACK=af31 scripts/airflow-stack.sh stop >/dev/null; fi
      exit $af31_status
    ) > "$af31_log" 2>&1 &
    af31=$!
  fi
  python -m pytest --durations=20 -m "e2e and not e2e_alone" || status=$?  # the slowest, to plan the next overlap
  echo "== the tests that drive the simulation directly (checkpoints, gke, jobset, sim) =="
  wait "$sim_driven" || status=$?
  sim_driven=""
  cat "$sim_log"; rm -f "$sim_log"
  wait "$unit" || status=$?
  cat "$unit_log"; rm -f "$unit_log"
  if [ -n "${af31:-}" ]; then
    echo "== the end-to-end scenarios on Airflow 3.1.7 (TPU_RL_STACK=af31) =="
    wait "$af31" || status=$?
    af31=""
    cat "$af31_log"; rm -f "$af31_log"
  fi
  wait_for_compat
  # The fault campaign last, alone: it restarts the PostgreSQL the other sessions use, and strikes the stack.
  python -m pytest -p no:cacheprovider -s -m e2e_alone || status=$?
else
  python -m pytest "$@" || status=$?
fi
wait_for_compat
exit $status
