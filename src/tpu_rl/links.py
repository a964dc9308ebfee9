"""Extra links of the JobSet task: its GKE workload page and its pods' logs in Cloud Logging.

Airflow 3 stores each link's URL in XCom when the task finishes a step on the worker (``get_link`` is
called there, with the operator instance) and the UI reads that XCom back: no plugin registration is
needed. The links are empty for clusters reached through a plain Kubernetes connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

CONSOLE = "https://console.cloud.google.com"


def workload_url(*, project_id: str, location: str, cluster_name: str, namespace: str, name: str) -> str:
    """The page ``xpk`` prints for a JobSet (GKE lists it with its headless service)."""
    return (
        f"{CONSOLE}/kubernetes/service/{location}/{cluster_name}/{namespace}/{name}/details?project={quote(project_id)}"
    )


def logging_query(
    *, project_id: str, location: str, cluster_name: str, namespace: str, name: str, since: str = ""
) -> str:
    lines = [
        'resource.type="k8s_container"',
        f'resource.labels.project_id="{project_id}"',
        f'resource.labels.location="{location}"',
        f'resource.labels.cluster_name="{cluster_name}"',
        f'resource.labels.namespace_name="{namespace}"',
        f'labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"="{name}"',
    ]
    if since:
        lines.append(f'timestamp>="{since}"')
    return "\n".join(lines)


def logging_url(**kwargs: str) -> str:
    project_id = kwargs["project_id"]
    return f"{CONSOLE}/logs/query;query={quote(logging_query(**kwargs), safe='')}?project={quote(project_id)}"


class _JobSetLink(BaseOperatorLink):
    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        params = getattr(operator, "link_params", lambda: None)()
        return self.format(params) if params else ""

    def format(self, params: dict[str, str]) -> str:
        raise NotImplementedError


class JobSetWorkloadLink(_JobSetLink):
    name = "GKE workload"

    def format(self, params: dict[str, str]) -> str:
        return workload_url(**{k: v for k, v in params.items() if k != "since"})


class JobSetLogsLink(_JobSetLink):
    name = "JobSet logs"

    def format(self, params: dict[str, str]) -> str:
        return logging_url(**params)
