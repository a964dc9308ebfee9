"""GKE's validation rules of the simulation (sim/gke_rules.py, sim/gke_machines.py): each refused request, and its
accepted twin.

Pure: no simulation, no network. Each test fails if its rule is removed.
"""

from __future__ import annotations

import copy
from datetime import UTC

import pytest

from sim import gke_machines as machines
from sim import gke_rules as rules
from sim.gke_errors import GkeError

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

REGION, PROJECT = "us-east5", "tpu-rl-sim"


def tpu_pool(**overrides):
    pool = {
        "name": "tpu-slice-0",
        "initial_node_count": 16,
        "locations": ["us-east5-b"],
        "config": {
            "machine_type": "ct6e-standard-4t",
            "disk_type": "hyperdisk-balanced",
            "workload_metadata_config": {"mode": "GKE_METADATA"},
        },
        "placement_policy": {"type": "COMPACT", "tpu_topology": "8x8"},
        "management": {"auto_repair": True, "auto_upgrade": True},
    }
    pool.update(overrides)
    return pool


def cluster(**overrides):
    body = {
        "name": "tpu-rl",
        "release_channel": {"channel": "REGULAR"},
        "workload_identity_config": {"workload_pool": f"{PROJECT}.svc.id.goog"},
        "node_pools": [{"name": "system", "initial_node_count": 1, "config": {"machine_type": "n2-standard-8"}}],
    }
    body.update(overrides)
    return body


def refused(fn, *args, code="INVALID_ARGUMENT"):
    with pytest.raises(GkeError) as info:
        fn(*args)
    assert info.value.code == code
    return info.value.message


def test_valid_tpu_pool_and_cluster_pass():
    rules.check_cluster(cluster(), REGION, PROJECT, {})
    rules.check_node_pool(cluster(), tpu_pool(), REGION, PROJECT, {})


def test_auto_upgrade_off_on_release_channel_refused_auto_repair_off_accepted():
    pool = tpu_pool(management={"auto_repair": True, "auto_upgrade": False})
    message = refused(rules.check_management_with_release_channel, cluster(), pool)
    assert message == "Auto_upgrade cannot be false when release_channel REGULAR is set."
    # Without a release channel GKE lets it be turned off; without `management` the defaults (true) apply.
    rules.check_management_with_release_channel(cluster(release_channel={"channel": "UNSPECIFIED"}), pool)
    rules.check_management_with_release_channel(cluster(), {k: v for k, v in pool.items() if k != "management"})
    # Auto-repair may be off on a channel cluster (flex-start needs it off).
    rules.check_management_with_release_channel(
        cluster(), tpu_pool(management={"auto_repair": False, "auto_upgrade": True})
    )


@pytest.mark.parametrize("name", ["1abc", "Abc", "abc-", "a_b", "a" * 41, ""])
def test_bad_cluster_and_pool_names_refused(name):
    refused(rules.check_cluster_name, name)
    refused(rules.check_node_pool_name, name)


@pytest.mark.parametrize("name", ["a", "tpu-rl-1", "a" * 40])
def test_good_names_pass(name):
    rules.check_cluster_name(name)
    rules.check_node_pool_name(name)


def test_pool_zone_outside_region_refused():
    message = refused(rules.check_pool_locations, REGION, tpu_pool(locations=["us-central1-a"]))
    assert "us-central1-a" in message and REGION in message
    rules.check_pool_locations(REGION, tpu_pool(locations=["us-east5-a", "us-east5-c"]))


def test_tpu_node_count_must_match_topology():
    message = refused(machines.check_tpu_slice, tpu_pool(initial_node_count=8))
    assert message.startswith("Node count 8 is not a valid size of TPU pod slice with topology 8x8")
    machines.check_tpu_slice(tpu_pool(initial_node_count=16))
    machines.check_tpu_slice(
        tpu_pool(initial_node_count=2, placement_policy={"type": "COMPACT", "tpu_topology": "2x4"})
    )


def test_tpu_topology_must_exist_for_generation():
    assert "7x9" in refused(
        machines.check_tpu_slice, tpu_pool(placement_policy={"type": "COMPACT", "tpu_topology": "7x9"})
    )
    # v5p/v4 are 3D: 2x2x2 is a v5p topology, 8x8 is not.
    v5p = tpu_pool(
        config={"machine_type": "ct5p-hightpu-4t"},
        initial_node_count=2,
        placement_policy={"type": "COMPACT", "tpu_topology": "2x2x2"},
    )
    machines.check_tpu_slice(v5p)
    machines.check_tpu_slice(
        {**v5p, "initial_node_count": 48, "placement_policy": {"type": "COMPACT", "tpu_topology": "4x4x12"}}
    )
    refused(
        machines.check_tpu_slice,
        {**v5p, "initial_node_count": 12, "placement_policy": {"type": "COMPACT", "tpu_topology": "2x4x6"}},
    )
    refused(machines.check_tpu_slice, {**v5p, "placement_policy": {"type": "COMPACT", "tpu_topology": "8x8"}})


def test_multi_host_slice_needs_compact_placement_and_4_chip_hosts():
    assert "COMPACT" in refused(machines.check_tpu_slice, tpu_pool(placement_policy={"tpu_topology": "8x8"}))
    eight = tpu_pool(config={"machine_type": "ct6e-standard-8t"}, initial_node_count=8)
    refused(machines.check_tpu_slice, eight)
    # single host: an 8-chip VM holds a whole 2x4 slice, no placement needed
    machines.check_tpu_slice(
        tpu_pool(
            config={"machine_type": "ct6e-standard-8t"}, initial_node_count=1, placement_policy={"tpu_topology": "2x4"}
        )
    )


def test_topology_without_tpu_machine_refused():
    refused(machines.check_tpu_slice, tpu_pool(config={"machine_type": "n2-standard-8"}))


def with_reservation(affinity):
    pool = tpu_pool()
    pool["config"] = {**pool["config"], "reservation_affinity": affinity}
    return pool


def test_specific_reservation_form():
    good = {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [f"projects/{PROJECT}/reservations/res-a"],
    }
    known = rules.reservation_consumers(["res-a"], PROJECT)
    rules.check_reservation_affinity(with_reservation(good), PROJECT, known)
    rules.check_reservation_affinity(with_reservation({**good, "values": ["res-a"]}), PROJECT, known)
    refused(rules.check_reservation_affinity, with_reservation({**good, "key": "reservation"}), PROJECT, known)
    refused(
        rules.check_reservation_affinity,
        with_reservation({**good, "values": ["res-a", "res-b"]}),
        PROJECT,
        rules.reservation_consumers(["res-a", "res-b"], PROJECT),
    )
    refused(rules.check_reservation_affinity, with_reservation({**good, "values": []}), PROJECT, known)


def test_unknown_reservation_not_found():
    affinity = {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["gone"],
    }
    message = refused(rules.check_reservation_affinity, with_reservation(affinity), PROJECT, {}, code="NOT_FOUND")
    assert message == (
        'Google Compute Engine: reservation "gone" not found for node pool "tpu-slice-0" at zone "us-east5-b".'
    )
    # ANY_RESERVATION names none
    rules.check_reservation_affinity(with_reservation({"consume_reservation_type": "ANY_RESERVATION"}), PROJECT, {})


def spot_pool(**config):
    pool = tpu_pool()
    pool["config"] = {**pool["config"], "spot": True, **config}
    return pool


def flex_pool(**overrides):
    pool = tpu_pool(
        initial_node_count=0,
        management={"auto_repair": False, "auto_upgrade": True},
        autoscaling={"enabled": True, "min_node_count": 0, "max_node_count": 16, "location_policy": "ANY"},
    )
    pool["config"] = {
        **pool["config"],
        "flex_start": True,
        "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"},
    }
    pool.update(overrides)
    return pool


def test_spot_pool_consumes_no_reservation():
    rules.check_node_pool(cluster(), spot_pool(), REGION, PROJECT, {})
    rules.check_capacity(spot_pool(reservation_affinity={"consume_reservation_type": "NO_RESERVATION"}))
    for kind in ("ANY_RESERVATION", "SPECIFIC_RESERVATION"):
        assert "Spot VMs cannot consume reservations" in refused(
            rules.check_capacity, spot_pool(reservation_affinity={"consume_reservation_type": kind})
        )


def test_flex_start_pool_as_gke_documents_it_passes():
    rules.check_node_pool(cluster(), flex_pool(), REGION, PROJECT, {})


@pytest.mark.parametrize(
    "change, words",
    [
        ({"initial_node_count": 16}, "initial_node_count must be 0"),
        ({"autoscaling": None}, "autoscaling enabled"),
        ({"autoscaling": {"enabled": True, "min_node_count": 16, "max_node_count": 16}}, "min_node_count 0"),
        ({"management": {"auto_repair": True, "auto_upgrade": True}}, "auto-repair to be disabled"),
        ({"management": None}, "auto-repair to be disabled"),  # GKE's default: auto-repair on
    ],
    ids=["initial nodes", "no autoscaling", "autoscaling from 16", "auto-repair on", "auto-repair by default"],
)
def test_flex_start_pool_gke_refuses(change, words):
    assert words in refused(rules.check_capacity, flex_pool(**change))


def test_flex_start_excludes_reservations_and_spot():
    pool = flex_pool()
    pool["config"] = {**pool["config"], "reservation_affinity": {"consume_reservation_type": "ANY_RESERVATION"}}
    assert "NO_RESERVATION" in refused(rules.check_capacity, pool)
    pool = flex_pool()
    pool["config"] = {**pool["config"], "spot": True}
    assert "spot and flex_start cannot both be set" in refused(rules.check_capacity, pool)


def test_flex_start_refuses_tpu_v4():
    pool = flex_pool(
        initial_node_count=0,
        placement_policy={"type": "COMPACT", "tpu_topology": "2x2x4"},
        autoscaling={"enabled": True, "min_node_count": 0, "max_node_count": 4},
    )
    pool["config"] = {**pool["config"], "machine_type": "ct4p-hightpu-4t", "disk_type": "pd-balanced"}
    assert 'does not support machine type "ct4p-hightpu-4t"' in refused(rules.check_capacity, pool)
    machines.check_tpu_slice(pool)


def test_autoscaled_slice_pool_is_sized_by_its_maximum():
    pool = flex_pool(autoscaling={"enabled": True, "min_node_count": 0, "max_node_count": 8})
    assert refused(machines.check_tpu_slice, pool).startswith(
        "Maximum node count 8 is not a valid size of TPU pod slice with topology 8x8"
    )
    machines.check_tpu_slice(flex_pool())


@pytest.mark.parametrize("machine_type", ["c4d-standard-96", "n4-standard-32", "ct6e-standard-4t", "c4-standard-96"])
def test_hyperdisk_only_machine_types_refuse_pd(machine_type):
    pool = {"name": "p", "config": {"machine_type": machine_type, "disk_type": "pd-ssd"}}
    assert "[pd-ssd, " in refused(machines.check_disk_type, pool)
    # no disk type: GKE's default pd-balanced, also refused
    assert "[pd-balanced, " in refused(
        machines.check_disk_type, {"name": "p", "config": {"machine_type": machine_type}}
    )
    machines.check_disk_type({"name": "p", "config": {"machine_type": machine_type, "disk_type": "hyperdisk-balanced"}})
    machines.check_disk_type({"name": "p", "config": {"machine_type": "n2-standard-8"}})


def test_c4d_refuses_gvnic_off():
    refused(
        machines.check_gvnic, {"name": "p", "config": {"machine_type": "c4d-standard-96", "gvnic": {"enabled": False}}}
    )
    machines.check_gvnic({"name": "p", "config": {"machine_type": "c4d-standard-96", "gvnic": {"enabled": True}}})
    machines.check_gvnic({"name": "p", "config": {"machine_type": "n2-standard-8", "gvnic": {"enabled": False}}})


def test_gke_metadata_needs_workload_identity():
    body = cluster()
    del body["workload_identity_config"]
    assert "Workload Identity" in refused(rules.check_workload_metadata, body, tpu_pool())
    rules.check_workload_metadata(cluster(), tpu_pool())


def test_duplicates_already_exist():
    refused(rules.check_cluster_absent, "tpu-rl", PROJECT, REGION, {"tpu-rl"}, code="ALREADY_EXISTS")
    rules.check_cluster_absent("tpu-rl", PROJECT, REGION, {"other"})
    refused(rules.check_node_pool_absent, "tpu-rl", "p", {"p"}, code="ALREADY_EXISTS")
    body = cluster(node_pools=[{"name": "a", "initial_node_count": 1}, {"name": "a", "initial_node_count": 1}])
    refused(rules.check_cluster, body, REGION, PROJECT, {})


def test_concurrent_operations_refused_only_on_the_same_pool_or_the_cluster():
    """GKE runs operations on different node pools side by side; it refuses a pool's second operation, any
    operation during a cluster-level one, and a cluster-level one during any."""
    creating = [{"name": "operation-1-abc", "operation_type": "CREATE_NODE_POOL", "pool": "tpu-0"}]
    message = refused(
        rules.check_no_running_operation, "tpu-rl", creating, "delete node pool", "tpu-0", code="FAILED_PRECONDITION"
    )
    assert message == (
        "Operation operation-1-abc is currently creating a node pool for cluster tpu-rl. "
        "Please wait and try again once it is done."
    )
    rules.check_no_running_operation("tpu-rl", creating, "create node pool", "tpu-1")  # another pool: allowed
    refused(rules.check_no_running_operation, "tpu-rl", creating, "delete cluster", code="FAILED_PRECONDITION")
    message = refused(
        rules.check_no_running_operation,
        "tpu-rl",
        [{"name": "operation-2-def", "operation_type": "CREATE_CLUSTER", "pool": None}],
        "create node pool",
        "tpu-1",
        code="FAILED_PRECONDITION",
    )
    assert message == "Cluster is running incompatible operation operation-2-def."
    rules.check_no_running_operation("tpu-rl", [], "delete cluster")


def test_gkes_own_upgrade_refuses_pool_operations_and_six_operations_at_once_are_throttled():
    """GKE's control-plane upgrade blocks every other operation ("... is currently upgrading cluster", as
    terraform-provider-google 3650 quotes it); a sixth operation at once on a cluster is a 429 that says "quota"."""
    upgrading = [{"name": "operation-3-ghi", "operation_type": "UPGRADE_MASTER", "pool": None}]
    message = refused(
        rules.check_no_running_operation, "tpu-rl", upgrading, "create node pool", "tpu-0", code="FAILED_PRECONDITION"
    )
    assert message == (
        "Operation operation-3-ghi is currently upgrading cluster tpu-rl. Please wait and try again once it is done."
    )
    five = [{"name": f"op-{i}", "operation_type": "CREATE_NODE_POOL", "pool": f"tpu-{i}"} for i in range(5)]
    rules.check_concurrent_operations("tpu-rl", five[:4])
    message = refused(rules.check_concurrent_operations, "tpu-rl", five, code="RESOURCE_EXHAUSTED")
    assert message == (
        'Too many operations: cluster "tpu-rl" hits the concurrent operations quota 5, please try again later.'
    )


def test_the_package_reads_gkes_refusals_by_status_before_words():
    """What the emulator answers (and GKE, as its sources quote it) is read by the package's one classifier: a 429
    that says "quota" is throttling, a 403 that says quota is quota (any other 403 is IAM), a busy cluster is busy."""
    from tpu_rl.gke import Refusal, refusal

    def answer(rule, *args) -> tuple[str, str]:
        with pytest.raises(GkeError) as error:
            rule(*args)
        return error.value.code, error.value.message

    five = [{"name": f"op-{i}", "operation_type": "CREATE_NODE_POOL", "pool": f"tpu-{i}"} for i in range(5)]
    upgrading = [{"name": "operation-3-ghi", "operation_type": "UPGRADE_MASTER", "pool": None}]
    quota = rules.quota_message(
        {"config": {"machine_type": "ct6e-standard-4t"}, "initial_node_count": 16, "placement_policy": {}},
        REGION,
    )
    assert refusal(*answer(rules.check_concurrent_operations, "tpu-rl", five)) is Refusal.THROTTLED
    assert refusal("RESOURCE_EXHAUSTED", rules.request_rate_message("123")) is Refusal.THROTTLED
    assert refusal(*answer(rules.check_no_running_operation, "c", upgrading, "delete cluster")) is Refusal.BUSY
    assert refusal("PERMISSION_DENIED", quota) is Refusal.QUOTA
    assert refusal("RESOURCE_EXHAUSTED", "Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 0.0 in region us-east5.") is (
        Refusal.QUOTA
    )
    assert refusal("PERMISSION_DENIED", "Permission 'container.clusters.delete' denied") is Refusal.PERMISSION
    assert refusal("INVALID_ARGUMENT", "quota") is None


def test_every_machine_type_the_package_offers_is_known_and_regions_have_their_real_zones():
    from tpu_rl.machines import SHAPES
    from tpu_rl.tpu import GENERATIONS

    offered = set(SHAPES) | {m for g in GENERATIONS.values() for m in g.machine_types}
    assert offered - set(machines.MACHINE_TYPES) == set()
    assert rules.zones_of("us-east5") == ["us-east5-a", "us-east5-b", "us-east5-c"]
    refused(rules.check_pool_locations, "us-east5", {"name": "p", "locations": ["us-east5-d"]})
    refused(rules.zones_of, "us-east9", code="NOT_FOUND")


def test_cluster_checks_its_pools():
    body = cluster(node_pools=[tpu_pool(management={"auto_repair": True, "auto_upgrade": False})])
    refused(rules.check_cluster, body, REGION, PROJECT, {})
    body = copy.deepcopy(cluster())
    body["node_pools"][0]["config"]["machine_type"] = "no-such-type"
    assert 'Machine type "no-such-type" does not exist.' == refused(rules.check_cluster, body, REGION, PROJECT, {})


def test_node_metadata_keys_gke_reserves_or_cannot_hold_are_refused():
    for key in ("kube-env", "startup-script"):
        assert "is reserved" in refused(
            rules.check_node_pool,
            cluster(),
            tpu_pool(config={**tpu_pool()["config"], "metadata": {key: "x"}}),
            REGION,
            PROJECT,
            {},
        )
    assert "must match" in refused(
        rules.check_node_pool,
        cluster(),
        tpu_pool(config={**tpu_pool()["config"], "metadata": {"tpu.rl/run": "x"}}),
        REGION,
        PROJECT,
        {},
    )
    assert "exceeds 32 KB" in refused(
        rules.check_node_pool,
        cluster(),
        tpu_pool(config={**tpu_pool()["config"], "metadata": {"big": "x" * 40000}}),
        REGION,
        PROJECT,
        {},
    )
    rules.check_node_pool(
        cluster(),
        tpu_pool(config={**tpu_pool()["config"], "metadata": {"tpu-rl-run-id": "manual__2026-12-01T00:00:00+00:00"}}),
        REGION,
        PROJECT,
        {},
    )


def test_allocatable_follows_gke_reservations():
    # GKE's worked example in "Plan GKE Standard node sizes": a 32 GiB / 8 vCPU node reserves 3.56 GiB memory
    # (1 + 0.8 + 0.8 + 0.96) plus 100 MiB eviction, and 90 m CPU (60 + 10 + 10 + 4 x 2.5).
    capacity, allocatable = machines.node_resources(machines.MACHINE_TYPES["e2-standard-8"])
    assert capacity["memory"] == f"{32 * 1024 * 1024}Ki"
    reserved_ki = 32 * 1024 * 1024 - int(allocatable["memory"].removesuffix("Ki"))
    assert reserved_ki == pytest.approx(3.56 * 1024 * 1024 + 100 * 1024, abs=2)
    assert allocatable["cpu"] == "7910m"
    # above 128 GiB the 2 % tier applies: 720 GiB -> 0.25*4 + 0.2*4 + 0.1*8 + 0.06*112 + 0.02*592 GiB
    reserved = machines.reserved_memory_bytes(720 * machines.GIB) / machines.GIB
    assert reserved == pytest.approx(1 + 0.8 + 0.8 + 6.72 + 11.84)
    capacity, allocatable = machines.node_resources(machines.MACHINE_TYPES["ct6e-standard-4t"])
    assert capacity["google.com/tpu"] == allocatable["google.com/tpu"] == "4"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tpu_pool_mode": "cluster"},
        {
            "cluster_nodepool_count": 2,
            "ici_expert_parallelism": 1,
            "capacity_type": "reservation",
            "reservation": "my-v6e-reservation",
        },
        {
            "tpu_type": "v5p-256",
            "topology": "4x4x8",
            "compute_type": "ct5p-hightpu-4t",
            "pw_cpu_machine_type": "n4-standard-64",
            "zone": "us-east5-a",  # the zone of us-east5 that offers v5p
        },
        {"capacity_type": "spot"},
        {"capacity_type": "flex_start"},
        {
            "capacity_type": "flex_start",
            "tpu_pool_mode": "cluster",
            "cluster_nodepool_count": 2,
            "ici_expert_parallelism": 1,
        },
    ],
    ids=[
        "tutorial",
        "pools-with-the-cluster",
        "two-slices-reserved",
        "v5p-on-n4",
        "spot",
        "flex-start",
        "flex-start-pools-with-the-cluster",
    ],
)
def test_every_request_the_pipeline_makes_passes_gkes_rules(overrides):
    """The pipeline's cluster and node pool bodies (what the plan prints and the operators send) against
    the rules: this fails for the auto_upgrade=false pools of a REGULAR-channel cluster, a pd-* boot disk
    on C4D or ct6e, a pool outside the region, a non-compact multi-host slice, a Spot or flex-start pool
    GKE would refuse."""
    from datetime import datetime

    from tpu_rl import gke
    from tpu_rl.config import RunConfig
    from tpu_rl.run import RunIdentity
    from tpu_rl_testing import TUTORIAL_CONF

    config = RunConfig.from_params({**TUTORIAL_CONF, "project": PROJECT, **overrides})
    run = RunIdentity("maxtext_rl_tpu", "manual__rules")
    cluster = gke.cluster_body(config, run, datetime(2026, 11, 30, tzinfo=UTC))
    reservations = rules.reservation_consumers([config.reservation] if config.reservation else [], PROJECT)
    rules.check_cluster(cluster, REGION, PROJECT, reservations)
    for index in range(config.cluster_nodepool_count):
        rules.check_node_pool(cluster, gke.tpu_node_pool(config, run, index), REGION, PROJECT, reservations)


@pytest.mark.parametrize("name", list(__import__("tpu_rl.capacity", fromlist=["CAPACITY"]).CAPACITY))
def test_every_capacity_type_makes_a_pool_gke_takes_and_reads_as_its_properties_say(name):
    """Over the registry (``tpu_rl.capacity``): a type added there is checked here against GKE's rules, and its
    properties are what its request says (empty at create, preemptible, a reservation named)."""
    from datetime import datetime

    from tpu_rl import gke
    from tpu_rl.capacity import CAPACITY
    from tpu_rl.config import RunConfig
    from tpu_rl.run import RunIdentity
    from tpu_rl_testing import TUTORIAL_CONF

    kind = CAPACITY[name]
    reservation = {"reservation": "my-v6e-reservation"} if kind.needs_reservation else {}
    config = RunConfig.from_params({**TUTORIAL_CONF, "project": PROJECT, "capacity_type": name, **reservation})
    run = RunIdentity("maxtext_rl_tpu", "manual__capacity")
    cluster = gke.cluster_body(config, run, datetime(2026, 11, 30, tzinfo=UTC))
    pool = gke.tpu_node_pool(config, run, 0)
    rules.check_node_pool(
        cluster,
        pool,
        REGION,
        PROJECT,
        rules.reservation_consumers([config.reservation] if config.reservation else [], PROJECT),
    )
    affinity = pool["config"].get("reservation_affinity") or {}
    assert (affinity.get("consume_reservation_type") == "SPECIFIC_RESERVATION") == kind.needs_reservation
    assert (pool["initial_node_count"] == 0) == kind.starts_empty == config.uses_flex_start
    assert bool(pool["config"].get("spot")) == kind.preemptible
    assert ("preemptible" in gke.quota_hint(config)) == kind.preemptible
    assert gke.capacity_fields(config)  # the plan says what it sets


@pytest.mark.parametrize("value", ["projects/owner-proj/reservations/shared-v6e", "shared-v6e"])
def test_a_reservation_another_project_shares_is_consumed_by_its_path_and_refused_unless_shared(value):
    """A TPU reservation is often owned by a central project and shared: the run names it
    projects/OWNER/reservations/NAME, and the pool's request carries that path as it is (it became
    projects/RUN/reservations/projects/OWNER/...); GKE refuses one that is not shared with the pool's project."""
    from datetime import datetime

    from tpu_rl import gke
    from tpu_rl.config import RunConfig
    from tpu_rl.run import RunIdentity
    from tpu_rl_testing import TUTORIAL_CONF

    config = RunConfig.from_params(
        {**TUTORIAL_CONF, "project": PROJECT, "capacity_type": "reservation", "reservation": value}
    )
    run = RunIdentity("maxtext_rl_tpu", "manual__shared")
    cluster = gke.cluster_body(config, run, datetime(2026, 11, 30, tzinfo=UTC))
    pool = gke.tpu_node_pool(config, run, 0)
    owner = "owner-proj" if value.startswith("projects/") else PROJECT
    path = f"projects/{owner}/reservations/shared-v6e"
    assert pool["config"]["reservation_affinity"]["values"] == [path]
    shared = rules.reservation_consumers([{"name": path, "shared_with": [PROJECT]}], PROJECT)
    rules.check_node_pool(cluster, pool, REGION, PROJECT, shared)
    if owner != PROJECT:
        not_shared = rules.reservation_consumers([{"name": path, "shared_with": ["someone-else"]}], PROJECT)
        message = refused(rules.check_node_pool, cluster, pool, REGION, PROJECT, not_shared, code="NOT_FOUND")
        assert 'reservation "shared-v6e" not found for node pool' in message
    block = with_reservation({**pool["config"]["reservation_affinity"], "values": [f"{path}/reservationBlocks/b1"]})
    rules.check_reservation_affinity(block, PROJECT, shared)


def test_a_tpu_machine_type_only_in_the_zones_that_offer_it():
    """Cloud TPU "TPU regions and zones": us-east5 offers v6e in -a and -b, v5p in -a only; GKE refuses a pool of the
    machine type elsewhere with its GCE_NOT_FOUND text, also a pool without locations on a cluster of every zone."""
    rules.check_node_pool(cluster(), tpu_pool(locations=["us-east5-a"]), REGION, PROJECT, {})
    assert refused(rules.check_node_pool, cluster(), tpu_pool(locations=["us-east5-c"]), REGION, PROJECT, {}) == (
        'Invalid machine type "ct6e-standard-4t" in zone "us-east5-c": GCE_NOT_FOUND'
    )
    v5p = tpu_pool(
        config={"machine_type": "ct5p-hightpu-4t"}, placement_policy={"type": "COMPACT", "tpu_topology": "4x4x4"}
    )
    rules.check_machine_zones(cluster(), {**v5p, "locations": ["us-east5-a"]}, REGION)
    assert 'zone "us-east5-b"' in refused(rules.check_machine_zones, cluster(), v5p, REGION)
    unplaced = {k: v for k, v in tpu_pool().items() if k != "locations"}
    assert 'zone "us-east5-c"' in refused(rules.check_machine_zones, cluster(), unplaced, REGION)
    rules.check_machine_zones(cluster(locations=["us-east5-b"]), unplaced, REGION)
    assert 'zone "us-east5-c"' in refused(
        rules.check_cluster, cluster(node_pools=[tpu_pool(locations=["us-east5-c"])]), REGION, PROJECT, {}
    )
    rules.check_machine_zones(
        cluster(), {"name": "cpu", "locations": ["us-east5-c"], "config": {"machine_type": "n2-standard-8"}}, REGION
    )


def test_the_package_and_the_emulator_agree_on_where_each_tpu_generation_is():
    """Two tables, one in the package (tpu_rl.tpu, tpu_rl.capacity) and one in the emulator, which stands in for GCP
    and shares no code with it: the same zones for every generation, and for flex-start; every zone served."""
    from tpu_rl.capacity import CAPACITY
    from tpu_rl.tpu import GENERATIONS

    emulator_name = {"v6e": "v6e", "v5litepod": "v5e", "v5p": "v5p", "v4": "v4"}
    assert {emulator_name[g.name]: frozenset(g.zones) for g in GENERATIONS.values()} == machines.TPU_ZONES
    flex = CAPACITY["flex_start"]
    package_flex = {emulator_name[name]: frozenset(zones) for name, zones in flex.zones.items()}
    assert package_flex == machines.FLEX_START_TPU_ZONES
    assert {emulator_name[g] for g in flex.unsupported_generations}.isdisjoint(machines.FLEX_START_TPU_ZONES)
    for zones in (*machines.TPU_ZONES.values(), *machines.FLEX_START_TPU_ZONES.values()):
        for zone in zones:
            assert zone in rules.zones_of(zone.rsplit("-", 1)[0])


def test_flex_start_tpus_need_gke_1_33_and_a_zone_of_flex_start():
    """GKE "About flex-start": TPUs from GKE 1.33.0-gke.1712000; v6e in asia-northeast1-b, us-east5-a, us-east5-b."""
    rules.check_node_pool(cluster(current_master_version="1.33.0-gke.1712000"), flex_pool(), REGION, PROJECT, {})
    rules.check_flex_start_tpu(cluster(initial_cluster_version="latest"), flex_pool(), REGION)
    old = cluster(current_master_version="1.32.4-gke.1106000")
    assert "requires GKE version 1.33.0-gke.1712000 or later; the cluster runs 1.32.4-gke.1106000" in refused(
        rules.check_node_pool, old, flex_pool(), REGION, PROJECT, {}
    )
    assert "1.33.0-gke.1600000" in refused(
        rules.check_cluster,
        cluster(initial_cluster_version="1.33.0-gke.1600000", node_pools=[flex_pool()]),
        REGION,
        PROJECT,
        {},
    )
    europe = flex_pool(locations=["europe-west4-a"])  # a v6e zone, not one of flex-start
    assert 'flex-start does not offer machine type "ct6e-standard-4t" in zone "europe-west4-a"' in refused(
        rules.check_flex_start_tpu, cluster(), europe, "europe-west4"
    )
    rules.check_node_pool(cluster(), tpu_pool(locations=["europe-west4-a"]), "europe-west4", PROJECT, {})


def test_flex_start_runs_at_most_seven_days():
    """GKE "About flex-start": up to seven days (the default when max_run_duration is unset)."""
    week = flex_pool()
    week["config"] = {**week["config"], "max_run_duration": "604800s"}
    rules.check_node_pool(cluster(), week, REGION, PROJECT, {})
    longer = copy.deepcopy(week)
    longer["config"]["max_run_duration"] = "691200s"
    assert "max_run_duration 691200s exceeds the flex-start limit of 7 days" in refused(
        rules.check_node_pool, cluster(), longer, REGION, PROJECT, {}
    )


def test_a_pool_requests_capacity_type_is_read_from_its_fields():
    assert rules.capacity_type_of({"config": {"spot": True}}) == "spot"
    assert rules.capacity_type_of({"config": {"flex_start": True}}) == "flex_start"
    reserved = {"config": {"reservation_affinity": {"consume_reservation_type": "SPECIFIC_RESERVATION"}}}
    assert rules.capacity_type_of(reserved) == "reservation"
    no_reservation = {"config": {"reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"}}}
    assert rules.capacity_type_of(no_reservation) == "on_demand"
    assert rules.capacity_type_of({"config": {}}) == "on_demand"


def test_a_capacity_fault_can_hold_one_zone_and_capacity_type_only(monkeypatch, tmp_path):
    """A zone stocked out on demand while its Spot capacity is there; quota missing for Spot only."""
    from sim import gke_faults

    monkeypatch.setattr(gke_faults, "SIM", tmp_path)
    gke_faults.set_fault("zone-b", "stockout", zone="us-east5-b", capacity_type="on_demand")
    gke_faults.set_fault("spot-quota", "quota", capacity_type="spot")
    assert gke_faults.take("stockout", "tpu-x-0", "ct6e-standard-4t", "c", "us-east5-b", "spot") is None
    assert gke_faults.take("stockout", "tpu-x-0", "ct6e-standard-4t", "c", "us-east5-a", "on_demand") is None
    assert gke_faults.take("stockout", "tpu-x-0", "ct6e-standard-4t", "c", "us-east5-b", "on_demand") == "zone-b"
    assert gke_faults.take("quota", "tpu-x-0", "ct6e-standard-4t", "c", "us-east5-a", "spot") == "spot-quota"
    assert gke_faults.take("quota", "tpu-x-0", "ct6e-standard-4t", "c", "us-east5-a", "on_demand") is None


def test_a_reservation_with_a_fixed_number_of_vms_refuses_a_pool_it_cannot_hold_as_capacity_not_throttling():
    """A reservation of 20 VMs, 8 of them taken: a slice pool of 16 hosts is refused at once with GKE's 429, which
    the package reads as capacity that is not there (a stockout), not as throttling to wait out."""
    from tpu_rl.gke import Refusal, refusal

    reserved = tpu_pool(
        initial_node_count=16,
        config={
            **tpu_pool()["config"],
            "reservation_affinity": {
                "consume_reservation_type": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": ["my-v6e"],
            },
        },
    )
    counts = rules.reservation_vm_counts([{"name": "my-v6e", "vm_count": 20}, "unbounded"], "p")
    assert counts == {"projects/p/reservations/my-v6e": 20}
    rules.check_reservation_vms(reserved, "us-east5-a", "p", counts, consumed=4)  # 16 of the 16 left
    with pytest.raises(GkeError) as short:
        rules.check_reservation_vms(reserved, "us-east5-a", "p", counts, consumed=8)
    assert short.value.code == "RESOURCE_EXHAUSTED"
    assert short.value.message.startswith(
        'Reservation does not have enough resources for the request: specific reservation "my-v6e" is insufficient '
        'for node pool "tpu-slice-0" at zone "us-east5-a": required 16 and short of 4 VM count of machine type'
    )
    assert refusal(short.value.code, short.value.message) is Refusal.CAPACITY
    rules.check_reservation_vms(tpu_pool(), "us-east5-a", "p", counts, consumed=20)  # consumes no reservation
