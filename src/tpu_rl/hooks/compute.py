"""Compute Engine's reads the preflight needs: a reservation in a zone, where a project's reservations live, a region's
quotas. Through the Google provider's connection and credentials (``GoogleBaseHook``) and google-cloud-compute's
clients (which come with the Google provider). Each read gives what ``tpu_rl.preflight`` judges; a read Compute Engine
refuses (a permission, the API not enabled) gives why, never an exception: the preflight then warns instead of
passing in silence."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from tpu_rl.preflight import QuotaReading, ReservationReading

#: Each read, all its attempts together (the client retries 503s and timeouts).
CALL_TIMEOUT_SECONDS = 60.0


def _why(error: Any) -> str:
    """A refusal in a few words: its HTTP code and Compute Engine's message (or the transport's error)."""
    code = getattr(error, "code", "")
    return f"{code} {getattr(error, 'message', '') or error}".strip() if code else f"{type(error).__name__}: {error}"


def _unreadable() -> tuple[type[BaseException], ...]:
    """What makes a read unreadable rather than failed: Compute Engine's refusal, a token that cannot be had, an API
    that cannot be reached (the pool create is then the first to tell)."""
    import requests
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import GoogleAuthError

    return (GoogleAPICallError, GoogleAuthError, requests.RequestException)


class ComputeApiHook:
    """Compute Engine of the projects ``gcp_conn_id`` reaches."""

    def __init__(self, gcp_conn_id: str = "", credentials: Any = None) -> None:
        """Through the Airflow connection ``gcp_conn_id``, or with ``credentials`` (the command's, outside Airflow)."""
        self.gcp_conn_id = gcp_conn_id
        self._given = credentials

    @cached_property
    def _credentials(self) -> Any:
        if self._given is not None:
            return self._given
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

        return GoogleBaseHook(gcp_conn_id=self.gcp_conn_id).get_credentials()

    @cached_property
    def _reservations(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.ReservationsClient(credentials=self._credentials)

    @cached_property
    def _regions(self) -> Any:
        from google.cloud import compute_v1

        return compute_v1.RegionsClient(credentials=self._credentials)

    def reservation(self, zone: str, path: str) -> ReservationReading:
        """Reservation ``path`` (``projects/OWNER/reservations/NAME``) as Compute Engine shows it in ``zone``; when it
        is not there, the zones its owner has one of that name in (when the owner's list may be read)."""
        from google.api_core.exceptions import NotFound

        owner, name = path.split("/")[1], path.split("/")[3]
        try:
            found = self._reservations.get(project=owner, zone=zone, reservation=name, timeout=CALL_TIMEOUT_SECONDS)
        except NotFound:
            return ReservationReading(path, zone, found=False, elsewhere=self._zones_of(owner, name))
        except _unreadable() as error:
            return ReservationReading(path, zone, unreadable=_why(error))
        specific = found.specific_reservation
        shared = tuple(found.share_settings.project_map.keys()) if found.share_settings else ()
        return ReservationReading(
            path,
            zone,
            found=True,
            status=found.status,
            machine_type=specific.instance_properties.machine_type if specific else "",
            count=int(specific.count) if specific and "count" in specific else None,
            in_use=int(specific.in_use_count) if specific else 0,
            shared_with=shared,
        )

    def _zones_of(self, owner: str, name: str) -> tuple[str, ...]:
        """The zones ``owner`` has a reservation ``name`` in (none when its list may not be read)."""
        try:
            pages = self._reservations.aggregated_list(project=owner, timeout=CALL_TIMEOUT_SECONDS)
            return tuple(
                scope.removeprefix("zones/")
                for scope, listed in pages
                for reservation in listed.reservations
                if reservation.name == name
            )
        except _unreadable():
            return ()

    def quotas(self, project: str, region: str) -> QuotaReading:
        try:
            found = self._regions.get(project=project, region=region, timeout=CALL_TIMEOUT_SECONDS)
        except _unreadable() as error:
            return QuotaReading(region, unreadable=_why(error))
        return QuotaReading(region, {q.metric: (float(q.limit), float(q.usage)) for q in found.quotas})
