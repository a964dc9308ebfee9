#!/usr/bin/env bash
# Composer 3 compatibility: imports the DAG and runs tests/unit on Airflow 3.1.7 with the packages of
# composer-3-airflow-3.1.7-build.0 as read, and the package's floors where its list could not be read
# (docs/reference/versions.md; constraints-af31.txt comes from scripts/compile-af31.sh). Its own venv (.venv-af31, reinstalled only
# when requirements-af31.txt or constraints-af31.txt change), Airflow home (.airflow-af31) and database
# (airflow_af31, beside the main one on the PostgreSQL of scripts/postgres.sh): nothing of the 3.3.2 setup
# is touched. Arguments go to pytest instead of tests/unit; --install-only installs the venv and stops there,
# --install-wheel installs the venv and the checkout's wheel (make wheel) and stops there.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
VENV=.venv-af31
STAMP=$VENV/.installed
PYTHON=${PYTHON_AF31:-python3.11}  # Composer 3 runs Python 3.11
DB=airflow_af31

if [ ! -f "$STAMP" ] || [ requirements-af31.txt -nt "$STAMP" ] || [ constraints-af31.txt -nt "$STAMP" ]; then
  echo "installing $VENV from requirements-af31.txt and constraints-af31.txt"
  test -x $VENV/bin/pip || "$PYTHON" -m venv --clear $VENV  # --clear: a half-deleted venv
  scripts/uv.sh pip install -q --compile-bytecode --python $VENV/bin/python -c constraints-af31.txt -r requirements-af31.txt
  touch "$STAMP"
fi
if [ "${1:-}" = --install-only ]; then
  exit 0
fi

# The wheel, as Composer installs a custom package into its image: with the image's pins, and only if that
# moves no installed package (pip's report of what it would install must name the wheel alone). Installed again only
# when the wheel changed (its SHA-256: the build is reproducible), so the 3.1.7 stack (scripts/airflow-stack.sh,
# TPU_RL_STACK=af31) that runs on this venv is not reinstalled under its feet.
wheel=$(ls dist/tpu_rl-*-py3-none-any.whl)
report=$(mktemp)
$VENV/bin/pip install -q --dry-run --report "$report" -c constraints-af31.txt "$wheel"
$VENV/bin/python - "$report" <<'PY'
import json, sys
would = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.load(open(sys.argv[1]))["install"]}
others = {name: version for name, version in would.items() if name != "tpu-rl"}
assert not others, f"installing the wheel would change the Composer image's packages: {others}"
print(f"wheel: installs with the image's pins, changing no installed package ({would})")
PY
rm -f "$report"
sum=$(sha256sum "$wheel" | cut -d' ' -f1)
if [ "$(cat $VENV/.tpu_rl-wheel 2>/dev/null)" != "$sum" ]; then
  $VENV/bin/pip install -q --no-deps --force-reinstall "$wheel"
  echo "$sum" > $VENV/.tpu_rl-wheel
fi
if [ "${1:-}" = --install-wheel ]; then
  exit 0
fi

started=false
cleanup() { if $started; then scripts/postgres.sh stop; fi; }
trap cleanup EXIT
pg=$(scripts/postgres.sh start)  # not tee /dev/stderr: that truncates a log file stderr goes to
echo "$pg"
if [[ $pg == started* ]]; then started=true; fi

# The main run's database URL (scripts/airflow-env.sh, or the caller's override) with another database.
main_url=$(source scripts/airflow-env.sh && echo "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
af31_url=$($VENV/bin/python - "$main_url" "$DB" <<'PY'
import sys
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

url, name = make_url(sys.argv[1]), sys.argv[2]
admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
with admin.connect() as conn:
    if not conn.execute(text("select 1 from pg_database where datname = :n"), {"n": name}).scalar():
        conn.execute(text(f'create database "{name}"'))
admin.dispose()
print(url.set(database=name).render_as_string(hide_password=False))
PY
)

export AIRFLOW_HOME=$repo/.airflow-af31 AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=$af31_url
source scripts/airflow-env.sh
export PATH=$repo/$VENV/bin:$PATH
echo "Airflow $(python -c 'import airflow; print(airflow.__version__)' 2>/dev/null) on database $DB"
log=$(mktemp)
airflow db migrate >"$log" 2>&1 || { cat "$log"; exit 1; }

# The DAG processor's view: the DAG file imports with no error.
if ! python - >"$log" 2>&1 <<'PY'
import os
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.1
    from airflow.models.dagbag import DagBag

bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"], include_examples=False)
for path, error in bag.import_errors.items():
    print(f"IMPORT ERROR {path}:\n{error}")
dag = bag.get_dag("maxtext_rl_tpu")
assert not bag.import_errors and dag is not None, "the DAG does not import"
print(f"DAG import: {dag.dag_id} with {len(dag.tasks)} tasks, no import errors")
PY
then
  cat "$log"; rm -f "$log"; exit 1
fi
tail -n 1 "$log"; rm -f "$log"

python -m pytest "${@:-tests/unit}"
