"""The preflight: what Compute Engine says of the project, read before anything is created, against what the run
will ask GKE for. Pure: the hook reads (``tpu_rl.hooks.compute``), this decides; ``preflight`` (the operator) and
``make plan`` (with credentials) print the same findings.

Each capacity candidate is judged on its own: its reservation (found in its zone, READY, of the slice's machine type,
shared with the run's project, with enough VMs not in use for the run's slices: what xpk checks before it creates a
cluster, ``xpk/core/capacity.py`` ``assess_available_slices``) and the regional TPU quota its capacity type draws.
A candidate refused here is left out of ``create_tpu_pools``' order with the reason; a run none of whose candidates
passes, or whose cluster's CPU pools the region's CPU quota cannot hold, fails before any bucket, cluster or pool
exists. What cannot be read (a permission, an API not enabled, a quota Compute Engine does not list) is a warning,
never a silent pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_rl.candidates import Candidate, field_name
from tpu_rl.capacity import CAPACITY
from tpu_rl.gke import TPU_QUOTA_METRICS
from tpu_rl.machines import SHAPES

#: Compute Engine's CPU quota of a machine family: its own (``N2_CPUS``, ``C4D_CPUS``, ...), or ``CPUS`` for E2 and
#: N1, which draw the region's general quota (Compute Engine "Allocation quotas": "CPU quota ... E2 and N1 machine
#: types use the CPUS quota; other machine series have their own quota, such as N2_CPUS").
GENERAL_CPU_FAMILIES = ("e2", "n1")
#: Compute Engine's reservation status a pool can consume (REST reference Reservation.status: CREATING, DELETING,
#: INVALID, READY, UPDATING); xpk reads a reservation that is not READY as none (``_get_reservation_cached``).
READY = "READY"


@dataclass(frozen=True)
class ReservationReading:
    """What Compute Engine answered for a reservation asked for in one zone (``path``:
    ``projects/OWNER/reservations/NAME``). ``unreadable``: why it could not be read (then nothing else is known);
    ``elsewhere``: the zones the owner's reservations of that name live in, when it is not in ``zone``."""

    path: str
    zone: str
    found: bool = False
    status: str = ""
    machine_type: str = ""
    count: int | None = None
    in_use: int = 0
    shared_with: tuple[str, ...] = ()
    elsewhere: tuple[str, ...] = ()
    unreadable: str = ""

    @property
    def owner(self) -> str:
        return self.path.split("/")[1]

    @property
    def name(self) -> str:
        return self.path.split("/")[3]


@dataclass(frozen=True)
class QuotaReading:
    """A region's Compute Engine quotas: metric -> (limit, usage); ``unreadable``: why they could not be read."""

    region: str
    quotas: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    unreadable: str = ""


@dataclass(frozen=True)
class Finding:
    """One thing the preflight found: the field it concerns, what the project has, and the fix."""

    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}; fix: {self.fix}"


@dataclass(frozen=True)
class CandidateVerdict:
    index: int
    candidate: Candidate
    refusals: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()

    @property
    def usable(self) -> bool:
        return not self.refusals


@dataclass(frozen=True)
class Preflight:
    """The verdict on each capacity candidate, and on what the whole run needs (the cluster's CPU pools)."""

    candidates: tuple[CandidateVerdict, ...] = ()
    refusals: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()

    @property
    def skipped(self) -> dict[int, str]:
        """Candidates left out, by index, with why (the first refusal)."""
        return {v.index: str(v.refusals[0]) for v in self.candidates if not v.usable}

    @property
    def passed(self) -> bool:
        return not self.refusals and (not self.candidates or any(v.usable for v in self.candidates))

    def all_warnings(self) -> list[Finding]:
        return [*self.warnings, *(w for v in self.candidates for w in v.warnings)]

    def failure(self) -> str:
        """The run's refusal: every problem, each with its fix."""
        problems = [*self.refusals, *(r for v in self.candidates for r in v.refusals)]
        lines = "\n".join(f"  - {p}" for p in problems)
        return (
            f"the project cannot give this run what it needs ({len(problems)} problem(s)); nothing was created:\n"
            f"{lines}"
        )


# --- what to read -----------------------------------------------------------------------------------------------


def reservation_path(candidate: Candidate, project: str) -> str:
    """``projects/OWNER/reservations/NAME`` of a candidate's reservation (a bare name: the run's project's); blocks
    and sub-blocks are left off (the reservation is read, as xpk's ``get_reservation`` does)."""
    parts = candidate.reservation.split("/")
    if parts[0] == "projects" and len(parts) >= 4:
        return f"projects/{parts[1]}/reservations/{parts[3]}"
    return f"projects/{project}/reservations/{parts[0]}"


def reservations_to_read(config: Any) -> list[tuple[str, str]]:
    """(zone, path) of every reservation a candidate of the run would consume."""
    if not creates_tpu_pools(config):
        return []
    wanted = [(c.zone, reservation_path(c, config.project)) for c in config.candidates if c.reservation]
    return list(dict.fromkeys(wanted))


def creates_tpu_pools(config: Any) -> bool:
    return bool(config.tpu_pools_per_run or config.tpu_pools_with_cluster)


# --- the decisions ----------------------------------------------------------------------------------------------


def assess(
    config: Any,
    reservations: Mapping[tuple[str, str], ReservationReading],
    quotas: QuotaReading,
    cluster_pools: Sequence[Mapping[str, Any]] = (),
    cluster_zones: int = 1,
) -> Preflight:
    """The preflight of a run: ``reservations`` by (zone, path) as :func:`reservations_to_read` lists them;
    ``quotas`` the cluster region's; ``cluster_pools`` the pool requests of the cluster the run creates (none: it
    creates none) whose nodes go to ``cluster_zones`` zones each unless they name their own locations."""
    verdicts = []
    if creates_tpu_pools(config):
        for index, candidate in enumerate(config.candidates):
            refusals, warnings = _tpu_quota(config, index, candidate, quotas)
            if candidate.reservation:
                reading = reservations[(candidate.zone, reservation_path(candidate, config.project))]
                more, more_warnings = _reservation(config, index, candidate, reading)
                refusals, warnings = refusals + more, warnings + more_warnings
            verdicts.append(CandidateVerdict(index, candidate, tuple(refusals), tuple(warnings)))
    refusals, warnings = _cpu_quota(config, quotas, cluster_pools, cluster_zones)
    return Preflight(tuple(verdicts), tuple(refusals), tuple(warnings))


def _field(config: Any, index: int, key: str, single: str) -> str:
    return field_name(index, key) if config.capacity_candidates else single


def _reservation(
    config: Any, index: int, candidate: Candidate, reading: ReservationReading
) -> tuple[list[Finding], list[Finding]]:
    where = _field(config, index, "reservation", "reservation")
    if reading.unreadable:
        return [], [
            Finding(
                where,
                f"could not read reservation {reading.path} in {candidate.zone} ({reading.unreadable}): not checked, "
                "the pool create will be the first to tell",
                "grant the Airflow identity roles/compute.viewer on the reservation's project "
                "(docs/getting-started/composer.md)",
            )
        ]
    if not reading.found:
        if reading.elsewhere:
            zones = ", ".join(reading.elsewhere)
            return [
                Finding(
                    where,
                    f"reservation {reading.path} is in {zones}, not in {candidate.zone} (a reservation is zonal)",
                    f"set {_field(config, index, 'zone', 'zone')} to {reading.elsewhere[0]}, or name a reservation "
                    f"of {candidate.zone}",
                )
            ], []
        return [
            Finding(
                where,
                f"reservation {reading.path} does not exist in {candidate.zone}",
                f"check the name with `gcloud compute reservations list --project {reading.owner}`; a reservation of "
                "another project is named projects/OWNER/reservations/NAME",
            )
        ], []
    return _reservation_fit(config, where, candidate, reading)


def _reservation_fit(
    config: Any, where: str, candidate: Candidate, reading: ReservationReading
) -> tuple[list[Finding], list[Finding]]:
    """A reservation found in the candidate's zone: READY, of the slice's machine type, the run's project's or shared
    with it, with enough VMs not in use for the run's slices."""
    slices, hosts = config.cluster_nodepool_count, config.hosts_per_slice
    refusals, warnings = [], []
    if reading.status != READY:
        refusals.append(
            Finding(
                where,
                f"reservation {reading.path} is {reading.status or 'of no status'}, not {READY}",
                "wait until it is READY (`gcloud compute reservations describe`), or use another capacity candidate",
            )
        )
    wanted_type = config.compute_type
    if reading.machine_type and reading.machine_type != wanted_type:
        refusals.append(
            Finding(
                where,
                f"reservation {reading.path} holds {reading.machine_type} VMs; the run's {config.tpu_type} slice needs "
                f"{wanted_type}",
                f"use a reservation of {wanted_type}, or set tpu_type and topology to what the reservation holds",
            )
        )
    elif not reading.machine_type:
        warnings.append(Finding(where, f"reservation {reading.path} names no machine type: not checked", "none needed"))
    if reading.owner != config.project and config.project not in reading.shared_with:
        refusals.append(
            Finding(
                where,
                f"reservation {reading.path} belongs to project {reading.owner} and is not shared with "
                f"{config.project}",
                f"share it with {config.project} (`gcloud compute reservations update {reading.name} --zone "
                f"{candidate.zone} --project {reading.owner} --add-share-with {config.project}`)",
            )
        )
    if reading.count is not None:
        free = max(0, reading.count - reading.in_use)
        if free < slices * hosts:
            refusals.append(
                Finding(
                    where,
                    f"reservation {reading.path} has {free} of {reading.count} VMs not in use; the run's {slices} "
                    f"slice(s) of {hosts} host(s) need {slices * hosts}",
                    "free its VMs (delete the pools or instances that hold them), ask for a larger reservation, or "
                    "use another capacity candidate",
                )
            )
    return refusals, warnings


def _tpu_quota(
    config: Any, index: int, candidate: Candidate, quotas: QuotaReading
) -> tuple[list[Finding], list[Finding]]:
    """The regional TPU quota the candidate's capacity type draws: none for a reservation (its chips need no quota:
    GKE "Troubleshoot TPUs in GKE"); the preemptible one for Spot and flex-start (Cloud TPU "Request TPUs using
    flex-start": flex-start needs enough preemptible quota)."""
    if CAPACITY[candidate.capacity_type].needs_reservation:
        return [], []
    preemptible = candidate.capacity_type in ("spot", "flex_start")
    metric = TPU_QUOTA_METRICS.get((config.slice.generation.name, preemptible))
    where = _field(config, index, "capacity_type", "capacity_type")
    kind = "preemptible " if preemptible else ""
    if metric is None:
        return [], [
            Finding(
                where,
                f"the {kind}TPU {config.slice.generation.name} quota's Compute Engine metric is not known here: "
                "not checked",
                f"check it on the Quotas page (IAM & Admin > Quotas & System Limits) for {config.chips} chips in "
                f"{quotas.region}",
            )
        ]
    return _quota(metric, config.chips, quotas, where, f"{config.chips} {config.tpu_type} chips")


def _quota(
    metric: str, need: float, quotas: QuotaReading, where: str, what: str, *, least: float | None = None
) -> tuple[list[Finding], list[Finding]]:
    """Refused when ``least`` (default: ``need``) is more than the quota leaves; a warning when only ``need`` is."""
    if quotas.unreadable:
        return [], [
            Finding(
                where,
                f"could not read the quotas of {quotas.region} ({quotas.unreadable}): {metric} not checked",
                "grant the Airflow identity roles/compute.viewer on the project (docs/getting-started/composer.md)",
            )
        ]
    if metric not in quotas.quotas:
        return [], [
            Finding(
                where,
                f"Compute Engine lists no quota {metric} for {quotas.region}: not checked",
                "check it on the Quotas page (IAM & Admin > Quotas & System Limits)",
            )
        ]
    limit, usage = quotas.quotas[metric]
    left = max(0.0, limit - usage)
    least = need if least is None else least
    if least > left:
        return [
            Finding(
                where,
                f"quota {metric} in {quotas.region} is {limit:g} with {usage:g} in use; {what} need {least:g}",
                f"request more {metric} on the Quotas page (IAM & Admin > Quotas & System Limits, Compute Engine "
                "API), free what uses it, or choose a capacity type or region that has it",
            )
        ], []
    if need > left:
        return [], [
            Finding(
                where,
                f"quota {metric} in {quotas.region} leaves {left:g}; {what} may grow to {need:g}",
                f"request more {metric} if the pool must scale that far",
            )
        ]
    return [], []


def cpu_quota_metric(machine_type: str) -> str:
    family = machine_type.split("-")[0]
    return "CPUS" if family in GENERAL_CPU_FAMILIES else f"{family.upper()}_CPUS"


def _cpu_quota(
    config: Any, quotas: QuotaReading, pools: Sequence[Mapping[str, Any]], cluster_zones: int
) -> tuple[list[Finding], list[Finding]]:
    """The CPU quota of the cluster's CPU pools, by metric: refused when their first nodes do not fit, a warning when
    their autoscaling maximum does not."""
    start: dict[str, float] = {}
    most: dict[str, float] = {}
    for pool in pools:
        machine_type = pool["config"]["machine_type"]
        shape = SHAPES.get(machine_type)
        if shape is None:  # a TPU pool: its chips are the TPU quota's
            continue
        zones = len(pool.get("locations") or ()) or cluster_zones
        metric = cpu_quota_metric(machine_type)
        start[metric] = start.get(metric, 0) + shape.vcpus * int(pool.get("initial_node_count") or 0) * zones
        peak = int((pool.get("autoscaling") or {}).get("max_node_count") or pool.get("initial_node_count") or 0)
        most[metric] = most.get(metric, 0) + shape.vcpus * peak * zones
    refusals: list[Finding] = []
    warnings: list[Finding] = []
    for metric in start:
        more, more_warnings = _quota(
            metric, most[metric], quotas, "pw_cpu_machine_type", "the cluster's CPU pools' vCPUs", least=start[metric]
        )
        refusals += more
        warnings += more_warnings
    return refusals, warnings


def report_lines(result: Preflight) -> list[str]:
    """What the log and the plan print: each candidate's verdict, then the warnings."""
    lines = []
    for verdict in result.candidates:
        state = "ok" if verdict.usable else f"left out: {verdict.refusals[0]}"
        lines.append(f"candidate {verdict.index} ({verdict.candidate.describe()}): {state}")
        lines += [f"  also: {r}" for r in verdict.refusals[1:]]
    lines += [f"refused: {r}" for r in result.refusals]
    lines += [f"warning: {w}" for w in result.all_warnings()]
    return lines
