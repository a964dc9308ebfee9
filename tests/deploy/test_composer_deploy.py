"""scripts/deploy_composer.py against a real GCS emulator: the bucket ends up laid out the way Composer
serves it (dags/ -> /home/airflow/gcs/dags, plugins/ -> .../plugins, data/ -> .../data), this package's
stale files go and nobody else's do, caches and tests never ship, and a second deploy uploads nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("deploy_composer", REPO / "scripts/deploy_composer.py")
deploy = sys.modules["deploy_composer"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deploy)

# What an earlier deploy of this package left: a DAG file it shipped (listed in its manifest) and a module.
STALE = ["dags/old_dag.py", "plugins/tpu_rl/removed.py", "data/tpu_rl/include/examples/old.json"]
# Objects the deploy must leave alone in a shared environment: Composer's liveness DAG, other teams' DAGs,
# plugins and data.
FOREIGN = ["dags/airflow_monitoring.py", "dags/other_team_dag.py", "plugins/other_team/hooks.py",
           "data/run-output/metrics.json", "data/include/other_team.json"]
OTHER_TEAM_IGNORE = "other_team/scratch/\n"


def _expected_objects(repo: Path) -> set[str]:
    """Written from Composer's folder mapping, not from the script: every DAG file, every file of the tpu_rl
    package (its sources and its data: the JobSet release it installs), every include asset."""
    expected = {"dags/maxtext_rl_tpu.py", "dags/maxtext_rl_tpu_programs.py", "dags/maxtext_rl_tpu_reaper.py",
                "plugins/.airflowignore", "plugins/tpu_rl_run_view.py",
                "data/tpu_rl/deployed.json"}
    expected |= {f"plugins/{p.relative_to(repo / 'plugins').as_posix()}" for p in (repo / "plugins/tpu_rl").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert "plugins/tpu_rl/releases/jobset-v0.10.1.yaml" in expected
    expected |= {f"data/tpu_rl/include/{p.relative_to(repo / 'include').as_posix()}"
                 for p in (repo / "include").rglob("*") if p.is_file()}
    return expected


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of the package folders with the caches a real checkout has after a test run."""
    repo = tmp_path / "repo"
    for folder in ("dags", "plugins", "include", "tests"):
        shutil.copytree(REPO / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cache = repo / "plugins/tpu_rl/__pycache__"
    cache.mkdir()
    (cache / "config.cpython-312.pyc").write_bytes(b"\x00bytecode")
    (repo / "plugins/tpu_rl/stray.pyc").write_bytes(b"\x00bytecode")
    (repo / "dags/__pycache__").mkdir()
    (repo / "dags/__pycache__/maxtext_rl_tpu.cpython-312.pyc").write_bytes(b"\x00bytecode")
    return repo


def _prefill(bucket) -> None:
    for name in STALE + FOREIGN:
        bucket.blob(name).upload_from_string(b"# left over from an earlier deploy\n")
    bucket.blob("data/tpu_rl/deployed.json").upload_from_string(json.dumps(["dags/old_dag.py"]))
    bucket.blob("plugins/.airflowignore").upload_from_string(OTHER_TEAM_IGNORE)


def _names(client, bucket) -> set[str]:
    return {blob.name for blob in client.list_blobs(bucket)}


def test_deploy_gives_the_layout_composer_serves(gcs_client, composer_bucket, checkout, tmp_path):
    _prefill(composer_bucket)

    result = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    print(f"first deploy: {result.summary()}")

    names = _names(gcs_client, composer_bucket)
    expected = _expected_objects(checkout)
    assert names == expected | set(FOREIGN), "the bucket must hold the package, the others' files and nothing else"
    assert sorted(result.deleted) == sorted(STALE)
    # Other teams' ignore patterns stay; ours keeps the plugin manager out of tpu_rl/.
    assert composer_bucket.blob("plugins/.airflowignore").download_as_text().splitlines() == [
        "other_team/scratch/", *[line for line in (checkout / "plugins/.airflowignore").read_text().splitlines()
                                 if line.strip()]]
    assert json.loads(composer_bucket.blob("data/tpu_rl/deployed.json").download_as_text()) == [
        "dags/maxtext_rl_tpu.py", "dags/maxtext_rl_tpu_programs.py", "dags/maxtext_rl_tpu_reaper.py",
        "plugins/tpu_rl_run_view.py"]
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n], "tests/ shipped"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], "bytecode caches shipped"

    # What Composer's workers would see: the DAG file parses with tpu_rl imported from the bucket's plugins/.
    gcs = tmp_path / "home-airflow-gcs"
    for name in names:
        if name.startswith(("dags/", "plugins/")):
            target = gcs / name
            target.parent.mkdir(parents=True, exist_ok=True)
            composer_bucket.blob(name).download_to_filename(str(target))
    probe = (
        "import sys, runpy; sys.path.insert(0, sys.argv[1]); "
        "dag = runpy.run_path(sys.argv[2])['dag']; import tpu_rl; "
        "assert tpu_rl.__file__.startswith(sys.argv[1]), tpu_rl.__file__; print(dag.dag_id, len(dag.tasks))"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(gcs / "plugins"), str(gcs / "dags/maxtext_rl_tpu.py")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("maxtext_rl_tpu ")


def test_second_deploy_uploads_nothing_and_a_change_uploads_one_file(gcs_client, composer_bucket, checkout):
    files = deploy.local_files(checkout)
    first = deploy.sync(gcs_client, composer_bucket.name, files)
    second = deploy.sync(gcs_client, composer_bucket.name, files)
    print(f"first deploy: {first.summary()}; second deploy: {second.summary()}")
    assert (second.uploaded, second.deleted) == ([], [])
    assert len(second.unchanged) == len(first.uploaded) == len(files) + 1  # with plugins/.airflowignore

    plan = checkout / "plugins/tpu_rl/plan.py"
    plan.write_text(plan.read_text() + "\n# edited\n")
    third = deploy.sync(gcs_client, composer_bucket.name, deploy.local_files(checkout))
    print(f"after editing plan.py: {third.summary()}")
    assert (third.uploaded, third.deleted) == (["plugins/tpu_rl/plan.py"], [])


def test_cli_with_a_bucket_syncs_without_gcloud(gcs_client, composer_bucket, monkeypatch, capsys, tmp_path):
    _prefill(composer_bucket)
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud reachable: --bucket alone must not call it

    assert deploy.main(["--bucket", composer_bucket.name, "--project", "test"]) == 0

    out = capsys.readouterr().out
    assert f"delete gs://{composer_bucket.name}/dags/old_dag.py" in out
    assert _names(gcs_client, composer_bucket) == _expected_objects(REPO) | set(FOREIGN)


def test_dry_run_prints_the_plan_and_changes_nothing(gcs_client, composer_bucket, monkeypatch, capsys, tmp_path):
    _prefill(composer_bucket)
    before = {b.name: b.md5_hash for b in gcs_client.list_blobs(composer_bucket)}
    monkeypatch.setenv("PATH", str(tmp_path))

    deploy.main(["--env", "rl-env", "--location", "us-east5", "--project", "p1", "--bucket", composer_bucket.name,
                 "--dry-run", "--update-pypi"])

    out = capsys.readouterr().out
    assert "gcloud composer environments describe rl-env --location us-east5 --project p1" in out
    assert "gcloud composer environments update rl-env --location us-east5 --project p1 " \
           "'--update-pypi-package=apache-airflow-providers-cncf-kubernetes>=" in out
    assert f"would delete gs://{composer_bucket.name}/plugins/tpu_rl/removed.py" in out
    assert {b.name: b.md5_hash for b in gcs_client.list_blobs(composer_bucket)} == before


def _fake_gcloud(directory: Path, bucket: str, pypi: dict[str, str]) -> Path:
    """A stand-in for the gcloud CLI only (GCS stays the emulator): answers describe, logs every call."""
    log = directory / "gcloud.log"
    describe = json.dumps({"config": {"dagGcsPrefix": f"gs://{bucket}/dags", "softwareConfig": {"pypiPackages": pypi}}})
    script = directory / "gcloud"
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\ncase \"$3\" in describe) echo '{describe}';; esac\n")
    script.chmod(0o755)
    return log


@pytest.mark.parametrize("installed, update_pypi", [("same", True), ("older", False), ("older", True)])
def test_env_deploy_shows_the_package_diff_and_updates_only_when_asked(gcs_client, composer_bucket, monkeypatch,
                                                                        capsys, tmp_path, installed, update_pypi):
    """The update rebuilds the image and restarts Airflow: never by default; when asked, only the packages that
    differ, each with --update-pypi-package (other packages of the environment stay)."""
    pypi = {**deploy.parse_requirements(REPO / "requirements.txt"), "other-teams-package": "==1.2"}
    if installed == "older":
        pypi["apache-airflow-providers-google"] = ">=10.0.0"
    log = _fake_gcloud(tmp_path, composer_bucket.name, pypi)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    assert deploy.main(["--env", "rl-env", "--location", "us-east5", *(["--update-pypi"] if update_pypi else [])]) == 0

    out = capsys.readouterr().out
    calls = log.read_text().splitlines()
    assert calls[0].startswith("composer environments describe rl-env --location us-east5")
    updates = [c for c in calls if " update " in f" {c} "]
    if installed == "same":
        assert updates == [] and "already has every requirement" in out
        return
    assert "apache-airflow-providers-google: >=10.0.0 -> >=19.5.0" in out
    wanted = ("composer environments update rl-env --location us-east5 "
              "--update-pypi-package=apache-airflow-providers-google>=19.5.0")
    assert updates == ([wanted] if update_pypi else [])
    if not update_pypi:
        assert "not updated" in out and "UPDATE_PYPI=1" in out
    assert "dags/maxtext_rl_tpu.py" in _names(gcs_client, composer_bucket)
