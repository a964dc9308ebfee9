"""Deploy this package to a Cloud Composer 3 environment: ``make deploy-composer ENV=... REPOSITORY=...``.

Cloud Composer 3 gives plugins/ to neither its scheduler nor its triggerer, so the package ships the way
Airflow code ships, as a distribution (Composer's "Install Python dependencies" page):

1. the wheel (``make wheel``, dist/) is uploaded to the team's Artifact Registry Python repository, created if
   missing, behind a virtual repository (created if missing) that serves packages from it before PyPI's;
2. the environment's service account may read both (``roles/artifactregistry.reader``) and the environment's pip
   configuration (``gs://BUCKET/config/pip/pip.conf``) names the virtual repository as its only index, so no
   ``tpu-rl`` published elsewhere can take this one's place (pip orders no indexes);
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
import tempfile
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

#: PyPI's simple index, which pip reads when pip.conf names no index: the virtual repository's PyPI remote serves
#: the same packages, so pip.conf may drop it.
PUBLIC_INDEXES = ("https://pypi.org/simple", "https://pypi.python.org/simple")


def _same_index(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def environment_pip_conf(current: str, index: str, ours: tuple[str, ...] = ()) -> str:
    """The environment's pip.conf with ``index`` (the virtual repository's simple index) as its only index.

    pip orders no indexes ("pip does not search package indexes in any particular order": Artifact Registry's page
    on authentication for Python repositories, which recommends a virtual repository): beside another index, a
    ``tpu-rl`` of the same version with a more specific wheel tag wins wherever it comes from. The virtual
    repository serves a version that several upstreams have from the one of the highest priority ("If you request
    a version that is available in more than one upstream repository, Artifact Registry chooses an upstream
    repository to use based on the priority settings": Artifact Registry, "Manage Python packages"), and the
    environment installs ``tpu-rl==<version>``, which the team's repository has before the environment asks for it.
    ``ours`` (the repository earlier deploys named as an extra index) and PyPI (the virtual repository's remote
    serves it) are dropped; any other index is refused, naming the fix; every other setting stays."""
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(current)
    if not config.has_section("global"):
        config.add_section("global")
    present = config.get("global", "index-url", fallback="").strip()
    if present and not any(_same_index(present, known) for known in (index, *PUBLIC_INDEXES)):
        raise SystemExit(_other_index(present, index))
    extra = config.get("global", "extra-index-url", fallback="").split()
    others = [url for url in extra if not any(_same_index(url, known) for known in (index, *ours, *PUBLIC_INDEXES))]
    if others:
        raise SystemExit(_other_extra_indexes(others, index))
    if present == index and not extra:
        return current
    config.set("global", "index-url", index)
    config.remove_option("global", "extra-index-url")
    out = io.StringIO()
    config.write(out)
    return out.getvalue()


def _other_index(present: str, index: str) -> str:
    return (
        f"{PIP_CONF} sets index-url = {present}, the index the environment installs every custom package from: "
        f"the deploy will not replace it (packages of other teams may come from there) nor put {index} beside it "
        "(pip would then take tpu-rl from either). Make that index an upstream of the virtual repository, at a "
        "priority below the repository tpu-rl is uploaded to, and remove index-url from the pip.conf; or, if it is "
        "already such a virtual repository, deploy with VIRTUAL_REPOSITORY= naming it"
    )


def _other_extra_indexes(others: list[str], index: str) -> str:
    return (
        f"{PIP_CONF} sets extra-index-url = {' '.join(others)}: pip reads every extra index beside {index} and "
        "orders none, so a tpu-rl published there (the same version with a more specific wheel tag) would be "
        "installed instead of this one. Make each an upstream of the virtual repository, at a priority below the "
        "repository tpu-rl is uploaded to (gcloud artifacts repositories update VIRTUAL --upstream-policy-file=...), "
        "remove it from extra-index-url in the pip.conf, then deploy again"
    )


# --- the repositories ---------------------------------------------------------------------------------------


def repository_url(project: str, location: str, repository: str) -> str:
    """Where twine uploads (Artifact Registry's Python repositories; pip reads ``<url>simple/``)."""
    return f"https://{location}-python.pkg.dev/{project}/{repository}/"


def repository_name(project: str, location: str, repository: str) -> str:
    return f"projects/{project}/locations/{location}/repositories/{repository}"


#: The virtual repository's upstreams: "Entries with a greater priority value take precedence in the pull order"
#: (Artifact Registry API, UpstreamPolicy.priority). The team's repository comes first, PyPI's remote after it.
TEAM_PRIORITY, PYPI_PRIORITY = 100, 1


def upstream_policies(project: str, location: str, repository: str, pypi_remote: str) -> list[dict]:
    """The file ``--upstream-policy-file`` reads: a JSON list of {id, repository, priority} (gcloud's
    ``command_lib/artifacts/util.py``, AppendUpstreamPoliciesToRequest)."""
    return [
        {"id": repository, "repository": repository_name(project, location, repository), "priority": TEAM_PRIORITY},
        {"id": pypi_remote, "repository": repository_name(project, location, pypi_remote), "priority": PYPI_PRIORITY},
    ]


def virtual_repository_refusal(described: dict, location: str, repository: str) -> str | None:
    """Why an existing repository cannot be the environment's index: it must be a virtual repository whose
    upstream of the highest priority, alone, is ``repository``; None when it is."""
    if described.get("mode") != "VIRTUAL_REPOSITORY":
        return f"is a {described.get('mode', 'STANDARD_REPOSITORY')}, not a virtual repository"
    policies = described.get("virtualRepositoryConfig", {}).get("upstreamPolicies", [])
    # The name's project may be the number rather than the id (unverified): the location and the name decide.
    ours = [p for p in policies if p.get("repository", "").endswith(f"/locations/{location}/repositories/{repository}")]
    if not ours:
        return f"has no upstream {repository}"
    above = [p["repository"] for p in policies if p not in ours and p.get("priority", 0) >= ours[0].get("priority", 0)]
    if above:
        return f"serves {', '.join(above)} at a priority as high as {repository}'s or higher"
    return None


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


#: How each repository is created (``gcloud artifacts repositories create``; Artifact Registry's "Create remote
#: repositories": ``--mode=remote-repository --remote-python-repo=PYPI``; "Create virtual repositories":
#: ``--mode=virtual-repository --upstream-policy-file=FILE``).
STANDARD = ("--repository-format=python",)
PYPI_REMOTE = ("--repository-format=python", "--mode=remote-repository", "--remote-python-repo=PYPI")


def virtual_mode(policy_file: Path) -> tuple[str, ...]:
    return ("--repository-format=python", "--mode=virtual-repository", f"--upstream-policy-file={policy_file}")


def repository_commands(
    project: str, location: str, repository: str, service_account: str, mode: tuple[str, ...] = STANDARD
) -> dict[str, list[str]]:
    where = ["--location", location, "--project", project]
    return {
        "describe": ["gcloud", "artifacts", "repositories", "describe", repository, *where, "--format=json"],
        "create": [
            "gcloud",
            "artifacts",
            "repositories",
            "create",
            repository,
            *mode,
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


@dataclass
class Repositories:
    """Where twine uploads the wheel (the team's standard repository) and the simple index the environment installs
    from (the virtual repository, which serves tpu-rl from the team's repository before PyPI)."""

    project: str
    location: str
    upload_url: str
    index: str

    @classmethod
    def of(cls, args: argparse.Namespace, run: Runner) -> Repositories:
        project = args.project or ""
        if not project and not (args.repository_url and args.virtual_repository_url):
            project = run.read(["gcloud", "config", "get-value", "project"]).strip()
        location = args.repository_location or args.location
        upload = args.repository_url or repository_url(project, location, args.repository)
        virtual = args.virtual_repository_url or repository_url(project, location, args.virtual_repository)
        return cls(project, location, upload.rstrip("/") + "/", f"{virtual.rstrip('/')}/simple/")


def planned_pip_conf(client, bucket_name: str, where: Repositories) -> tuple[str, str]:
    """(the environment's pip.conf now, the one this deploy writes): refused before any change when other indexes
    there would let pip take tpu-rl from elsewhere."""
    blob = client.bucket(bucket_name).blob(PIP_CONF)
    current = blob.download_as_text() if blob.exists() else ""
    return current, environment_pip_conf(current, where.index, ours=(f"{where.upload_url}simple/",))


def existing_virtual_repository(args: argparse.Namespace, where: Repositories, run: Runner) -> bool:
    """Whether the virtual repository exists; refused when it does but would not serve tpu-rl from the team's
    repository first. A dry run does not look (it creates nothing either)."""
    if not args.virtual_repository or run.dry_run:
        return False
    describe = repository_commands(where.project, where.location, args.virtual_repository, "")["describe"]
    found = subprocess.run(describe, capture_output=True, text=True)
    if found.returncode != 0:
        return False
    refusal = virtual_repository_refusal(json.loads(found.stdout), where.location, args.repository)
    if refusal:
        policies = upstream_policies(where.project, where.location, args.repository, args.pypi_remote)
        raise SystemExit(
            f"the virtual repository {args.virtual_repository} {refusal}: it would serve a tpu-rl of this version "
            f"from another upstream before {args.repository}'s. Give {args.repository} the highest priority, alone "
            "(gcloud artifacts repositories "
            f"update {args.virtual_repository} --location {where.location} --upstream-policy-file=FILE, FILE as "
            f"below, with the other upstreams you need at priorities under {TEAM_PRIORITY}), or name another "
            f"VIRTUAL_REPOSITORY=:\n{json.dumps(policies, indent=1)}"
        )
    return True


def prepare_repositories(
    args: argparse.Namespace, where: Repositories, service_account: str | None, virtual_exists: bool, run: Runner
) -> None:
    """Creates the team's repository unless it exists and, unless the virtual repository exists, PyPI's remote
    repository and the virtual one (the team's first); the environment's service account reads both the team's
    repository and the virtual one, through which it installs."""
    account = service_account or "SERVICE_ACCOUNT"
    team = repository_commands(where.project, where.location, args.repository, account)
    if run.dry_run or subprocess.run(team["describe"], capture_output=True).returncode != 0:
        print(f"repository {args.repository} in {where.location}: created unless it exists")
        run.change(team["create"])
    run.change(team["reader"], capture_output=True)
    if not args.virtual_repository:
        return
    with tempfile.TemporaryDirectory() as folder:
        policy_file = Path(folder) / "upstream-policies.json"
        virtual = repository_commands(
            where.project, where.location, args.virtual_repository, account, virtual_mode(policy_file)
        )
        if not virtual_exists:
            create_virtual_repository(args, where, virtual["create"], policy_file, run)
        run.change(virtual["reader"], capture_output=True)


def create_virtual_repository(
    args: argparse.Namespace, where: Repositories, create: list[str], policy_file: Path, run: Runner
) -> None:
    """PyPI's remote repository unless it exists, then the virtual repository over it and the team's."""
    remote = repository_commands(where.project, where.location, args.pypi_remote, "", PYPI_REMOTE)
    if run.dry_run or subprocess.run(remote["describe"], capture_output=True).returncode != 0:
        print(f"remote repository {args.pypi_remote} (PyPI) in {where.location}: created unless it exists")
        run.change(remote["create"])
    policies = upstream_policies(where.project, where.location, args.repository, args.pypi_remote)
    policy_file.write_text(json.dumps(policies, indent=1))
    print(
        f"virtual repository {args.virtual_repository}: {args.repository} (priority {TEAM_PRIORITY}) before "
        f"{args.pypi_remote} (priority {PYPI_PRIORITY}); upstream policies:\n{policy_file.read_text()}"
    )
    run.change(create)


def publish_wheel(wheel: Path, upload_url: str, run: Runner) -> None:
    """The wheel in the team's repository (twine, with gcloud's access token for Artifact Registry)."""
    token = None
    if ".pkg.dev/" in upload_url and not run.dry_run:
        token = run.read(["gcloud", "auth", "print-access-token"]).strip()
    upload(wheel, upload_url, token, run)


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

    # Before anything changes: where the wheel goes and the index the environment installs from, the pip.conf that
    # names that index alone, and the virtual repository's upstreams; each refused here, naming the fix.
    where = Repositories.of(args, run)
    conf = planned_pip_conf(client, bucket, where)
    virtual = existing_virtual_repository(args, where, run)

    # 1-2. The repositories, which the environment may read; the wheel in the team's one; pip.conf names the virtual.
    if args.repository:
        prepare_repositories(args, where, service_account, virtual, run)
    publish_wheel(wheel, where.upload_url, run)
    write_pip_conf(client, bucket, conf, where.index, run)

    # 3. The environment's custom package, then 4. the DAG files and programs that use it.
    install_package(env, pypi, requirement, run)
    deploy_dags(client, bucket, args)
    return 0


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", help="Composer environment name (required: it installs the package the DAGs import)")
    parser.add_argument("--location", help="the environment's region")
    parser.add_argument("--project", help="Google Cloud project (default: gcloud's)")
    parser.add_argument("--repository", help="Artifact Registry Python repository the wheel is uploaded to")
    parser.add_argument(
        "--virtual-repository",
        help="Artifact Registry virtual repository the environment installs from: --repository first, then PyPI "
        "(created with --pypi-remote if missing)",
    )
    parser.add_argument("--pypi-remote", default="pypi", help="the remote repository of PyPI behind the virtual one")
    parser.add_argument("--repository-location", help="the repositories' region (default: the environment's)")
    parser.add_argument(
        "--repository-url", help="the repository's URL, when it is not Artifact Registry's for --repository"
    )
    parser.add_argument(
        "--virtual-repository-url",
        help="the virtual repository's URL, when it is not Artifact Registry's for --virtual-repository",
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
    "REPOSITORY=<repository> VIRTUAL_REPOSITORY=<virtual repository>; BUCKET= (with SERVICE_ACCOUNT=) only skips "
    "the environment's describe"
)
#: With the repository as an index beside PyPI, pip could install a tpu-rl that someone publishes there.
NO_VIRTUAL_REPOSITORY = (
    "--env needs --virtual-repository (VIRTUAL_REPOSITORY=): the Artifact Registry virtual repository the "
    "environment installs from, which serves tpu-rl from --repository before PyPI (created if missing). pip orders "
    "no indexes: beside PyPI, a tpu-rl published there could be installed instead of this one"
)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses (``parser.error``) the combinations a deploy cannot complete, before any call."""
    if not args.env:
        parser.error(NO_ENVIRONMENT)
    if not args.location:
        parser.error("--env needs --location (LOCATION=): the environment's region")
    if not (args.repository or args.repository_url):
        parser.error("--env needs --repository: the Artifact Registry Python repository the wheel is uploaded to")
    if not (args.virtual_repository or args.virtual_repository_url):
        parser.error(NO_VIRTUAL_REPOSITORY)
    if args.virtual_repository and not args.repository:
        parser.error("--virtual-repository needs --repository: the upstream it serves tpu-rl from, before PyPI")
    if args.repository and args.bucket and not args.service_account and not args.dry_run:
        parser.error(
            "--repository with --bucket needs --service-account: the environment's service account, which is "
            "granted roles/artifactregistry.reader on the repositories (without --bucket, gcloud's describe gives it)"
        )


def describe_environment(env: Environment, run: Runner) -> tuple[str, str | None, dict[str, str]]:
    """The environment's bucket, service account and custom PyPI packages, from gcloud's describe."""
    described = json.loads(run.read(env.describe_command())).get("config", {})
    bucket = described["dagGcsPrefix"].removeprefix("gs://").split("/", 1)[0]
    service_account = described.get("nodeConfig", {}).get("serviceAccount")
    pypi = described.get("softwareConfig", {}).get("pypiPackages", {})
    print(f"environment {env.name}: bucket gs://{bucket}, service account {service_account}")
    return bucket, service_account, pypi


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


def write_pip_conf(client, bucket_name: str, conf: tuple[str, str], index: str, run: Runner) -> None:
    """Writes the planned pip.conf (the virtual repository's index alone), unless the bucket has it already."""
    current, planned = conf
    if planned == current:
        print(f"gs://{bucket_name}/{PIP_CONF} already names {index} alone")
    elif run.dry_run:
        print(f"would write gs://{bucket_name}/{PIP_CONF}:\n{planned}")
    else:
        print(f"+ write gs://{bucket_name}/{PIP_CONF} (index-url {index}, no other index)")
        client.bucket(bucket_name).blob(PIP_CONF).upload_from_string(planned)


if __name__ == "__main__":
    sys.exit(main())
