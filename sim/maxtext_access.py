"""Who may do what, and which faults a pod meets, for the MaxText stage emulator (part of the simulation, never
imported by plugins/).

Faults: merges the pod's own sim.tpu-rl.dev/* annotations with the first matching rule of the fault ConfigMap
(sim/faults.py) and decides whether this attempt fails (the same rule as the kwok stages, sim/kwok/pod-fail.yaml).

Bucket IAM: on the nodes of GKE-emulated clusters (annotated with their service account), a stage pod's
principal (the node's account with hostNetwork or without the GKE metadata server; else its Kubernetes
service account's Workload Identity principal) needs the permissions of its stage in the bucket policy
($TPU_RL_SIM_DIR/bucket-policy.json, principal -> roles, read on each check; default: the nodes' account
with roles/storage.objectAdmin and roles/storage.legacyBucketReader); else the pod fails with the error
the real client prints.

HF_TOKEN: checked to come from a Secret that exists (pod fails otherwise); a literal value or
hf_access_token= on the command line gives a warning. Values are never printed.
"""

import json
import os
from pathlib import Path

from . import faults, gke_rules
from .maxtext_outputs import SIM, PodFailure

#: The prefix of the pod annotations the emulator reads (faults) and writes (what it did, when the pod exits).
PREFIX = "sim.tpu-rl.dev/"
#: The buckets' IAM policy (principal -> roles), a file read on each check so a test can change it.
BUCKET_POLICY_FILE = Path(os.environ.get("TPU_RL_SIM_DIR") or SIM) / "bucket-policy.json"
DEFAULT_BUCKET_POLICY = {
    "serviceAccount:tpu-rl-nodes@tpu-rl-sim.iam.gserviceaccount.com": [
        "roles/storage.objectAdmin",
        "roles/storage.legacyBucketReader",
    ]
}
#: The Cloud Storage permissions of the predefined roles the stages' identities get (the storage.* part that
#: matters here). Source: IAM docs, "Cloud Storage roles" (https://cloud.google.com/storage/docs/access-control/iam-roles):
#: objectAdmin and objectUser hold storage.objects.* but no storage.buckets.get; legacyBucketReader holds
#: storage.buckets.get and storage.objects.list; storage.admin holds both.
ROLE_PERMISSIONS = {
    "roles/storage.admin": {
        "storage.buckets.get",
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    },
    "roles/storage.objectAdmin": {
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    },
    "roles/storage.objectUser": {
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    },
    "roles/storage.objectViewer": {"storage.objects.get", "storage.objects.list"},
    "roles/storage.legacyBucketReader": {"storage.buckets.get", "storage.objects.list"},
    "roles/storage.bucketViewer": {"storage.buckets.get"},
}
#: What each stage does in the bucket. MaxText 0.2.4's HF->MaxText conversion calls get_bucket() before it
#: writes (maxtext/utils/gcs_utils.py, reached from checkpoint_conversion/utils/utils.py).
STAGE_PERMISSIONS = {
    "to_maxtext": ["storage.buckets.get", "storage.objects.create", "storage.objects.list"],
    "train_rl": ["storage.objects.get", "storage.objects.list", "storage.objects.create", "storage.objects.delete"],
    "to_huggingface": ["storage.objects.get", "storage.objects.list", "storage.objects.create"],
}


# ---------------------------------------------------------------- faults


def fault_rule_annotations(fault_switch, pod, workload, stage, attempt_key):
    """The first rule of the fault switch that matches the pod and still applies to this attempt (its `times`),
    as the annotations that override the pod's own. Returns (rule name, annotations), (None, {}) for none."""
    for name, rule in faults.list_faults(fault_switch).items():
        if matches(rule, pod, workload, stage) and faults.record_applied(fault_switch, name, attempt_key):
            patch = {
                PREFIX + field.replace("_", "-"): str(rule[field])
                for field in faults.EFFECT_FIELDS
                if rule.get(field) is not None
            }
            patch[PREFIX + "fault-rule"] = name
            return name, patch
    return None, {}


def matches(rule, pod, workload, stage):
    """Whether the pod meets each match field the rule gives (sim/faults.py); the workload's name by prefix."""
    labels = pod.metadata.labels or {}
    checks = {
        "prefix": workload,
        "stage": stage,
        "replicated_job": labels.get("jobset.sigs.k8s.io/replicatedjob-name"),
        "namespace": pod.metadata.namespace,
        "job_index": labels.get("jobset.sigs.k8s.io/job-index"),
    }
    for field, actual in checks.items():
        want = rule.get(field)
        if want is None:
            continue
        if actual is None or (not actual.startswith(want) if field == "prefix" else actual != want):
            return False
    return True


def maxtext_faults(annotations):
    """The stage faults asked for (annotation maxtext-fault, comma-separated)."""
    return [f.strip() for f in annotations.get(PREFIX + "maxtext-fault", "").split(",") if f.strip()]


def will_fail(annotations, attempt):
    """Same rule as the kwok stages (sim/kwok/pod-fail.yaml)."""
    if annotations.get(PREFIX + "fail-attempts") is not None:
        return attempt < int(annotations[PREFIX + "fail-attempts"])
    return annotations.get(PREFIX + "exit-code", "0") != "0"


# ---------------------------------------------------------------- permissions


def check_bucket_access(core, pod, stage, args, flags):
    """Cloud Storage answers 403 to a principal without access to the bucket. Nodes that carry no service account
    (the standing cluster's) are not checked."""
    principal = bucket_principal(core, pod)
    if principal is None:
        return
    try:
        policy = json.loads(BUCKET_POLICY_FILE.read_text())
    except (OSError, ValueError):
        policy = DEFAULT_BUCKET_POLICY
    granted = set().union(*(ROLE_PERMISSIONS.get(role, set()) for role in policy.get(principal, [])))
    url = args.get("base_output_directory") or flags.get("base_output_directory") or "the bucket"
    for permission in STAGE_PERMISSIONS.get(stage, []):
        if permission in granted:
            continue
        if permission == "storage.buckets.get":  # what maxtext/utils/gcs_utils.py raises after get_bucket()
            bucket = url.removeprefix("gs://").split("/", 1)[0]
            raise PodFailure(
                f"ValueError: GCS bucket {bucket} not found or accessible "
                f"(403 Forbidden: {principal} does not have storage.buckets.get access to the "
                "Google Cloud Storage bucket)"
            )
        raise PodFailure(f"403 Forbidden: {principal} does not have {permission} access to {url}")


def bucket_principal(core, pod):
    """Who the pod is to Cloud Storage, decided as on GKE: a pod with hostNetwork, or on a node without the GKE
    metadata server, is the node's service account; otherwise the Workload Identity principal of its Kubernetes
    service account. None on a node that carries no service account."""
    node = core.read_node(pod.spec.node_name)
    account = (node.metadata.annotations or {}).get(gke_rules.NODE_SERVICE_ACCOUNT_ANNOTATION)
    if account is None:
        return None
    metadata_server = (node.metadata.labels or {}).get("iam.gke.io/gke-metadata-server-enabled") == "true"
    if pod.spec.host_network or not metadata_server:
        return f"serviceAccount:{account}"
    return (
        f"principal://iam.googleapis.com/projects/{gke_rules.PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
        f"tpu-rl-sim.svc.id.goog/subject/ns/{pod.metadata.namespace}/sa/"
        f"{pod.spec.service_account_name or 'default'}"
    )


def check_secrets(core, pod, container, args):
    """HF token hygiene. Never reads or prints a token's value beyond checking the key exists. Returns the
    warnings, a missing Secret or key first."""
    from kubernetes.client.exceptions import ApiException

    warnings = []
    if container is None:
        return warnings
    if "hf_access_token" in args:
        warnings.append("hf_access_token-on-command-line")
    for env in container.env or []:
        if env.name != "HF_TOKEN":
            continue
        ref = env.value_from.secret_key_ref if env.value_from else None
        if env.value is not None:
            warnings.append("HF_TOKEN-literal-value")
        elif ref is not None:
            try:
                secret = core.read_namespaced_secret(ref.name, pod.metadata.namespace)
                if ref.key not in (secret.data or {}) and not ref.optional:
                    warnings.insert(0, f"missing-secret-key {ref.name}/{ref.key} for HF_TOKEN")
            except ApiException as e:
                if e.status != 404:
                    raise
                if not ref.optional:
                    warnings.insert(0, f"missing-secret {ref.name} for HF_TOKEN")
    return warnings
