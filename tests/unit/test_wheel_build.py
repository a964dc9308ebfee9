"""The wheel is a function of the sources: two checkouts of one commit, made and built under different umasks,
give the same SHA-256 through ``make wheel``, so a redeploy or a rollback from any checkout finds its very wheel in
the repository (the deploy refuses another wheel under a published version)."""

from __future__ import annotations

import hashlib
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scripts.build_wheel import unexpected_entries
from tpu_rl_testing import WHEEL_BUILD_INPUTS, checkout_copy, make_wheel

pytestmark = pytest.mark.core

REPO = Path(__file__).resolve().parents[2]


def test_two_checkouts_under_different_umasks_build_the_same_wheel(tmp_path):
    def checkout_and_build(umask: int) -> Path:
        return make_wheel(checkout_copy(tmp_path / f"checkout-{umask:o}", WHEEL_BUILD_INPUTS, umask), umask)

    with ThreadPoolExecutor(2) as builds:  # side by side: a build is seconds, mostly pip setting up its backend
        wheels = list(builds.map(checkout_and_build, (0o022, 0o077)))

    digests = {hashlib.sha256(wheel.read_bytes()).hexdigest() for wheel in wheels}
    assert len(digests) == 1, digests
    with zipfile.ZipFile(wheels[1]) as archive:
        modes = {entry.filename: entry.external_attr >> 16 for entry in archive.infolist()}
    # Every file 0644; RECORD is the one entry setuptools writes from memory, always 0664 (WheelFile.writestr).
    odd = {name: oct(mode) for name, mode in modes.items() if mode != 0o100644 and not name.endswith("/RECORD")}
    assert not odd and modes["tpu_rl/__init__.py"] == 0o100644
    assert [mode for name, mode in modes.items() if name.endswith("/RECORD")] == [0o100664]


def test_the_build_backend_is_pinned_exactly():
    """Another setuptools writes other bytes (its version is in the WHEEL file, its code makes the zip)."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert requires and all("==" in requirement for requirement in requires), requires


def test_a_wheel_with_a_checkouts_mode_or_another_backend_is_refused(tmp_path):
    wheel = tmp_path / "tpu_rl-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        private = zipfile.ZipInfo("tpu_rl/__init__.py")
        private.external_attr = 0o100600 << 16
        archive.writestr(private, "")
        generator = zipfile.ZipInfo("tpu_rl-0.0.0.dist-info/WHEEL")
        generator.external_attr = 0o100644 << 16
        archive.writestr(generator, "Wheel-Version: 1.0\nGenerator: setuptools (65.5.0)\n")

    problems = unexpected_entries(wheel, "setuptools (84.2.1)")

    assert len(problems) == 2
    assert "tpu_rl/__init__.py: mode 0o100600" in problems[0] and "another backend" in problems[1]
