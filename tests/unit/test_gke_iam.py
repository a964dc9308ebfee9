"""IAM in the GKE emulator (sim/gke_iam.py): each refusal GKE makes for a missing permission and its accepted twin,
the emulator's check of a real request (google-cloud-container's messages, in process), the package's reading of
the refusal (it names the permission and the role, and is not quota), and that the Cloud Composer guide
(docs/getting-started/composer.md) grants exactly the roles the simulation starts with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim import gke_iam
from sim.gke_errors import GkeError

pytestmark = pytest.mark.core

REPO = Path(__file__).resolve().parents[2]
PROJECT, WATCHED = "tpu-rl-sim", "other-project"
CALLER = gke_iam.PIPELINE.removeprefix("serviceAccount:")
CLUSTER = f"projects/{PROJECT}/locations/us-east5/clusters/c"
POLICY = gke_iam.sim_policy(PROJECT, [PROJECT, WATCHED])


def refusal(call, *args) -> GkeError:
    with pytest.raises(GkeError) as error:
        call(*args)
    return error.value


@pytest.mark.parametrize("method", sorted(gke_iam.METHOD_PERMISSIONS))
def test_every_method_is_refused_without_the_role_and_allowed_with_it(method):
    permission = gke_iam.METHOD_PERMISSIONS[method]
    gke_iam.check(POLICY, CALLER, permission, PROJECT, CLUSTER)
    refused = refusal(gke_iam.check, {}, CALLER, permission, PROJECT, CLUSTER)
    assert refused.code == "PERMISSION_DENIED"
    assert refused.message == f'Required "{permission}" permission(s) for "{CLUSTER}".'


def test_every_method_the_emulator_serves_checks_a_permission():
    from unittest import mock

    from sim import gke_transport

    handler = gke_transport.grpc_handler(mock.MagicMock())
    assert set(handler._method_handlers) == {
        f"/google.container.v1.ClusterManager/{m}" for m in gke_iam.METHOD_PERMISSIONS
    }


def test_roles_expand_to_the_permissions_their_reference_lists():
    assert gke_iam.role_grants("roles/container.admin", "container.clusters.connect")
    assert gke_iam.role_grants("roles/container.admin", "container.operations.list")
    assert not gke_iam.role_grants("roles/container.admin", gke_iam.ACT_AS)
    assert gke_iam.role_grants("roles/iam.serviceAccountUser", gke_iam.ACT_AS)
    assert not gke_iam.role_grants("roles/iam.serviceAccountUser", "container.clusters.create")
    assert not gke_iam.role_grants("roles/composer.worker", "container.clusters.create")  # not expanded: nothing


def test_nodes_may_run_only_as_an_account_the_caller_may_act_as():
    gke_iam.check_act_as(POLICY, CALLER, [gke_iam.NODE_SERVICE_ACCOUNT])
    other = "someone-else@tpu-rl-sim.iam.gserviceaccount.com"
    refused = refusal(gke_iam.check_act_as, POLICY, CALLER, [gke_iam.NODE_SERVICE_ACCOUNT, other])
    assert refused.code == "INVALID_ARGUMENT"  # GKE answers it with 400, not 403
    assert refused.message == (
        f'The user does not have access to service account "{other}". Ask a project owner to grant you the '
        "iam.serviceAccountUser role on the service account."
    )


def test_a_pool_without_a_service_account_runs_as_the_compute_engine_default_account():
    default = "100000000001-compute@developer.gserviceaccount.com"
    pools = [
        {"config": {"machine_type": "n2-standard-8"}},
        {"config": {"service_account": "a@p.iam.gserviceaccount.com"}},
    ]
    assert gke_iam.node_accounts(pools, 100000000001) == [default, "a@p.iam.gserviceaccount.com"]
    assert default in refusal(gke_iam.check_act_as, POLICY, CALLER, [default]).message


def test_the_dns_endpoint_needs_container_clusters_connect():
    gke_iam.check(POLICY, CALLER, gke_iam.CONNECT, PROJECT, CLUSTER)
    viewer_only = {"projects": {PROJECT: {gke_iam.PIPELINE: ["roles/iam.serviceAccountUser"]}}}
    refused = refusal(gke_iam.check, viewer_only, CALLER, gke_iam.CONNECT, PROJECT, CLUSTER)
    assert '"container.clusters.connect"' in refused.message


def test_the_reaper_lists_and_deletes_in_every_watched_project_and_nowhere_else():
    for permission in ("container.clusters.list", "container.operations.list", "container.clusters.delete"):
        gke_iam.check(POLICY, CALLER, permission, WATCHED, f"projects/{WATCHED}/locations/us-east5")
        assert refusal(gke_iam.check, POLICY, CALLER, permission, "unwatched", "projects/unwatched").code == (
            "PERMISSION_DENIED"
        )


# --- the emulator's check of a real request ----------------------------------------------------------------------


@pytest.fixture
def emulator(tmp_path, monkeypatch):
    """The emulator's IAM check alone (no state, no listener), its policy the simulation's."""
    from google.cloud import container_v1

    from sim import gke_emulator

    monkeypatch.setattr(gke_emulator, "GKE_DIR", tmp_path)
    (tmp_path / "iam.json").write_text(json.dumps(gke_iam.sim_policy(PROJECT, [PROJECT])))
    emulator = gke_emulator.Emulator.__new__(gke_emulator.Emulator)
    emulator.c = container_v1
    return emulator


def pool_request(account: str):
    from google.cloud import container_v1

    config = {"machine_type": "n2-standard-8", "service_account": account} if account else {}
    return container_v1.CreateNodePoolRequest(parent=CLUSTER, node_pool={"name": "p", "config": config})


def test_the_emulator_refuses_a_pool_whose_nodes_the_caller_may_not_act_as(emulator):
    emulator.authorize("CreateNodePool", pool_request(gke_iam.NODE_SERVICE_ACCOUNT), CALLER)
    for account in ("other@tpu-rl-sim.iam.gserviceaccount.com", ""):
        refused = refusal(emulator.authorize, "CreateNodePool", pool_request(account), CALLER)
        assert refused.code == "INVALID_ARGUMENT" and "does not have access to service account" in refused.message


def test_the_emulator_refuses_a_cluster_create_to_an_identity_without_a_role(emulator):
    from google.cloud import container_v1

    pools = [{"name": "system", "config": {"service_account": gke_iam.NODE_SERVICE_ACCOUNT}}]
    request = container_v1.CreateClusterRequest(
        parent=f"projects/{PROJECT}/locations/us-east5", cluster={"name": "c", "node_pools": pools}
    )
    emulator.authorize("CreateCluster", request, CALLER)
    refused = refusal(emulator.authorize, "CreateCluster", request, "stranger@elsewhere.iam.gserviceaccount.com")
    assert refused.message == f'Required "container.clusters.create" permission(s) for "{CLUSTER}".'
    listing = container_v1.ListClustersRequest(parent="projects/unwatched/locations/us-east5")
    assert refusal(emulator.authorize, "ListClusters", listing, CALLER).code == "PERMISSION_DENIED"


def test_the_dns_endpoint_refuses_an_identity_without_connect(emulator):
    from sim import gke_dns

    route = gke_dns.Route(apiserver="127.0.0.1:1")
    route.project, route.cluster_path = PROJECT, CLUSTER
    assert emulator.connect_refusal(route, CALLER) is None
    assert '"container.clusters.connect"' in emulator.connect_refusal(
        route, "stranger@elsewhere.iam.gserviceaccount.com"
    )


# --- the package's reading of the refusal -------------------------------------------------------------------------


def test_the_package_reads_gkes_iam_refusals_as_permission_and_names_the_role():
    from tpu_rl.gke import Refusal, permission_fix
    from tpu_rl.gke import refusal as read

    denied = gke_iam.denied("container.clusters.update", CLUSTER)
    assert read(denied.code, denied.message) is Refusal.PERMISSION  # not quota: no wait grants a role
    fix = permission_fix(denied.message, PROJECT)
    assert "container.clusters.update" in fix and "roles/container.admin" in fix and PROJECT in fix
    no_act_as = gke_iam.no_act_as("other@p.iam.gserviceaccount.com")
    assert read(no_act_as.code, no_act_as.message) is Refusal.PERMISSION
    fix = permission_fix(no_act_as.message, PROJECT)
    assert "iam.serviceAccounts.actAs" in fix and "roles/iam.serviceAccountUser" in fix
    assert "other@p.iam.gserviceaccount.com" in fix
    other_form = "Permission 'container.clusters.list' denied on resource '//container.googleapis.com/projects/p'"
    assert "container.clusters.list" in permission_fix(other_form, "p")
    assert read("INVALID_ARGUMENT", "Cluster.initial_node_count or Cluster.node_pools must be set.") is None


# --- the documents and the simulation agree ------------------------------------------------------------------------


def documented_grants() -> dict[str, set[str]]:
    """The roles the Composer guide's commands in step 1 (the identities) grant the environment's account: on its
    project, on the nodes' account, and on each project the reaper watches. Step 4's Secret Manager grant is no
    role GKE checks."""
    doc = (REPO / "docs" / "getting-started" / "composer.md").read_text()
    section = doc[doc.index("\n## 1. Identities") : doc.index("\n## 2. ")]
    text = re.sub(r"\\\n\s*", " ", section)
    grants: dict[str, set[str]] = {"project": set(), "node account": set(), "watched project": set()}
    shapes = {
        "project": r"gcloud projects add-iam-policy-binding \$PROJECT ",
        "node account": r"gcloud iam service-accounts add-iam-policy-binding \$NODE_SA ",
        "watched project": r"gcloud projects add-iam-policy-binding \$project ",
    }
    for where, start in shapes.items():
        pattern = start + r"[^\n]*--member serviceAccount:\$COMPOSER_SA\s+--role (roles/[\w.]+)"
        grants[where] = set(re.findall(pattern, text))
    return grants


def test_the_roles_the_docs_grant_are_exactly_the_ones_the_simulation_starts_with():
    grants = documented_grants()
    assert grants == {
        "project": set(gke_iam.PIPELINE_PROJECT_ROLES),
        "node account": set(gke_iam.PIPELINE_NODE_ACCOUNT_ROLES),
        "watched project": set(gke_iam.REAPER_PROJECT_ROLES),
    }
    policy = gke_iam.sim_policy(PROJECT, [WATCHED])
    assert set(policy["projects"][PROJECT][gke_iam.PIPELINE]) == grants["project"]
    assert set(policy["projects"][WATCHED][gke_iam.PIPELINE]) == grants["watched project"]
    assert set(policy["service_accounts"][gke_iam.NODE_SERVICE_ACCOUNT][gke_iam.PIPELINE]) == grants["node account"]


def test_the_policy_names_the_simulations_own_identities():
    from sim.gke_settings import SA_EMAIL

    simulation = json.loads((REPO / "include" / "examples" / "simulation.json").read_text())
    assert gke_iam.PIPELINE == f"serviceAccount:{SA_EMAIL}"
    assert gke_iam.NODE_SERVICE_ACCOUNT == simulation["node_service_account"]
