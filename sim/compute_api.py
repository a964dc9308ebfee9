"""The part of Compute Engine's REST API a run's preflight reads, as the GKE emulator serves it: a zone's reservation,
the project's reservations in every zone, a region and its quotas. The clients reach it unmodified as
``https://compute.googleapis.com`` through the emulator's CONNECT proxy (HTTPS_PROXY), over TLS with a certificate of
the stand-in public CA (sim/gke_dns.py), which they trust through REQUESTS_CA_BUNDLE (google-cloud-compute's REST
transport is requests').

What it holds is what the GKE emulator's pool creates consume (one truth for both):
- reservations: $SIM/gke/reservations.json (sim/gke_emulator.py's docstring), each entry optionally with ``zone`` (the
  one zone it lives in; absent: found in any zone), ``machine_type`` and ``status`` (default READY); ``vm_count`` is
  ``specificReservation.count``, and ``inUseCount`` the VMs the emulated project's pools take from it;
- quotas: $SIM/gke/quotas.json, ``{"REGION": {"METRIC": limit}}``; a region without an entry has the defaults below;
  a metric's usage is what the emulated project's pools in that region use.

Each answer follows Compute Engine's REST reference (Reservation, Region, Quota, ReservationAggregatedList); refusals
are its JSON errors (``{"error": {"code", "message", "errors": [{"domain", "reason", "message"}]}}``): 401 without a
token the emulator issued, 403 naming the permission the caller lacks (IAM: sim/gke_iam.py; the read permissions are
``compute.reservations.get``/``.list`` and ``compute.regions.get``: Compute Engine IAM permissions reference), 404
``The resource '...' was not found`` (the wording gcloud prints for a missing reservation).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import gke_iam

log = logging.getLogger("gke.compute")

HOST = "compute.googleapis.com"
BASE = "https://www.googleapis.com/compute/v1"
#: A region's quotas when $SIM/gke/quotas.json names none for it: enough for every scenario of the simulation, for
#: every metric the emulated machine types draw (sim/gke_rules.py ``quota_needs``; a real project's defaults for TPU
#: metrics are 0 until a quota increase: Cloud TPU "Quotas").
PLENTY = 100000.0


def _default_quotas() -> dict[str, float]:
    from .gke_machines import MACHINE_TYPES
    from .gke_rules import GENERAL_CPU_FAMILIES, TPU_QUOTA_METRICS

    metrics = {"CPUS", "IN_USE_ADDRESSES", "SSD_TOTAL_GB"}
    for machine in MACHINE_TYPES.values():
        if machine.tpu_chips:
            metric = TPU_QUOTA_METRICS.get(machine.family, "TPUS")
            metrics |= {metric, f"PREEMPTIBLE_{metric}"}
        elif machine.family not in GENERAL_CPU_FAMILIES:
            metrics.add(f"{machine.family.upper()}_CPUS")
    return dict.fromkeys(sorted(metrics), PLENTY)


DEFAULT_QUOTAS: dict[str, float] = _default_quotas()
READ_RESERVATION = "compute.reservations.get"
LIST_RESERVATIONS = "compute.reservations.list"
READ_REGION = "compute.regions.get"

_ZONAL = re.compile(r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/reservations/(?P<name>[^/?]+)")
_AGGREGATED = re.compile(r"/compute/v1/projects/(?P<project>[^/]+)/aggregated/reservations")
_REGION = re.compile(r"/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/?]+)")


class ComputeError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


def not_found(resource: str) -> ComputeError:
    return ComputeError(404, "notFound", f"The resource '{resource}' was not found")


def forbidden(permission: str, resource: str) -> ComputeError:
    """Compute Engine's 403: ``Required 'compute.regions.get' permission for 'projects/P/regions/R'``."""
    return ComputeError(403, "forbidden", f"Required '{permission}' permission for '{resource}'")


def reservation_entries(entries: list, project: str) -> list[dict]:
    """reservations.json's entries as dicts: owner, name, zone (None: any), machine type, count, sharing, status."""
    out = []
    for entry in entries:
        raw = entry if isinstance(entry, dict) else {"name": entry}
        path = raw["name"]
        owner, name = (path.split("/")[1], path.split("/")[3]) if path.startswith("projects/") else (project, path)
        out.append(
            {
                "owner": owner,
                "name": name,
                "zone": raw.get("zone"),
                "machine_type": raw.get("machine_type", ""),
                "count": raw.get("vm_count"),
                "shared_with": list(raw.get("shared_with", [])),
                "status": raw.get("status", "READY"),
            }
        )
    return out


def reservation_resource(entry: dict, zone: str, in_use: int) -> dict:
    """A Reservation as Compute Engine's REST reference shows it."""
    shared = entry["shared_with"]
    body: dict[str, Any] = {
        "kind": "compute#reservation",
        "name": entry["name"],
        "zone": f"{BASE}/projects/{entry['owner']}/zones/{zone}",
        "selfLink": f"{BASE}/projects/{entry['owner']}/zones/{zone}/reservations/{entry['name']}",
        "status": entry["status"],
        "specificReservationRequired": True,
        "shareSettings": {
            "shareType": "SPECIFIC_PROJECTS" if shared else "LOCAL",
            **({"projectMap": {p: {"projectId": p} for p in shared}} if shared else {}),
        },
        "specificReservation": {
            "inUseCount": str(in_use),
            "instanceProperties": {"machineType": entry["machine_type"]} if entry["machine_type"] else {},
        },
    }
    if entry["count"] is not None:
        body["specificReservation"]["count"] = str(entry["count"])
    return body


def region_resource(project: str, region: str, limits: dict[str, float], usage: dict[str, float]) -> dict:
    return {
        "kind": "compute#region",
        "name": region,
        "status": "UP",
        "selfLink": f"{BASE}/projects/{project}/regions/{region}",
        "quotas": [
            {"metric": metric, "limit": float(limit), "usage": float(usage.get(metric, 0.0))}
            for metric, limit in sorted(limits.items())
        ],
    }


class ComputeApi:
    """Answers the reads; ``reservations()`` and ``quotas()`` give the files' contents (read on each request),
    ``in_use(owner, name)`` the VMs the project's pools take from a reservation, ``usage(project, region)`` each
    quota metric's usage, ``policy()`` the IAM policy, ``caller(token)`` the account of a bearer token."""

    def __init__(
        self,
        *,
        reservations: Callable[[], list],
        quotas: Callable[[], dict],
        in_use: Callable[[str, str], int],
        usage: Callable[[str, str], dict[str, float]],
        policy: Callable[[], dict],
        caller: Callable[[str], str | None],
    ):
        self.reservations, self.quotas, self.in_use, self.usage = reservations, quotas, in_use, usage
        self.policy, self.caller = policy, caller

    def answer(self, path: str, token: str) -> dict:
        caller = self.caller(token)
        if caller is None:
            raise ComputeError(401, "required", "Request had invalid authentication credentials.")
        if match := _ZONAL.fullmatch(path):
            return self.reservation(caller, **match.groupdict())
        if match := _AGGREGATED.fullmatch(path):
            return self.all_reservations(caller, match["project"])
        if match := _REGION.fullmatch(path):
            return self.region(caller, match["project"], match["region"])
        raise not_found(path)

    def _check(self, caller: str, permission: str, project: str, resource: str) -> None:
        roles = gke_iam.project_roles(self.policy(), f"serviceAccount:{caller}", project)
        if not gke_iam.allowed(roles, permission):
            raise forbidden(permission, resource)

    def _entries(self, project: str) -> list[dict]:
        return [e for e in reservation_entries(self.reservations(), project) if e["owner"] == project]

    def reservation(self, caller: str, project: str, zone: str, name: str) -> dict:
        resource = f"projects/{project}/zones/{zone}/reservations/{name}"
        self._check(caller, READ_RESERVATION, project, resource)
        for entry in self._entries(project):
            if entry["name"] == name and entry["zone"] in (None, zone):
                return reservation_resource(entry, zone, self.in_use(project, name))
        raise not_found(resource)

    def all_reservations(self, caller: str, project: str) -> dict:
        """ReservationAggregatedList: ``items`` keyed ``zones/ZONE``; a reservation without a zone is listed under
        none (it stands for one found wherever it is asked for)."""
        self._check(caller, LIST_RESERVATIONS, project, f"projects/{project}")
        items: dict[str, dict] = {}
        for entry in self._entries(project):
            if entry["zone"]:
                bucket = items.setdefault(f"zones/{entry['zone']}", {"reservations": []})
                bucket["reservations"].append(
                    reservation_resource(entry, entry["zone"], self.in_use(project, entry["name"]))
                )
        return {"kind": "compute#reservationAggregatedList", "items": items}

    def region(self, caller: str, project: str, region: str) -> dict:
        resource = f"projects/{project}/regions/{region}"
        self._check(caller, READ_REGION, project, resource)
        limits = {**DEFAULT_QUOTAS, **(self.quotas().get(region) or {})}
        return region_resource(project, region, limits, self.usage(project, region))


def serve(port: int, pki: Path, api: ComputeApi) -> None:
    """The REST server on 127.0.0.1:port, TLS with a compute.googleapis.com certificate of the stand-in public CA."""
    from .gke_dns import host_certificate

    crt, key = host_certificate(pki, HOST)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(crt, key)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            try:
                code, body = 200, api.answer(self.path.split("?", 1)[0], token)
            except ComputeError as error:
                code, body = error.code, error.body()
            except Exception as error:  # noqa: BLE001 - answered as Compute Engine's 500
                log.exception("compute: %s", self.path)
                code, body = 500, ComputeError(500, "backendError", str(error)).body()
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):
            log.info("compute %s", fmt % args)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    # The handshake in each connection's own thread (on its first read), never in the accepting one.
    server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="compute", daemon=True).start()
