"""Deploy this DAG package to a Cloud Composer environment: ``make deploy-composer ENV=... LOCATION=...``.

Composer serves its bucket's folders to Airflow: ``dags/`` -> /home/airflow/gcs/dags, ``plugins/`` ->
/home/airflow/gcs/plugins (on sys.path, where ``tpu_rl`` is imported from), ``data/`` ->
/home/airflow/gcs/data. The DAG reads nothing from ``include/`` at run time; its example run configs go to
``data/tpu_rl/include/``, out of the DAG processor's folder.

Safe in an environment shared with other DAG packages:
- it owns only ``plugins/tpu_rl/`` and ``data/tpu_rl/`` (stale objects there are deleted) and the DAG files
  and plugin file (``plugins/tpu_rl_run_view.py``) it shipped itself: ``data/tpu_rl/deployed.json`` lists them, so a DAG file removed from the repo is
  deleted at the next deploy and other packages' DAGs never are;
- ``plugins/.airflowignore`` is merged: this package's line is added, other lines stay;
- the environment's PyPI packages change only with ``--update-pypi``, and then only the packages whose
  requirement differs, one ``--update-pypi-package`` each (``--update-pypi-packages-from-file`` would
  replace the environment's whole list). What would change is printed first, every time.

Needs only google-cloud-storage (``make deploy-composer`` installs it alone) and, with ``--env``, gcloud.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Local folder -> bucket prefix. Plugins first, DAGs last: the DAG processor never sees a new DAG file
#: importing a plugin module that is not there yet.
FOLDERS = {"plugins/tpu_rl": "plugins/tpu_rl/", "include": "data/tpu_rl/include/", "dags": "dags/"}
#: Single files -> object names: the run view's plugin, which Airflow loads only from the plugins folder's top.
FILES = {"plugins/tpu_rl_run_view.py": "plugins/tpu_rl_run_view.py"}
#: Prefixes only this package writes: whatever is there and not in the repo is stale.
OWNED = ("plugins/tpu_rl/", "data/tpu_rl/")
#: The objects of the last deploy outside the owned prefixes (the DAG files).
MANIFEST = "data/tpu_rl/deployed.json"
AIRFLOWIGNORE = "plugins/.airflowignore"


def local_files(repo: Path = REPO) -> dict[str, Path]:
    """Object name -> file, for what Composer needs; bytecode caches are interpreter-specific, never shipped."""
    files = {}
    for folder, prefix in FOLDERS.items():
        for path in sorted((repo / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files[prefix + path.relative_to(repo / folder).as_posix()] = path
        if folder == "plugins/tpu_rl":  # the plugin after the package it imports
            files.update({name: repo / local for local, name in FILES.items()})
    return files


def _md5(data: bytes) -> str:
    """In the form GCS reports (base64 of the digest)."""
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def merged_airflowignore(remote: str, ours: str) -> str:
    """The bucket's plugins/.airflowignore with this package's patterns added; nothing of others removed."""
    lines = remote.splitlines()
    missing = [line for line in ours.splitlines() if line.strip() and line not in lines]
    if not missing:
        return remote
    return "\n".join([*lines, *missing]) + "\n"


@dataclass
class SyncResult:
    uploaded: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"uploaded {len(self.uploaded)}, deleted {len(self.deleted)}, unchanged {len(self.unchanged)}"


def sync(client, bucket_name: str, files: dict[str, Path], dry_run: bool = False,
         airflowignore: Path = REPO / "plugins/.airflowignore") -> SyncResult:
    """Make the bucket hold ``files``: uploads only what differs (md5), merges plugins/.airflowignore, then
    deletes what this package left stale (after the uploads, so a deploy never leaves a moment with no DAG)."""
    bucket = client.bucket(bucket_name)
    remote = {blob.name: blob.md5_hash for prefix in {*FOLDERS.values(), *OWNED, *FILES.values()}
              for blob in client.list_blobs(bucket, prefix=prefix) if not blob.name.endswith("/")}
    previous = bucket.get_blob(MANIFEST)
    shipped_before = set(json.loads(previous.download_as_bytes())) if previous else set()
    result = SyncResult()

    def put(name: str, data: bytes) -> None:
        if remote.get(name) == _md5(data):
            result.unchanged.append(name)
            return
        result.uploaded.append(name)
        if not dry_run:
            bucket.blob(name).upload_from_string(data)

    ignore = bucket.get_blob(AIRFLOWIGNORE)
    if ignore:
        remote[AIRFLOWIGNORE] = ignore.md5_hash
    put(AIRFLOWIGNORE, merged_airflowignore(ignore.download_as_text() if ignore else "",
                                            airflowignore.read_text()).encode())
    for name, path in files.items():
        put(name, path.read_bytes())
    outside = sorted(name for name in files if not name.startswith(OWNED))
    if not dry_run:
        bucket.blob(MANIFEST).upload_from_string(json.dumps(outside, indent=1), content_type="application/json")
    stale = {n for n in remote if n.startswith(OWNED)} | (shipped_before & remote.keys())
    for name in sorted(stale - files.keys() - {MANIFEST}):
        result.deleted.append(name)
        if not dry_run:
            bucket.blob(name).delete()
    return result


# --- the environment's PyPI packages ------------------------------------------------------------------------


def _env_args(env: str, location: str, project: str | None) -> list[str]:
    return [env, "--location", location] + (["--project", project] if project else [])


def describe_command(env: str, location: str, project: str | None) -> list[str]:
    return ["gcloud", "composer", "environments", "describe", *_env_args(env, location, project),
            "--format=json(config.dagGcsPrefix,config.softwareConfig.pypiPackages)"]


def update_command(env: str, location: str, project: str | None, packages: dict[str, str]) -> list[str]:
    """One --update-pypi-package per package: it adds or updates that package and keeps the others."""
    return ["gcloud", "composer", "environments", "update", *_env_args(env, location, project),
            *[f"--update-pypi-package={name}{spec}" for name, spec in sorted(packages.items())]]


def describe(env: str, location: str, project: str | None) -> tuple[str, dict[str, str]]:
    """The environment's bucket (from ``gs://BUCKET/dags``) and its current custom PyPI packages."""
    out = subprocess.run(describe_command(env, location, project), capture_output=True, text=True, check=True)
    config = json.loads(out.stdout).get("config", {})
    bucket = config["dagGcsPrefix"].removeprefix("gs://").split("/", 1)[0]
    return bucket, config.get("softwareConfig", {}).get("pypiPackages", {})


def parse_requirements(path: Path) -> dict[str, str]:
    """Package -> extras and specifier, split the way gcloud splits the file (so the two compare equal)."""
    packages = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.search(r"(\[|\(|==|>=|!=|<=|<|>|~=|===)", line)
        name, tail = (line[: match.start()].strip(), line[match.start():].strip()) if match else (line, "")
        packages[name] = tail
    return packages


def pypi_changes(current: dict[str, str], wanted: dict[str, str]) -> dict[str, str]:
    """The requirements the environment's custom list lacks or holds with another specifier."""
    return {name: spec for name, spec in wanted.items() if current.get(name) != spec}


def describe_changes(current: dict[str, str], changes: dict[str, str]) -> list[str]:
    return [f"  {name}: {'add ' + name + spec if name not in current else current[name] + ' -> ' + spec}"
            for name, spec in sorted(changes.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", help="Composer environment name (finds the bucket; needed for --update-pypi)")
    parser.add_argument("--location", help="Composer environment region")
    parser.add_argument("--project", help="Google Cloud project (default: gcloud's)")
    parser.add_argument("--bucket", help="Environment bucket name; skips the gcloud describe")
    parser.add_argument("--requirements", type=Path, default=REPO / "requirements.txt")
    parser.add_argument("--update-pypi", action="store_true",
                        help="add or update the environment's PyPI packages that differ from requirements.txt "
                             "(rebuilds the image and restarts Airflow)")
    parser.add_argument("--dry-run", action="store_true", help="print the gcloud commands and the sync plan; change nothing")
    args = parser.parse_args(argv)
    if not args.bucket and not (args.env and args.location):
        parser.error("give --env and --location, or --bucket")
    if args.env and not args.location:
        parser.error("--env needs --location")
    if args.update_pypi and not args.env:
        parser.error("--update-pypi needs --env and --location")

    current_pypi = None
    bucket = args.bucket
    if args.env:
        if args.dry_run and bucket:
            print("would run:", shlex.join(describe_command(args.env, args.location, args.project)))
        else:
            bucket, current_pypi = describe(args.env, args.location, args.project)

    from google.cloud import storage

    result = sync(storage.Client(project=args.project), bucket, local_files(), dry_run=args.dry_run)
    for verb, names in (("upload", result.uploaded), ("delete", result.deleted)):
        for name in names:
            print(f"{'would ' if args.dry_run else ''}{verb} gs://{bucket}/{name}")
    print(f"sync gs://{bucket}: {result.summary()}{' (dry run)' if args.dry_run else ''}")

    if not args.env:
        return 0
    wanted = parse_requirements(args.requirements)
    if current_pypi is None:  # a dry run that was given the bucket
        update = update_command(args.env, args.location, args.project, wanted)
        print("would compare the environment's PyPI packages with requirements.txt; at most:", shlex.join(update))
        return 0
    changes = pypi_changes(current_pypi, wanted)
    if not changes:
        print(f"PyPI packages: the environment already has every requirement of {args.requirements.name}")
        return 0
    print(f"PyPI packages the environment's list lacks or holds otherwise ({args.requirements.name}):")
    print("\n".join(describe_changes(current_pypi, changes)))
    update = update_command(args.env, args.location, args.project, changes)
    if not args.update_pypi:
        print("not updated (the update rebuilds the image and restarts Airflow; the preinstalled providers may "
              "already satisfy these). To apply: add UPDATE_PYPI=1, which runs:", shlex.join(update))
    elif args.dry_run:
        print("would run:", shlex.join(update))
    else:
        print("+", shlex.join(update), flush=True)
        subprocess.run(update, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
