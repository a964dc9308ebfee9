"""Capacity candidates: the ordered places a run's TPU slices may come from, each a zone of the cluster's region
and a capacity type (with its reservation where the type needs one), optionally with its own price and wait.

A run gives them as the param ``capacity_candidates`` (a list of objects); without it the run has one candidate,
made from ``zone``, ``capacity_type``, ``reservation`` and ``capacity_wait_minutes`` as before. A run's slices
all come from one candidate: MaxText's multislice data parallelism runs over the DCN between the slices, which
GKE's TPU multislice keeps inside one zone. Pure: the shape of the param is checked here; the rules a candidate
must meet (the generation offered in its zone, a reservation's format) are the single choice's rules, in
``tpu_rl.config_rules``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpu_rl.capacity import CAPACITY

#: The longest capacity wait a run may ask for, all its candidates' together; create_tpu_pools's execution_timeout
#: leaves room above it.
CAPACITY_WAIT_MAX_MINUTES = 24 * 60
#: create_tpu_pools's execution_timeout: the longest wait, and two hours for the creates and a create GKE holds.
CREATE_TPU_POOLS_TIMEOUT_MINUTES = CAPACITY_WAIT_MAX_MINUTES + 120
#: How long GKE holds a pool create it has no capacity for before it ends it with a stockout: about 35 minutes
#: (observed: "Not all instances running in IGM after 35m ... [GCE_STOCKOUT]", Cluster Toolkit PR 6278; GKE documents
#: no figure). Each candidate left may cost that much after its wait.
GKE_HELD_CREATE_MINUTES = 35
#: The param's name, and what each candidate may hold: key -> (the Python type, what the form shows for it).
PARAM = "capacity_candidates"
KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "zone": (str, "a zone of the run's region that offers the TPU generation, e.g. us-east5-b"),
    "capacity_type": (str, f"one of {', '.join(CAPACITY)}"),
    "reservation": (str, "the reservation to consume (capacity_type 'reservation' only)"),
    "price_per_chip_hour": ((int, float), "USD per chip-hour on this candidate (default: tpu_price_per_chip_hour)"),
    "wait_minutes": (
        int,
        f"minutes to wait for a stocked-out pool here before the next candidate, 0 to {CAPACITY_WAIT_MAX_MINUTES} "
        "(default 0)",
    ),
}
REQUIRED_KEYS = ("zone", "capacity_type")


@dataclass(frozen=True)
class Candidate:
    """One place a slice may come from. ``price_per_chip_hour`` None: the run's ``tpu_price_per_chip_hour``."""

    zone: str
    capacity_type: str
    reservation: str = ""
    price_per_chip_hour: float | None = None
    wait_minutes: int = 0

    def describe(self) -> str:
        """E.g. ``spot in us-east5-b`` or ``reservation 'v6e-pool' in us-east5-a``."""
        kind = f"{self.capacity_type} '{self.reservation}'" if self.reservation else self.capacity_type
        return f"{kind} in {self.zone}"

    def price(self, default: float) -> float:
        return default if self.price_per_chip_hour is None else float(self.price_per_chip_hour)


def field_name(index: int, key: str) -> str:
    """How a problem names a candidate's key: ``capacity_candidates[1].zone``."""
    return f"{PARAM}[{index}].{key}"


def shape_problems(raw: Sequence[Any]) -> list[tuple[str, str, str]]:
    """(field, problem, fix) for every entry of the param that is not a candidate: not an object, a key it
    cannot hold, a required key missing, a value of the wrong type. The rules of a well-formed candidate are
    ``tpu_rl.config_rules``'s."""
    return [problem for index, entry in enumerate(raw) for problem in _entry_problems(index, entry)]


def _entry_problems(index: int, entry: Any) -> list[tuple[str, str, str]]:
    if not isinstance(entry, Mapping):
        return [(f"{PARAM}[{index}]", f"{entry!r} is not an object", 'write {"zone": ..., "capacity_type": ...}')]
    problems = [
        (f"{PARAM}[{index}]", f"'{key}' is not a key of a candidate", f"use {', '.join(KEYS)}")
        for key in entry
        if key not in KEYS
    ]
    problems += [
        (field_name(index, key), "is required", f"set it to {KEYS[key][1]}")
        for key in REQUIRED_KEYS
        if not entry.get(key)
    ]
    for key, (kind, meaning) in KEYS.items():
        value = entry.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) or not _in_range(key, value)):
            problems.append((field_name(index, key), f"{value!r} is not valid", f"give {meaning}"))
    return problems


def _in_range(key: str, value: Any) -> bool:
    """The bounds the form's schema sets (:func:`form_schema`), for a conf that did not come through the form."""
    if key == "capacity_type":
        return value in CAPACITY
    if key == "wait_minutes":
        return 0 <= value <= CAPACITY_WAIT_MAX_MINUTES
    if key == "price_per_chip_hour":
        return value >= 0
    return True


def parse(raw: Sequence[Any]) -> tuple[Candidate, ...]:
    """The well-formed entries of the param as candidates, in order (:func:`shape_problems` reports the others)."""
    return tuple(
        Candidate(
            zone=entry["zone"],
            capacity_type=entry["capacity_type"],
            reservation=entry.get("reservation") or "",
            price_per_chip_hour=entry.get("price_per_chip_hour"),
            wait_minutes=entry.get("wait_minutes") or 0,
        )
        for index, entry in enumerate(raw)
        if not _entry_problems(index, entry)
    )


def form_schema() -> dict[str, Any]:
    """The JSON schema of the param in the trigger form: a list of candidate objects."""
    properties: dict[str, Any] = {
        "zone": {"type": "string", "description": KEYS["zone"][1]},
        "capacity_type": {"type": "string", "enum": list(CAPACITY), "description": KEYS["capacity_type"][1]},
        "reservation": {"type": "string", "description": KEYS["reservation"][1]},
        "price_per_chip_hour": {"type": "number", "minimum": 0, "description": KEYS["price_per_chip_hour"][1]},
        "wait_minutes": {
            "type": "integer",
            "minimum": 0,
            "maximum": CAPACITY_WAIT_MAX_MINUTES,
            "description": KEYS["wait_minutes"][1],
        },
    }
    return {
        "items": {
            "type": "object",
            "properties": properties,
            "required": list(REQUIRED_KEYS),
            "additionalProperties": False,
        }
    }
