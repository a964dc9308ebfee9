"""What a run does when GKE refuses a call for IAM: it fails at once (no wait grants a role), its message naming the
permission and the role to grant, never reading the 403 as quota. GKE's answers are the emulator's
(sim/gke_iam.py), raised as google-api-core raises them for the real clients."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from google.api_core import exceptions

from sim import gke_iam
from tpu_rl.compat import AirflowFailException
from tpu_rl.hooks.gke import GkeApiHook, GkeRefusedError
from tpu_rl.operators import cluster as cluster_ops
from tpu_rl.operators import tpu_pools
from tpu_rl_testing import TUTORIAL_CONF, TaskInstanceStandIn, task_context

CLUSTER = "projects/my-project/locations/us-east5/clusters/qwen-rl"


def client_error(refusal) -> exceptions.GoogleAPICallError:
    """The client library's exception for the emulator's refusal (the class of its gRPC status)."""
    return {"PERMISSION_DENIED": exceptions.PermissionDenied, "INVALID_ARGUMENT": exceptions.InvalidArgument}[
        refusal.code
    ](refusal.message)


def refusing(monkeypatch, error) -> None:
    """GKE answers every call with ``error``."""

    def refuse(*args, **kwargs):
        raise error

    gke = SimpleNamespace(**{name: refuse for name in ("create_node_pool", "list_clusters", "list_operations")})
    provider = SimpleNamespace(create_cluster=refuse, get_cluster=refuse)
    monkeypatch.setattr(GkeApiHook, "client", property(lambda self: gke))
    monkeypatch.setattr(GkeApiHook, "provider_hook", property(lambda self: provider))


def context(task_id: str):
    return task_context(TaskInstanceStandIn("maxtext_rl_tpu", "manual__iam", task_id), TUTORIAL_CONF)


def test_a_pool_whose_nodes_the_identity_may_not_act_as_fails_at_once_naming_the_role(monkeypatch):
    account = TUTORIAL_CONF["node_service_account"]
    refusing(monkeypatch, client_error(gke_iam.no_act_as(account)))
    operator = tpu_pools.CreateTpuNodePoolsOperator(task_id="create_tpu_pools")
    with pytest.raises(AirflowFailException) as failed:
        operator.execute(context("create_tpu_pools"))
    message = str(failed.value)
    assert "iam.serviceAccounts.actAs" in message and "roles/iam.serviceAccountUser on that account" in message
    assert account in message and "quota" not in message.lower()


def test_a_cluster_create_refused_for_iam_fails_at_once_instead_of_waiting(monkeypatch):
    refusing(monkeypatch, client_error(gke_iam.denied("container.clusters.create", CLUSTER)))
    operator = cluster_ops.CreateClusterOperator(task_id="create_cluster")
    with pytest.raises(AirflowFailException) as failed:  # not deferred to ask again
        operator.execute(context("create_cluster"))
    message = str(failed.value)
    assert message.startswith('GKE refused to create cluster qwen-rl: Required "container.clusters.create"')
    assert "grant it roles/container.admin there" in message and "my-project" in message


def test_the_reapers_listing_refused_for_iam_names_the_role_in_that_project(monkeypatch):
    refusing(monkeypatch, client_error(gke_iam.denied("container.clusters.list", "projects/watched/locations/-")))
    with pytest.raises(GkeRefusedError) as refused:
        GkeApiHook("google_cloud_default", "watched", "-").list_clusters()
    assert "container.clusters.list" in refused.value.message
    assert "roles/container.admin" in refused.value.message and "project watched" in refused.value.message


def test_the_dns_endpoints_refusal_names_the_role_and_rbacs_is_left_as_it_is(monkeypatch):
    """The DNS-based endpoint answers 403 naming container.clusters.connect (sim/gke_dns.py); the Kubernetes hook's
    error then says which role to grant. A 403 of Kubernetes RBAC names no IAM permission and is left alone."""
    from kubernetes.client.exceptions import ApiException

    from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook

    def answering(body: str):
        answer = SimpleNamespace(status=403, reason="Forbidden", data=body, getheaders=dict)

        def call_api(*args, **kwargs):
            raise ApiException(http_resp=answer)

        client = SimpleNamespace(
            configuration=SimpleNamespace(proxy=None, no_proxy=None, verify_ssl=True, ssl_ca_cert="cluster-ca.crt"),
            rest_client=SimpleNamespace(pool_manager=SimpleNamespace(connection_pool_kw={})),
            call_api=call_api,
        )
        monkeypatch.setattr(
            KubernetesApiHook, "kube_hook", property(lambda self: SimpleNamespace(get_conn=lambda: client))
        )
        target = ClusterTarget(project_id="my-project", location="us-east5", cluster_name="qwen-rl")
        with pytest.raises(ApiException) as refused:
            KubernetesApiHook(target).api_client().call_api("/apis/jobset.x-k8s.io/v1alpha2/jobsets", "GET")
        return refused.value

    connect = gke_iam.denied(gke_iam.CONNECT, CLUSTER).message
    refused = answering(json.dumps({"kind": "Status", "code": 403, "message": connect}))
    assert refused.status == 403 and "container.clusters.connect" in str(refused)
    assert "grant it roles/container.admin there" in str(refused)
    rbac = 'jobsets.jobset.x-k8s.io is forbidden: User "x" cannot list resource "jobsets"'
    assert "roles/" not in str(answering(json.dumps({"kind": "Status", "code": 403, "message": rbac})))
