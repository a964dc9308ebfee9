"""Builds the wheel of src/ (``make wheel``) as a function of the sources: the same commit gives the same bytes in
any checkout, so a redeploy or a rollback finds its very wheel in the repository (scripts/deploy_composer.py
compares SHA-256s and refuses another wheel under a published version).

What else reaches the bytes, and how each is held fixed:

- the files' modes: setuptools' bdist_wheel writes each file's ``st_mode`` into its zip entry (``WheelFile.write``
  in setuptools 84.2.1, ``setuptools/_vendor/wheel/wheelfile.py``, wheel 0.46.3), and a checkout's modes follow
  the umask it was made under. The build reads a fresh copy whose files are 0644, under umask 022 (the files
  setuptools writes itself: METADATA, WHEEL, entry_points.txt);
- the entries' time stamps: SOURCE_DATE_EPOCH (``get_zipinfo_datetime``, same file);
- the build backend: pinned exactly in pyproject.toml's ``[build-system]``, and checked against the wheel's
  ``Generator`` (a build without pip's isolation would use whatever setuptools is installed);
- what an earlier build left: setuptools keeps build/lib between builds (a deleted module would ship); the copy
  has none.

Usage: ``python scripts/build_wheel.py [OUT_DIR]`` (default dist/) prints the wheel's path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What setuptools reads for this project: its configuration, the package (with the readme, ``src/README.md``: the
#: METADATA's description), and the license files ``license-files`` adds to the dist-info.
TOP_LEVEL = ("pyproject.toml",)
PACKAGE = "src"
LICENSE_PATTERNS = ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*")
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", "build")
#: 1980-01-01, the earliest time a zip entry can hold.
SOURCE_DATE_EPOCH = "315532800"
FILE_MODE = 0o644
#: The one entry setuptools writes from memory, with a mode of its own (``WheelFile.writestr``: 0o664).
RECORD_MODE = 0o664


def copy_sources(repo: Path, target: Path) -> None:
    """The build's inputs under ``target``, every file 0644 whatever the checkout's umask gave it."""
    target.mkdir(parents=True)
    files = [repo / name for name in TOP_LEVEL] + sorted(p for g in LICENSE_PATTERNS for p in repo.glob(g))
    for path in files:
        shutil.copyfile(path, target / path.name)
    shutil.copytree(repo / PACKAGE, target / PACKAGE, ignore=SKIPPED, copy_function=shutil.copyfile)
    for path in target.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else FILE_MODE)


def pinned_backend(repo: Path) -> str:
    """``setuptools (X.Y.Z)``, as the wheel's WHEEL file names its generator; refuses an unpinned backend."""
    requires = tomllib.loads((repo / "pyproject.toml").read_text())["build-system"]["requires"]
    match = next((re.fullmatch(r"setuptools==([\w.]+)", r.replace(" ", "")) for r in requires), None)
    if not match:
        raise SystemExit(f"pyproject.toml [build-system] requires {requires}: pin setuptools exactly (==)")
    return f"setuptools ({match.group(1)})"


def unexpected_entries(wheel: Path, generator: str) -> list[str]:
    """What in the wheel is not as a build from these sources alone makes it: a mode other than 0644 (RECORD's
    0664), or another generator."""
    found = []
    with zipfile.ZipFile(wheel) as archive:
        for entry in archive.infolist():
            expected = RECORD_MODE if entry.filename.endswith(".dist-info/RECORD") else FILE_MODE
            mode = entry.external_attr >> 16
            if mode != (0o100000 | expected):
                found.append(f"{entry.filename}: mode {oct(mode)}, not {oct(0o100000 | expected)}")
            if entry.filename.endswith(".dist-info/WHEEL"):
                wheel_file = archive.read(entry).decode()
                if f"Generator: {generator}" not in wheel_file:
                    found.append(f"{entry.filename}: built by another backend than {generator}:\n{wheel_file}")
    return found


def build(repo: Path, out_dir: Path) -> Path:
    """The wheel of ``repo``'s sources in ``out_dir``; refused (SystemExit) unless it is as described above."""
    generator = pinned_backend(repo)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sources, built = Path(tmp) / "sources", Path(tmp) / "wheel"
        copy_sources(repo, sources)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(built), str(sources)],
            env={**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
            umask=0o022,
            check=True,
        )
        (wheel,) = built.glob("*.whl")
        problems = unexpected_entries(wheel, generator)
        if problems:
            raise SystemExit(f"{wheel.name} would not be reproducible:\n" + "\n".join(problems))
        return Path(shutil.copy(wheel, out_dir / wheel.name))


if __name__ == "__main__":
    print(build(REPO, Path(sys.argv[1] if len(sys.argv) > 1 else "dist")))
