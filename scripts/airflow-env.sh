# Sourced by the Makefile's scripts: a local Airflow home on the PostgreSQL of scripts/postgres.sh,
# with this checkout's dags/ and plugins/.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export AIRFLOW_HOME=${AIRFLOW_HOME:-$repo/.airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$repo/dags
export AIRFLOW__CORE__PLUGINS_FOLDER=$repo/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-$("$repo/scripts/postgres.sh" url)}
export PATH=$repo/.venv/bin:$PATH
