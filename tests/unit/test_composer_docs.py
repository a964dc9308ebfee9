"""docs/composer.md's quickstart and what it must agree with: the example conf a user copies
(include/examples/tutorial.json) names the accounts, bucket and place the commands create."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tpu_rl_testing import REPO

pytestmark = pytest.mark.core

DOC = (REPO / "docs" / "composer.md").read_text()
TUTORIAL = json.loads((REPO / "include" / "examples" / "tutorial.json").read_text())


def quickstart_variables() -> dict[str, str]:
    """The shell variables the quickstart's first block sets (``PROJECT=... REGION=...`` on one line)."""
    line = next(line for line in DOC.splitlines() if line.startswith("PROJECT="))
    return dict(word.split("=", 1) for word in shlex.split(line))


def created_service_accounts() -> list[str]:
    return re.findall(r"^gcloud iam service-accounts create ([\w-]+) --project \$PROJECT$", DOC, re.M)


def test_the_node_account_the_docs_create_is_the_one_the_example_names():
    variables = quickstart_variables()
    node_sa = re.search(r"^NODE_SA=([\w-]+)@\$PROJECT\.iam\.gserviceaccount\.com$", DOC, re.M).group(1)
    assert node_sa in created_service_accounts()
    assert TUTORIAL["node_service_account"] == f"{node_sa}@{variables['PROJECT']}.iam.gserviceaccount.com"
    assert f"service account `{node_sa}`" in DOC  # the identities table names the same account


def test_the_example_runs_where_the_quickstart_creates_things():
    variables = quickstart_variables()
    assert TUTORIAL["project"] == variables["PROJECT"]
    assert TUTORIAL["region"] == variables["REGION"]
    assert TUTORIAL["zone"] == variables["ZONE"]
    assert TUTORIAL["gcs_bucket"] == variables["BUCKET"]


# --- section 4: connections through Secret Manager --------------------------------------------------------------


def backend_kwargs() -> dict:
    return json.loads(re.search(r"secrets-backend_kwargs=(\{[^']*\})'", DOC).group(1))


@pytest.fixture
def backend(monkeypatch):
    """The Google provider's backend as the docs configure it, its Secret Manager calls recorded (no credentials)."""
    from airflow.providers.google.cloud._internal_client.secret_manager_client import _SecretManagerClient
    from airflow.providers.google.cloud.secrets import secret_manager

    monkeypatch.setattr(secret_manager, "get_credentials_and_project_id", lambda **_: (None, "my-project"))
    asked: list[str] = []
    monkeypatch.setattr(_SecretManagerClient, "get_secret", lambda self, secret_id, **_: asked.append(secret_id))
    return secret_manager.CloudSecretManagerBackend(**backend_kwargs()), asked


def test_the_backend_looks_up_connections_only_and_under_the_granted_prefix(backend):
    from tpu_rl.config import RunConfig

    store, asked = backend
    assert store.get_variable("anything") is None and store.get_config("anything") is None
    assert asked == []  # variables and configuration never reach Secret Manager
    store.get_conn_value(RunConfig().hf_token_conn_id)
    (created,) = re.findall(r"gcloud secrets create (airflow-connections-huggingface_default) ", DOC)
    assert asked == [created]
    granted = re.search(r"""resource\.name\.startsWith\("projects/'\$PROJECT_NUMBER'/secrets/([\w-]+)"\)""", DOC)
    assert granted.group(1) == store.connections_prefix + store.sep
    assert all(name.startswith(granted.group(1)) for name in re.findall(r"gcloud secrets create ([\w-]+) ", DOC))


def test_the_smtp_example_reaches_a_port_google_cloud_leaves_open():
    from airflow.providers.smtp.hooks.smtp import SmtpHook
    from airflow.sdk import Connection

    template = re.search(r"""printf '(\{"conn_type": "smtp".*?)' "\$SMTP_PASSWORD\"""", DOC).group(1)
    connection = Connection.from_json(template.replace("%s", "secret"), conn_id="smtp_team")
    hook = SmtpHook(smtp_conn_id="smtp_team")
    hook.conn = connection
    assert connection.port in (465, 587)  # port 25 of an outside address is blocked
    assert hook.use_ssl == (connection.port == 465)  # 587 speaks STARTTLS, not implicit TLS
    assert hook.smtp_starttls
    assert connection.extra_dejson["from_email"]


# --- section 1: the deployer's roles ----------------------------------------------------------------------------

#: The permission each gcloud command of scripts/deploy_composer.py needs (Composer's "Access control with IAM",
#: permissions per API method; IAM's "Artifact Registry roles and permissions").
DEPLOY_COMMAND_PERMISSIONS = {
    ("composer", "environments", "describe"): ("composer.environments.get",),
    ("composer", "environments", "update"): ("composer.environments.update",),
    ("artifacts", "repositories", "describe"): ("artifactregistry.repositories.get",),
    ("artifacts", "repositories", "create"): (".create",),
    ("artifacts", "repositories", "add-iam-policy-binding"): (".getIamPolicy", ".setIamPolicy"),
}


def deploy_gcloud_commands() -> list[tuple[str, ...]]:
    from scripts.deploy_composer import Environment, repository_commands

    env = Environment("rl-env", "us-east5", "my-project")
    repository = repository_commands("my-project", "us-east5", "airflow-packages", "sa@p.iam.gserviceaccount.com")
    commands = [env.describe_command(), env.update_command("tpu-rl==1"), *repository.values()]
    return [tuple(command[1:4]) for command in commands]


def test_every_gcloud_command_of_the_deploy_has_its_permission_in_the_deployers_roles():
    deployer = DOC[DOC.index("**The deployer's roles.**") : DOC.index("**The reaper's roles.**")]
    for command in deploy_gcloud_commands():
        assert command in DEPLOY_COMMAND_PERMISSIONS, f"gcloud {' '.join(command)}: which permission, which role?"
        for permission in DEPLOY_COMMAND_PERMISSIONS[command]:
            assert f"`{permission}`" in deployer, permission
    for role in ("roles/composer.admin", "roles/artifactregistry.admin", "roles/storage.objectAdmin"):
        assert f"--role {role}" in deployer


# --- section 2: the environment's image; section 5: the deploy ----------------------------------------------------


def test_the_environment_is_created_with_an_airflow_version_not_a_build_composer_retires():
    (create,) = re.findall(r"^gcloud composer environments create .*?(?<!\\)$", DOC, re.M | re.S)
    image = re.search(r"--image-version (\S+)", create).group(1)
    assert re.fullmatch(r"composer-3-airflow-\d+\.\d+\.\d+", image), image
    assert "gcloud composer environments list-upgrades rl-env" in DOC
    assert "--format='value(config.softwareConfig.imageVersion)'" in DOC


def _make_variables_to_flags() -> dict[str, str]:
    """The deploy-composer target's ``$(if $(VAR),--flag ...)``: each make variable and the flag it passes."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("deploy-composer: wheel") :].split("\n\n", 1)[0]
    return dict(re.findall(r"\$\(if \$\((\w+)\),(--[\w-]+)", recipe))


def test_every_documented_deploy_command_passes_the_deploys_checks():
    """Through the Makefile to scripts/deploy_composer.py: each `make deploy-composer` of the docs names the
    environment, the repository and the virtual repository the environment installs from."""
    from scripts.deploy_composer import argument_parser, check_arguments

    flags = _make_variables_to_flags()
    commands = re.findall(r"^make deploy-composer ((?:.*\\\n)*.*)$", DOC, re.M)
    assert len(commands) >= 3
    for command in commands:
        words = shlex.split(command.replace("\\\n", " "), comments=True)
        args = []
        for name, value in (word.split("=", 1) for word in words):
            args += [flags[name]] if name in ("DRY_RUN", "REPLACE_PROGRAMS") else [flags[name], value]
        parser = argument_parser()
        check_arguments(parser, parser.parse_args(args))
