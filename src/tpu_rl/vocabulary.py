"""The Kubernetes and GKE vocabulary the package speaks: API groups and versions, label and annotation
keys, container and replicated-job names, Pathways ports. Each is spelled here once.

Pure constants (no imports): the core (``manifests``, ``jobset_status``, ``gke``, ``run``) and the Airflow
half (hooks, operators, triggers) both use them.
"""

from __future__ import annotations

# -- JobSet (v0.10.1, what the GKE blueprint installs) -------------------------------------------------

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
JOBSET_API = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
#: The CRD whose presence says JobSet was installed (maybe only in part).
JOBSET_CRD = f"{JOBSET_PLURAL}.{JOBSET_GROUP}"

#: Labels and annotations the JobSet controller puts on (or reads from) its Jobs and pods.
JOBSET_LABEL_PREFIX = "jobset.sigs.k8s.io/"
JOBSET_NAME_LABEL = f"{JOBSET_LABEL_PREFIX}jobset-name"
JOBSET_UID_LABEL = f"{JOBSET_LABEL_PREFIX}jobset-uid"
REPLICATED_JOB_LABEL = f"{JOBSET_LABEL_PREFIX}replicatedjob-name"
REPLICATED_JOB_REPLICAS_LABEL = f"{JOBSET_LABEL_PREFIX}replicatedjob-replicas"
JOB_INDEX_LABEL = f"{JOBSET_LABEL_PREFIX}job-index"
RESTART_ATTEMPT_LABEL = f"{JOBSET_LABEL_PREFIX}restart-attempt"
COORDINATOR_LABEL = f"{JOBSET_LABEL_PREFIX}coordinator"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
#: Set by the Job controller on each pod of an Indexed Job.
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

# -- Kueue (read at v1beta1: served by Kueue 0.16 and by the older releases on GKE) --------------------

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
KUEUE_WORKLOADS = "workloads"
KUEUE_LOCALQUEUES = "localqueues"
KUEUE_JOB_UID_LABEL = f"{KUEUE_GROUP}/job-uid"
KUEUE_QUEUE_NAME_LABEL = f"{KUEUE_GROUP}/queue-name"

# -- GKE nodes ---------------------------------------------------------------------------------------

NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
#: Pod annotation of a TPU slice's workload: the slice's topology.
TPU_SLICE_TOPOLOGY_ANNOTATION = "cloud.google.com/gke-tpu-slice-topology"
#: The extended resource a TPU host offers, and the key of the taint GKE puts on TPU nodes.
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT_KEY = TPU_RESOURCE
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: GKE's default node pool: never a place for a TPU pod.
DEFAULT_POOL = "default-pool"
#: The label ``gcluster job submit`` puts on its workloads.
GCLUSTER_WORKLOAD_LABEL = "gcluster.google.com/workload"

# -- This package's own labels and annotations ------------------------------------------------------

#: Label keys that tie Kubernetes objects to the run that created them.
LABEL_RUN_KEY = "tpu-rl.dev/run-key"
LABEL_DAG_ID = "tpu-rl.dev/dag-id"
LABEL_TASK_ID = "tpu-rl.dev/task-id"
#: The longest value a Kubernetes label (and a GKE resource label) holds.
LABEL_VALUE_MAX = 63
#: GKE resource labels allow only lowercase letters, digits, '-' and '_'.
GKE_LABEL_RUN_KEY = "tpu-rl-run-key"
#: On a cluster created with keep_cluster: the reaper never deletes it.
GKE_LABEL_KEEP = "tpu-rl-keep"
#: Resource label of a cluster that runs share (cluster_mode=shared): its lease, not its creator, decides its end.
GKE_LABEL_SHARED = "tpu-rl-shared"
#: Node-pool metadata keys (GCE instance metadata: free-form values) with the creating run's identity, which
#: resource labels cannot hold; a created cluster carries it in its description (gke.owner_description).
GKE_METADATA_DAG_ID = "tpu-rl-dag-id"
GKE_METADATA_RUN_ID = "tpu-rl-run-id"
#: The Airflow environment of the run that made a resource (``tpu_rl.environment``), only when it is named: a
#: label holds its label-safe form (environment.label_value), the node pool's metadata, the cluster's description
#: and an annotation the full name, which the reaper reads.
GKE_LABEL_ENVIRONMENT = "tpu-rl-environment"
GKE_METADATA_ENVIRONMENT = GKE_LABEL_ENVIRONMENT
LABEL_ENVIRONMENT = "tpu-rl.dev/environment"
#: Annotations with the full (unsanitized) identity of the run that made a JobSet or Secret; label values
#: are slugs.
ANNOTATION_DAG_ID = LABEL_DAG_ID
ANNOTATION_RUN_ID = "tpu-rl.dev/run-id"
ANNOTATION_ENVIRONMENT = LABEL_ENVIRONMENT
ANNOTATION_TASK_ID = LABEL_TASK_ID
ANNOTATION_SUBMITTED_TRY = "tpu-rl.dev/submitted-try"
#: On a JobSet: how far its trigger logged the workload's log (``triggers/workload_log.LogPrinter``), written by
#: compare and swap.
ANNOTATION_LOG_CURSOR = "tpu-rl.dev/log-cursor"
#: On a JobSet, followed by a trigger's owner token of that record: the trigger ended in a live triggerer, so
#: Airflow uploaded its log to remote logging (a triggerer that dies uploads nothing).
ANNOTATION_LOG_UPLOADED_PREFIX = "tpu-rl.dev/log-uploaded-"

# -- Workload pods -----------------------------------------------------------------------------------

#: The Kubernetes service account every workload pod runs as (created per namespace when absent, never deleted):
#: not the namespace's default one, and without an API token (the workloads never call the Kubernetes API).
WORKLOAD_SERVICE_ACCOUNT = "tpu-rl-workload"
#: The container that runs a MaxText command (gcluster's name): its log is the workload's log.
WORKLOAD_CONTAINER = "workload-container"
#: The replicated job of a conversion JobSet.
CONVERSION_JOB = "main-job"

#: Pathways: the head (proxy and resource manager as sidecars, the trainer as its workload container)
#: and one worker replicated job per slice.
PATHWAYS_HEAD = "pathways-head"
PATHWAYS_WORKER_JOB = "worker"
PATHWAYS_PROXY_CONTAINER = "pathways-proxy"
PATHWAYS_RM_CONTAINER = "pathways-rm"
PATHWAYS_WORKER_CONTAINER = "pathways-worker"
#: The proxy's port: the trainer's JAX_BACKEND_TARGET.
PATHWAYS_PROXY_PORT = 29000
#: The resource manager's port: the proxy and the workers register there.
PATHWAYS_RM_PORT = 29001
#: The worker's server port.
PATHWAYS_WORKER_PORT = 29005
#: The other ports gcluster opens on the resource manager and on a worker (kept as it renders them).
PATHWAYS_RM_EXTRA_PORTS = (29002,)
PATHWAYS_WORKER_EXTRA_PORTS = (29006, 8471, 8080)

#: A DNS label (and so a Kubernetes hostname part) has at most 63 characters.
DNS_LABEL_MAX = 63
#: Longest Pathways JobSet name: the coordinator address ``<js>-pathways-head-0-0.<js>`` must fit
#: DNS_LABEL_MAX, or the head's Jobs fail silently (22).
PATHWAYS_JOBSET_NAME_MAX = (DNS_LABEL_MAX - len(f"-{PATHWAYS_HEAD}-0-0.")) // 2
