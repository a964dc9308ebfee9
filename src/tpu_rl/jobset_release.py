"""The JobSet release the pipeline installs on a cluster that has none, shipped with the package.

``releases/jobset-<version>.yaml`` is the release's ``manifests.yaml`` (rendered by
scripts/render-jobset-release.sh): no download at run time, so clusters without internet egress and
air-gapped Composer environments install the same bytes.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

#: Where the release runs its controller.
CONTROLLER_NAMESPACE, CONTROLLER_DEPLOYMENT = "jobset-system", "jobset-controller-manager"
#: Apply order: what others refer to first; the webhook configurations (failurePolicy Fail) last.
_KIND_ORDER = [
    "Namespace",
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "Role",
    "ClusterRoleBinding",
    "RoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
    "Deployment",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
]


def shipped_versions() -> list[str]:
    names = (entry.name for entry in resources.files("tpu_rl.releases").iterdir())
    return sorted(n[len("jobset-") : -len(".yaml")] for n in names if n.startswith("jobset-") and n.endswith(".yaml"))


@cache
def release_objects(version: str) -> tuple[dict[str, Any], ...]:
    """The release's objects in apply order (each keeps its own namespace)."""
    import yaml

    text = resources.files("tpu_rl.releases").joinpath(f"jobset-{version}.yaml").read_text()
    objects = [o for o in yaml.safe_load_all(text) if o]
    rank = {kind: i for i, kind in enumerate(_KIND_ORDER)}
    return tuple(sorted(objects, key=lambda o: rank.get(o["kind"], len(rank))))


def describe(obj: dict[str, Any]) -> str:
    namespace = obj["metadata"].get("namespace")
    return f"{obj['kind']} {namespace + '/' if namespace else ''}{obj['metadata']['name']}"
