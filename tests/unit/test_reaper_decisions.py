"""The reaper's decisions (tpu_rl.reaper) and the ownership marks it reads from what the pipeline creates."""

import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from tpu_rl import environment, gke, manifests
from tpu_rl import reaper as rp
from tpu_rl.config import RunConfig
from tpu_rl.run import RunIdentity
from tpu_rl.vocabulary import (
    ANNOTATION_DAG_ID,
    ANNOTATION_ENVIRONMENT,
    ANNOTATION_RUN_ID,
    GKE_LABEL_ENVIRONMENT,
    GKE_LABEL_KEEP,
    GKE_METADATA_ENVIRONMENT,
    LABEL_ENVIRONMENT,
)

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
RUN = RunIdentity("maxtext_rl_tpu", "manual__2026-12-01T10:00:00+00:00")
OTHER = RunIdentity("maxtext_rl_tpu", "scheduled__2026-12-01T11:00:00+00:00")


def resource(kind=rp.NODE_POOL, age_minutes=120, chips=64, owner=RUN, **extra) -> rp.Resource:
    return rp.Resource(
        kind,
        "tpu-1234abcd-0",
        owner,
        NOW - timedelta(minutes=age_minutes),
        "p",
        "us-east5",
        cluster="c",
        chips=chips,
        **extra,
    )


def test_the_pipelines_cluster_pools_and_secret_name_their_run(tutorial_conf):
    config = RunConfig.from_params({**tutorial_conf, "keep_cluster": True})
    body = gke.cluster_body(config, RUN, NOW)
    assert gke.cluster_owner(body["description"]) == RUN
    assert body["resource_labels"][GKE_LABEL_KEEP] == "true"
    assert GKE_LABEL_KEEP not in gke.cluster_body(RunConfig.from_params(tutorial_conf), RUN, NOW)["resource_labels"]
    assert gke.pool_owner(gke.tpu_node_pool(config, RUN, 0)["config"]["metadata"]) == RUN
    secret = manifests.hf_token_secret(config, RUN)
    assert secret["metadata"]["annotations"] == {ANNOTATION_DAG_ID: RUN.dag_id, ANNOTATION_RUN_ID: RUN.run_id}
    assert gke.cluster_owner("A cluster of another team") is None and gke.pool_owner({}) is None


def test_live_runs_keep_what_they_made_and_ended_or_lost_runs_lose_it():
    grace = timedelta(minutes=60)
    for state in ("queued", "running"):
        kept = rp.decide(resource(), state, NOW, grace)
        assert (kept.reap, kept.reason) == (False, f"its run is {state}")
    assert rp.decide(resource(), "failed", NOW, grace).reason == "its run ended (failed)"
    # A state the rule does not know (e.g. an enum's repr) keeps: only an ended or lost run's resources go.
    assert not rp.decide(resource(), "DagRunState.RUNNING", NOW, grace).reap
    lost = rp.decide(resource(), rp.MISSING, NOW, grace)
    assert lost.reap and lost.reason == "its run no longer exists in Airflow"
    assert lost.chip_hours == 64 * 2  # 64 chips for two hours


def test_grace_keep_cluster_and_other_users_hold_a_resource():
    young = rp.decide(resource(age_minutes=30), rp.MISSING, NOW, timedelta(minutes=60))
    assert not young.reap and young.reason == "younger than the grace period (60.0 min)"
    kept = rp.decide(resource(rp.CLUSTER, kept_by_design="created with keep_cluster"), rp.MISSING, NOW, timedelta())
    assert not kept.reap and kept.reason == "created with keep_cluster"
    used = rp.decide(resource(rp.CLUSTER), "success", NOW, timedelta(), users=(OTHER,))
    assert not used.reap and used.reason == f"in use by the live run {OTHER.dag_id} / {OTHER.run_id}"


def test_the_report_and_what_fails_the_reaper():
    decisions = [
        rp.decide(resource(), rp.MISSING, NOW, timedelta()),
        rp.decide(resource(rp.SECRET, chips=0, namespace="default"), rp.MISSING, NOW, timedelta()),
        rp.decide(resource(age_minutes=5), "running", NOW, timedelta()),
    ]
    table = rp.report(decisions).splitlines()
    assert table[0].split() == [
        "decision",
        "kind",
        "resource",
        "owner",
        "run",
        "run",
        "state",
        "age",
        "TPU",
        "chips",
        "chip-hours",
        "reason",
    ]
    assert table[2].startswith("reap") and "128.00" in table[2] and "no longer exists" in table[2]
    assert table[4].startswith("keep") and "its run is running" in table[4]
    # Only TPU capacity that is still there fails the task: the Secret holds no chips, a deleted pool no longer bills.
    assert rp.left_behind_capacity(decisions) == [decisions[0]]
    import dataclasses

    assert rp.left_behind_capacity([dataclasses.replace(decisions[0], deleted=True)]) == []


def test_a_shared_cluster_whose_lease_a_live_run_holds_is_kept_though_that_run_has_nothing_in_it_yet():
    """A run that joined a shared cluster's lease and has not created its Secret yet still uses the cluster."""
    from tpu_rl.operators.reaper import ReapOrphanedResourcesOperator

    cluster = rp.Resource(
        rp.CLUSTER,
        "c",
        RUN,
        NOW - timedelta(hours=5),
        "p",
        "us-east5",
        lease="gs://b/tpu-rl/leases/cluster/p-us-east5-c.json",
    )
    states = {RUN: "success", OTHER: "running"}
    users = ReapOrphanedResourcesOperator._live_users([cluster], states, {("p", "us-east5", "c"): (RUN, OTHER)})
    decision = rp.decide(cluster, states[RUN], NOW, timedelta(minutes=60), users[("p", "us-east5", "c")])
    assert (decision.reap, decision.reason) == (False, f"in use by the live run {OTHER.dag_id} / {OTHER.run_id}")
    ended = ReapOrphanedResourcesOperator._live_users(
        [cluster], {**states, OTHER: "failed"}, {("p", "us-east5", "c"): (RUN, OTHER)}
    )
    assert ended == {} and rp.decide(cluster, "success", NOW, timedelta(minutes=60)).reap


def test_a_leaked_flex_start_slice_counts_the_chips_it_scales_to():
    """A flex-start pool is created with initial_node_count 0 and autoscales to its slice: counting only its
    initial nodes gave 0 chips, no alert and 0 chip-hours for a slice that may be billing."""
    import json

    from google.cloud.container_v1 import NodePool

    from tpu_rl.config import RunConfig
    from tpu_rl.gke import tpu_node_pool
    from tpu_rl.operators.reaper import pool_chips
    from tpu_rl.run import RunIdentity
    from tpu_rl_testing import TUTORIAL_CONF

    run = RunIdentity("maxtext_rl_tpu", "manual__1")
    for capacity_type in ("flex_start", "on_demand", "spot"):
        config = RunConfig.from_params({**TUTORIAL_CONF, "capacity_type": capacity_type})
        pool = NodePool.from_json(json.dumps(tpu_node_pool(config, run, 0)))
        assert pool_chips(pool) == 64, capacity_type


def test_what_gke_is_deleting_is_reported_as_being_deleted_not_as_a_leak():
    """Right after a run deleted its cluster, GKE still lists it (STOPPING) with its pools: a dry run of the reaper
    called them leaks and failed. Nobody needs to remove them: the report says who is deleting them."""
    from types import SimpleNamespace

    from tpu_rl.operators.reaper import _being_deleted, _running_deletes

    def op(kind, target, status="RUNNING", name="operation-1"):
        link = f"https://container.googleapis.com/v1/projects/123/locations/us-east5/clusters/{target}"
        return SimpleNamespace(
            operation_type=SimpleNamespace(name=kind), status=SimpleNamespace(name=status), target_link=link, name=name
        )

    deletes = _running_deletes(
        [op("DELETE_CLUSTER", "c"), op("DELETE_NODE_POOL", "d/nodePools/tpu-1", "DONE"), op("CREATE_NODE_POOL", "e")]
    )
    assert deletes == {("c", None): "operation-1"}
    assert _being_deleted("STOPPING", deletes.get(("c", None)), "the cluster") == (
        "GKE runs the delete of the cluster (operation operation-1)"
    )
    assert _being_deleted("STOPPING", None) == "GKE is deleting the node pool (status STOPPING)"
    assert _being_deleted("RUNNING", None) == ""

    going = resource(being_deleted="GKE runs the delete of the cluster (operation operation-1)")
    decision = rp.decide(going, rp.MISSING, NOW, timedelta(0))
    assert decision.word == "being deleted" and decision.row()["decision"] == "being deleted"
    assert rp.left_behind_capacity([decision]) == []
    assert "being deleted" in rp.report([decision])
    assert rp.decide(resource(), rp.MISSING, NOW, timedelta(0)).word == "reap"


# -- two Airflow environments share the project (tpu_rl.environment) ---------------------------------------------

PROD, STAGING = "us-east5/prod", "us-east5/staging"


@pytest.mark.core
def test_the_environment_is_named_by_tpu_rl_or_by_composer_and_else_unnamed():
    composer = {"COMPOSER_LOCATION": "us-east5", "COMPOSER_ENVIRONMENT": "prod"}
    assert environment.current(composer) == PROD
    assert environment.current({**composer, "TPU_RL_ENVIRONMENT": "local"}) == "local"
    assert environment.current({"TPU_RL_ENVIRONMENT": " "}) == environment.current({"COMPOSER_LOCATION": "x"}) == ""


@pytest.mark.core
def test_an_environments_label_value_is_itself_when_it_can_be_and_else_a_stable_short_form():
    assert environment.label_value("local") == "local"
    label = environment.label_value(PROD)
    assert label.startswith("us-east5-prod-") and label == environment.label_value(PROD)
    assert label != environment.label_value("us-east5-prod") == "us-east5-prod"  # unlike the name that looks the same
    for name in (PROD, "Prod", "x" * 200, "/", "äö"):
        value = environment.label_value(name)
        assert len(value) <= 63 and re.fullmatch(r"[a-z0-9]([a-z0-9_-]*[a-z0-9])?", value), name
    assert environment.label_value("x" * 200) != environment.label_value("x" * 201)


@pytest.mark.core
def test_what_a_run_of_a_named_environment_creates_carries_the_environment_and_an_unnamed_ones_nothing_new(
    tutorial_conf,
):
    config = RunConfig.from_params({**tutorial_conf, "cluster_mode": "shared"})
    run = dataclasses.replace(RUN, environment=PROD)
    cluster = gke.cluster_body(config, run, NOW)
    assert cluster["resource_labels"][GKE_LABEL_ENVIRONMENT] == environment.label_value(PROD)
    assert gke.cluster_owner(cluster["description"]).environment == PROD
    assert gke.cluster_lease_uri(cluster["description"]) == gke.shared_lease_uri(config)
    pool = gke.tpu_node_pool(config, run, 0)["config"]
    assert pool["resource_labels"][GKE_LABEL_ENVIRONMENT] == environment.label_value(PROD)
    assert pool["metadata"][GKE_METADATA_ENVIRONMENT] == PROD and gke.pool_owner(pool["metadata"]) == run
    for made in (manifests.hf_token_secret(config, run), manifests.training_jobset(config, run)):
        assert made["metadata"]["labels"][LABEL_ENVIRONMENT] == environment.label_value(PROD)
    assert manifests.hf_token_secret(config, run)["metadata"]["annotations"][ANNOTATION_ENVIRONMENT] == PROD

    unnamed = json.dumps([gke.cluster_body(config, RUN, NOW), manifests.hf_token_secret(config, RUN)])
    assert "environment" not in unnamed and gke.cluster_owner(gke.owner_description(RUN)).environment == ""


@pytest.mark.core
def test_a_reaper_keeps_what_another_environment_made_and_judges_its_own_and_unmarked_resources():
    """The rule table of tpu_rl.reaper: the marked resource of another environment is kept, whatever this
    Airflow says of its run; an unmarked one (made before the mark, or by an unnamed environment) is judged."""

    def made_in(env: str) -> rp.Resource:
        return resource(owner=dataclasses.replace(RUN, environment=env))

    for here, env in ((STAGING, PROD), ("", PROD)):
        kept = rp.decide(made_in(env), rp.NOT_ASKED, NOW, timedelta(), here=here)
        assert not kept.reap and kept.reason == (
            f"created by Airflow environment {env}, not this one ({here or 'unnamed'})"
        )
        assert kept.row()["owner_environment"] == env and f"({env})" in rp.report([kept])
    for here, env in ((STAGING, STAGING), (STAGING, ""), ("", "")):
        judged = rp.decide(made_in(env), rp.MISSING, NOW, timedelta(), here=here)
        assert judged.reap and judged.reason == "its run no longer exists in Airflow"
    assert not rp.asks_about(made_in(PROD).owner, STAGING) and rp.asks_about(made_in("").owner, STAGING)


@pytest.mark.core
def test_a_cluster_is_kept_while_another_environment_has_something_in_it_or_holds_its_lease():
    from tpu_rl.operators.reaper import ReapOrphanedResourcesOperator

    prod_run = dataclasses.replace(OTHER, environment=PROD)
    cluster = resource(rp.CLUSTER, chips=0)
    jobset = resource(rp.JOBSET, chips=0, owner=prod_run, namespace="default")
    states = {RUN: "success", prod_run: rp.NOT_ASKED}
    where = ("p", "us-east5", "c")
    for found, holders in (([cluster, jobset], {}), ([cluster], {where: (prod_run,)})):
        users = ReapOrphanedResourcesOperator._live_users(found, states, holders)
        decision = rp.decide(cluster, "success", NOW, timedelta(), users[where], here=STAGING)
        assert not decision.reap
        assert decision.reason == f"in use by the run {OTHER.dag_id} / {OTHER.run_id} of Airflow environment {PROD}"


@pytest.mark.core
def test_a_run_in_create_mode_refuses_a_cluster_another_environment_made_without_asking_its_airflow(monkeypatch):
    """The stand-in's Airflow knows no run, as it knows none of another environment: an unmarked leftover is
    adopted, a marked one of another environment refused (its creator may live, and delete it at its end)."""
    from types import SimpleNamespace

    from tpu_rl.compat import AirflowFailException
    from tpu_rl.operators.cluster import CreateClusterOperator
    from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

    monkeypatch.setenv("TPU_RL_ENVIRONMENT", STAGING)
    context = task_context(TaskInstanceStandIn("maxtext_rl_tpu", "manual__me", "create_cluster"), TUTORIAL_CONF)
    operator = CreateClusterOperator(task_id="create_cluster")
    assert operator.bind_scope(context).run.environment == STAGING

    def made_by(run: RunIdentity) -> SimpleNamespace:
        return SimpleNamespace(resource_labels={}, description=gke.owner_description(run))

    operator._check_adoptable(context, made_by(OTHER))
    with pytest.raises(AirflowFailException, match=f"of Airflow environment {PROD}, not this one \\({STAGING}\\)"):
        operator._check_adoptable(context, made_by(dataclasses.replace(OTHER, environment=PROD)))
