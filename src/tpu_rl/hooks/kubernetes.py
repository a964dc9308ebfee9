"""Hooks for a cluster's Kubernetes API: a GKE cluster through the Google provider, or any cluster through a
Kubernetes connection (:class:`ClusterTarget` names which).

They only talk to the API (JobSets, their pods and logs, nodes, Secrets, service accounts, Kueue, the server's
version); the operator decides what to do and the trigger waits. Objects are returned as plain dicts, as the
API sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.utils.log.logging_mixin import LoggingMixin

from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.gke import iam_permission, permission_fix
from tpu_rl.hooks.backoff import REQUEST_ATTEMPTS, backoff_seconds
from tpu_rl.hooks.google_credentials import warm_google_credentials
from tpu_rl.hooks.in_thread import in_thread, run_to_the_end
from tpu_rl.vocabulary import (
    JOBSET_API,
    JOBSET_GROUP,
    JOBSET_NAME_LABEL,
    JOBSET_PLURAL,
    JOBSET_UID_LABEL,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_VERSION,
    KUEUE_WORKLOADS,
)

if TYPE_CHECKING:
    from tpu_rl.config import RunConfig

#: A watch request lasts this long on the server before we reconnect from the last resourceVersion:
#: bounded, so a half-open connection is noticed and GKE tokens are refreshed.
WATCH_SECONDS = 300
#: A log stream is reopened this often even when the pod prints nothing (long XLA compiles).
LOG_STREAM_SECONDS = 600
#: Answers after which a request is made again, as client-go does (``rest/with_retry.go``): 429 (API Priority and
#: Fairness, saying when in Retry-After) and the 5xx of an API server that restarts or of GKE's front end before
#: it. Connection errors (refused, reset) are retried too (:mod:`tpu_rl.hooks.backoff`).
RETRYABLE_STATUSES = (429, 500, 502, 503, 504)
#: (connect, read) seconds of a synchronous request that names none.
REQUEST_TIMEOUT = (10, 60)


def honour_environment(client: Any) -> None:
    """Reaches the hosts ``NO_PROXY`` names directly, and trusts the CA file ``SSL_CERT_FILE`` names for a server
    whose CA the kubeconfig does not pin (a DNS-based endpoint's public certificate), as kubernetes 35 and later do.
    kubernetes 34 (what Composer's 3.1.7 images can pair with cncf-kubernetes 10.11, which asks <35) reads
    ``NO_PROXY`` in ``Configuration.__init__`` and then sets it back to None, so with ``HTTPS_PROXY`` set every
    request went through the proxy, a private cluster endpoint's too; and it trusts certifi's bundle alone
    (``rest.RESTClientObject``), not the CA file of the environment (a TLS-inspecting egress proxy's, say). The
    REST client is made again with the environment's values."""
    configuration = client.configuration
    no_proxy = os.environ.get("no_proxy") or os.environ.get("NO_PROXY")
    ca_file = os.environ.get("SSL_CERT_FILE")
    changed = False
    if configuration.proxy and no_proxy and not configuration.no_proxy:
        configuration.no_proxy, changed = no_proxy, True
    if ca_file and configuration.verify_ssl and not configuration.ssl_ca_cert:
        configuration.ssl_ca_cert, changed = ca_file, True
    if changed:
        from kubernetes.client import rest

        client.rest_client = rest.RESTClientObject(configuration)


def request_retry() -> Any:
    """urllib3's retry of every request the synchronous client makes: connection errors and
    :data:`RETRYABLE_STATUSES`, :data:`REQUEST_ATTEMPTS` tries in all with backoff (Retry-After honoured), then
    the last answer as the client raises it. Every method: a create whose answer was lost meets itself (409),
    which each create here reads as done."""
    from urllib3.util.retry import Retry

    return Retry(
        total=REQUEST_ATTEMPTS - 1,
        backoff_factor=1,
        backoff_max=16,
        status_forcelist=RETRYABLE_STATUSES,
        allowed_methods=None,
        respect_retry_after_header=True,
        raise_on_status=False,
    )


@dataclass
class ClusterTarget:
    """Which cluster to reach, and how: a Kubernetes connection, or a GKE cluster by project, location and
    name through ``gcp_conn_id`` (by its DNS-based endpoint with ``use_dns_endpoint``).

    The one description of the connection: the operator holds it (its names are templated), its hooks use
    it, and the trigger carries it serialised (:meth:`to_dict`, :meth:`from_dict`). For the trigger it
    also carries the GKE cluster's endpoint as the operator resolved it (:meth:`with_endpoint` and
    ``KubernetesApiHook.gke_endpoint``): ``cluster_url`` and ``ssl_ca_cert``, so the triggerer asks nothing of GKE.
    """

    template_fields: ClassVar[Sequence[str]] = (
        "kubernetes_conn_id",
        "project_id",
        "location",
        "cluster_name",
        "gcp_conn_id",
    )
    #: What the JobSet operator takes as keywords instead of a ClusterTarget.
    KEYWORDS: ClassVar[Sequence[str]] = (*template_fields, "use_dns_endpoint")

    kubernetes_conn_id: str | None = None
    project_id: str | None = None
    location: str | None = None
    cluster_name: str | None = None
    gcp_conn_id: str = "google_cloud_default"
    use_dns_endpoint: bool = False
    cluster_url: str | None = field(default=None, repr=False)
    ssl_ca_cert: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if bool(self.kubernetes_conn_id) == bool(self.cluster_name or self.cluster_url):
            raise ValueError("Give either kubernetes_conn_id or (project_id, location, cluster_name).")
        if self.cluster_name and not (self.project_id and self.location):
            raise ValueError("A GKE cluster needs project_id and location as well as cluster_name.")

    @property
    def is_gke(self) -> bool:
        return bool(self.cluster_name or self.cluster_url)

    def with_endpoint(self, cluster_url: str, ssl_ca_cert: str) -> ClusterTarget:
        """This GKE cluster, with its endpoint resolved."""
        return replace(self, cluster_url=cluster_url, ssl_ca_cert=ssl_ca_cert)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterTarget:
        return cls(**data)

    @classmethod
    def for_run(cls, config: RunConfig) -> ClusterTarget:
        """The run's cluster: its Kubernetes connection when it names one, else its GKE cluster."""
        if config.kubernetes_conn_id:
            return cls(kubernetes_conn_id=config.kubernetes_conn_id, gcp_conn_id=config.gcp_conn_id)
        return cls(
            project_id=config.project,
            location=config.region,
            cluster_name=config.cluster_name,
            gcp_conn_id=config.gcp_conn_id,
            use_dns_endpoint=config.uses_dns_endpoint,
        )


class KubernetesApiHook(LoggingMixin):
    """Synchronous calls of the operators (JobSets, pods, nodes, Secrets, service accounts, Kueue, the version)."""

    def __init__(self, target: ClusterTarget) -> None:
        super().__init__()
        self.target = target

    @cached_property
    def gke_endpoint(self) -> tuple[str, str]:
        """(API server URL, CA certificate) of the GKE cluster, as the GKE API reports them; the DNS-based
        endpoint when the target asks for it (refused with the fix when the cluster does not serve it)."""
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

        t = self.target
        cluster = GKEHook(gcp_conn_id=t.gcp_conn_id, location=t.location).get_cluster(
            name=t.cluster_name, project_id=t.project_id
        )
        if t.use_dns_endpoint:
            dns = cluster.control_plane_endpoints_config.dns_endpoint_config
            if not (dns.endpoint and dns.allow_external_traffic):
                raise AirflowFailException(
                    f"control_plane_endpoint: cluster {t.cluster_name} does not allow access through its DNS-based "
                    "endpoint (controlPlaneEndpointsConfig.dnsEndpointConfig.allowExternalTraffic is off). Enable "
                    f"it: `gcloud container clusters update {t.cluster_name} --location {t.location} "
                    "--enable-dns-access`, or set control_plane_endpoint to 'ip' (its authorized networks must "
                    "then admit Airflow's egress address)."
                )
            url = f"https://{dns.endpoint}"
        else:
            url = f"https://{cluster.endpoint}"
        return url, cluster.master_auth.cluster_ca_certificate

    @cached_property
    def kube_hook(self):
        t = self.target
        if t.is_gke:
            from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesHook

            cluster_url, ssl_ca_cert = self.gke_endpoint
            return GKEKubernetesHook(
                cluster_url=cluster_url,
                ssl_ca_cert=ssl_ca_cert,
                use_dns_endpoint=t.use_dns_endpoint,
                gcp_conn_id=t.gcp_conn_id,
            )
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(conn_id=t.kubernetes_conn_id)

    def api_client(self) -> Any:
        """A client of the provider's hook (a fresh one carries a refreshed GKE token) whose requests are
        retried (:func:`request_retry`) and bounded (:data:`REQUEST_TIMEOUT`): the client sets no timeout, and a
        request to a stalled API server would hang until the task's ``execution_timeout``."""
        from kubernetes.client.exceptions import ApiException

        client = self.kube_hook.get_conn()
        honour_environment(client)
        client.rest_client.pool_manager.connection_pool_kw["retries"] = request_retry()
        call_api = client.call_api

        def bounded(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_request_timeout") is None:
                kwargs["_request_timeout"] = REQUEST_TIMEOUT
            try:
                return call_api(*args, **kwargs)
            except ApiException as refused:
                raise self._with_permission_fix(refused) from None

        client.call_api = bounded
        return client

    def _with_permission_fix(self, refused: Any) -> Any:
        """A 403 of GKE's DNS-based endpoint, which names the IAM permission its caller lacks
        (container.clusters.connect), with the role to grant; any other answer (Kubernetes RBAC's 403 included) as
        it is."""
        message = _status_message(refused.body)
        if refused.status == 403 and self.target.is_gke and iam_permission(message):
            refused.reason = f"{refused.reason}: {permission_fix(message, self.target.project_id or '')}"
        return refused

    @cached_property
    def _custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client())

    def get_jobset(self, name: str, namespace: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._custom.get_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_jobset(self, body: dict, namespace: str) -> dict:
        """Creates the JobSet. A create the API server applied but whose answer was lost is made again
        (:func:`request_retry`) and meets its own JobSet (409): that one, carrying every annotation of ``body``
        (the submission's identity), is returned; any other of that name is the conflict it is."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._custom.create_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body
            )
        except ApiException as e:
            existing = self.get_jobset(body["metadata"]["name"], namespace) if e.status == 409 else None
            wanted = body["metadata"].get("annotations") or {}
            if existing and wanted and wanted.items() <= (existing["metadata"].get("annotations") or {}).items():
                return existing
            raise

    def delete_jobset(self, name: str, namespace: str, uid: str | None = None) -> bool:
        """Delete with foreground propagation, so its Jobs and pods go first; False if already gone.

        With ``uid``, only that incarnation is deleted (a precondition): never a successor of the same name.
        """
        from kubernetes.client.exceptions import ApiException

        body: dict[str, Any] = {"propagationPolicy": "Foreground"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._custom.delete_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, body=body
            )
            return True
        except ApiException as e:
            if e.status in (404, 409):  # gone, or the name now belongs to another incarnation
                return False
            raise

    # -- installing JobSet ------------------------------------------------------------------------

    @cached_property
    def _dynamic(self):
        from kubernetes.dynamic import DynamicClient

        return DynamicClient(self.api_client())

    def apply(self, obj: dict, field_manager: str = "tpu-rl") -> None:
        """Server-side apply of one object in its own namespace. Forced: a repair takes back the fields a
        half-finished install left. (``kubernetes.utils.create_from_yaml(apply=True)`` would put every
        object in one namespace, which the apiserver refuses for the release's ``jobset-system`` ones.)"""
        resource = self._dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(
            body=obj, namespace=obj["metadata"].get("namespace"), field_manager=field_manager, force_conflicts=True
        )

    def crd_served_versions(self, name: str) -> list[str] | None:
        """The served versions of a CustomResourceDefinition, or None when it does not exist."""
        from kubernetes.client import ApiextensionsV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            crd = ApiextensionsV1Api(self.api_client()).read_custom_resource_definition(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return [v.name for v in crd.spec.versions if v.served]

    def deployment_problem(self, name: str, namespace: str) -> str | None:
        """Why the Deployment is not Available (None when it is)."""
        from kubernetes.client import AppsV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            status = AppsV1Api(self.api_client()).read_namespaced_deployment_status(name, namespace).status
        except ApiException as e:
            if e.status == 404:
                return f"Deployment {namespace}/{name} does not exist"
            raise
        for condition in status.conditions or []:
            if condition.type == "Available" and condition.status == "True":
                return None
        return f"Deployment {namespace}/{name}: {status.available_replicas or 0} available replicas"

    def list_nodes(self, label_selector: str) -> list:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client()).list_node(label_selector=label_selector).items

    def list_labelled(self, label_selector: str) -> tuple[list[dict], list[dict]]:
        """(JobSets, Secrets) of every namespace with the label; each as {"metadata": ...} (the Secrets
        without their data). A cluster without the JobSet CRD has no JobSets."""
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        api = self.api_client()
        try:
            jobsets = self._custom.list_cluster_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL, label_selector=label_selector
            )["items"]
        except ApiException as e:
            if e.status != 404:
                raise
            jobsets = []
        secrets = CoreV1Api(api).list_secret_for_all_namespaces(label_selector=label_selector).items
        return (
            [{"metadata": j["metadata"]} for j in jobsets],
            [{"metadata": api.sanitize_for_serialization(s.metadata)} for s in secrets],
        )

    def server_version(self) -> str:
        """The cluster's Kubernetes version (its API server answers)."""
        from kubernetes.client import VersionApi

        return VersionApi(self.api_client()).get_code().git_version

    def has_custom_object(self, group: str, version: str, plural: str, name: str, namespace: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.get_namespaced_custom_object(group, version, namespace, plural, name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def create_service_account(self, body: dict, namespace: str) -> bool:
        """False if it exists (it is shared by the runs of the namespace)."""
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            CoreV1Api(self.api_client()).create_namespaced_service_account(namespace, body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def put_secret(self, body: dict, namespace: str) -> bool:
        """Creates the Secret, or replaces the one of that name; True when it was created."""
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        core = CoreV1Api(self.api_client())
        try:
            core.create_namespaced_secret(namespace, body)
            return True
        except ApiException as e:
            if e.status != 409:
                raise
        core.replace_namespaced_secret(body["metadata"]["name"], namespace, body)
        return False

    def delete_secret(self, name: str, namespace: str) -> bool:
        """False if it was already gone."""
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            CoreV1Api(self.api_client()).delete_namespaced_secret(name, namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def jobset_admission_problem(self, namespace: str) -> str | None:
        """Whether JobSet's webhooks admit and default a JobSet: a server-side dry-run create (nothing is
        stored). None when they do; else what the apiserver answered."""
        from kubernetes.client.exceptions import ApiException

        probe = {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": {"name": "tpu-rl-install-probe", "namespace": namespace},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "probe",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [{"name": "probe", "image": "busybox"}],
                                    }
                                }
                            }
                        },
                    }
                ]
            },
        }
        try:
            admitted = self._custom.create_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, probe, dry_run="All"
            )
        except ApiException as e:
            return f"{e.status} {e.reason}: {(e.body or '')[:300]}"
        if not admitted.get("spec", {}).get("successPolicy"):
            return "the JobSet was admitted without defaults: its mutating webhook did not run"
        return None

    def wait_until_gone(self, name: str, namespace: str, uid: str, timeout: float, interval: float = 2) -> None:
        """Foreground deletion finishes only when the pods are gone: wait for that before resubmitting."""
        deadline = time.monotonic() + timeout
        while (jobset := self.get_jobset(name, namespace)) and jobset["metadata"]["uid"] == uid:
            if time.monotonic() > deadline:
                raise AirflowException(
                    f"JobSet {namespace}/{name} (uid {uid}) still exists {timeout:.0f} s after its deletion; "
                    f"finalizers: {jobset['metadata'].get('finalizers')}"
                )
            time.sleep(interval)


def _status_message(body: Any) -> str:
    """The message of a Kubernetes Status answer (the body as it is when it is not one)."""
    try:
        return str(json.loads(body).get("message") or body)
    except (TypeError, ValueError, AttributeError):
        return str(body or "")


async def _call_retried(api: Any, method: str, path: str, request: dict[str, Any]) -> Any:
    """``api.call_api``, made again as :func:`request_retry` makes the synchronous client's requests: after a
    connection error (refused, reset, timed out) or a :data:`RETRYABLE_STATUSES` answer, with backoff."""
    import aiohttp

    for attempt in range(1, REQUEST_ATTEMPTS):
        try:
            response = await api.call_api(path, method, **request)
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(backoff_seconds(attempt))
            continue
        if response.status not in RETRYABLE_STATUSES:
            return response
        response.release()
        await asyncio.sleep(_retry_after(response.headers) or backoff_seconds(attempt))
    return await api.call_api(path, method, **request)  # the last try: its answer or its error


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a Retry-After header asks for (the API server sends seconds), at most 30."""
    try:
        return min(30.0, float(headers.get("Retry-After", "")))
    except ValueError:
        return None


class AsyncKubernetesApiHook(LoggingMixin):
    """Asynchronous calls the trigger makes while it waits: watches, log streams and a few reads. The API
    paths are built here and nowhere else.

    :param target: the cluster; a GKE cluster with its endpoint resolved (:meth:`ClusterTarget.with_endpoint`).

    Every request opens its own client (``get_conn``), so a GKE token is fresh for each one.
    """

    def __init__(self, target: ClusterTarget) -> None:
        super().__init__()
        if target.is_gke and not target.cluster_url:
            raise ValueError("The GKE cluster's endpoint is not resolved: see ClusterTarget.with_endpoint.")
        self.target = target

    @cached_property
    def kube_hook(self):
        t = self.target
        if t.is_gke:
            from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook

            return GKEKubernetesAsyncHook(
                cluster_url=t.cluster_url,
                # A DNS endpoint has a public certificate, not the cluster CA's. google provider 19.x
                # (Composer 3's Airflow 3.1) ignores use_dns_endpoint here and pins the CA anyway.
                ssl_ca_cert=None if t.use_dns_endpoint else t.ssl_ca_cert,
                use_dns_endpoint=t.use_dns_endpoint,
                gcp_conn_id=t.gcp_conn_id,
            )
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        return AsyncKubernetesHook(conn_id=t.kubernetes_conn_id)

    async def ready(self) -> Any:
        """:attr:`kube_hook`, made in a thread the first time. Its provider module imports the Kubernetes
        client (``kubernetes_asyncio.client``, hundreds of modules; Google's module more): on a trigger's event
        loop that import stalls every trigger of the triggerer. A trigger awaits this before its first request,
        so the imports the calls make later find the modules loaded (and, for GKE, the credentials read)."""
        if "kube_hook" not in self.__dict__:
            hook = await in_thread(getattr, self, "kube_hook")
            if self.target.is_gke:  # its token reads the credentials on the loop: read them here, kept by the hook
                await warm_google_credentials(hook)
            else:  # its connection, read once and kept by the hook, never cut short (``in_thread``'s module says why)
                await run_to_the_end(hook.get_conn_extras())
        return self.kube_hook

    @contextlib.asynccontextmanager
    async def _open(
        self,
        method: str,
        path: str,
        *,
        query: dict | None = None,
        body: Any = None,
        timeout: Any = 60,
        content_type: str = "application/json",
    ) -> AsyncIterator[Any]:
        """One request; yields the aiohttp response, or raises ApiException for an error status."""
        hook = await self.ready()
        from kubernetes_asyncio.client import ApiException

        request = {
            "query_params": list((query or {}).items()),
            "body": body,
            "header_params": {"Accept": "application/json", "Content-Type": content_type},
            "auth_settings": ["BearerToken"],
            "_preload_content": False,
            "_request_timeout": timeout,
        }
        async with hook.get_conn() as api:
            response = await _call_retried(api, method, path, request)
            try:
                if not 200 <= response.status <= 299:
                    raise ApiException(status=response.status, reason=(await response.text())[:2000])
                yield response
            finally:
                response.release()

    async def _request(
        self, method: str, path: str, *, query: dict | None = None, body: Any = None, **options: Any
    ) -> dict | None:
        """The JSON answer, or None for 404 Not Found (absent, as the synchronous hook says it)."""
        from kubernetes_asyncio.client import ApiException

        try:
            async with self._open(method, path, query=query, body=body, **options) as response:
                return json.loads(await response.read())
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def get_jobset(self, name: str, namespace: str) -> dict | None:
        """The JobSet, or None if it does not exist."""
        return await self._request("GET", f"{_jobsets_path(namespace)}/{name}")

    async def delete_jobset(self, name: str, namespace: str, uid: str) -> None:
        await self._request(
            "DELETE",
            f"{_jobsets_path(namespace)}/{name}",
            body={"propagationPolicy": "Foreground", "preconditions": {"uid": uid}},
        )

    async def annotate_jobset(
        self, name: str, namespace: str, uid: str, key: str, value: str, *, replacing: str | None = None
    ) -> bool:
        """Sets the annotation ``key`` of the JobSet ``name`` of incarnation ``uid`` to ``value``; with ``replacing``,
        only where the annotation still reads that (compare and swap). A JSON patch whose ``test`` operations the
        apiserver evaluates on the object as it stores it: of two writers that read the same value, one succeeds.
        False when a test failed (422: another value, or another JobSet of that name); gone: True, nothing set."""
        from kubernetes_asyncio.client import ApiException

        if replacing is None:
            body: Any = {"metadata": {"uid": uid, "annotations": {key: value}}}
            content_type = "application/merge-patch+json"
        else:
            pointer = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
            body = [
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": pointer, "value": replacing},
                {"op": "replace", "path": pointer, "value": value},
            ]
            content_type = "application/json-patch+json"
        try:
            await self._request("PATCH", f"{_jobsets_path(namespace)}/{name}", body=body, content_type=content_type)
        except ApiException as e:
            if e.status == 422:
                return False
            raise
        return True

    def watch_jobset(self, name: str, namespace: str) -> AsyncIterator[tuple[str, dict]]:
        """Events of the JobSets named ``name`` (any incarnation), as :meth:`_watch` gives them."""
        return self._watch(_jobsets_path(namespace), field_selector=f"metadata.name={name}")

    def watch_pods(self, name: str, namespace: str, uid: str) -> AsyncIterator[tuple[str, dict]]:
        """Events of the pods of the JobSet ``name`` (incarnation ``uid``), as :meth:`_watch` gives them."""
        return self._watch(_pods_path(namespace), label_selector=f"{JOBSET_NAME_LABEL}={name},{JOBSET_UID_LABEL}={uid}")

    async def node_exists(self, name: str) -> bool | None:
        """Whether the node still exists (None if we may not read nodes)."""
        from kubernetes_asyncio.client import ApiException

        try:
            return bool(await self._request("GET", f"/api/v1/nodes/{name}"))
        except ApiException as e:
            if e.status == 403:
                return None
            raise

    async def kueue_workloads(self, namespace: str, jobset_uid: str) -> list[dict]:
        """Kueue's Workloads for the JobSet ([] when Kueue is not installed)."""
        listing = await self._request(
            "GET",
            f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/namespaces/{namespace}/{KUEUE_WORKLOADS}",
            query={"labelSelector": f"{KUEUE_JOB_UID_LABEL}={jobset_uid}"},
        )
        return (listing or {}).get("items", [])

    async def _watch(
        self, path: str, *, field_selector: str = "", label_selector: str = ""
    ) -> AsyncIterator[tuple[str, dict]]:
        """Events (type, object) of a collection, forever: a list first (each item as ADDED), then a
        watch from its resourceVersion that reconnects where it left off, and lists again when the
        server has forgotten that version (410 Gone). Objects gone during a relist come as DELETED.
        """
        import aiohttp
        from kubernetes_asyncio.client import ApiException

        selectors = {k: v for k, v in (("fieldSelector", field_selector), ("labelSelector", label_selector)) if v}
        known: dict[str, dict] = {}
        resource_version = ""
        while True:
            try:
                if not resource_version:
                    listing = await self._request("GET", path, query=selectors)
                    resource_version = listing["metadata"]["resourceVersion"]
                    current = {o["metadata"]["uid"]: o for o in listing.get("items", [])}
                    for uid in set(known) - set(current):
                        yield "DELETED", known.pop(uid)
                    for uid, obj in current.items():
                        known[uid] = obj
                        yield "ADDED", obj
                query = {
                    **selectors,
                    "watch": "true",
                    "resourceVersion": resource_version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": str(WATCH_SECONDS),
                }
                async for event in self._stream_json(path, query, WATCH_SECONDS + 30):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            resource_version = ""
                            break
                        raise AirflowException(f"Watch of {path} failed: {obj}")
                    resource_version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        known.pop(obj["metadata"]["uid"], None)
                    else:
                        known[obj["metadata"]["uid"]] = obj
                    yield kind, obj
            except ApiException as e:
                if e.status != 410:
                    raise
                resource_version = ""
            except (TimeoutError, OSError, aiohttp.ClientError) as e:
                # The apiserver restarting, a dropped or half-open connection.
                self.log.info("Watch of %s interrupted (%s); reconnecting", path, type(e).__name__)
                await asyncio.sleep(2)

    async def _stream_json(self, path: str, query: dict, total_seconds: float) -> AsyncIterator[dict]:
        import aiohttp

        async for line in self._stream_lines(path, query, aiohttp.ClientTimeout(total=total_seconds, sock_connect=30)):
            if line.strip():
                yield json.loads(line)

    async def _stream_lines(self, path: str, query: dict, timeout: Any) -> AsyncIterator[bytes]:
        """Lines of a streamed answer (a watch or a followed log), until the server ends it."""
        import aiohttp

        async with self._open("GET", path, query=query, timeout=timeout) as response:
            pending = b""
            try:
                async for chunk in response.content.iter_any():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        yield line
            except aiohttp.ClientPayloadError:
                pass
            if pending:
                yield pending

    async def follow_log(
        self, pod: str, namespace: str, container: str, since_seconds: int | None
    ) -> AsyncIterator[str]:
        """Lines ``<RFC3339 timestamp> <text>`` of a container's log, followed until it exits or the
        stream is reopened after LOG_STREAM_SECONDS (the caller reconnects)."""
        import aiohttp

        query = {"container": container, "follow": "true", "timestamps": "true"}
        if since_seconds is not None:
            query["sinceSeconds"] = str(max(1, since_seconds))
        timeout = aiohttp.ClientTimeout(total=LOG_STREAM_SECONDS, sock_connect=30)
        try:
            async for line in self._stream_lines(f"{_pods_path(namespace)}/{pod}/log", query, timeout):
                yield line.decode("utf-8", "replace")
        except TimeoutError:
            return


def _jobsets_path(namespace: str) -> str:
    return f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{namespace}/{JOBSET_PLURAL}"


def _pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"
