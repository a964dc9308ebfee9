"""Deploy this DAG package to a Cloud Composer environment: ``make deploy-composer ENV=... LOCATION=...``.

Composer serves its bucket's folders to Airflow: ``dags/`` -> /home/airflow/gcs/dags, ``plugins/`` ->
/home/airflow/gcs/plugins (on sys.path, where ``tpu_rl`` is imported from), ``data/`` ->
/home/airflow/gcs/data. The DAG reads nothing from ``include/`` at run time; its example run configs go to
``data/include/`` (/home/airflow/gcs/data/include), which keeps them out of the DAG processor's folder.

Two steps:
1. sync (google-cloud-storage, so a GCS emulator can test it): mirror the three folders, deleting what
   the repo no longer has, shipping no caches;
2. gcloud (describe for the bucket, update for the PyPI packages): thin, printed with ``--dry-run``.

The sync owns ``dags/`` and ``plugins/``: in an environment shared with other DAG packages it deletes
their files. ``--update-pypi-packages-from-file`` likewise replaces the whole PyPI package list.
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
# Local folder -> bucket prefix. Plugins first, DAGs last: the DAG processor never sees a new DAG file
# importing a plugin module that is not there yet.
FOLDERS = {"plugins": "plugins/", "include": "data/include/", "dags": "dags/"}
# Composer's own liveness DAG (Composer 1 and 2 keep it in the bucket): deleting it marks the environment
# unhealthy.
KEEP = {"dags/airflow_monitoring.py"}


def local_files(repo: Path = REPO) -> dict[str, Path]:
    """Object name -> file, for what Composer needs; bytecode caches are interpreter-specific, never shipped."""
    files = {}
    for folder, prefix in FOLDERS.items():
        for path in sorted((repo / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files[prefix + path.relative_to(repo / folder).as_posix()] = path
    return files


def _md5(path: Path) -> str:
    """In the form GCS reports (base64 of the digest)."""
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


@dataclass
class SyncResult:
    uploaded: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"uploaded {len(self.uploaded)}, deleted {len(self.deleted)}, unchanged {len(self.unchanged)}"


def sync(client, bucket_name: str, files: dict[str, Path], dry_run: bool = False) -> SyncResult:
    """Make the bucket's managed prefixes hold exactly ``files``: uploads only what differs (md5), then
    deletes stale objects (after the uploads, so a deploy never leaves a moment with no DAG)."""
    bucket = client.bucket(bucket_name)
    remote = {
        blob.name: blob.md5_hash
        for prefix in FOLDERS.values()
        for blob in client.list_blobs(bucket, prefix=prefix)
        if not blob.name.endswith("/")  # folder placeholders created by the console
    }
    result = SyncResult()
    for name, path in files.items():
        if remote.get(name) == _md5(path):
            result.unchanged.append(name)
            continue
        result.uploaded.append(name)
        if not dry_run:
            bucket.blob(name).upload_from_filename(str(path))
    for name in sorted(remote.keys() - files.keys() - KEEP):
        result.deleted.append(name)
        if not dry_run:
            bucket.blob(name).delete()
    return result


def _env_args(env: str, location: str, project: str | None) -> list[str]:
    return [env, "--location", location] + (["--project", project] if project else [])


def describe_command(env: str, location: str, project: str | None) -> list[str]:
    return ["gcloud", "composer", "environments", "describe", *_env_args(env, location, project),
            "--format=json(config.dagGcsPrefix,config.softwareConfig.pypiPackages)"]


def update_command(env: str, location: str, project: str | None, requirements: Path) -> list[str]:
    return ["gcloud", "composer", "environments", "update", *_env_args(env, location, project),
            "--update-pypi-packages-from-file", str(requirements)]


def describe(env: str, location: str, project: str | None) -> tuple[str, dict[str, str]]:
    """The environment's bucket (from ``gs://BUCKET/dags``) and its current PyPI packages."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", help="Composer environment name (needed for the PyPI update)")
    parser.add_argument("--location", help="Composer environment region")
    parser.add_argument("--project", help="Google Cloud project (default: gcloud's)")
    parser.add_argument("--bucket", help="Environment bucket name; skips the gcloud describe")
    parser.add_argument("--requirements", type=Path, default=REPO / "requirements.txt")
    parser.add_argument("--dry-run", action="store_true", help="print the gcloud commands and the sync plan; change nothing")
    args = parser.parse_args(argv)
    if not args.bucket and not (args.env and args.location):
        parser.error("give --env and --location, or --bucket")
    if args.env and not args.location:
        parser.error("--env needs --location")

    current_pypi = None
    bucket = args.bucket
    if args.env:
        if args.dry_run:
            print("would run:", shlex.join(describe_command(args.env, args.location, args.project)))
        else:
            bucket, current_pypi = describe(args.env, args.location, args.project)

    files = local_files()
    if bucket:
        from google.cloud import storage

        result = sync(storage.Client(project=args.project), bucket, files, dry_run=args.dry_run)
        for verb, names in (("upload", result.uploaded), ("delete", result.deleted)):
            for name in names:
                print(f"{'would ' if args.dry_run else ''}{verb} gs://{bucket}/{name}")
        print(f"sync gs://{bucket}: {result.summary()}{' (dry run)' if args.dry_run else ''}")
    else:
        for name in files:
            print(f"would sync {name}")

    if args.env:
        update = update_command(args.env, args.location, args.project, args.requirements)
        if args.dry_run:
            print("would run (unless the environment already has exactly these packages):", shlex.join(update))
        elif current_pypi == parse_requirements(args.requirements):
            print(f"PyPI packages unchanged ({len(current_pypi)}): no environment update")
        else:
            print("+", shlex.join(update), flush=True)
            subprocess.run(update, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
