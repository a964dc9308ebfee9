"""How the real clients reach the GKE emulator: the ClusterManager gRPC service over TLS, behind an HTTP
CONNECT proxy (the clients run with grpc_proxy / HTTPS_PROXY pointing at it, so they dial
container.googleapis.com, compute.googleapis.com and gke-<id>.<location>.gke.goog unmodified). The proxy never
dials anything but the emulator's own ports on 127.0.0.1."""

from __future__ import annotations

import logging
import select
import socket
import threading
from concurrent import futures
from typing import Any

from . import gke_dns
from .gke_errors import GkeError
from .gke_settings import COMPUTE_HOST, COMPUTE_PORT, DNS_PORT, GRPC_PORT, HOST, PKI, PROXY_PORT, SERVICE

log = logging.getLogger("gke")


UNAUTHENTICATED_TEXT = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid "
    "authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)


def grpc_handler(emulator: Any):
    """The ClusterManager service's methods, each answered by the emulator's method of that name once the
    caller's bearer token is one it knows (else UNAUTHENTICATED) and IAM lets its account make the call
    (``emulator.authorize``, sim/gke_iam.py); a GkeError becomes its gRPC status."""
    import grpc
    from google.cloud import container_v1 as c

    methods = {
        "CreateCluster": (c.CreateClusterRequest, c.Operation, emulator.create_cluster),
        "GetCluster": (c.GetClusterRequest, c.Cluster, emulator.get_cluster),
        "ListClusters": (c.ListClustersRequest, c.ListClustersResponse, emulator.list_clusters),
        "DeleteCluster": (c.DeleteClusterRequest, c.Operation, emulator.delete_cluster),
        "CreateNodePool": (c.CreateNodePoolRequest, c.Operation, emulator.create_node_pool),
        "GetNodePool": (c.GetNodePoolRequest, c.NodePool, emulator.get_node_pool),
        "ListNodePools": (c.ListNodePoolsRequest, c.ListNodePoolsResponse, emulator.list_node_pools),
        "DeleteNodePool": (c.DeleteNodePoolRequest, c.Operation, emulator.delete_node_pool),
        "GetOperation": (c.GetOperationRequest, c.Operation, emulator.get_operation),
        "ListOperations": (c.ListOperationsRequest, c.ListOperationsResponse, emulator.list_operations),
    }

    def wrap(method, call):
        def handle(request, context):
            metadata = dict(context.invocation_metadata())
            auth = metadata.get("authorization", "")
            caller = emulator.accounts.caller(auth[7:]) if auth.startswith("Bearer ") else None
            if caller is None:
                log.info("%s: UNAUTHENTICATED", method)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_TEXT)
            try:
                emulator.authorize(method, request, caller)
                answer = call(request)
                log.info("%s by %s: OK", method, caller)
                return answer
            except GkeError as e:
                log.info("%s by %s: %s %s", method, caller, e.code, e.message)
                context.abort(getattr(grpc.StatusCode, e.code), e.message)

        return handle

    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            wrap(name, call), request_deserializer=req.deserialize, response_serializer=resp.serialize
        )
        for name, (req, resp, call) in methods.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def serve_grpc(emulator: Any):
    """The gRPC server, TLS with $SIM/pki/gke.crt (SAN container.googleapis.com), on GRPC_PORT."""
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc_handler(emulator),))
    creds = grpc.ssl_server_credentials([((PKI / "gke.key").read_bytes(), (PKI / "gke.crt").read_bytes())])
    if server.add_secure_port(f"127.0.0.1:{GRPC_PORT}", creds) == 0:
        raise SystemExit(f"cannot listen on 127.0.0.1:{GRPC_PORT}")
    server.start()
    return server


def serve_proxy():
    """The CONNECT proxy on PROXY_PORT: container.googleapis.com:443 to the gRPC server, compute.googleapis.com:443
    to the Compute Engine stand-in (sim/compute_api.py), a cluster's DNS endpoint to the DNS front end, anything else
    403."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", PROXY_PORT))
    listener.listen(64)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_tunnel, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name="proxy", daemon=True).start()


def _upstream_port(request_line: str) -> int | None:
    """The emulator's own port a CONNECT request line asks for, or None for any other target."""
    parts = request_line.split()
    target = parts[1].rsplit(":", 1) if len(parts) == 3 and parts[0] == "CONNECT" else ["", ""]
    if target == [HOST, "443"]:
        return GRPC_PORT
    if target == [COMPUTE_HOST, "443"]:
        return COMPUTE_PORT
    if gke_dns.is_endpoint_host(target[0]) and target[1] == "443":
        return DNS_PORT
    return None


def _tunnel(conn):
    """One client connection: its CONNECT request read, then refused or piped to the port it asks for."""
    try:
        conn.settimeout(10)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        port = _upstream_port(line)
        if port is None:
            log.info("proxy refused %r", line)
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()
            return
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            upstream.sendall(rest)
        conn.settimeout(None)
        upstream.settimeout(None)
        _pipe(conn, upstream)
    except OSError:
        try:
            conn.close()
        except OSError:
            pass


def _pipe(a, b):
    """Copies bytes both ways until either side closes or neither sends for 5 minutes; then closes both."""
    try:
        while True:
            readable, _, _ = select.select([a, b], [], [], 300)
            if not readable:
                return
            for s in readable:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return
    finally:
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass
