"""Who may do what in the GKE emulator: an IAM policy (roles granted to identities on projects, and on service
accounts for ``iam.serviceAccounts.actAs``), the permission each ClusterManager method and the DNS endpoint checks,
and GKE's refusal when the caller lacks it. Pure: the emulator (sim/gke_emulator.py, sim/gke_dns.py) asks
:func:`check` before it does anything else with a request; tests/unit/test_gke_iam.py tests the rules.

The simulation's setup (``gke_emulator.py init``, run by sim/up.sh) writes :func:`sim_policy` to
``$SIM/gke/iam.json``: exactly the roles docs/getting-started/composer.md grants the pipeline's identity (the
environment's service account, whose key the ``google_cloud_default`` connection names) and the reaper's, so the
simulation proves that the documented roles suffice (tests/unit/test_gke_iam.py checks that the document and the seed
agree). The file is
read on each request, as the fault rules are. Nothing but the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path

from .gke_errors import GkeError

#: The identity of the simulation's ``google_cloud_default`` key (sim/gke_settings.py ``SA_EMAIL``), which stands
#: for the environment's service account (``composer-rl`` in docs/getting-started/composer.md).
PIPELINE = "serviceAccount:tpu-rl-sim@tpu-rl-sim.iam.gserviceaccount.com"
#: The nodes' service account of the simulation's runs (include/examples/simulation.json ``node_service_account``).
NODE_SERVICE_ACCOUNT = "tpu-rl-nodes@tpu-rl-sim.iam.gserviceaccount.com"

#: The permission GKE checks for each ClusterManager method. GKE "API permissions"
#: (kubernetes-engine/docs/reference/api-permissions): clusters.create "container.clusters.create on the containing
#: Cloud project, and iam.serviceAccounts.actAs on the specified service account"; clusters.delete/get/list
#: container.clusters.delete/get/list; nodePools.create and .delete "container.clusters.update on the requested
#: cluster"; nodePools.get and .list container.clusters.get. The operations: the REST reference of
#: projects.locations.operations.get / .list ("Authorization requires the following IAM permission on the specified
#: resource name: container.operations.get"; on the parent: container.operations.list).
METHOD_PERMISSIONS: dict[str, str] = {
    "CreateCluster": "container.clusters.create",
    "GetCluster": "container.clusters.get",
    "ListClusters": "container.clusters.list",
    "DeleteCluster": "container.clusters.delete",
    "CreateNodePool": "container.clusters.update",
    "GetNodePool": "container.clusters.get",
    "ListNodePools": "container.clusters.get",
    "DeleteNodePool": "container.clusters.update",
    "GetOperation": "container.operations.get",
    "ListOperations": "container.operations.list",
}
#: The permission GKE's DNS-based endpoint checks before it passes a request to the control plane (GKE "About
#: network isolation", DNS-based endpoint: access "is controlled by IAM ... container.clusters.connect").
CONNECT = "container.clusters.connect"
#: Creating a cluster or a node pool whose nodes run as a service account is acting as it ("To set a service account
#: on nodes, you must also have the Service Account User role (roles/iam.serviceAccountUser) on the user-managed
#: service account that your nodes will use": IAM roles reference, roles/container.admin).
ACT_AS = "iam.serviceAccounts.actAs"

#: The predefined roles the emulator expands, with the permissions it checks that each holds (IAM "Google
#: Kubernetes Engine roles and permissions": roles/container.admin holds ``container.*``; IAM "Service Accounts
#: roles and permissions": roles/iam.serviceAccountUser holds iam.serviceAccounts.actAs, .get, .list). A role not in
#: this table grants nothing here, which is stricter than GCP (roles/composer.worker, say, is not expanded): the
#: simulation then proves that the roles it does expand suffice.
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "roles/container.admin": ("container.*",),
    "roles/iam.serviceAccountUser": (ACT_AS, "iam.serviceAccounts.get", "iam.serviceAccounts.list"),
    # IAM "Compute Engine roles and permissions": roles/compute.viewer, "Read-only access to get and list Compute
    # Engine resources": among them compute.reservations.get/.list and compute.regions.get (the preflight's reads).
    "roles/compute.viewer": ("compute.reservations.get", "compute.reservations.list", "compute.regions.get"),
}


def role_grants(role: str, permission: str) -> bool:
    """Whether the role holds the permission (a trailing ``.*`` holds every permission under it)."""
    for held in ROLE_PERMISSIONS.get(role, ()):
        if held == permission or (held.endswith(".*") and permission.startswith(held[:-1])):
            return True
    return False


def allowed(roles: list[str], permission: str) -> bool:
    return any(role_grants(role, permission) for role in roles)


def project_roles(policy: dict, member: str, project: str) -> list[str]:
    return list(policy.get("projects", {}).get(project, {}).get(member, []))


def account_roles(policy: dict, member: str, email: str) -> list[str]:
    """Roles on the service account itself, and on its project (a project-level grant covers its accounts)."""
    own = policy.get("service_accounts", {}).get(email, {}).get(member, [])
    project = email.split("@", 1)[-1].split(".", 1)[0]
    return list(own) + project_roles(policy, member, project)


def denied(permission: str, resource: str) -> GkeError:
    """GKE's refusal of a call its caller lacks a permission for: 403 ``Required "container.clusters.create"
    permission(s) for "projects/P/locations/L/clusters/C".`` (ErrorInfo reason IAM_PERMISSION_DENIED, domain
    container.googleapis.com: quoted in 2i2c-org/infrastructure issue 488, pulumi/examples issue 150,
    terraform-google-modules/terraform-google-kubernetes-engine issue 926 over gRPC as PermissionDenied)."""
    return GkeError("PERMISSION_DENIED", f'Required "{permission}" permission(s) for "{resource}".')


def no_act_as(email: str) -> GkeError:
    """GKE's refusal of nodes that would run as an account the caller may not act as: HTTP 400 (gcloud: "ResponseError:
    code=400, message=The user does not have access to service account "887891891186-compute@developer.gserviceaccount
    .com". Ask a project owner to grant you the iam.serviceAccountUser role on the service account.", from
    ``gcloud container node-pools create``; Terraform's Google provider shows it as "Error 400: ..., badRequest")."""
    return GkeError(
        "INVALID_ARGUMENT",
        f'The user does not have access to service account "{email}". Ask a project owner to grant you the '
        "iam.serviceAccountUser role on the service account.",
    )


def check(policy: dict, caller: str, permission: str, project: str, resource: str) -> None:
    """Raises GKE's 403 unless ``caller`` (an email) holds ``permission`` in ``project``; ``resource`` is what the
    message names (the project or the cluster)."""
    if not allowed(project_roles(policy, f"serviceAccount:{caller}", project), permission):
        raise denied(permission, resource)


def check_act_as(policy: dict, caller: str, accounts: list[str]) -> None:
    """Raises GKE's refusal unless ``caller`` may act as every node service account of the request."""
    for email in accounts:
        if not allowed(account_roles(policy, f"serviceAccount:{caller}", email), ACT_AS):
            raise no_act_as(email)


def node_accounts(pools: list[dict], project_number: int) -> list[str]:
    """The service accounts the request's nodes would run as: each pool's ``config.service_account``, or GKE's
    default, the Compute Engine default service account ``PROJECT_NUMBER-compute@developer.gserviceaccount.com``
    (NodeConfig.service_account: "If unspecified, the 'default' service account is used")."""
    default = f"{project_number}-compute@developer.gserviceaccount.com"
    return list(dict.fromkeys((p.get("config") or {}).get("service_account") or default for p in pools))


# --- the simulation's policy ------------------------------------------------------------------------------------

#: What docs/getting-started/composer.md ("1. Identities and the roles each one uses") grants the environment's service
#: account that the GKE API and the DNS endpoint check: on the run's project, on the node account, and on each project
#: the reaper watches.
PIPELINE_PROJECT_ROLES = ("roles/composer.worker", "roles/container.admin", "roles/compute.viewer")
PIPELINE_NODE_ACCOUNT_ROLES = ("roles/iam.serviceAccountUser",)
REAPER_PROJECT_ROLES = ("roles/container.admin",)


def sim_policy(project: str, watched: list[str]) -> dict:
    """The policy the simulation starts with: the pipeline's roles in its project, on the nodes' account, and the
    reaper's in every watched project (the reaper runs as the same connection)."""
    projects: dict[str, dict[str, list[str]]] = {project: {PIPELINE: list(PIPELINE_PROJECT_ROLES)}}
    for other in watched:
        roles = projects.setdefault(other, {}).setdefault(PIPELINE, [])
        roles.extend(r for r in REAPER_PROJECT_ROLES if r not in roles)
    return {
        "projects": projects,
        "service_accounts": {NODE_SERVICE_ACCOUNT: {PIPELINE: list(PIPELINE_NODE_ACCOUNT_ROLES)}},
    }


def read_policy(path: Path) -> dict:
    """The policy in force (read on each request); none written yet: nobody may do anything, as on a project whose
    IAM grants nothing."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
