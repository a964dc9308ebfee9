"""docker-compose.yaml is consistent with the repo (no Docker engine runs here, so this is what can be
checked): each assertion is a failure a user would meet on `docker compose up`."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tpu_rl.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())  # anchors and << merge keys resolve here
SERVICES = COMPOSE["services"]
AIRFLOW = [name for name in SERVICES if name.startswith("airflow-")]
LONG_RUNNING = [name for name in SERVICES if name != "airflow-init"]
AIRFLOW_HOME = "/opt/airflow"


def _pinned_airflow() -> str:
    match = re.search(r"^apache-airflow(\[[^\]]*\])?==(\S+)$", (REPO / "requirements-dev.txt").read_text(), re.M)
    return match.group(2)


def _mounts(service: str) -> dict[str, tuple[str, bool]]:
    """Container path -> (host source, read-only), from the short volume syntax."""
    mounts = {}
    for volume in SERVICES[service].get("volumes", []):
        # The source may hold ${A:-${B}/x}: split on the first ':' outside ${...}.
        parts = re.findall(r"(?:\$\{(?:[^{}]|\$\{[^}]*\})*\}|[^:])+", volume)
        mounts[parts[1]] = (parts[0], parts[2:] == ["ro"])
    return mounts


def _env(service: str) -> dict[str, str]:
    return SERVICES[service].get("environment", {})


def _env_example() -> dict[str, str]:
    """KEY=VALUE lines of .env.example, commented-out examples included (docker compose strips quotes)."""
    values = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        match = re.match(r"^#?\s*([A-Z_][A-Z0-9_]*)=(.*)$", line)
        if match:
            values[match.group(1)] = match.group(2).strip().strip("'")
    return values


def _under_read_only_mount(service: str, path: str) -> bool:
    return any(path.startswith(target.rstrip("/") + "/") and ro for target, (_, ro) in _mounts(service).items())


def test_the_official_services_are_all_there():
    expected = {
        "postgres",
        "redis",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-worker",
        "airflow-triggerer",
        "airflow-init",
    }
    assert expected <= set(SERVICES), (
        f"missing: {expected - set(SERVICES)} (no triggerer = deferred tasks never resume)"
    )


@pytest.mark.parametrize("service", AIRFLOW)
def test_every_airflow_service_installs_the_package_from_its_wheel(service):
    """A missing mount is 'DAG not found' in the UI, or 'No module named tpu_rl' in one component only (the
    triggerer's: every deferred task fails). As on Cloud Composer 3, the package is no plugins folder's."""
    mounts = _mounts(service)
    for folder in ("dags", "include"):
        assert mounts.get(f"{AIRFLOW_HOME}/{folder}", (None,))[0] == f"./{folder}", f"{service}: ./{folder} not mounted"
    assert f"{AIRFLOW_HOME}/plugins" not in mounts
    env = _env(service)
    assert env.get("AIRFLOW__CORE__DAGS_FOLDER", f"{AIRFLOW_HOME}/dags") == f"{AIRFLOW_HOME}/dags"
    if service == "airflow-init":  # the official file's: it only migrates the database, and installs nothing
        assert env["_PIP_ADDITIONAL_REQUIREMENTS"] == ""
        return
    pip = env["_PIP_ADDITIONAL_REQUIREMENTS"].split()
    assert mounts[pip[pip.index("--find-links") + 1]] == ("./dist", True)
    requirement = (REPO / "requirements.txt").read_text().split()[-1]
    assert requirement.startswith("tpu-rl==") and mounts[pip[pip.index("-r") + 1]] == ("./requirements.txt", True)


def test_one_image_at_the_pinned_airflow_version():
    """Version drift: the stack would run an Airflow the tests never ran."""
    version = _pinned_airflow()
    assert {SERVICES[s]["image"] for s in AIRFLOW} == {f"apache/airflow:{version}"}
    # _PIP_ADDITIONAL_REQUIREMENTS installs requirements.txt and may not move Airflow off the image's version.
    pip = _env("airflow-worker")["_PIP_ADDITIONAL_REQUIREMENTS"].split()
    assert f"apache-airflow=={version}" in pip
    requirements = pip[pip.index("-r") + 1]
    assert _mounts("airflow-worker")[requirements] == ("./requirements.txt", True)


def test_celery_with_redis_broker_and_postgres_backends():
    env = _env("airflow-scheduler")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    broker = urlsplit(env["AIRFLOW__CELERY__BROKER_URL"])
    assert (broker.scheme, broker.hostname) == ("redis", "redis")
    pg = _env("postgres")
    for key, scheme in (
        ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql+psycopg2"),
        ("AIRFLOW__CELERY__RESULT_BACKEND", "db+postgresql"),
    ):
        url = urlsplit(env[key])
        # Wrong credentials or database name: airflow-init fails its migration and nothing starts.
        assert (url.scheme, url.hostname, url.username, url.password, url.path.lstrip("/")) == (
            scheme,
            "postgres",
            pg["POSTGRES_USER"],
            pg["POSTGRES_PASSWORD"],
            pg["POSTGRES_DB"],
        ), key


def test_every_component_shares_the_configuration():
    """Same executor, database, broker and JWT secret everywhere: a component with a different JWT secret
    rejects the task tokens the scheduler signs."""
    keys = (
        "AIRFLOW__CORE__EXECUTOR",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CELERY__BROKER_URL",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    )
    assert len({tuple(_env(s)[k] for k in keys) for s in AIRFLOW}) == 1
    api = urlsplit(_env("airflow-worker")["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api.hostname == "airflow-apiserver" and api.path == "/execution/"


@pytest.mark.parametrize("service", LONG_RUNNING)
def test_healthchecks(service):
    """depends_on service_healthy waits on these; without one, a dependent starts too early or never."""
    assert SERVICES[service]["healthcheck"]["test"]


def test_api_server_health_is_the_v2_version_endpoint_on_the_published_port():
    test = SERVICES["airflow-apiserver"]["healthcheck"]["test"]
    url = urlsplit(next(arg for arg in test if arg.startswith("http")))
    assert url.path == "/api/v2/version"
    assert f"{url.port}:{url.port}" in SERVICES["airflow-apiserver"]["ports"]


@pytest.mark.parametrize("service", [s for s in AIRFLOW if s != "airflow-init"])
def test_components_wait_for_a_migrated_database(service):
    depends = SERVICES[service]["depends_on"]
    assert depends["airflow-init"]["condition"] == "service_completed_successfully"
    assert depends["postgres"]["condition"] == depends["redis"]["condition"] == "service_healthy"


def test_init_migrates_and_workers_wait_for_the_api_server():
    init = SERVICES["airflow-init"]
    assert init["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert _env("airflow-init")["_AIRFLOW_DB_MIGRATE"] == "true"
    assert "/entrypoint airflow" in init["command"][-1], "only the image entrypoint runs the migration"
    # Tasks report to the execution API: a worker started before it would fail its first tasks.
    assert SERVICES["airflow-worker"]["depends_on"]["airflow-apiserver"]["condition"] == "service_healthy"


def test_repo_paths_exist():
    """A missing source is created by Docker as an empty root-owned directory: the DAG silently vanishes."""
    for service in SERVICES:
        for source, _ in _mounts(service).values():
            if source.startswith("./") and source != "./logs":  # logs/ is output, created by airflow-init
                assert (REPO / source).exists(), f"{service}: {source} does not exist in the repo"


def test_env_file_is_optional_uncommitted_and_has_a_template():
    assert SERVICES["airflow-worker"]["env_file"] == [{"path": ".env", "required": False}]
    assert (REPO / ".env.example").is_file()
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert ignored.returncode == 0, ".env (the Hugging Face token) is not in .gitignore"


def test_required_variables_are_in_the_template():
    """Each ${VAR:?...} stops `docker compose up`; the template must name every one of them."""
    text = (REPO / "docker-compose.yaml").read_text()
    required = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):?\?", text))
    assert required and required <= set(_env_example())


def test_the_hugging_face_connection_is_the_one_the_dag_reads():
    conn_id = next(f.default for f in dataclasses.fields(RunConfig) if f.name == "hf_token_conn_id")
    value = _env_example()[f"AIRFLOW_CONN_{conn_id.upper()}"]
    assert json.loads(value)["password"], "the DAG reads the token from the connection's password"


def test_credentials_are_mounted_read_only_where_the_env_points():
    env = _env("airflow-worker")
    assert _under_read_only_mount("airflow-worker", env["GOOGLE_APPLICATION_CREDENTIALS"])
    kube = json.loads(_env_example()["AIRFLOW_CONN_TPU_CLUSTER"])
    assert kube["conn_type"] == "kubernetes"
    assert _under_read_only_mount("airflow-worker", kube["extra"]["kube_config_path"])
    # Secrets stay out of the file itself.
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", (REPO / "docker-compose.yaml").read_text())


def test_the_local_stack_runs_with_the_compose_files_airflow_settings():
    """scripts/airflow-stack.sh takes its Airflow settings from this file (scripts/compose_env.py): what the
    end-to-end tests ran on is what `docker compose up` runs, but for where the services are."""
    from scripts.compose_env import CONTAINER_ONLY, LOCAL_ONLY, compose_environment, local_environment

    local = local_environment("postgresql+psycopg2://postgres@127.0.0.1:5/db", 6, "http://127.0.0.1:7", "s")
    compose = compose_environment()
    assert set(local) == set(compose) - CONTAINER_ONLY - LOCAL_ONLY
    assert local["AIRFLOW__CORE__EXECUTOR"] == compose["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert local["AIRFLOW__CELERY__BROKER_URL"] == "redis://:@127.0.0.1:6/0"
    assert local["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+postgresql+psycopg2://postgres@127.0.0.1:5/db"
    addresses = {k for k, v in compose.items() if any(part in v for part in ("postgres", "redis", "${", "airflow-"))}
    same = set(local) - addresses
    assert same and all(local[k] == compose[k] for k in same)
    stack = (REPO / "scripts" / "airflow-stack.sh").read_text()
    for component in ("redis-server", "celery worker", "scheduler-2", "triggerer-2", "dag-processor", "api-server"):
        assert component in stack


def test_the_environment_name_is_the_callers_or_local_on_the_stack_as_in_docker_compose(monkeypatch):
    """The name the runs mark what they create with (docs/how-to/programs.md, "Two Airflow environments"): docker
    compose fills ${TPU_RL_ENVIRONMENT:-local} from .env or the shell, scripts/airflow-stack.sh from its caller's
    environment."""
    from scripts.compose_env import compose_environment, local_environment

    assert compose_environment()["TPU_RL_ENVIRONMENT"] == "${TPU_RL_ENVIRONMENT:-local}"
    addresses = ("postgresql+psycopg2://postgres@127.0.0.1:5/db", 6, "http://127.0.0.1:7", "s")
    monkeypatch.delenv("TPU_RL_ENVIRONMENT", raising=False)
    assert local_environment(*addresses)["TPU_RL_ENVIRONMENT"] == "local"
    monkeypatch.setenv("TPU_RL_ENVIRONMENT", "ci-stack")
    assert local_environment(*addresses)["TPU_RL_ENVIRONMENT"] == "ci-stack"
