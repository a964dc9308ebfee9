"""GKE's DNS-based control-plane endpoint, as the GKE emulator serves it.

A GKE cluster always has a DNS name, ``<uid>.<location>.gke.goog`` (API reference,
ControlPlaneEndpointsConfig.DNSEndpointConfig.endpoint: "Always present, but the behavior may change
according to the value of DNSEndpointConfig.allow_external_traffic"). Behind it a Google front end, not
the control plane, terminates TLS with a publicly trusted certificate ("signed by a public, generally
recognized Google CA"; IP-based endpoints are "signed by the cluster root CA": GKE docs, About network
isolation, https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation), checks IAM, and
passes the request on. That is why clients must not pin the cluster CA for it (the provider's
GKEClusterConnection sets no ssl_ca_cert with use_dns_endpoint).

Here:
- a root CA of its own stands in for Google's public CA: ``$SIM/pki/public-ca.crt``, appended to the
  system's bundle in ``$SIM/pki/public-trust.pem``, which the simulation's clients trust through
  SSL_CERT_FILE (the kubernetes and kubernetes_asyncio clients use the default trust store when no CA is
  given). The cluster CA is not in it: a client that pins the cluster CA for the DNS name fails, as on GKE.
- the CONNECT proxy sends ``CONNECT <name>.gke.goog:443`` here (clients reach it through HTTPS_PROXY);
- each connection's first request is checked: the name must be a cluster's, its DNS endpoint must allow
  external traffic (else 403), the bearer token must be a Google access token the emulator issued (else
  401), its account must hold ``container.clusters.connect`` on the cluster (IAM, sim/gke_iam.py; else 403
  naming the permission); then the connection is joined to the cluster's apiserver over TLS (verified with the
  cluster CA), which authorizes the same token as on its IP endpoint.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("gke.dns")

DOMAIN = "gke.goog"


def endpoint_name(cluster_id: str, location: str) -> str:
    """The DNS endpoint of a cluster: ``gke-<32 hex>-<project number>.<location>.gke.goog`` in GKE's
    answers (e.g. gke-94fc1769e0c844e99793ee485d88c68c0b39.europe-west1.gke.goog in gcpdiag issue 115);
    the emulator's uid part is the cluster id."""
    return f"gke-{cluster_id}.{location}.{DOMAIN}"


def is_endpoint_host(host: str) -> bool:
    return host.endswith(f".{DOMAIN}")


# --- the stand-in public CA -------------------------------------------------------------------------------


def ensure_public_ca(pki: Path) -> None:
    """The public root (if missing) and the trust bundle: the system's roots plus this one."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    crt, key_path = pki / "public-ca.crt", pki / "public-ca.key"
    if not crt.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpu-rl-sim public root (Google Trust Services)")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_path.chmod(0o600)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    system = ssl.get_default_verify_paths().openssl_cafile
    roots = Path(system).read_text() if system and Path(system).exists() else ""
    (pki / "public-trust.pem").write_text(roots + crt.read_text())


def _region_certificate(pki: Path, location: str) -> tuple[Path, Path]:
    """A serving cert for ``*.<location>.gke.goog`` signed by the public root (made once per location)."""
    return host_certificate(pki, f"*.{location}.{DOMAIN}", location)


def host_certificate(pki: Path, host: str, file_name: str | None = None) -> tuple[Path, Path]:
    """A serving cert for ``host`` (a name or a wildcard) signed by the public root, made once: the DNS endpoints'
    and the Compute Engine stand-in's (sim/compute_api.py)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    file_name = file_name or host
    crt, key_path = pki / "gke-dns" / f"{file_name}.crt", pki / "gke-dns" / f"{file_name}.key"
    if crt.exists():
        return crt, key_path
    crt.parent.mkdir(parents=True, exist_ok=True)
    ca_key = serialization.load_pem_private_key((pki / "public-ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((pki / "public-ca.crt").read_bytes())
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    wildcard = host
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, wildcard)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(wildcard)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt, key_path


# --- the front end ----------------------------------------------------------------------------------------


class Route:
    """Where a DNS name leads: the cluster's apiserver, a refusal (HTTP status, message), or with ``reset`` a
    connection closed before any answer (a front end or a control-plane replica going away); ``project`` and
    ``cluster_path``: the cluster whose IAM decides who may pass."""

    def __init__(self, apiserver: str | None = None, refusal: tuple[int, str] | None = None, reset: bool = False):
        self.apiserver, self.refusal, self.reset = apiserver, refusal, reset
        self.project, self.cluster_path = "", ""


#: The Status reason of each status the front end answers with (Kubernetes' metav1.StatusReason names).
REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 503: "ServiceUnavailable"}


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": status,
        }
    ).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n"
    ).encode() + body


def serve(
    port: int,
    pki: Path,
    route: Callable[[str], Route | None],
    caller: Callable[[str], str | None],
    refusal: Callable[[Route, str], str | None],
) -> None:
    """Runs the front end on 127.0.0.1:port in a thread of its own.

    route(host): the cluster behind a DNS name (None: no such cluster); caller(token): the account of a
    Google access token, or None; refusal(route, account): why IAM refuses that account the cluster (it lacks
    container.clusters.connect), or None."""
    server_tls = _server_tls(pki)
    upstream_tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    upstream_tls.check_hostname = False  # the apiserver's cert names 127.0.0.1, dialed as host:port
    handle = functools.partial(_handle, route=route, caller=caller, refusal=refusal, upstream_tls=upstream_tls)
    ready = threading.Event()

    def run():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port, ssl=server_tls))
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, name="dns-endpoint", daemon=True).start()
    if not ready.wait(30):
        raise SystemExit(f"cannot listen on 127.0.0.1:{port}")


def _server_tls(pki: Path) -> ssl.SSLContext:
    """TLS that presents, by SNI, the certificate of the location a name is in (``*.<location>.gke.goog``, made on
    first use); us-central1's to a client that names none."""
    contexts: dict[str, ssl.SSLContext] = {}

    def context_for(location: str) -> ssl.SSLContext:
        if location not in contexts:
            crt, key = _region_certificate(pki, location)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(crt, key)
            contexts[location] = ctx
        return contexts[location]

    def on_sni(sslobj, server_name, _ctx):
        if server_name and is_endpoint_host(server_name):
            sslobj.context = context_for(server_name.split(".", 1)[1].rsplit(".", 2)[0])

    base = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    base.load_cert_chain(*_region_certificate(pki, "us-central1"))
    base.sni_callback = on_sni
    return base


async def _pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _handle(reader, writer, route, caller, refusal, upstream_tls):
    """One connection: its first request is checked (see the module's docstring), then refused or joined to the
    cluster's apiserver."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    host = headers.get("host", "").split(":")[0]
    target = route(host)
    auth = headers.get("authorization", "")
    account = caller(auth[7:]) if auth.startswith("Bearer ") else None
    if target is None:
        writer.write(_response(404, "NotFound", f"No cluster has the DNS endpoint {host}."))
    elif target.reset:
        writer.close()
        return
    elif target.refusal:
        writer.write(_response(target.refusal[0], REASONS[target.refusal[0]], target.refusal[1]))
    elif account is None:
        writer.write(
            _response(
                401,
                "Unauthorized",
                "Request had invalid authentication credentials. Expected OAuth 2 access token.",
            )
        )
    elif denied := refusal(target, account):  # IAM: container.clusters.connect on the cluster
        writer.write(_response(403, "Forbidden", denied))
    else:
        host_part, port_part = target.apiserver.rsplit(":", 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host_part, int(port_part), ssl=upstream_tls)
        except OSError as e:
            writer.write(_response(503, "ServiceUnavailable", f"The control plane is unreachable: {e}"))
        else:
            up_writer.write(head)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            return
    await writer.drain()
    writer.close()
