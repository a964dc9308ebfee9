"""The Compute Engine stand-in (sim/compute_api.py) and the GKE emulator's rules that share its state: a zonal
reservation refused in another zone, a pool beyond the region's quota refused at once with GKE's 403, and Compute
Engine's answers (found, 404, 403) as its REST reference shapes them. Pure: no simulation, no network."""

from __future__ import annotations

import pytest

from sim import compute_api
from sim import gke_rules as rules
from sim.gke_errors import GkeError

pytestmark = pytest.mark.core

CALLER = "tpu-rl-sim@tpu-rl-sim.iam.gserviceaccount.com"
VIEWER = {"projects": {"tpu-rl-sim": {f"serviceAccount:{CALLER}": ["roles/compute.viewer"]}}}
RESERVATIONS = [
    {
        "name": "projects/tpu-rl-sim/reservations/v6e-b",
        "zone": "us-east5-b",
        "machine_type": "ct6e-standard-4t",
        "vm_count": 16,
        "shared_with": ["consumer"],
    }
]


def api(policy=VIEWER, quotas=None, in_use=4):
    return compute_api.ComputeApi(
        reservations=lambda: RESERVATIONS,
        quotas=lambda: quotas or {},
        in_use=lambda owner, name: in_use,
        usage=lambda project, region: {"TPUS_PER_TPU_FAMILY": 16.0},
        policy=lambda: policy,
        caller=lambda token: CALLER if token == "good" else None,
    )


def test_a_reservation_is_read_in_its_zone_with_what_is_in_use_and_who_shares_it():
    found = api().answer("/compute/v1/projects/tpu-rl-sim/zones/us-east5-b/reservations/v6e-b", "good")
    assert found["status"] == "READY"
    assert found["specificReservation"] == {
        "count": "16",
        "inUseCount": "4",
        "instanceProperties": {"machineType": "ct6e-standard-4t"},
    }
    assert found["shareSettings"] == {
        "shareType": "SPECIFIC_PROJECTS",
        "projectMap": {"consumer": {"projectId": "consumer"}},
    }
    listed = api().answer("/compute/v1/projects/tpu-rl-sim/aggregated/reservations", "good")
    assert [r["name"] for r in listed["items"]["zones/us-east5-b"]["reservations"]] == ["v6e-b"]


def test_compute_engine_refuses_as_it_does():
    with pytest.raises(compute_api.ComputeError) as missing:
        api().answer("/compute/v1/projects/tpu-rl-sim/zones/us-east5-a/reservations/v6e-b", "good")
    assert (missing.value.code, missing.value.message) == (
        404,
        "The resource 'projects/tpu-rl-sim/zones/us-east5-a/reservations/v6e-b' was not found",
    )
    with pytest.raises(compute_api.ComputeError) as denied:
        api(policy={}).answer("/compute/v1/projects/tpu-rl-sim/regions/us-east5", "good")
    assert (denied.value.code, denied.value.message) == (
        403,
        "Required 'compute.regions.get' permission for 'projects/tpu-rl-sim/regions/us-east5'",
    )
    with pytest.raises(compute_api.ComputeError) as unknown:
        api().answer("/compute/v1/projects/tpu-rl-sim/regions/us-east5", "forged")
    assert unknown.value.code == 401


def test_a_regions_quotas_are_the_files_over_the_defaults_with_the_projects_usage():
    region = api(quotas={"us-east5": {"TPUS_PER_TPU_FAMILY": 32}}).answer(
        "/compute/v1/projects/tpu-rl-sim/regions/us-east5", "good"
    )
    quotas = {q["metric"]: (q["limit"], q["usage"]) for q in region["quotas"]}
    assert quotas["TPUS_PER_TPU_FAMILY"] == (32.0, 16.0)
    assert quotas["C4D_CPUS"] == (compute_api.DEFAULT_QUOTAS["C4D_CPUS"], 0.0)


def tpu_pool(**config):
    return {
        "name": "tpu-slice-0",
        "initial_node_count": 16,
        "locations": ["us-east5-a"],
        "config": {"machine_type": "ct6e-standard-4t", **config},
    }


def test_a_zonal_reservation_is_not_found_from_another_zone():
    pool = tpu_pool(
        reservation_affinity={
            "consume_reservation_type": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": ["v6e-b"],
        }
    )
    with pytest.raises(GkeError) as refused:
        rules.check_reservation_zone(pool, "us-east5-a", "tpu-rl-sim", RESERVATIONS)
    assert refused.value.code == "NOT_FOUND"
    assert refused.value.message == (
        'Google Compute Engine: reservation "v6e-b" not found for node pool "tpu-slice-0" at zone "us-east5-a".'
    )
    rules.check_reservation_zone(pool, "us-east5-b", "tpu-rl-sim", RESERVATIONS)


def test_a_pool_beyond_the_regions_quota_is_refused_with_gkes_403_and_reservations_draw_none():
    cluster = {"locations": ["us-east5-a", "us-east5-b", "us-east5-c"]}
    on_demand = tpu_pool()
    needs = rules.quota_needs(cluster, on_demand, "us-east5")
    assert needs == {"TPUS_PER_TPU_FAMILY": 64.0}
    assert rules.quota_needs(cluster, tpu_pool(spot=True), "us-east5") == {"PREEMPTIBLE_TPUS_PER_TPU_FAMILY": 64.0}
    reserved = tpu_pool(reservation_affinity={"consume_reservation_type": "SPECIFIC_RESERVATION"})
    assert rules.quota_needs(cluster, reserved, "us-east5") == {}
    system = {"initial_node_count": 1, "config": {"machine_type": "n2-standard-8"}}
    assert rules.quota_needs(cluster, system, "us-east5") == {"N2_CPUS": 24.0}
    with pytest.raises(GkeError) as refused:
        rules.check_quota(on_demand, needs, {"TPUS_PER_TPU_FAMILY": 64.0}, {"TPUS_PER_TPU_FAMILY": 16.0}, "us-east5")
    assert refused.value.code == "PERMISSION_DENIED"
    assert refused.value.message.startswith(
        "Insufficient regional quota to satisfy request: resource \"TPUS_PER_TPU_FAMILY\": request requires '64.0' "
        "and is short '16.0'. project has a quota of '64.0' with '48.0' available in region us-east5."
    )
    rules.check_quota(on_demand, needs, {"TPUS_PER_TPU_FAMILY": 80.0}, {"TPUS_PER_TPU_FAMILY": 16.0}, "us-east5")
