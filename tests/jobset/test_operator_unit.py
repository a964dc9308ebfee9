"""The operator's parts that need no cluster: identity labels, name checks, links, serialization,
and the GKE credentials path (with the GKE cluster API mocked, and only that)."""

from __future__ import annotations

from unittest import mock

import pytest
from jobset_helpers import tpu_jobset

from tpu_rl.operators.jobset import JobSetOperator
from tpu_rl_testing import TaskInstanceStandIn, task_context


def test_labels_are_valid_and_annotations_carry_full_identity():
    ti = TaskInstanceStandIn("My DAG.v2", "manual__2026-11-29T10:00:00+00:00", "group.Train_RL", try_number=3)
    op = JobSetOperator(task_id="t", manifest=tpu_jobset("x"), kubernetes_conn_id="k")
    manifest = op._identified(op.build_manifest(task_context(ti)), task_context(ti))
    meta = manifest["metadata"]
    assert meta["namespace"] == "default"
    assert meta["labels"]["tpu-rl.dev/task-id"] == "group-train-rl"
    assert meta["labels"]["tpu-rl.dev/dag-id"] == "my-dag-v2"
    assert len(meta["labels"]["tpu-rl.dev/run-key"]) == 8
    assert meta["annotations"]["tpu-rl.dev/run-id"] == ti.run_id
    assert meta["annotations"]["tpu-rl.dev/submitted-try"] == "3"
    assert op.manifest["metadata"].get("labels") is None  # the template is not mutated


def test_a_named_airflow_environment_is_labelled_and_annotated_in_full(monkeypatch):
    """The reaper of another environment sharing the cluster keeps the JobSet (tpu_rl.reaper)."""
    monkeypatch.setenv("TPU_RL_ENVIRONMENT", "us-east5/prod")
    ti = TaskInstanceStandIn("d", "r", "t")
    op = JobSetOperator(task_id="t", manifest=tpu_jobset("x"), kubernetes_conn_id="k")
    meta = op._identified(op.build_manifest(task_context(ti)), task_context(ti))["metadata"]
    assert meta["annotations"]["tpu-rl.dev/environment"] == "us-east5/prod"
    assert meta["labels"]["tpu-rl.dev/environment"].startswith("us-east5-prod-")
    monkeypatch.delenv("TPU_RL_ENVIRONMENT")
    meta = op._identified(op.build_manifest(task_context(ti)), task_context(ti))["metadata"]
    assert "tpu-rl.dev/environment" not in meta["annotations"] | meta["labels"]


def test_pathways_name_longer_than_22_is_refused_before_submission():
    manifest = tpu_jobset("much-too-long-pathways-name", replicated_job="pathways-head")
    op = JobSetOperator(task_id="t", manifest=manifest, kubernetes_conn_id="k")
    ti = TaskInstanceStandIn("d", "r", "t")
    with pytest.raises(ValueError, match="longer than 22"):
        op._identified(op.build_manifest(task_context(ti)), task_context(ti))


def test_links_survive_dag_serialization_without_a_plugin():
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("links_dag", schedule=None) as dag:
        JobSetOperator(task_id="train", manifest=tpu_jobset("x"), project_id="p", location="us-east5", cluster_name="c")
    task = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).get_task("train")
    assert set(task.extra_links) == {"GKE workload", "JobSet logs"}


def test_link_urls_for_a_gke_jobset():
    op = JobSetOperator(
        task_id="train", manifest=tpu_jobset("x"), project_id="proj", location="us-east5", cluster_name="tpu-cluster"
    )
    op.tracked = {"name": "qwen-train-1a2b3c4d", "namespace": "default", "uid": "u", "created": "2026-11-29T10:00:00Z"}
    workload, logs = (link.get_link(op, ti_key=None) for link in op.operator_extra_links)
    assert workload == (
        "https://console.cloud.google.com/kubernetes/service/us-east5/tpu-cluster/default/"
        "qwen-train-1a2b3c4d/details?project=proj"
    )
    assert "jobset_sigs_k8s_io%2Fjobset-name%22%3D%22qwen-train-1a2b3c4d%22" in logs
    assert logs.endswith("?project=proj")
    plain = JobSetOperator(task_id="t", manifest=tpu_jobset("x"), kubernetes_conn_id="k")
    plain.tracked = op.tracked
    assert [link.get_link(plain, ti_key=None) for link in plain.operator_extra_links] == ["", ""]


def test_gke_cluster_reached_through_google_provider_hooks(monkeypatch):
    """MOCKED: the GKE cluster API (GKEHook.get_cluster), and the connection is anonymous. Everything else
    is the providers' real code: the cluster's endpoint and CA reach GKEKubernetesHook."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        '{"conn_type": "google_cloud_platform", "extra": {"is_anonymous": true, "project": "p"}}',
    )
    from google.cloud.container_v1 import Cluster

    from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook

    cluster = Cluster(endpoint="34.1.2.3", master_auth={"cluster_ca_certificate": "Q0E="})
    op = JobSetOperator(task_id="t", manifest=tpu_jobset("x"), project_id="p", location="us-east5", cluster_name="c")
    with mock.patch(
        "airflow.providers.google.cloud.hooks.kubernetes_engine.GKEHook.get_cluster", return_value=cluster
    ) as get_cluster:
        kube_hook = op.hook.kube_hook
    get_cluster.assert_called_once_with(name="c", project_id="p")
    assert type(kube_hook).__name__ == "GKEKubernetesHook"
    assert kube_hook._cluster_url == "https://34.1.2.3" and kube_hook._ssl_ca_cert == "Q0E="
    async_hook = AsyncKubernetesApiHook(op.cluster.with_endpoint(*op.hook.gke_endpoint))
    assert type(async_hook.kube_hook).__name__ == "GKEKubernetesAsyncHook"
    assert async_hook.kube_hook._ssl_ca_cert == "Q0E="


def test_the_trigger_reaches_a_gke_cluster_by_the_endpoint_the_operator_resolved(monkeypatch):
    """MOCKED: the GKE cluster API, as above. A DNS-based endpoint: the trigger's client trusts its public
    certificate (no cluster CA), and a cluster that refuses external traffic there is refused with the fix."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        '{"conn_type": "google_cloud_platform", "extra": {"is_anonymous": true, "project": "p"}}',
    )
    from google.cloud.container_v1 import Cluster

    from tpu_rl.compat import AirflowFailException
    from tpu_rl.triggers.jobset import JobSetTrigger

    dns = {"dns_endpoint_config": {"endpoint": "gke-1.us-east5.gke.goog", "allow_external_traffic": True}}
    cluster = Cluster(
        endpoint="34.1.2.3", master_auth={"cluster_ca_certificate": "Q0E="}, control_plane_endpoints_config=dns
    )
    op = JobSetOperator(
        task_id="t",
        manifest=tpu_jobset("x"),
        project_id="p",
        location="us-east5",
        cluster_name="c",
        use_dns_endpoint=True,
    )
    jobset = {"metadata": {"name": "x", "namespace": "default", "uid": "u"}, "spec": tpu_jobset("x")["spec"]}
    with mock.patch("airflow.providers.google.cloud.hooks.kubernetes_engine.GKEHook.get_cluster", return_value=cluster):
        trigger = op._trigger(jobset)
    classpath, kwargs = trigger.serialize()
    assert kwargs["cluster"]["cluster_url"] == "https://gke-1.us-east5.gke.goog"
    restored = JobSetTrigger(**kwargs)
    assert restored.cluster == trigger.cluster
    assert restored.hook().kube_hook._ssl_ca_cert is None

    dns["dns_endpoint_config"]["allow_external_traffic"] = False
    closed = JobSetOperator(
        task_id="t",
        manifest=tpu_jobset("x"),
        project_id="p",
        location="us-east5",
        cluster_name="c",
        use_dns_endpoint=True,
    )
    with mock.patch(
        "airflow.providers.google.cloud.hooks.kubernetes_engine.GKEHook.get_cluster",
        return_value=Cluster(endpoint="34.1.2.3", control_plane_endpoints_config=dns),
    ):
        with pytest.raises(AirflowFailException, match="--enable-dns-access"):
            closed._trigger(jobset)
