# Sourced by the Makefile's scripts: a local Airflow home on the PostgreSQL of scripts/postgres.sh, with this
# checkout's dags/ and, as on Cloud Composer 3, no plugins: the package is the installed wheel (make venv),
# and its Training tab comes from the wheel's entry point. The plugins folder is an empty one of our own.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export AIRFLOW_HOME=${AIRFLOW_HOME:-$repo/.airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$repo/dags
export AIRFLOW__CORE__PLUGINS_FOLDER=$AIRFLOW_HOME/empty-plugins
mkdir -p "$AIRFLOW__CORE__PLUGINS_FOLDER"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-$("$repo/scripts/postgres.sh" url)}
export PATH=${TPU_RL_VENV:-$repo/.venv}/bin:$PATH  # TPU_RL_VENV: another install (the 3.1.7 stack's)
