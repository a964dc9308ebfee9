"""The wheel's dependencies against the Cloud Composer 3 builds the docs support (docs/composer-builds.json, read from
Google's "Preinstalled packages changelog" and release notes): Composer installs a custom package into an image whose
packages are fixed, so a floor above a build's preinstalled version makes that build's image update try to move a
preinstalled provider (or fail). And make test-compat's pins are the compatibility build's packages as read."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.core

REPO = Path(__file__).resolve().parents[2]
BUILDS = json.loads((REPO / "docs/composer-builds.json").read_text())


def _known_versions(build: dict) -> dict[str, str]:
    """Each package's version read from the build's list, else the lower bound the file gives for it."""
    known = {canonicalize_name(name): bound for name, (bound, _why) in build["at_least"].items()}
    known.update({canonicalize_name(name): version for name, version in build["packages"].items()})
    return known


def _pins(path: Path) -> dict[str, str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(name): version for name, version in (line.split("==") for line in lines if line)}


def test_every_dependency_accepts_what_each_supported_build_ships():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    refused = []
    for build_name, build in BUILDS["builds"].items():
        known = _known_versions(build)
        for requirement in map(Requirement, dependencies):
            version = known.get(canonicalize_name(requirement.name))
            if version is not None and not requirement.specifier.contains(version, prereleases=True):
                refused.append(
                    f"{build_name}: {requirement.name} {version} (read, or the least it can be); asked: {requirement}"
                )
    assert not refused, "\n".join(refused)


def test_the_compatibility_install_pins_the_build_as_read():
    pins = _pins(REPO / "constraints-af31.txt")
    build = BUILDS["builds"][BUILDS["compatibility_build"]]
    differ = {
        name: (version, pins[canonicalize_name(name)])
        for name, version in build["packages"].items()
        if canonicalize_name(name) in pins and pins[canonicalize_name(name)] != version
    }
    assert not differ, f"constraints-af31.txt differs from {BUILDS['compatibility_build']} (listed, pinned): {differ}"
