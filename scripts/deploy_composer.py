"""Deploy this package to a Cloud Composer 3 environment: ``make deploy-composer ENV=... LOCATION=... REPOSITORY=...``.

Cloud Composer 3 gives plugins/ to neither its scheduler nor its triggerer, so the package ships the way
Airflow code ships, as a distribution (Composer's "Install Python dependencies" page):

1. the wheel (``make wheel``, dist/) is uploaded to an Artifact Registry Python repository, created if missing;
2. the environment's service account may read it (``roles/artifactregistry.reader`` on the repository) and the
   environment's pip configuration (``gs://BUCKET/config/pip/pip.conf``) names it as an extra index;
3. the environment's custom PyPI package ``tpu-rl`` is set to this version: one ``--update-pypi-package``,
   which keeps every other package of the environment (Composer rebuilds its image and restarts Airflow);
4. then the DAG files and the programs go to ``dags/`` (the DAG processor parses the new files against the new
   package): the programs file beside the DAG file that reads it, since ``dags/`` is what Composer gives the
   DAG processor.

Safe in an environment shared with other DAG packages: the sync owns only ``data/tpu_rl/`` and the objects its
manifest (``data/tpu_rl/deployed.json``) lists. The manifest is written before anything is uploaded, naming
what this deploy may create, so a deploy killed half-way leaves nothing that a later deploy does not own. A
programs file edited in the bucket since the last deploy is kept and reported, never overwritten or deleted
without ``--replace-programs``. What earlier deploys put in plugins/ (the package as a plugin) is deleted.

A deploy names its environment (``--env``): without the environment's custom package the DAG files could not
import ``tpu_rl``. A version the repository already has, built from the same sources (the same SHA-256: the build
is reproducible), is not uploaded again, and the environment is pointed at it: a redeploy, or a rollback
(``git checkout vX && make deploy-composer ENV=...``).

``--dry-run`` prints every step and changes nothing. Needs google-cloud-storage and twine (``make
deploy-composer`` installs them alone), and gcloud for the steps on the environment and the repository.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTION = "tpu-rl"
#: The repository's programs file -> where the DAG processor reads it (beside the DAG file that loads it).
PROGRAMS = ("include/programs.yaml", "dags/maxtext_rl_tpu_programs.yaml")
MANIFEST = "data/tpu_rl/deployed.json"
#: Prefixes only this package writes: whatever is there and not wanted is stale.
OWNED = ("data/tpu_rl/",)
#: What deploys made before the package was a distribution: the package and its plugin in plugins/.
LEGACY = ("plugins/tpu_rl/", "plugins/tpu_rl_run_view.py")
PIP_CONF = "config/pip/pip.conf"


def version(repo: Path = REPO) -> str:
    match = re.search(r'^__version__ = "([^"]+)"', (repo / "src/tpu_rl/__init__.py").read_text(), re.M)
    assert match, "src/tpu_rl/__init__.py has no __version__"
    return match.group(1)


def wheel_path(repo: Path = REPO) -> Path:
    return repo / "dist" / f"tpu_rl-{version(repo)}-py3-none-any.whl"


def local_files(repo: Path = REPO) -> dict[str, Path]:
    """Object name -> file: the DAG files (no bytecode caches), and the programs file when the repository has one."""
    files = {
        f"dags/{path.relative_to(repo / 'dags').as_posix()}": path
        for path in sorted((repo / "dags").rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")
    }
    source, target = PROGRAMS
    if (repo / source).is_file():
        files[target] = repo / source
    return files


def _md5(data: bytes) -> str:
    """In the form GCS reports (base64 of the digest)."""
    return base64.b64encode(hashlib.md5(data).digest()).decode()


# --- the DAG files and programs -----------------------------------------------------------------------------


@dataclass
class SyncResult:
    uploaded: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Objects left as they are, with why (a programs file edited in the bucket).
    kept: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        kept = f", kept {len(self.kept)}" if self.kept else ""
        return f"uploaded {len(self.uploaded)}, deleted {len(self.deleted)}, unchanged {len(self.unchanged)}{kept}"


def read_manifest(bucket) -> dict[str, list[str]]:
    """Object -> the MD5s this package may have left there. A manifest of earlier deploys (a list of names)
    names objects without their contents."""
    blob = bucket.get_blob(MANIFEST)
    if blob is None:
        return {}
    data = json.loads(blob.download_as_bytes())
    return {name: [] for name in data} if isinstance(data, list) else {k: list(v) for k, v in data["objects"].items()}


def _write_manifest(bucket, objects: dict[str, list[str]], deployed_version: str) -> None:
    body = {"distribution": DISTRIBUTION, "version": deployed_version, "objects": dict(sorted(objects.items()))}
    bucket.blob(MANIFEST).upload_from_string(json.dumps(body, indent=1), content_type="application/json")


def sync(
    client,
    bucket_name: str,
    files: dict[str, Path],
    *,
    dry_run: bool = False,
    replace_programs: bool = False,
    deployed_version: str = "",
) -> SyncResult:
    """Make the bucket hold ``files``: uploads only what differs (MD5), then deletes what this package left stale
    (after the uploads, so the environment never has a moment without its DAGs)."""
    bucket = client.bucket(bucket_name)
    remote = {
        blob.name: blob.md5_hash
        for prefix in ("dags/", *OWNED, *LEGACY)
        for blob in client.list_blobs(bucket, prefix=prefix)
        if not blob.name.endswith("/")
    }
    manifest = read_manifest(bucket)
    wanted = {name: path.read_bytes() for name, path in files.items()}
    result = SyncResult()

    programs = PROGRAMS[1]
    if programs in remote and remote[programs] not in manifest.get(programs, []) and not replace_programs:
        source = (
            "was edited in the bucket since the last deploy" if programs in manifest else "was not written by a deploy"
        )
        result.kept[programs] = (
            f"{source}; kept. Copy it into {PROGRAMS[0]} to deploy it from here, or deploy "
            "with --replace-programs (REPLACE_PROGRAMS=1) to replace it"
        )
        wanted.pop(programs, None)

    # Before anything changes: every object this deploy may create, with the contents it may leave.
    intent = {
        name: sorted({*manifest.get(name, []), *([_md5(wanted[name])] if name in wanted else [])})
        for name in manifest.keys() | wanted.keys()
    }
    if not dry_run:
        _write_manifest(bucket, intent, deployed_version)
    for name, data in wanted.items():
        if remote.get(name) == _md5(data):
            result.unchanged.append(name)
            continue
        result.uploaded.append(name)
        if not dry_run:
            bucket.blob(name).upload_from_string(data)
    owned = {name for name in remote if name.startswith(OWNED + LEGACY)} | (manifest.keys() & remote.keys())
    for name in sorted(owned - wanted.keys() - result.kept.keys() - {MANIFEST}):
        result.deleted.append(name)
        if not dry_run:
            bucket.blob(name).delete()
    if not dry_run:
        final = {name: [_md5(data)] for name, data in wanted.items()}
        final.update({name: manifest[name] for name in result.kept if name in manifest})  # still flagged next time
        _write_manifest(bucket, final, deployed_version)
    return result


# --- the environment's pip configuration --------------------------------------------------------------------


def merged_pip_conf(current: str, index: str) -> str:
    """The environment's pip.conf with ``index`` among ``[global] extra-index-url``; nothing of others removed."""
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(current)
    if not config.has_section("global"):
        config.add_section("global")
    indexes = config.get("global", "extra-index-url", fallback="").split()
    if index in indexes:
        return current
    config.set("global", "extra-index-url", "\n".join([*indexes, index]) if indexes else index)
    out = io.StringIO()
    config.write(out)
    return out.getvalue()


# --- the repository -----------------------------------------------------------------------------------------


def repository_url(project: str, location: str, repository: str) -> str:
    """Where twine uploads (Artifact Registry's Python repositories; pip reads ``<url>simple/``)."""
    return f"https://{location}-python.pkg.dev/{project}/{repository}/"


#: The index pip uses besides the extra ones of pip.conf.
PUBLIC_INDEX = "https://pypi.org/simple/"


def project_on_index(index: str, project: str) -> bool:
    """Whether a PEP 503 index has a project of that name (pip does not prefer one index over another)."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/{project}/", timeout=30):
            return True
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise


def published_sha256(index_url: str, wheel_name: str, token: str | None) -> str | None:
    """The SHA-256 of ``wheel_name`` in the repository's simple index (PEP 503), or None when absent."""
    request = urllib.request.Request(f"{index_url}simple/{DISTRIBUTION}/")
    if token:
        credentials = base64.b64encode(f"oauth2accesstoken:{token}".encode()).decode()
        request.add_header("Authorization", f"Basic {credentials}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            page = response.read().decode()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise
    match = re.search(re.escape(wheel_name) + r"#sha256=([0-9a-f]{64})", page)
    return match.group(1) if match else None


# --- the gcloud steps ---------------------------------------------------------------------------------------


@dataclass
class Environment:
    name: str
    location: str
    project: str | None

    def args(self) -> list[str]:
        return [self.name, "--location", self.location] + (["--project", self.project] if self.project else [])

    def describe_command(self) -> list[str]:
        return [
            "gcloud",
            "composer",
            "environments",
            "describe",
            *self.args(),
            "--format=json(config.dagGcsPrefix,config.nodeConfig.serviceAccount,config.softwareConfig.pypiPackages)",
        ]

    def update_command(self, requirement: str) -> list[str]:
        """One --update-pypi-package: adds or updates that package and keeps the environment's others
        (``--update-pypi-packages-from-file`` would replace the whole list)."""
        return ["gcloud", "composer", "environments", "update", *self.args(), f"--update-pypi-package={requirement}"]


def repository_commands(project: str, location: str, repository: str, service_account: str) -> dict[str, list[str]]:
    where = ["--location", location, "--project", project]
    return {
        "describe": ["gcloud", "artifacts", "repositories", "describe", repository, *where],
        "create": [
            "gcloud",
            "artifacts",
            "repositories",
            "create",
            repository,
            "--repository-format=python",
            *where,
            f"--description=Python packages of Airflow environments ({DISTRIBUTION})",
        ],
        "reader": [
            "gcloud",
            "artifacts",
            "repositories",
            "add-iam-policy-binding",
            repository,
            *where,
            f"--member=serviceAccount:{service_account}",
            "--role=roles/artifactregistry.reader",
        ],
    }


class Runner:
    """Runs or, in a dry run, prints the commands; read-only ones run in a dry run too when gcloud is there."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run

    def change(self, command: list[str], **kwargs) -> subprocess.CompletedProcess | None:
        if self.dry_run:
            print("would run:", shlex.join(command))
            return None
        print("+", shlex.join(command), flush=True)
        return subprocess.run(command, check=True, **kwargs)

    def read(self, command: list[str]) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    run = Runner(args.dry_run)
    wheel = wheel_path()
    requirement = f"{DISTRIBUTION}=={version()}"
    if not wheel.is_file():
        parser.error(f"{wheel.relative_to(REPO)} is missing: make wheel builds it")
    print(f"deploying {requirement} ({wheel.name}){' (dry run)' if args.dry_run else ''}")

    from google.cloud import storage

    client = storage.Client(project=args.project)
    env = Environment(args.env, args.location, args.project)
    bucket, service_account, pypi = args.bucket, args.service_account, {}
    if not bucket:
        bucket, service_account, pypi = describe_environment(env, run)

    # 1-2. The wheel in the repository, which the environment may read.
    repository = prepare_repository(args, service_account, run) if args.repository else None
    index_url = args.repository_url.rstrip("/") + "/" if args.repository_url else repository
    publish_wheel(wheel, index_url, client, bucket, run)

    # 3. The environment's custom package, then 4. the DAG files and programs that use it.
    install_package(env, pypi, requirement, run)
    deploy_dags(client, bucket, args)
    return 0


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", help="Composer environment name (required: it installs the package the DAGs import)")
    parser.add_argument("--location", help="the environment's region")
    parser.add_argument("--project", help="Google Cloud project (default: gcloud's)")
    parser.add_argument("--repository", help="Artifact Registry Python repository for the wheel (created if missing)")
    parser.add_argument("--repository-location", help="the repository's region (default: the environment's)")
    parser.add_argument(
        "--repository-url", help="the repository's URL, when it is not Artifact Registry's for --repository"
    )
    parser.add_argument("--bucket", help="the environment's bucket; skips gcloud's describe")
    parser.add_argument("--service-account", help="the environment's service account; with --bucket")
    parser.add_argument("--replace-programs", action="store_true", help="replace a programs file edited in the bucket")
    parser.add_argument("--dry-run", action="store_true", help="print every step; change nothing")
    return parser


#: Without the environment, nothing installs the package that the DAG files import.
NO_ENVIRONMENT = (
    "--env (make deploy-composer ENV=<environment>) is missing: the DAG files import tpu_rl, which only the "
    "environment's custom PyPI package installs, so a deploy without it would upload DAG files that cannot import "
    "(and delete the plugins/tpu_rl/ copy that older DAG files import). Give ENV=<environment> LOCATION=<region> "
    "REPOSITORY=<repository>; BUCKET= (with SERVICE_ACCOUNT=) only skips the environment's describe"
)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses (``parser.error``) the combinations a deploy cannot complete, before any call."""
    if not args.env:
        parser.error(NO_ENVIRONMENT)
    if not args.location:
        parser.error("--env needs --location (LOCATION=): the environment's region")
    if not (args.repository or args.repository_url):
        parser.error("--env needs --repository: the Artifact Registry Python repository the environment installs from")
    if args.repository and args.bucket and not args.service_account and not args.dry_run:
        parser.error(
            "--repository with --bucket needs --service-account: the environment's service account, which is "
            "granted roles/artifactregistry.reader on the repository (without --bucket, gcloud's describe gives it)"
        )


def describe_environment(env: Environment, run: Runner) -> tuple[str, str | None, dict[str, str]]:
    """The environment's bucket, service account and custom PyPI packages, from gcloud's describe."""
    described = json.loads(run.read(env.describe_command())).get("config", {})
    bucket = described["dagGcsPrefix"].removeprefix("gs://").split("/", 1)[0]
    service_account = described.get("nodeConfig", {}).get("serviceAccount")
    pypi = described.get("softwareConfig", {}).get("pypiPackages", {})
    print(f"environment {env.name}: bucket gs://{bucket}, service account {service_account}")
    return bucket, service_account, pypi


def prepare_repository(args: argparse.Namespace, service_account: str | None, run: Runner) -> str:
    """Creates the Artifact Registry repository unless it exists and lets the environment's service account read
    it; returns the repository's URL."""
    project = args.project or run.read(["gcloud", "config", "get-value", "project"]).strip()
    location = args.repository_location or args.location
    commands = repository_commands(project, location, args.repository, service_account or "SERVICE_ACCOUNT")
    if args.dry_run or subprocess.run(commands["describe"], capture_output=True).returncode != 0:
        print(f"repository {args.repository} in {location}: created unless it exists")
        run.change(commands["create"])
    run.change(commands["reader"], capture_output=True)
    return repository_url(project, location, args.repository)


def publish_wheel(wheel: Path, index_url: str, client, bucket: str, run: Runner) -> None:
    """The wheel in the repository and the repository in the environment's pip configuration; refused while
    PyPI has a project of the same name."""
    token = None
    if ".pkg.dev/" in index_url and not run.dry_run:
        token = run.read(["gcloud", "auth", "print-access-token"]).strip()
    if project_on_index(PUBLIC_INDEX, DISTRIBUTION):
        raise SystemExit(
            f"{PUBLIC_INDEX} has a project named {DISTRIBUTION}: with the repository as pip's extra "
            "index, the environment could install that one. Use an Artifact Registry virtual "
            "repository (this repository before PyPI) as the environment's index-url instead"
        )
    upload(wheel, index_url, token, run)
    pip_conf(client, bucket, index_url, run)


def install_package(env: Environment, pypi: dict[str, str], requirement: str, run: Runner) -> None:
    """Sets the environment's custom PyPI package to ``requirement``, unless it already installs it."""
    if pypi.get(DISTRIBUTION) == requirement.removeprefix(DISTRIBUTION):
        print(f"the environment already installs {requirement}")
        return
    print(
        f"custom PyPI package: {DISTRIBUTION}{pypi.get(DISTRIBUTION, ' (none)')} -> {requirement} "
        "(Composer rebuilds the image and restarts Airflow: several minutes)"
    )
    run.change(env.update_command(requirement))


def deploy_dags(client, bucket: str, args: argparse.Namespace) -> None:
    """Syncs the DAG files and programs to the bucket and prints what changed."""
    result = sync(
        client,
        bucket,
        local_files(),
        dry_run=args.dry_run,
        replace_programs=args.replace_programs,
        deployed_version=version(),
    )
    for verb, names in (("upload", result.uploaded), ("delete", result.deleted)):
        for name in names:
            print(f"{'would ' if args.dry_run else ''}{verb} gs://{bucket}/{name}")
    for name, why in result.kept.items():
        print(f"kept gs://{bucket}/{name}: it {why}")
    print(f"sync gs://{bucket}: {result.summary()}{' (dry run)' if args.dry_run else ''}")


def upload(wheel: Path, index_url: str, token: str | None, run: Runner) -> None:
    """twine upload, unless the repository has this very wheel (a redeploy, or a rollback to a version deployed
    before: the environment is then pointed at it). The same version with other contents is refused: the
    environment's image would not change (bump the version)."""
    local = hashlib.sha256(wheel.read_bytes()).hexdigest()
    # A dry run has no access token for Artifact Registry: it cannot look, and says what it would do.
    unreadable = run.dry_run and token is None and ".pkg.dev/" in index_url
    published = None if unreadable else published_sha256(index_url, wheel.name, token)
    if published == local:
        print(f"{index_url} already has {wheel.name} (sha256 {local[:12]}...)")
        return
    if published:
        raise SystemExit(
            f"{index_url} has another {wheel.name} (sha256 {published[:12]}..., this one {local[:12]}...): "
            "these sources are not the ones that version was built from. Bump __version__ in "
            "src/tpu_rl/__init__.py, then deploy again (to roll back to that version, deploy the commit it was "
            "built from: make wheel builds the same bytes in any checkout)"
        )
    # The token reaches twine through its environment, never its command line.
    env = {
        **os.environ,
        "TWINE_USERNAME": "oauth2accesstoken" if token else os.environ.get("TWINE_USERNAME", "upload"),
        "TWINE_PASSWORD": token or os.environ.get("TWINE_PASSWORD", ""),
    }
    run.change(
        [sys.executable, "-m", "twine", "upload", "--non-interactive", "--repository-url", index_url, str(wheel)],
        env=env,
    )


def pip_conf(client, bucket_name: str, index_url: str, run: Runner) -> None:
    """The environment's pip configuration names the repository's simple index (merged into what is there)."""
    blob = client.bucket(bucket_name).blob(PIP_CONF)
    current = blob.download_as_text() if blob.exists() else ""
    merged = merged_pip_conf(current, f"{index_url}simple/")
    if merged == current:
        print(f"gs://{bucket_name}/{PIP_CONF} already names {index_url}simple/")
    elif run.dry_run:
        print(f"would write gs://{bucket_name}/{PIP_CONF}:\n{merged}")
    else:
        print(f"+ write gs://{bucket_name}/{PIP_CONF} (extra-index-url {index_url}simple/)")
        blob.upload_from_string(merged)


if __name__ == "__main__":
    sys.exit(main())
