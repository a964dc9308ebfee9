"""The Cloud Composer guide (docs/getting-started/composer.md) and the deploy reference (docs/reference/deploy.md),
and what they must agree with: the example conf a user copies (include/examples/tutorial.json) names the accounts,
bucket and place the commands create; the run it shows takes the reservation; its cost is the tutorial slice's at
the default price; the deploy's own checks accept every documented deploy command."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tpu_rl_testing import REPO

pytestmark = pytest.mark.core

DOCS = REPO / "docs"
DOC = (DOCS / "getting-started" / "composer.md").read_text()
DEPLOY = (DOCS / "reference" / "deploy.md").read_text()
TUTORIAL = json.loads((REPO / "include" / "examples" / "tutorial.json").read_text())


def section(page: str, heading: str) -> str:
    """The text under a page's heading, up to the next heading of its level or above (``#`` lines inside fenced
    code are shell comments, not headings)."""
    level, lines, fenced = 0, [], False
    for line in page.splitlines():
        fenced ^= line.lstrip().startswith("```")
        heading_match = None if fenced else re.match(r"(#+) (.*)", line)
        if heading_match and level and len(heading_match.group(1)) <= level:
            break
        if heading_match and heading_match.group(2) == heading:
            level = len(heading_match.group(1))
        elif level:
            lines.append(line)
    assert level, f"no heading {heading!r}"
    return "\n".join(lines)


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


# --- step 4: connections through Secret Manager --------------------------------------------------------------


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


# --- the deploy reference: the deployer's roles ----------------------------------------------------------------

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
    deployer = section(DEPLOY, "The deployer's roles")
    for command in deploy_gcloud_commands():
        assert command in DEPLOY_COMMAND_PERMISSIONS, f"gcloud {' '.join(command)}: which permission, which role?"
        for permission in DEPLOY_COMMAND_PERMISSIONS[command]:
            assert f"`{permission}`" in deployer, permission
    for role in ("roles/composer.admin", "roles/artifactregistry.admin", "roles/storage.objectAdmin"):
        assert f"--role {role}" in deployer


# --- step 2: the environment's image; step 5: the deploy --------------------------------------------------------


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


def documented_deploy_commands(page: str) -> list[dict[str, str]]:
    """Each ``make deploy-composer`` of a page (a line of its own, continued by backslashes): its make variables."""
    commands = re.findall(r"^make deploy-composer ((?:.*\\\n)*.*)$", page, re.M)
    return [dict(word.split("=", 1) for word in shlex.split(c.replace("\\\n", " "), comments=True)) for c in commands]


def test_the_guide_deploys_after_a_dry_run_of_the_same_deploy_with_the_names_it_set():
    dry_run, deploy = documented_deploy_commands(section(DOC, "5. Deploy the package"))
    assert dry_run.pop("DRY_RUN") == "1"
    assert dry_run == deploy  # the dry run shows this very deploy
    defined = quickstart_variables()
    for value in deploy.values():
        assert value.removeprefix("$") in defined or not value.startswith("$"), f"{value}: set where?"


def test_every_documented_deploy_command_passes_the_deploys_checks():
    """Through the Makefile to scripts/deploy_composer.py: each `make deploy-composer` of the documentation names
    the environment, the repository and the virtual repository the environment installs from."""
    from scripts.deploy_composer import argument_parser, check_arguments

    flags = _make_variables_to_flags()
    pages = sorted(DOCS.rglob("*.md"))
    commands = [command for page in pages for command in documented_deploy_commands(page.read_text())]
    assert len(commands) >= len(documented_deploy_commands(DOC)) == 2
    for command in commands:
        args = []
        for name, value in command.items():
            args += [flags[name]] if name in ("DRY_RUN", "REPLACE_PROGRAMS") else [flags[name], value]
        parser = argument_parser()
        check_arguments(parser, parser.parse_args(args))


# --- step 6: the run, on a reservation, and what it costs --------------------------------------------------------


def example_conf() -> dict:
    (block,) = re.findall(r"^```json\n(.*?)^```$", DOC, re.M | re.S)
    return json.loads(block)


def test_the_example_run_is_the_tutorials_on_the_reservation_it_names():
    from tpu_rl import gke
    from tpu_rl.config import RunConfig
    from tpu_rl.run import RunIdentity

    conf = example_conf()
    assert TUTORIAL.items() <= conf.items()  # where the steps created things
    config = RunConfig.from_params(conf)  # validate_config's checks
    affinity = gke.tpu_node_pool(config, RunIdentity("maxtext_rl_tpu", "manual"), 0)["config"]["reservation_affinity"]
    assert affinity["consume_reservation_type"] == "SPECIFIC_RESERVATION"
    assert affinity["values"] == [f"projects/{conf['project']}/reservations/{conf['reservation']}"]


def test_the_cost_the_guide_gives_is_the_tutorial_slice_at_the_default_price():
    from tpu_rl.config import RunConfig

    config = RunConfig.from_params(TUTORIAL)
    step = " ".join(section(DOC, "6. Check, then run").split())
    chips = int(re.search(r"The tutorial's slice is (\d+) chips", step).group(1))
    price = float(re.search(r"list price of \$(\d+\.\d\d) per chip-hour", step).group(1))
    hourly = int(re.search(r"about \$(\d+) for each hour", step).group(1))
    assert (chips, price) == (config.chips, config.tpu_price_per_chip_hour)
    assert hourly == round(chips * price)
    assert config.tpu_pools_per_run and "`per_run`" in step  # the slice exists only around training
