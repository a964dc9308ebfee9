"""scripts/deploy_composer.py against real servers: a GCS emulator for the environment's bucket, pypiserver for the
team's Artifact Registry Python repository and for PyPI, and a virtual repository over both that serves a version
from the team's repository first, as Artifact Registry's does. The wheel reaches the repository and the
environment's pip configuration names the virtual repository alone; the DAG files and programs reach dags/ (what
Composer gives its DAG processor), nothing of other teams is touched, a programs file edited in the bucket is never
lost, and a deploy killed half-way leaves nothing a later deploy does not own. The uploaded wheel installs, through
that pip configuration, into a virtualenv that holds the Composer image's packages, adding tpu-rl alone (the team's,
though PyPI has a tpu-rl of the same version that pip would prefer), which then imports every trigger. A rollback
from another checkout finds its wheel in the repository and points the environment at it."""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_rl_testing import WHEEL_BUILD_INPUTS, checkout_copy, make_wheel

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("deploy_composer", REPO / "scripts/deploy_composer.py")
deploy = sys.modules["deploy_composer"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deploy)

PROGRAMS = "dags/maxtext_rl_tpu_programs.yaml"
# What earlier deploys of this package left: a DAG file (in its manifest), the package and its plugin in
# plugins/ (before the package was a distribution), an example under data/tpu_rl/.
STALE = [
    "dags/old_dag.py",
    "plugins/tpu_rl/removed.py",
    "plugins/tpu_rl/config.py",
    "plugins/tpu_rl_run_view.py",
    "data/tpu_rl/include/examples/old.json",
]
# Objects the deploy must leave alone in a shared environment: Composer's liveness DAG, other teams' DAGs,
# plugins and data.
FOREIGN = [
    "dags/airflow_monitoring.py",
    "dags/other_team_dag.py",
    "plugins/other_team/hooks.py",
    "data/run-output/metrics.json",
    "data/include/other_team.json",
]
#: Another team's setting in the environment's pip configuration, beside the extra index earlier deploys wrote.
OTHER_PIP_CONF = "[global]\ntimeout = 60\n"
OTHER_TEAMS_INDEX = "https://europe-python.pkg.dev/other/team/simple/"
#: A deploy always names its environment, which installs the package the DAG files import.
ENVIRONMENT = ("--env", "rl-env", "--location", "us-east5", "--project", "p1")


def test_another_index_in_the_environments_pip_conf_stops_the_deploy_before_any_change(
    gcs_client, composer_bucket, python_repository, virtual_repository, monkeypatch, tmp_path
):
    """pip orders no indexes: beside the virtual repository, another team's index could serve a tpu-rl of its own."""
    url, packages = python_repository
    conf = f"[global]\nextra-index-url = {OTHER_TEAMS_INDEX}\n"
    composer_bucket.blob(deploy.PIP_CONF).upload_from_string(conf)
    log = _fake_gcloud(tmp_path, composer_bucket.name, {})
    args = [*ENVIRONMENT, "--repository", "rl-packages", "--repository-url", url]

    with pytest.raises(SystemExit, match=f"extra-index-url = {OTHER_TEAMS_INDEX}: .* upstream of the virtual"):
        _main_with_path(monkeypatch, tmp_path, *args, "--virtual-repository", "rl-index")
    assert log.read_text().splitlines() == [DESCRIBE_ENVIRONMENT]
    assert not list(packages.iterdir()) and composer_bucket.blob(deploy.PIP_CONF).download_as_text() == conf


def test_a_virtual_repository_that_serves_pypi_first_stops_the_deploy_before_any_change(
    gcs_client, composer_bucket, python_repository, monkeypatch, tmp_path
):
    url, packages = python_repository
    pypi_first = {
        "mode": "VIRTUAL_REPOSITORY",
        "virtualRepositoryConfig": {
            "upstreamPolicies": [
                {"id": "a", "repository": "projects/p1/locations/us-east5/repositories/rl-packages", "priority": 1},
                {"id": "b", "repository": "projects/p1/locations/us-east5/repositories/pypi", "priority": 5},
            ]
        },
    }
    log = _fake_gcloud(tmp_path, composer_bucket.name, {}, described={"rl-index": pypi_first})
    args = [*ENVIRONMENT, "--repository", "rl-packages", "--repository-url", url, "--virtual-repository", "rl-index"]

    with pytest.raises(SystemExit, match="rl-index serves projects/p1/locations/us-east5/repositories/pypi at a"):
        _main_with_path(monkeypatch, tmp_path, *args)
    assert [call.split()[:3] for call in log.read_text().splitlines()] == [
        ["composer", "environments", "describe"],
        ["artifacts", "repositories", "describe"],
    ]
    assert not list(packages.iterdir()) and not composer_bucket.blob(deploy.PIP_CONF).exists()


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of what the deploy reads, with a programs file and the caches a real checkout has."""
    repo = tmp_path / "repo"
    for folder in ("dags", "include", "tests"):
        shutil.copytree(REPO / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(repo / "include/examples/programs.yaml", repo / "include/programs.yaml")
    (repo / "dags/__pycache__").mkdir()
    (repo / "dags/__pycache__/maxtext_rl_tpu.cpython-311.pyc").write_bytes(b"\x00bytecode")
    return repo


def _prefill(bucket) -> None:
    for name in STALE + FOREIGN:
        bucket.blob(name).upload_from_string(b"# left over from an earlier deploy\n")
    bucket.blob("data/tpu_rl/deployed.json").upload_from_string(
        json.dumps(["dags/old_dag.py", "plugins/tpu_rl_run_view.py"])
    )  # an earlier deploy's manifest


def _names(client, bucket) -> set[str]:
    return {blob.name for blob in client.list_blobs(bucket)}


def _expected(repo: Path) -> set[str]:
    """Written from Composer's folders, not from the script: the DAG files, the programs beside them, the manifest."""
    return {
        "dags/maxtext_rl_tpu.py",
        "dags/maxtext_rl_tpu_programs.py",
        "dags/maxtext_rl_tpu_reaper.py",
        PROGRAMS,
        "data/tpu_rl/deployed.json",
    }


def test_deploy_gives_the_layout_composer_serves(gcs_client, composer_bucket, checkout, tmp_path):
    _prefill(composer_bucket)

    result = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout), deployed_version="1.0.0")

    assert _names(gcs_client, composer_bucket) == _expected(checkout) | set(FOREIGN)
    assert sorted(result.deleted) == sorted(STALE)
    manifest = json.loads(composer_bucket.blob("data/tpu_rl/deployed.json").download_as_text())
    assert manifest["version"] == "1.0.0" and set(manifest["objects"]) == _expected(checkout) - {
        "data/tpu_rl/deployed.json"
    }

    # What Composer's DAG processor sees: dags/ alone parses into the package's DAGs and the programs'.
    dags = tmp_path / "home-airflow-gcs" / "dags"
    for name in _names(gcs_client, composer_bucket):
        if name.startswith("dags/") and name not in {
            f"dags/{n}" for n in ("airflow_monitoring.py", "other_team_dag.py")
        }:
            target = dags.parent / name
            target.parent.mkdir(parents=True, exist_ok=True)
            composer_bucket.blob(name).download_to_filename(str(target))
    probe = (
        "import sys\nfrom airflow.dag_processing.dagbag import DagBag\nbag = DagBag(dag_folder=sys.argv[1])\n"
        "assert not bag.import_errors, bag.import_errors\nprint(sorted(bag.dag_ids))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TPU_RL_PROGRAMS"}
    out = subprocess.run([sys.executable, "-c", probe, str(dags)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "maxtext_rl_tpu_daily" in out.stdout and "'maxtext_rl_tpu'" in out.stdout


def test_second_deploy_uploads_nothing_and_a_change_uploads_one_file(gcs_client, composer_bucket, checkout):
    first = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    second = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    assert (second.uploaded, second.deleted) == ([], [])
    assert len(second.unchanged) == len(first.uploaded) == 4

    dag = checkout / "dags/maxtext_rl_tpu.py"
    dag.write_text(dag.read_text() + "\n# edited\n")
    third = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    assert (third.uploaded, third.deleted) == (["dags/maxtext_rl_tpu.py"], [])


def test_a_programs_file_edited_in_the_bucket_is_kept_and_reported(gcs_client, composer_bucket, checkout):
    deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    edited = b"programs: {}\n# edited in the console\n"
    composer_bucket.blob(PROGRAMS).upload_from_string(edited)

    kept = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    assert PROGRAMS in kept.kept and "edited in the bucket" in kept.kept[PROGRAMS]
    assert PROGRAMS not in kept.uploaded and composer_bucket.blob(PROGRAMS).download_as_bytes() == edited
    (checkout / "include/programs.yaml").unlink()  # gone from the repository: still not deleted without a word
    still = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    assert PROGRAMS in still.kept and PROGRAMS not in still.deleted

    replaced = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout), replace_programs=True)
    assert PROGRAMS in replaced.deleted and PROGRAMS not in _names(gcs_client, composer_bucket)


def test_a_programs_file_someone_else_wrote_is_never_taken_over(gcs_client, composer_bucket, checkout):
    composer_bucket.blob(PROGRAMS).upload_from_string(b"programs: {}\n")

    result = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))

    assert "was not written by a deploy" in result.kept[PROGRAMS]
    assert composer_bucket.blob(PROGRAMS).download_as_bytes() == b"programs: {}\n"


def test_a_deploy_killed_half_way_leaves_nothing_a_later_deploy_does_not_own(
    gcs_client, composer_bucket, checkout, monkeypatch
):
    from google.cloud.storage import Blob

    (checkout / "dags/new_dag.py").write_text("# a DAG file added in this change\n")
    upload = Blob.upload_from_string

    def killed_after_the_new_file(blob, data, *args, **kwargs):
        upload(blob, data, *args, **kwargs)
        if blob.name == "dags/new_dag.py":
            raise KeyboardInterrupt("the deploy is killed")

    monkeypatch.setattr(Blob, "upload_from_string", killed_after_the_new_file)
    with pytest.raises(KeyboardInterrupt):
        deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    monkeypatch.setattr(Blob, "upload_from_string", upload)
    assert "dags/new_dag.py" in _names(gcs_client, composer_bucket)

    (checkout / "dags/new_dag.py").unlink()  # the change is reverted before the next deploy
    result = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    assert "dags/new_dag.py" in result.deleted and "dags/new_dag.py" not in _names(gcs_client, composer_bucket)


def _main_with_path(monkeypatch, tmp_path, *args: str) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert deploy.main(list(args)) == 0


DESCRIBE_ENVIRONMENT = (
    "composer environments describe rl-env --location us-east5 --project p1 "
    "--format=json(config.dagGcsPrefix,config.nodeConfig.serviceAccount,config.softwareConfig.pypiPackages)"
)


def _fake_gcloud(directory: Path, bucket: str, pypi: dict[str, str], described: dict[str, dict] | None = None) -> Path:
    """A stand-in for the gcloud CLI only (the bucket is the GCS emulator, the repositories pypiserver and the
    virtual index): it answers the describes (a repository exists only when ``described`` gives it), keeps the
    upstream policy file a create reads (``policy.json``) and logs every call."""
    log = directory / "gcloud.log"
    repositories = "".join(
        f"  'artifacts repositories describe {name}') echo '{json.dumps(body)}';;\n"
        for name, body in (described or {}).items()
    )
    describe = json.dumps(
        {
            "config": {
                "dagGcsPrefix": f"gs://{bucket}/dags",
                "softwareConfig": {"pypiPackages": pypi},
                "nodeConfig": {"serviceAccount": "composer-rl@p1.iam.gserviceaccount.com"},
            }
        }
    )
    script = directory / "gcloud"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\nfor arg; do case "$arg" in --upstream-policy-file=*) '
        f'cp "${{arg#*=}}" {directory}/policy.json;; esac; done\ncase "$1 $2 $3 $4" in\n'
        f"  'composer environments describe rl-env') echo '{describe}';;\n{repositories}"
        "  'artifacts repositories describe '*) exit 1;;\nesac\n"
    )
    script.chmod(0o755)
    return log


def test_deploy_uploads_the_wheel_configures_pip_then_updates_the_package_then_the_dags(
    gcs_client, composer_bucket, python_repository, virtual_repository, monkeypatch, capsys, tmp_path
):
    url, packages = python_repository
    # What earlier deploys left: the team's repository as an extra index beside PyPI, and another team's setting.
    composer_bucket.blob(deploy.PIP_CONF).upload_from_string(f"{OTHER_PIP_CONF}extra-index-url = {url}simple/\n")
    log = _fake_gcloud(tmp_path, composer_bucket.name, {"other-teams-package": "==1.2"})
    args = [*ENVIRONMENT, "--repository", "rl-packages", "--repository-url", url]
    args += ["--virtual-repository", "rl-index", "--virtual-repository-url", virtual_repository]

    _main_with_path(monkeypatch, tmp_path, *args)

    out = capsys.readouterr().out
    calls = log.read_text().splitlines()
    version = deploy.version()
    where = "--location us-east5 --project p1"
    reader = "--member=serviceAccount:composer-rl@p1.iam.gserviceaccount.com --role=roles/artifactregistry.reader"
    description = "--description=Python packages of Airflow environments (tpu-rl)"
    policy_file = re.search(r"--upstream-policy-file=(\S+)", "\n".join(calls)).group(1)
    assert calls == [
        DESCRIBE_ENVIRONMENT,
        f"artifacts repositories describe rl-index {where} --format=json",
        f"artifacts repositories describe rl-packages {where} --format=json",
        f"artifacts repositories create rl-packages --repository-format=python {where} {description}",
        f"artifacts repositories add-iam-policy-binding rl-packages {where} {reader}",
        f"artifacts repositories describe pypi {where} --format=json",
        "artifacts repositories create pypi --repository-format=python --mode=remote-repository "
        f"--remote-python-repo=PYPI {where} {description}",
        "artifacts repositories create rl-index --repository-format=python --mode=virtual-repository "
        f"--upstream-policy-file={policy_file} {where} {description}",
        f"artifacts repositories add-iam-policy-binding rl-index {where} {reader}",
        f"composer environments update rl-env {where} --update-pypi-package=tpu-rl=={version}",
    ]
    # The virtual repository serves a version from the team's repository before PyPI's remote.
    policies = json.loads((tmp_path / "policy.json").read_text())
    priority = {policy["repository"].rsplit("/", 1)[1]: policy["priority"] for policy in policies}
    assert priority["rl-packages"] > priority["pypi"] and set(priority) == {"rl-packages", "pypi"}
    assert all(policy["repository"].startswith("projects/p1/locations/us-east5/repositories/") for policy in policies)
    wheel = deploy.wheel_path()
    assert (packages / wheel.name).read_bytes() == wheel.read_bytes()
    assert deploy.published_sha256(url, wheel.name, None) == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # pip.conf names the virtual repository alone; the extra index is gone, the other team's setting stays.
    conf = configparser.ConfigParser()
    conf.read_string(composer_bucket.blob(deploy.PIP_CONF).download_as_text())
    assert dict(conf["global"]) == {"index-url": f"{virtual_repository}simple/", "timeout": "60"}
    # The DAG files go after the environment installs the package they import.
    assert out.index("--update-pypi-package") < out.index(f"upload gs://{composer_bucket.name}/dags/maxtext_rl_tpu.py")

    # Deployed again: the same wheel is not uploaded twice; a changed one under the same version is refused.
    _main_with_path(monkeypatch, tmp_path, *args)
    assert "already has" in capsys.readouterr().out
    other = tmp_path / "other" / wheel.name
    other.parent.mkdir()
    other.write_bytes(wheel.read_bytes() + b"\0")
    monkeypatch.setattr(deploy, "wheel_path", lambda repo=REPO: other)
    with pytest.raises(SystemExit, match="Bump __version__"):
        deploy.main(args)


#: What a deploy reads in a checkout: the wheel's build inputs, the deploy script, the DAG files and programs.
CHECKOUT = (*WHEEL_BUILD_INPUTS, "dags", "include")


def _deploy_checkout(checkout: Path, umask: int, args: list[str], monkeypatch, tmp_path) -> None:
    """``make deploy-composer`` in ``checkout``: its wheel (``make wheel`` under ``umask``), then its
    scripts/deploy_composer.py, which reads that checkout."""
    make_wheel(checkout, umask)
    name = f"deploy_composer_{checkout.name.replace('.', '_').replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, checkout / "scripts/deploy_composer.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert module.main(args) == 0


def test_a_rollback_from_another_checkout_points_the_environment_at_the_wheel_already_published(
    gcs_client, composer_bucket, python_repository, virtual_repository, monkeypatch, capsys, tmp_path
):
    """9.0.0 then 9.1.0 are deployed; ``git checkout v9.0.0 && make deploy-composer ENV=...`` in another checkout,
    made and built under another umask, builds 9.0.0's very wheel: nothing is uploaded, the environment is pointed
    at 9.0.0 again and dags/ holds 9.0.0's DAG files. 9.0.0 built from other sources is still refused."""
    url, packages = python_repository
    log = _fake_gcloud(tmp_path, composer_bucket.name, {"other-teams-package": "==1.2"})
    args = [*ENVIRONMENT, "--repository-url", url, "--virtual-repository-url", virtual_repository]

    def deploy_from(checkout: Path, umask: int) -> None:
        _deploy_checkout(checkout, umask, args, monkeypatch, tmp_path)

    deploy_from(checkout_copy(tmp_path / "v9.0.0", CHECKOUT, 0o022, "9.0.0"), 0o022)
    newer = checkout_copy(tmp_path / "v9.1.0", CHECKOUT, 0o022, "9.1.0")
    with (newer / "dags/maxtext_rl_tpu.py").open("a") as dag:
        dag.write("# changed in 9.1.0\n")
    deploy_from(newer, 0o022)
    published = {path.name: path.stat().st_mtime_ns for path in packages.iterdir()}
    assert set(published) == {"tpu_rl-9.0.0-py3-none-any.whl", "tpu_rl-9.1.0-py3-none-any.whl"}
    calls = len(log.read_text().splitlines())
    capsys.readouterr()

    rollback = checkout_copy(tmp_path / "rollback", CHECKOUT, 0o077, "9.0.0")
    deploy_from(rollback, 0o077)

    assert "already has tpu_rl-9.0.0-py3-none-any.whl" in capsys.readouterr().out
    assert {path.name: path.stat().st_mtime_ns for path in packages.iterdir()} == published
    assert log.read_text().splitlines()[calls:] == [
        "composer environments describe rl-env --location us-east5 --project p1 "
        "--format=json(config.dagGcsPrefix,config.nodeConfig.serviceAccount,config.softwareConfig.pypiPackages)",
        "composer environments update rl-env --location us-east5 --project p1 --update-pypi-package=tpu-rl==9.0.0",
    ]
    dag = composer_bucket.blob("dags/maxtext_rl_tpu.py").download_as_bytes()
    assert dag == (rollback / "dags/maxtext_rl_tpu.py").read_bytes()
    assert json.loads(composer_bucket.blob(deploy.MANIFEST).download_as_bytes())["version"] == "9.0.0"

    # The same version from other sources: refused before the environment changes.
    calls = len(log.read_text().splitlines())
    with (rollback / "src/tpu_rl/__init__.py").open("a") as init:
        init.write("# not what 9.0.0 was built from\n")
    with pytest.raises(SystemExit, match="Bump __version__"):
        deploy_from(rollback, 0o077)
    assert len(log.read_text().splitlines()) == calls + 1  # the describe alone
    assert {path.name: path.stat().st_mtime_ns for path in packages.iterdir()} == published


def test_dry_run_prints_every_step_and_changes_nothing(
    gcs_client, composer_bucket, python_repository, monkeypatch, capsys, tmp_path
):
    url, packages = python_repository
    _prefill(composer_bucket)
    before = {b.name: b.md5_hash for b in gcs_client.list_blobs(composer_bucket)}
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud: a dry run given the bucket needs none

    deploy.main(
        [
            "--env",
            "rl-env",
            "--location",
            "us-east5",
            "--project",
            "p1",
            "--repository",
            "rl-packages",
            "--virtual-repository",
            "rl-index",
            "--bucket",
            composer_bucket.name,
            "--service-account",
            "sa@p1.iam.gserviceaccount.com",
            "--dry-run",
        ]
    )

    out = capsys.readouterr().out
    for step in (
        "would run: gcloud artifacts repositories create rl-packages --repository-format=python",
        "would run: gcloud artifacts repositories add-iam-policy-binding rl-packages",
        "--role=roles/artifactregistry.reader",
        "would run: gcloud artifacts repositories create pypi --repository-format=python --mode=remote-repository "
        "--remote-python-repo=PYPI",
        "virtual repository rl-index: rl-packages (priority 100) before pypi (priority 1)",
        '"repository": "projects/p1/locations/us-east5/repositories/rl-packages",\n  "priority": 100',
        "would run: gcloud artifacts repositories create rl-index --repository-format=python "
        "--mode=virtual-repository --upstream-policy-file=",
        "would run: gcloud artifacts repositories add-iam-policy-binding rl-index",
        "twine upload --non-interactive --repository-url https://us-east5-python.pkg.dev/p1/rl-packages/",
        f"would write gs://{composer_bucket.name}/config/pip/pip.conf",
        "index-url = https://us-east5-python.pkg.dev/p1/rl-index/simple/",
        f"--update-pypi-package=tpu-rl=={deploy.version()}",
        f"would upload gs://{composer_bucket.name}/dags/maxtext_rl_tpu.py",
        f"would delete gs://{composer_bucket.name}/plugins/tpu_rl/removed.py",
    ):
        assert step in out, step
    assert {b.name: b.md5_hash for b in gcs_client.list_blobs(composer_bucket)} == before
    assert not list(packages.iterdir())


def test_the_uploaded_wheel_installs_with_the_composer_pins_and_imports_every_trigger(
    gcs_client, composer_bucket, python_repository, hostile_on_pypi, virtual_repository, monkeypatch, tmp_path
):
    """As Composer installs a PyPI package into its image: pip with the environment's pip.conf (the virtual
    repository alone) installs tpu-rl==VERSION, with the image's pins, into an environment that has
    composer-3-airflow-3.1.7's packages (constraints-af31.txt); it adds tpu-rl and changes nothing else, and the
    result imports every trigger of the package from its serialised classpath. PyPI has a tpu-rl of the same
    version with a wheel tag pip prefers: the team's is installed."""
    url, _ = python_repository
    _fake_gcloud(tmp_path, composer_bucket.name, {})
    args = [*ENVIRONMENT, "--bucket", composer_bucket.name, "--repository-url", url]
    _main_with_path(monkeypatch, tmp_path, *args, "--virtual-repository-url", virtual_repository)
    pip_conf = tmp_path / "pip.conf"
    composer_bucket.blob(deploy.PIP_CONF).download_to_filename(str(pip_conf))

    # The image, made by uv from its cache (the image's build is Composer's, not what this test proves; pip would
    # take minutes of CPU to fetch, install and compile the same pins).
    venv = tmp_path / "composer-image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    image = [REPO / "scripts/uv.sh", "pip", "install", "-q", "--python", f"{venv}/bin/python"]
    made = subprocess.run([*image, "-r", REPO / "constraints-af31.txt", "pip"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(Path.home()), "PIP_CONFIG_FILE": str(pip_conf)}
    report = tmp_path / "report.json"
    install = subprocess.run(
        [f"{venv}/bin/pip", "install", "-q", "--report", report, "-c", REPO / "constraints-af31.txt"]
        + [f"tpu-rl=={deploy.version()}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    installed = {i["metadata"]["name"]: i["download_info"] for i in json.loads(report.read_text())["install"]}
    assert list(installed) == ["tpu-rl"] and installed["tpu-rl"]["url"].startswith(url), installed
    team = hashlib.sha256(deploy.wheel_path().read_bytes()).hexdigest()
    assert installed["tpu-rl"]["archive_info"]["hashes"]["sha256"] == team

    from tpu_rl_testing import TRIGGER_IMPORT_PROBE

    # As a worker of that environment serialises each trigger (its provider versions decide the keywords) ...
    serialize = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from tpu_rl_testing import trigger_samples; "
        "print(json.dumps([list(t.serialize()) for t in trigger_samples()]))"
    )
    worker = subprocess.run(
        [f"{venv}/bin/python", "-c", serialize, str(REPO / "tests")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    # ... and its triggerer, with nothing of this repository on its path, imports and rebuilds them.
    probe = subprocess.run(
        [f"{venv}/bin/python", "-I", "-c", TRIGGER_IMPORT_PROBE],
        input=worker.stdout.strip().splitlines()[-1],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    files = json.loads(probe.stdout.strip().splitlines()[-1])["files"]
    assert files and all(f.startswith(f"{venv}/lib/") for f in files)
    imported = "import airflow, tpu_rl; print(airflow.__version__, tpu_rl.__version__, hasattr(tpu_rl, 'HOSTILE'))"
    versions = subprocess.run(
        [f"{venv}/bin/python", "-c", imported], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    ).stdout.split()
    assert versions == ["3.1.7", deploy.version(), "False"]


def _chosen_wheel(pip_conf: str, tmp_path: Path) -> str:
    """The file of tpu-rl==VERSION that pip takes with ``pip_conf`` as its configuration (its resolution, with
    nothing installed)."""
    conf = tmp_path / f"pip-{len(list(tmp_path.glob('pip-*.conf')))}.conf"
    conf.write_text(pip_conf)
    report = conf.with_suffix(".json")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf)}
    pip = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--no-deps"]
    chosen = subprocess.run(
        [*pip, "--no-cache-dir", "--report", str(report), f"tpu-rl=={deploy.version()}"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    (install,) = json.loads(report.read_text())["install"]
    return install["download_info"]["url"]


def test_beside_pypi_pip_takes_someone_elses_tpu_rl_and_through_the_virtual_repository_never(
    python_repository, pypi, hostile_on_pypi, virtual_repository, tmp_path
):
    """What earlier deploys wrote (the team's repository as an extra index beside PyPI) installs a tpu-rl of the same
    version that someone publishes on PyPI with a more specific wheel tag; the pip.conf the deploy now writes (the
    virtual repository alone) installs the team's."""
    url, packages = python_repository
    team = shutil.copy(deploy.wheel_path(), packages)

    beside_pypi = f"[global]\nindex-url = {pypi[0]}simple/\nextra-index-url = {url}simple/\n"
    assert _chosen_wheel(beside_pypi, tmp_path).endswith(f"/{hostile_on_pypi.name}")
    virtual_alone = deploy.environment_pip_conf("", f"{virtual_repository}simple/")
    chosen = _chosen_wheel(virtual_alone, tmp_path)
    assert chosen.startswith(url) and chosen.endswith(f"/{Path(team).name}"), chosen
