"""The Airflow configuration of docker-compose.yaml, for the local stack (scripts/airflow-stack.sh).

The stack takes its Airflow settings from the compose file's common environment rather than restating them,
so that what the end-to-end tests run on is what ``docker compose up`` would run. What differs is only where
things are (services on 127.0.0.1 ports instead of container names) and what a container alone has: the
image's pip hook, the credentials mount, and the FAB login (the local UI lets everyone in). A value with a
default (``${NAME:-default}``) is filled as docker compose fills it, from the caller's environment.

    python scripts/compose_env.py --postgres URL --redis-port N --api-url URL --jwt-secret-file PATH

prints ``export KEY=VALUE`` lines for bash to source.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yaml"
#: Settings of the image or the containers' filesystem, not of Airflow: the image's pip hook (the stack runs
#: the installed wheel), the credentials file's path in the container (the stack's connections name theirs).
CONTAINER_ONLY = {"_PIP_ADDITIONAL_REQUIREMENTS", "GOOGLE_APPLICATION_CREDENTIALS"}
#: The local UI makes everyone an admin (Airflow's simple auth manager), so the tests and a user need no login.
LOCAL_ONLY = {"AIRFLOW__CORE__AUTH_MANAGER"}
#: A value docker compose takes from its caller's environment, or else from the default after ``:-``.
_DEFAULTED = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):-(?P<default>[^${}]*)\}")


def compose_environment() -> dict[str, str]:
    """The common environment of the compose file's Airflow services (anchors resolved)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    return {key: str(value) for key, value in compose["x-airflow-common"]["environment"].items()}


def interpolated(value: str) -> str:
    """``${NAME:-default}`` as docker compose fills it (NAME's value when set and not empty, else the default);
    any other value as it is."""
    match = _DEFAULTED.fullmatch(value)
    return (os.environ.get(match["name"]) or match["default"]) if match else value


def local_environment(postgres_url: str, redis_port: int, api_url: str, jwt_secret: str) -> dict[str, str]:
    """The compose environment with each service's address replaced by the local one."""
    sql = postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    local = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql,
        # The compose file's db+postgresql:// takes SQLAlchemy's default driver, psycopg 3 from SQLAlchemy 2.1, which
        # the 3.1.7 stack's install (Composer's packages) lacks: psycopg2, as the metadata database's connection.
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + sql,
        "AIRFLOW__CELERY__BROKER_URL": f"redis://:@127.0.0.1:{redis_port}/0",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
    }
    env = {}
    for key, value in compose_environment().items():
        if key in CONTAINER_ONLY | LOCAL_ONLY:
            continue
        value = interpolated(value)
        if key not in local and ("${" in value or "postgres" in value or "redis" in value or "airflow-" in value):
            raise SystemExit(f"docker-compose.yaml sets {key}={value}: say in {__file__} what it is locally")
        env[key] = local.get(key, value)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", required=True, help="the stack's database URL (scripts/postgres.sh url DB)")
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--api-url", required=True, help="the API server's base URL")
    parser.add_argument("--jwt-secret-file", type=Path, required=True)
    args = parser.parse_args()
    secret = args.jwt_secret_file.read_text().strip()
    for key, value in local_environment(args.postgres, args.redis_port, args.api_url, secret).items():
        print(f"export {key}={shlex.quote(value)}")


if __name__ == "__main__":
    main()
