"""The one reader of the RFC 3339 times the services write: Kubernetes (``creationTimestamp``, the kubelet's log
line stamps), GKE (an operation's ``start_time``, ``end_time``) and Cloud Storage (``updated``, ``timeCreated``).
They end in ``Z`` or an offset and may carry nanoseconds; Python 3.11's ``datetime.fromisoformat`` reads both
(keeping microseconds). Pure: no I/O."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(text: str) -> datetime:
    """``text`` as an aware datetime; a time that names no zone is UTC (the JobSet operator's ``not_before``)."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_optional_time(text: str | None) -> datetime | None:
    """:func:`parse_time`, or None for none."""
    return parse_time(text) if text else None


def posix_time(text: str | None) -> float | None:
    """:func:`parse_time` as POSIX seconds, or None for none."""
    return parse_time(text).timestamp() if text else None
