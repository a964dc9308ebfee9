"""The preflight's decisions: what Compute Engine says of the project against what the run asks for, each refusal
naming the field and the fix, each unreadable thing a warning."""

import pytest

from sim import gke_rules
from tpu_rl import gke
from tpu_rl.config import RunConfig
from tpu_rl.preflight import (
    QuotaReading,
    ReservationReading,
    assess,
    cpu_quota_metric,
    report_lines,
    reservations_to_read,
)
from tpu_rl_testing import SMALL_SLICE

pytestmark = pytest.mark.core

PATH = "projects/my-project/reservations/my-v6e"
#: Quotas that hold the tutorial's run: 64 on-demand v6e chips, the cluster's CPU pools.
ENOUGH = QuotaReading(
    "us-east5",
    {"TPUS_PER_TPU_FAMILY": (64.0, 0.0), "C4D_CPUS": (1000.0, 0.0), "N2_CPUS": (1000.0, 0.0)},
)


def good_reservation(**changes) -> ReservationReading:
    base = {
        "path": PATH,
        "zone": "us-east5-b",
        "found": True,
        "status": "READY",
        "machine_type": "ct6e-standard-4t",
        "count": 16,
        "in_use": 0,
    }
    return ReservationReading(**{**base, **changes})


@pytest.fixture
def reserved(tutorial_conf) -> RunConfig:
    return RunConfig.from_params(
        {**tutorial_conf, "project": "my-project", "capacity_type": "reservation", "reservation": "my-v6e"}
    )


def verdict_of(config, reading, quotas=ENOUGH):
    return assess(config, {("us-east5-b", PATH): reading}, quotas)


def test_a_reservation_that_fits_passes_and_draws_no_tpu_quota(reserved):
    result = verdict_of(reserved, good_reservation(), QuotaReading("us-east5", {"TPUS_PER_TPU_FAMILY": (0.0, 0.0)}))
    assert result.passed and not result.skipped and not result.all_warnings()
    assert reservations_to_read(reserved) == [("us-east5-b", PATH)]


@pytest.mark.parametrize(
    ("reading", "problem", "fix"),
    [
        (
            good_reservation(machine_type="ct5lp-hightpu-4t"),
            "holds ct5lp-hightpu-4t VMs; the run's v6e-64 slice needs ct6e-standard-4t",
            "use a reservation of ct6e-standard-4t",
        ),
        (
            good_reservation(found=False, elsewhere=("us-east5-a",)),
            "is in us-east5-a, not in us-east5-b (a reservation is zonal)",
            "set zone to us-east5-a",
        ),
        (
            good_reservation(found=False),
            "does not exist in us-east5-b",
            "gcloud compute reservations list --project my-project",
        ),
        (
            good_reservation(in_use=8),
            "has 8 of 16 VMs not in use; the run's 1 slice(s) of 16 host(s) need 16",
            "ask for a larger reservation",
        ),
        (good_reservation(status="CREATING"), "is CREATING, not READY", "wait until it is READY"),
    ],
)
def test_a_reservation_that_cannot_hold_the_slice_fails_the_run_before_anything_is_created(
    reserved, reading, problem, fix
):
    result = verdict_of(reserved, reading)
    assert not result.passed
    failure = result.failure()
    assert failure.startswith("the project cannot give this run what it needs (1 problem(s)); nothing was created")
    assert f"reservation: reservation {PATH} {problem}" in failure
    assert fix in failure


def test_a_reservation_of_another_project_must_be_shared_with_the_runs(tutorial_conf):
    owned = "projects/capacity-team/reservations/v6e-pool"
    config = RunConfig.from_params(
        {**tutorial_conf, "project": "my-project", "capacity_type": "reservation", "reservation": owned}
    )
    not_shared = good_reservation(path=owned, shared_with=("other-project",))
    result = assess(config, {("us-east5-b", owned): not_shared}, ENOUGH)
    assert "belongs to project capacity-team and is not shared with my-project" in result.failure()
    assert "--add-share-with my-project" in result.failure()
    shared = good_reservation(path=owned, shared_with=("my-project",))
    assert assess(config, {("us-east5-b", owned): shared}, ENOUGH).passed


def test_an_unreadable_reservation_is_a_warning_never_a_silent_pass(reserved):
    result = verdict_of(reserved, good_reservation(found=False, unreadable="403 Required 'compute.reservations.get'"))
    assert result.passed
    [warning] = result.all_warnings()
    assert "could not read reservation" in warning.problem and "not checked" in warning.problem
    assert "roles/compute.viewer" in warning.fix
    assert any(line.startswith("warning: reservation: could not read") for line in report_lines(result))


def test_on_demand_needs_the_chips_of_the_slice_in_the_regions_tpu_quota(tutorial_config):
    none_left = QuotaReading("us-east5", {**ENOUGH.quotas, "TPUS_PER_TPU_FAMILY": (64.0, 32.0)})
    result = assess(tutorial_config, {}, none_left)
    assert not result.passed
    assert (
        "capacity_type: quota TPUS_PER_TPU_FAMILY in us-east5 is 64 with 32 in use; 64 v6e-64 chips need 64"
        in result.failure()
    )
    assert assess(tutorial_config, {}, ENOUGH).passed


def test_a_quota_metric_compute_engine_does_not_list_or_this_package_does_not_know_is_a_warning(tutorial_conf):
    on_demand = RunConfig.from_params(tutorial_conf)
    unlisted = assess(on_demand, {}, QuotaReading("us-east5", {"C4D_CPUS": (1e4, 0), "N2_CPUS": (1e4, 0)}))
    assert unlisted.passed
    assert [w.problem for w in unlisted.all_warnings()] == [
        "Compute Engine lists no quota TPUS_PER_TPU_FAMILY for us-east5: not checked"
    ]
    spot = RunConfig.from_params({**tutorial_conf, "capacity_type": "spot"})
    unknown = assess(spot, {}, ENOUGH)
    assert unknown.passed
    assert (
        "the preemptible TPU v6e quota's Compute Engine metric is not known here" in unknown.all_warnings()[0].problem
    )


def test_spot_and_flex_start_draw_the_preemptible_quota(tutorial_conf):
    small = {
        **tutorial_conf,
        **SMALL_SLICE,
        **{"tpu_type": "v5litepod-16", "compute_type": "ct5lp-hightpu-4t"},
        **{"zone": "us-west4-a", "region": "us-west4"},
    }
    quotas = QuotaReading(
        "us-west4",
        {
            "TPU_LITE_PODSLICE_V5": (64.0, 0.0),
            "PREEMPTIBLE_TPU_LITE_PODSLICE_V5": (0.0, 0.0),
            "C4D_CPUS": (1e4, 0),
            "N2_CPUS": (1e4, 0),
        },
    )
    assert assess(RunConfig.from_params(small), {}, quotas).passed
    for capacity in ("spot", "flex_start"):
        config = RunConfig.from_params({**small, "capacity_type": capacity})
        result = assess(config, {}, quotas)
        assert "quota PREEMPTIBLE_TPU_LITE_PODSLICE_V5 in us-west4 is 0 with 0 in use" in result.failure(), capacity


def test_a_candidate_that_fails_is_left_out_and_the_run_goes_on_with_the_others(tutorial_conf):
    config = RunConfig.from_params(
        {
            **tutorial_conf,
            "project": "my-project",
            "capacity_candidates": [
                {"zone": "us-east5-b", "capacity_type": "reservation", "reservation": "my-v6e"},
                {"zone": "us-east5-b", "capacity_type": "on_demand"},
            ],
        }
    )
    result = assess(config, {("us-east5-b", PATH): good_reservation(count=4)}, ENOUGH)
    assert result.passed
    assert list(result.skipped) == [0]
    assert result.skipped[0].startswith(f"capacity_candidates[0].reservation: reservation {PATH} has 4 of 4 VMs")
    assert report_lines(result)[:2] == [
        f"candidate 0 (reservation 'my-v6e' in us-east5-b): left out: {result.skipped[0]}",
        "candidate 1 (on_demand in us-east5-b): ok",
    ]
    no_quota = QuotaReading("us-east5", {**ENOUGH.quotas, "TPUS_PER_TPU_FAMILY": (0.0, 0.0)})
    neither = assess(config, {("us-east5-b", PATH): good_reservation(count=4)}, no_quota)
    assert not neither.passed
    assert "(2 problem(s))" in neither.failure()
    assert "capacity_candidates[1].capacity_type: quota TPUS_PER_TPU_FAMILY" in neither.failure()


def test_the_clusters_cpu_pools_need_their_first_nodes_in_the_cpu_quota(tutorial_config, run):
    from datetime import UTC, datetime

    pools = gke.cluster_body(tutorial_config, run, datetime.now(UTC))["node_pools"]
    short = QuotaReading("us-east5", {**ENOUGH.quotas, "C4D_CPUS": (64.0, 0.0)})
    result = assess(tutorial_config, {}, short, pools, cluster_zones=3)
    assert (
        "pw_cpu_machine_type: quota C4D_CPUS in us-east5 is 64 with 0 in use; the cluster's CPU pools' vCPUs need 96"
        in result.failure()
    )
    # The system pool: one n2-standard-8 in each of the regional cluster's three zones.
    enough = QuotaReading("us-east5", {**ENOUGH.quotas, "C4D_CPUS": (96.0, 0.0), "N2_CPUS": (24.0, 0.0)})
    grows = assess(tutorial_config, {}, enough, pools, cluster_zones=3)
    assert grows.passed
    assert {w.problem for w in grows.all_warnings()} == {
        "quota C4D_CPUS in us-east5 leaves 96; the cluster's CPU pools' vCPUs may grow to 384",
        "quota N2_CPUS in us-east5 leaves 24; the cluster's CPU pools' vCPUs may grow to 120",
    }


def test_cpu_quota_metrics_follow_compute_engines_families():
    assert [cpu_quota_metric(m) for m in ("c4d-standard-96", "n2-standard-8", "e2-standard-8")] == [
        "C4D_CPUS",
        "N2_CPUS",
        "CPUS",
    ]


def test_the_quota_metrics_the_package_checks_are_those_the_emulator_charges():
    """The preflight reads the metric a pool of the generation and capacity type draws in the emulator."""
    from tpu_rl.gke import TPU_QUOTA_METRICS
    from tpu_rl.tpu import GENERATIONS

    cluster = {"locations": ["us-east5-a"]}
    for (generation, preemptible), metric in TPU_QUOTA_METRICS.items():
        machine_type = next(iter(GENERATIONS[generation].machine_types))
        pool = {"initial_node_count": 1, "locations": ["us-east5-a"], "config": {"machine_type": machine_type}}
        if preemptible:
            pool["config"]["spot"] = True
        assert set(gke_rules.quota_needs(cluster, pool, "us-east5")) == {metric}, (generation, preemptible)
