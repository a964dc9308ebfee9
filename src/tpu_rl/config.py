"""The run's configuration: one typed, validated object built from the trigger form's params.

Every field is declared once here with its default, form section, title and description; the DAG's
``Param``s (``tpu_rl.params``) and the plan command are generated from these declarations.
Defaults are the tutorial's values. Validation collects every problem, each naming the field and the
fix, and runs before anything is created in the cloud.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tpu_rl.jobset_release import shipped_versions
from tpu_rl.machines import SHAPES, quantity_cpu, quantity_gib
from tpu_rl.run import INTERVAL_FIELDS, DataInterval, RunIdentity
from tpu_rl.tpu import SliceError, SliceShape, slice_shape
from tpu_rl.vocabulary import PATHWAYS_JOBSET_NAME_MAX

SECTIONS = ("Cloud", "Cluster", "TPU slice", "Model", "Training", "Evaluation and cost", "Advanced")

#: Models the MaxText 0.2.4 converters and model configs know (checked against the release by the tests).
SUPPORTED_MODELS = (
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "qwen3-30b-a3b",
    "qwen3-30b-a3b-base",
    "qwen3-235b-a22b",
    "llama3.1-8b",
    "llama3.1-70b",
)

#: What converting a model downloads from Hugging Face, GB: MaxText's Qwen3-30B-A3B RL tutorial
#: (docs/tutorials/posttraining/rl_qwen3_30b.md: "approximately 62 GB of free disk space to download its
#: safetensors"); the others, the bf16 safetensors of their parameters (2 bytes each).
HF_DOWNLOAD_GB = {
    "qwen3-0.6b": 1.5, "qwen3-4b": 8.1, "qwen3-8b": 16.4, "qwen3-14b": 29.6, "qwen3-32b": 65.6,
    "qwen3-30b-a3b": 62, "qwen3-30b-a3b-base": 62, "qwen3-235b-a22b": 470, "llama3.1-8b": 16.1, "llama3.1-70b": 141,
}

#: Where a created TPU pool's VMs come from; xpk offers the same four (``src/xpk/core/capacity.py``).
CAPACITY_TYPES = ("on_demand", "reservation", "spot", "flex_start")
#: TPU generations GKE's flex-start does not provision.
FLEX_START_UNSUPPORTED = ("v4",)
#: The longest capacity wait a run may ask for; create_tpu_pools's execution_timeout leaves room above it.
CAPACITY_WAIT_MAX_MINUTES = 24 * 60

#: The dataset ``train_rl`` uses when ``dataset_name`` is not given (MaxText 0.2.4, configs/post_train/rl.yml).
MAXTEXT_DEFAULT_DATASET = "openai/gsm8k"
#: Test batches ``train_rl`` evaluates before and after training unless extra_train_args sets
#: ``num_test_batches`` (MaxText 0.2.4, configs/post_train/rl.yml:120); 0 turns the evaluation off.
MAXTEXT_DEFAULT_TEST_BATCHES = 5
#: Cloud TPU v6e (Trillium) on-demand list price in USD per chip-hour, as Google Cloud announced it at general
#: availability (December 2024: "starting at $2.70 per chip-hour", $1.89 with a 1-year and $1.22 with a 3-year
#: commitment; the first regions were in US East, Europe West and Asia Northeast). Prices differ by region
#: and contract: see https://cloud.google.com/tpu/pricing and set the param to what the project pays.
V6E_ON_DEMAND_PRICE_PER_CHIP_HOUR = 2.70


def _param(default: Any, section: str, title: str, description: str, **schema: Any) -> Any:
    """Declares a field with what the trigger form shows for it. ``default=None`` marks it required."""
    metadata = {"section": section, "title": title, "description": description, "schema": schema}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _required(section: str, title: str, description: str, **schema: Any) -> Any:
    return _param(None, section, title, description, **schema)


@dataclass(frozen=True)
class RunConfig:
    # Cloud
    project: str = _required("Cloud", "Project", "Google Cloud project ID that is billed for the run.")
    region: str = _required("Cloud", "Region", "Region of the cluster and the bucket, e.g. us-east5.")
    zone: str = _required("Cloud", "Zone", "Zone of the TPU node pool (inside the region), e.g. us-east5-b.")
    gcs_bucket: str = _required(
        "Cloud", "Cloud Storage bucket", "Bucket for checkpoints and exports; created in the region if absent."
    )
    gcp_conn_id: str = _param("google_cloud_default", "Cloud", "Google Cloud connection", "Airflow connection id.")

    # Cluster
    cluster_name: str = _required("Cluster", "Cluster name", "GKE cluster to create or use (at most 40 characters).")
    cluster_mode: str = _param(
        "create",
        "Cluster",
        "Cluster mode",
        "create: this run creates the cluster and deletes it at the end. shared: runs that name the same "
        "cluster share it (a backfill, several programs): the first creates it, each holds a lease in the "
        "bucket, the last to leave deletes it. existing: use a running cluster and never delete it.",
        enum=["create", "shared", "existing"],
    )
    kubernetes_conn_id: str = _param(
        "",
        "Cluster",
        "Kubernetes connection",
        "Reach an existing cluster through this Airflow Kubernetes connection instead of GKE credentials "
        "(e.g. a local simulated cluster). Empty: use GKE.",
    )
    control_plane_endpoint: str = _param(
        "dns",
        "Cluster",
        "Control-plane endpoint",
        "How Airflow reaches the GKE cluster's Kubernetes API. dns: GKE's DNS-based endpoint, IAM-checked "
        "with no IP allow-list (what Cloud Composer needs: its egress addresses are not fixed); a created "
        "cluster enables it, an existing one needs `--enable-dns-access`. ip: the public IP endpoint, open "
        "only to authorized_cidr.",
        enum=["dns", "ip"],
    )
    namespace: str = _param("default", "Cluster", "Namespace", "Kubernetes namespace of the workloads.")
    pw_cpu_machine_type: str = _param(
        "c4d-standard-96",
        "Cluster",
        "CPU pool machine type",
        "Machine type of the CPU pool that runs the Pathways head and the conversions.",
    )
    cpu_pool_name: str = _param(
        "cpu-np", "Cluster", "CPU pool name", "Node pool for the Pathways head and the conversions."
    )
    cpu_pool_max_nodes: int = _param(4, "Cluster", "CPU pool max nodes", "Autoscaling limit.", minimum=1)
    authorized_cidr: str = _param(
        "0.0.0.0/0",
        "Cluster",
        "Authorized network",
        "CIDR allowed to reach the IP endpoint of a created cluster's control plane (the DNS endpoint is "
        "gated by IAM instead). The tutorial's 0.0.0.0/0 is open to the world: narrow it to your network; "
        "with control_plane_endpoint 'ip' it must admit Airflow's egress address.",
    )
    kueue_queue_name: str = _param(
        "",
        "Cluster",
        "Kueue LocalQueue",
        "Submit workloads through this Kueue LocalQueue (Kueue must run on the cluster). Empty: no Kueue.",
    )
    jobset_version: str = _param(
        "v0.10.1",
        "Cluster",
        "JobSet version",
        "Release installed when the cluster has no working JobSet (shipped with the package; no download).",
    )

    # TPU slice
    tpu_type: str = _param("v6e-64", "TPU slice", "TPU type", "Generation and size, e.g. v6e-64.")
    topology: str = _param("8x8", "TPU slice", "Topology", "Chip topology of one slice, e.g. 8x8.")
    compute_type: str = _param(
        "ct6e-standard-4t", "TPU slice", "TPU machine type", "Machine type of the TPU hosts."
    )
    cluster_nodepool_count: int = _param(
        1, "TPU slice", "Number of slices", "TPU node pools (slices) the training uses.", minimum=1
    )
    capacity_type: str = _param(
        "on_demand",
        "TPU slice",
        "Capacity type",
        "How the TPU pools the run creates get their VMs. on_demand: standard VMs, created at once or not at "
        "all. reservation: your reservation (set reservation). spot: Spot VMs, cheaper, preemptible. "
        "flex_start: Dynamic Workload Scheduler's flex-start, the pool starts empty and the slice is "
        "provisioned when training asks for it (at most 7 days).",
        enum=list(CAPACITY_TYPES),
    )
    reservation: str = _param(
        "", "TPU slice", "Reservation", "Name of the TPU reservation to consume; only with capacity_type 'reservation'."
    )
    capacity_wait_minutes: int = _param(
        0,
        "TPU slice",
        "Capacity wait (minutes)",
        "How long create_tpu_pools waits, deferred, while GKE has no capacity for a pool (a stockout) before "
        "it fails the run. 0: fail at the first stockout.",
        minimum=0,
        maximum=CAPACITY_WAIT_MAX_MINUTES,
    )
    capacity_group: str = _param(
        "",
        "TPU slice",
        "TPU capacity group",
        "Runs that name the same group (e.g. the reservation's name) hold at most capacity_slices TPU slices "
        "at once; the others wait in wait_for_tpu_capacity (rescheduled, no worker slot) until slices are "
        "free. Needs tpu_pool_mode 'per_run'. Empty: no limit.",
        pattern=r"^([a-z0-9][a-z0-9-]{0,62})?$",
    )
    capacity_slices: int = _param(
        1, "TPU slice", "Slices in the capacity group", "How many slices the group's runs may hold at once.", minimum=1
    )
    tpu_pool_mode: str = _param(
        "per_run",
        "TPU slice",
        "TPU node pool mode",
        "per_run: created just before training and deleted right after it. cluster: created with the "
        "cluster and kept for its life. existing: use the pool(s) already in the cluster.",
        enum=["per_run", "cluster", "existing"],
    )
    node_service_account: str = _param(
        "",
        "TPU slice",
        "Node service account",
        "Service account (email) of the nodes of the pools the run creates; every workload pod runs with "
        "hostNetwork and reaches Cloud Storage as this account. Required when the run creates a cluster or "
        "pools (see docs/composer.md for its roles and the actAs grant).",
    )

    # Model
    model_name: str = _param(
        "qwen3-30b-a3b", "Model", "MaxText model", "MaxText model name.", examples=list(SUPPORTED_MODELS)
    )
    hf_model_path: str = _param(
        "Qwen/Qwen3-30B-A3B-Instruct-2507",
        "Model",
        "Hugging Face model",
        "Checkpoint converted to MaxText, and the tokenizer shipped with the export.",
    )
    tokenizer_path: str = _param(
        "Qwen/Qwen3-30B-A3B-Instruct-2507", "Model", "Tokenizer", "Tokenizer used by the RL trainer."
    )
    hf_token_conn_id: str = _param(
        "huggingface_default",
        "Model",
        "Hugging Face token connection",
        "Airflow connection whose password is the Hugging Face token. It reaches the pods as a Kubernetes "
        "Secret, never as a value in the DAG, a log or a command line.",
    )
    cloud_image_name: str = _param(
        "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4",
        "Model",
        "MaxText image",
        "Container image of the conversions and the trainer.",
    )
    scan_layers: bool = _param(True, "Model", "Scan layers", "Must be the same in all three stages.")
    conversion_on_tpu: bool = _param(
        False,
        "Model",
        "Convert on the TPU slice",
        "Run the conversions the tutorial's way, as a job over the whole TPU slice. Default: one pod on the "
        "CPU pool, which leaves the slice free.",
    )
    conversion_cpu: str = _param("32", "Model", "Conversion CPU", "CPU request of a conversion pod.")
    conversion_memory: str = _param(
        "200Gi",
        "Model",
        "Conversion memory",
        "Memory request of a conversion pod (a 30B model needs >= 128Gi); it must fit what GKE leaves to pods "
        "on one CPU pool node (about 226Gi on n4-standard-64, 332Gi on c4d-standard-96).",
    )

    # Training
    run_name: str = _param("rl", "Training", "Run name", "run_name: folder of the run's checkpoints under the run's training output.", pattern=r"^[A-Za-z0-9_.-]+$")
    num_batches: int = _param(50, "Training", "Batches", "num_batches: batches of prompts to train on; the planned steps are num_batches x rl.num_iterations x train_fraction x num_epoch, as MaxText computes them.", minimum=1)
    batch_size: int = _param(4, "Training", "Batch size", "batch_size: prompts per batch; each gets rl.num_generations rollouts.", minimum=1)
    rollout_tensor_parallelism: int = _param(8, "Training", "Rollout tensor parallelism", "rollout_tensor_parallelism of the vLLM sampler; with expert parallelism it must divide the sampler chips.")
    rollout_expert_parallelism: int = _param(1, "Training", "Rollout expert parallelism", "rollout_expert_parallelism of the vLLM sampler.")
    trainer_devices_fraction: float = _param(0.5, "Training", "Trainer devices fraction", "trainer_devices_fraction: share of the chips that train; must give whole chips.")
    sampler_devices_fraction: float = _param(0.5, "Training", "Sampler devices fraction", "sampler_devices_fraction: share of the chips that generate rollouts (vLLM).")
    ici_tensor_parallelism: int = _param(4, "Training", "ICI tensor parallelism", "ici_tensor_parallelism of the trainer; FSDP takes the rest of the trainer chips.")
    ici_expert_parallelism: int = _param(4, "Training", "ICI expert parallelism", "ici_expert_parallelism of the trainer (MoE experts across chips).")
    hbm_utilization_vllm: float = _param(0.65, "Training", "vLLM HBM utilization", "hbm_utilization_vllm: share of sampler HBM vLLM may use (weights and KV cache).")
    reshard_chunk_size: int = _param(8, "Training", "Reshard chunk size", "reshard_chunk_size: model keys per chunk when weights move from trainer to sampler; smaller uses less memory.", minimum=1)
    remat_policy: str = _param("full", "Training", "Remat policy", "remat_policy: activation rematerialization of the trainer (full recomputes the most, uses the least HBM).")
    async_scheduling: bool = _param(False, "Training", "Async scheduling", "async_scheduling of vLLM.")
    allow_split_physical_axes: bool = _param(True, "Training", "Allow split physical axes", "allow_split_physical_axes: lets a mesh axis span parts of the physical torus.")
    ragged_gather_reduce_fallback: bool = _param(
        True, "Training", "Ragged gather reduce fallback", "ragged_gather_reduce_fallback: the JAX reference MoE kernel instead of the fused one."
    )
    data_template_path: str = _param(
        "maxtext/examples/chat_templates/openmathinstruct2_rl.json", "Training", "Data template", "data_template_path: chat template of the prompts, inside the image."
    )
    dataset_name: str = _param(
        "", "Training", "Dataset", f"dataset_name. Empty: MaxText's default ({MAXTEXT_DEFAULT_DATASET})."
    )
    checkpoint_period: int = _param(
        50, "Training", "Checkpoint period", "Steps between checkpoints; a crash loses up to this many.", minimum=1
    )
    interval_data: dict = _param(
        {},
        "Training",
        "Data of each interval",
        "For scheduled and backfilled runs: MaxText data keys whose value depends on the run's data interval, "
        "e.g. {\"train_split\": \"train[{first}:{stop}]\"} or {\"hf_train_files\": "
        "\"gs://my-bucket/prompts/dt={ds}/*.parquet\"}. Fields: {ds}, {ds_nodash}, {start}, {end} (the "
        "interval), {index} (intervals since the program's start), {first} and {stop} (index x "
        "examples_per_interval, and the next).",
    )
    examples_per_interval: int = _param(
        0,
        "Training",
        "Examples per interval",
        "Prompts each interval trains on, for {first} and {stop}: at least num_batches x batch_size. 0: not used.",
        minimum=0,
    )
    extra_train_args: dict = _param(
        {},
        "Training",
        "Extra train_rl arguments",
        "More MaxText keys for train_rl, e.g. {\"rl.num_iterations\": 2}. Unknown keys fail the trainer.",
    )

    # Evaluation and cost
    min_post_accuracy: float = _param(
        0.0,
        "Evaluation and cost",
        "Minimum accuracy after training",
        "Quality gate: the run fails when the accuracy of the trainer's evaluation after training (its "
        "'Post RL Training' line, in percent) is below this. 0: no minimum. Needs the evaluation "
        f"(num_test_batches, default {MAXTEXT_DEFAULT_TEST_BATCHES}, not 0 in extra_train_args).",
        minimum=0,
        maximum=100,
    )
    require_no_regression: bool = _param(
        False,
        "Evaluation and cost",
        "Require no regression",
        "Quality gate: the run fails when the accuracy after training is lower than before training.",
    )
    tpu_price_per_chip_hour: float = _param(
        V6E_ON_DEMAND_PRICE_PER_CHIP_HOUR,
        "Evaluation and cost",
        "TPU price per chip-hour (USD)",
        "What one TPU chip costs per hour, to show the run's TPU cost. Default: the v6e on-demand list price "
        "Google Cloud announced at general availability (December 2024); set your region's and contract's "
        "price (https://cloud.google.com/tpu/pricing). 0: show chip-hours only.",
        minimum=0,
    )
    notify_conn_id: str = _param(
        "",
        "Evaluation and cost",
        "Notification connection",
        "An SMTP connection (its from_email extra is the sender) through which the run's summary is mailed to "
        "notify_to when the run succeeds. Empty: no notification.",
    )
    notify_to: str = _param(
        "",
        "Evaluation and cost",
        "Notify",
        "Who gets the run's summary through notify_conn_id: addresses separated by commas.",
    )

    # Advanced
    workload_prefix: str = _param(
        "qwen",
        "Advanced",
        "Workload name prefix",
        "Prefix of the JobSet names (the run adds the stage and a run key).",
        pattern=r"^[a-z][a-z0-9-]*$",
    )
    pathways_image_tag: str = _param(
        "latest",
        "Advanced",
        "Pathways image tag",
        "Tag of the Pathways proxy and server images; pin it to match the JAX in the MaxText image.",
    )
    max_restarts: int = _param(
        0,
        "Advanced",
        "JobSet restarts",
        "failurePolicy.maxRestarts of the training JobSet. Airflow retries resume from the last checkpoint.",
        minimum=0,
    )
    max_preemptions: int = _param(
        3,
        "Advanced",
        "Preemptions resumed",
        "How many times train_rl resumes a training whose pods were preempted (Spot VM reclaimed, TPU host "
        "maintenance, host lost) from its newest complete checkpoint; apart from the retries for other failures.",
        minimum=0,
        maximum=100,
    )
    ttl_seconds_after_finished: int = _param(
        3600, "Advanced", "JobSet TTL", "Seconds a finished JobSet is kept (--gke-ttl-after-finished).", minimum=0
    )
    keep_cluster: bool = _param(
        False, "Advanced", "Keep the cluster", "Do not delete a cluster this run created (you pay for it)."
    )

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RunConfig:
        """Builds and validates the config; raises ConfigError naming every bad field."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        problems = [
            Problem(name, "is not a parameter of this DAG", "remove it from the run's conf")
            for name in params
            if name not in known
        ]
        values = {}
        for name, spec in known.items():
            value = params.get(name)
            if value is None:
                value = _default_of(spec)
            try:
                values[name] = _coerce(value, spec.type)
            except (TypeError, ValueError):
                problems.append(Problem(name, f"must be {spec.type}, got {value!r}", f"give a {spec.type} value"))
                values[name] = _default_of(spec)
        config = cls(**values)
        problems += config.problems()
        if problems:
            raise ConfigError(problems)
        return config

    def problems(self) -> list[Problem]:
        return list(_validate(self))

    def for_interval(self, interval: DataInterval | None) -> RunConfig:
        """The config of a run that trains one data interval: ``interval_data`` filled in and passed to the
        trainer with the other MaxText keys. Raises ConfigError when the keys need an interval the run lacks."""
        if not self.interval_data:
            return self
        if interval is None:
            raise ConfigError([Problem(
                "interval_data", "needs the run's data interval, and this run has none (a manual run)",
                "run it through the program's schedule or a backfill, or clear interval_data",
            )])
        values = interval.template_values(self.examples_per_interval)
        rendered = {key: template.format(**values) for key, template in self.interval_data.items()}
        return dataclasses.replace(self, extra_train_args={**self.extra_train_args, **rendered})

    # Derived values, computed once.

    @cached_property
    def slice(self) -> SliceShape:
        return slice_shape(self.tpu_type, self.topology, self.compute_type)

    @property
    def chips(self) -> int:
        return self.slice.chips * self.cluster_nodepool_count

    @property
    def hosts_per_slice(self) -> int:
        return self.slice.hosts

    @property
    def trainer_devices(self) -> float:
        return self.chips * self.trainer_devices_fraction

    @property
    def sampler_devices(self) -> float:
        return self.chips * self.sampler_devices_fraction

    @property
    def train_steps(self) -> int:
        """Steps train_rl plans, as MaxText 0.2.4 computes them (configs/types.py, RLConfig:
        ``int(num_batches * rl.num_iterations * train_fraction * num_epoch)``, Tunix's ``max_steps``). A flat
        ``num_iterations`` is accepted and wins over ``rl.num_iterations`` (pyconfig copies flat keys into the
        nested model)."""
        args = self.extra_train_args
        iterations = args.get("num_iterations", args.get("rl.num_iterations", 1))
        return int(self.num_batches * int(iterations) * float(args.get("train_fraction", 1.0))
                   * int(args.get("num_epoch", 1)))

    @property
    def conversion_disk_gib(self) -> int:
        """The local disk a conversion pod asks for: the Hugging Face download (MaxText's converter keeps it in the
        Hugging Face cache, ``$HF_HOME``: convert_checkpoint.md), a fifth more, and 10 GiB for the cache's own
        files."""
        return math.ceil(HF_DOWNLOAD_GB.get(self.model_name, 62) * 1e9 / 2**30 * 1.2 + 10)

    @property
    def cpu_pool_disk_gb(self) -> int:
        """A created CPU pool's boot disk: 500 GB, or enough for a conversion pod's disk where GKE leaves about
        47% of a boot disk to pods (its "Plan GKE Standard node sizes" example)."""
        return max(500, math.ceil(self.conversion_disk_gib * 2**30 / 1e9 / 0.45))

    @property
    def evaluation_batches(self) -> int:
        """Test batches train_rl evaluates before and after training (0: no evaluation lines)."""
        return int(self.extra_train_args.get("num_test_batches", MAXTEXT_DEFAULT_TEST_BATCHES))

    @property
    def has_quality_gate(self) -> bool:
        return bool(self.min_post_accuracy) or self.require_no_regression

    @property
    def effective_dataset(self) -> str:
        return self.dataset_name or MAXTEXT_DEFAULT_DATASET

    @property
    def creates_cluster(self) -> bool:
        """The run creates the cluster, or (shared) may be the one that creates it."""
        return self.cluster_mode in ("create", "shared")

    @property
    def shares_cluster(self) -> bool:
        """cluster_mode=shared: runs lease the cluster; the last to leave deletes it."""
        return self.cluster_mode == "shared"

    @property
    def capacity_limited(self) -> bool:
        return bool(self.capacity_group)

    @property
    def uses_dns_endpoint(self) -> bool:
        """Airflow reaches the GKE cluster through its DNS-based control-plane endpoint."""
        return self.control_plane_endpoint == "dns"

    @property
    def tpu_pools_per_run(self) -> bool:
        """tpu_pool_mode=per_run: the run creates its TPU pools just before training and deletes them after."""
        return self.tpu_pool_mode == "per_run"

    @property
    def tpu_pools_with_cluster(self) -> bool:
        """tpu_pool_mode=cluster: the TPU pools are created with the cluster and kept for its life."""
        return self.tpu_pool_mode == "cluster"

    @property
    def uses_existing_tpu_pools(self) -> bool:
        """tpu_pool_mode=existing: the slice's pools are already in the cluster."""
        return self.tpu_pool_mode == "existing"

    @property
    def uses_flex_start(self) -> bool:
        """capacity_type=flex_start: the TPU pools start empty and GKE provisions a slice when pods ask for it."""
        return self.capacity_type == "flex_start"

    @property
    def creates_node_pools(self) -> bool:
        return self.creates_cluster or self.tpu_pools_per_run

    def pathways_image(self, name: str) -> str:
        return f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/{name}:{self.pathways_image_tag}"


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}; fix: {self.fix}."


class ConfigError(ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"The run's parameters are invalid ({len(problems)} problem(s)):\n{lines}")

    @property
    def fields(self) -> list[str]:
        return [p.field for p in self.problems]


def field_specs() -> list[dataclasses.Field]:
    return list(dataclasses.fields(RunConfig))


def _default_of(spec: dataclasses.Field) -> Any:
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict}


def _coerce(value: Any, type_name: str) -> Any:
    """Accepts what JSON and the trigger form send: numbers as strings, ints for floats."""
    if value is None:
        return None
    kind = _TYPES[type_name]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(value)
    if kind is int and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        raise ValueError(value)
    if kind is dict and not isinstance(value, dict):
        raise TypeError(value)
    if kind is str and not isinstance(value, str):
        raise TypeError(value)
    return kind(value)


_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_REGION = re.compile(r"[a-z]+-[a-z]+\d+")
_CLUSTER = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?")
_SERVICE_ACCOUNT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9.-]+\.gserviceaccount\.com")
#: train_rl keys that have their own param; extra_train_args must not set them twice.
_OWN_TRAIN_KEYS = {
    "run_name", "base_output_directory", "model_name", "load_parameters_path", "hf_access_token",
    "num_batches", "batch_size", "rollout_tensor_parallelism", "rollout_expert_parallelism",
    "trainer_devices_fraction", "sampler_devices_fraction", "tokenizer_path", "ici_tensor_parallelism",
    "ici_expert_parallelism", "hbm_utilization_vllm", "reshard_chunk_size", "remat_policy", "async_scheduling",
    "allow_split_physical_axes", "ragged_gather_reduce_fallback", "data_template_path", "dataset_name",
    "checkpoint_period", "scan_layers",
}


def _validate(c: RunConfig):
    """Every problem of the config, rule group by rule group (always in the same order)."""
    for rules in (_validate_required, _validate_cloud_names, _validate_cluster_access, _validate_model,
                  _validate_node_identity, _validate_conversion, _validate_workloads, _validate_slice,
                  _validate_interval_data, _validate_dataset, _validate_planned_steps, _validate_evaluation,
                  _validate_notification):
        yield from rules(c)


def _validate_required(c: RunConfig):
    """Fields without a default, fields with a fixed set of choices and numbers with bounds (the form checks
    them; the plan command and the REST API do not)."""
    for spec in dataclasses.fields(c):
        if spec.default is None and not getattr(c, spec.name):
            yield Problem(spec.name, "is required", f"set {spec.name} ({spec.metadata['description']})")
        schema, value = spec.metadata["schema"], getattr(c, spec.name)
        choices = schema.get("enum")
        if choices and value not in choices:
            yield Problem(spec.name, f"'{value}' is not one of its choices",
                          f"use {' or '.join(repr(x) for x in choices)}")
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(value, (int, float)) and ((low is not None and value < low) or (high is not None and value > high)):
            bounds = f"at least {low}" if high is None else f"from {low} to {high}"
            yield Problem(spec.name, f"{value} is out of range", f"use a value {bounds}")


def _validate_cloud_names(c: RunConfig):
    """Project, region, zone, cluster and bucket: names GCP accepts."""
    if c.project and not _PROJECT.fullmatch(c.project):
        yield Problem("project", f"'{c.project}' is not a project ID", "use 6-30 lowercase letters, digits, dashes")
    if c.region and not _REGION.fullmatch(c.region):
        yield Problem("region", f"'{c.region}' is not a region", "use a region such as us-east5")
    if c.zone and c.region and not c.zone.startswith(f"{c.region}-"):
        yield Problem("zone", f"'{c.zone}' is not in region '{c.region}'", f"use a zone of {c.region}, e.g. {c.region}-b")
    if c.cluster_name and not _CLUSTER.fullmatch(c.cluster_name):
        yield Problem(
            "cluster_name",
            f"'{c.cluster_name}' is not a GKE cluster name",
            "use at most 40 lowercase letters, digits and dashes, starting with a letter",
        )
    if c.gcs_bucket and (not _BUCKET.fullmatch(c.gcs_bucket) or c.gcs_bucket.startswith("goog") or ".." in c.gcs_bucket):
        yield Problem(
            "gcs_bucket",
            f"'{c.gcs_bucket}' is not a valid bucket name",
            "use 3-63 lowercase letters, digits, dashes, underscores or dots, starting and ending with a letter "
            "or digit, not starting with 'goog'",
        )


def _validate_cluster_access(c: RunConfig):
    """How the cluster is reached and which TPU pools a run may create in it; the namespace."""
    if c.kubernetes_conn_id and c.creates_cluster:
        yield Problem(
            "kubernetes_conn_id",
            "reaches an existing cluster, but cluster_mode is 'create'",
            "set cluster_mode to 'existing', or clear kubernetes_conn_id",
        )
    if c.kubernetes_conn_id and not c.uses_existing_tpu_pools:
        yield Problem(
            "tpu_pool_mode",
            "must be 'existing' when the cluster is reached through kubernetes_conn_id (no GKE API to create pools)",
            "set tpu_pool_mode to 'existing'",
        )
    if c.cluster_mode == "existing" and c.tpu_pools_with_cluster:
        yield Problem(
            "tpu_pool_mode",
            "'cluster' creates the pool with the cluster, but cluster_mode is 'existing'",
            "use 'per_run' or 'existing'",
        )
    if c.capacity_limited and not c.tpu_pools_per_run:
        yield Problem(
            "capacity_group",
            f"limits the slices runs create, but tpu_pool_mode is '{c.tpu_pool_mode}' (the run creates none)",
            "set tpu_pool_mode to 'per_run', or clear capacity_group",
        )
    elif c.capacity_limited and c.cluster_nodepool_count > c.capacity_slices:
        yield Problem(
            "capacity_slices",
            f"the group has {c.capacity_slices} slice(s), and a run needs {c.cluster_nodepool_count} (it would wait for ever)",
            f"set capacity_slices to at least {c.cluster_nodepool_count}",
        )
    if c.capacity_type == "reservation" and not c.reservation:
        yield Problem("reservation", "is required when capacity_type is 'reservation'",
                      "name the reservation to consume, or choose another capacity_type")
    if c.reservation and c.capacity_type != "reservation":
        yield Problem("reservation", f"is set, but capacity_type is '{c.capacity_type}', which consumes no reservation",
                      "set capacity_type to 'reservation', or clear reservation")
    if c.uses_existing_tpu_pools and c.capacity_type != "on_demand":
        yield Problem("capacity_type", f"'{c.capacity_type}' says how the TPU pools the run creates get their VMs, but "
                      "tpu_pool_mode is 'existing' (the run creates none; preemptions are resumed on any capacity)",
                      "leave capacity_type 'on_demand', or set tpu_pool_mode to 'per_run'")
    if c.capacity_wait_minutes and (c.uses_existing_tpu_pools or c.uses_flex_start):
        reason = ("tpu_pool_mode is 'existing' (the run creates no pool)" if c.uses_existing_tpu_pools else
                  "a flex_start pool is created empty at once: its slice comes when train_rl's pods ask for it, "
                  "and train_rl waits for it")
        yield Problem("capacity_wait_minutes", f"bounds the wait of a pool create that GKE holds for capacity, but {reason}",
                      "set it to 0")
    if not _K8S_NAME.fullmatch(c.namespace):
        yield Problem("namespace", f"'{c.namespace}' is not a Kubernetes namespace name", "use lowercase letters, digits, dashes")


def _validate_model(c: RunConfig):
    """The model MaxText knows, its Hugging Face repo, the conversion pod's resources."""
    if c.model_name not in SUPPORTED_MODELS:
        yield Problem("model_name", f"'{c.model_name}' is not a supported MaxText model", f"use one of {', '.join(SUPPORTED_MODELS)}")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", c.hf_model_path):
        yield Problem("hf_model_path", f"'{c.hf_model_path}' is not a Hugging Face repo id", "use owner/name")
    for name in ("conversion_cpu", "conversion_memory"):
        if not _QUANTITY.fullmatch(getattr(c, name)):
            yield Problem(name, f"'{getattr(c, name)}' is not a Kubernetes quantity", "use e.g. 32 or 256Gi")


def _validate_node_identity(c: RunConfig):
    """The service account of the nodes this run creates."""
    if c.creates_node_pools and not c.kubernetes_conn_id and not _SERVICE_ACCOUNT.fullmatch(c.node_service_account):
        yield Problem(
            "node_service_account",
            "is required when the run creates a cluster or node pools"
            + (f" ('{c.node_service_account}' is not a service account email)" if c.node_service_account else ""),
            "give the email of a service account with bucket access that the Airflow identity may act as "
            "(roles/iam.serviceAccountUser); the Compute Engine default account is refused on purpose",
        )


def _validate_workloads(c: RunConfig):
    """The JobSet release installed, the JobSet names Pathways accepts, vLLM's HBM share."""
    if c.jobset_version not in shipped_versions():
        yield Problem(
            "jobset_version", f"'{c.jobset_version}' is not shipped with this package",
            f"use {' or '.join(shipped_versions())}, or install that JobSet on the cluster yourself",
        )
    longest = RunIdentity.longest_jobset_name(c.workload_prefix)
    if len(longest) > PATHWAYS_JOBSET_NAME_MAX:
        suffix = len(longest) - len(c.workload_prefix)
        yield Problem(
            "workload_prefix",
            f"makes JobSet names of {len(longest)} characters; Pathways allows {PATHWAYS_JOBSET_NAME_MAX}",
            f"shorten it to at most {PATHWAYS_JOBSET_NAME_MAX - suffix} characters",
        )
    if not 0 < c.hbm_utilization_vllm <= 1:
        yield Problem("hbm_utilization_vllm", f"{c.hbm_utilization_vllm} is outside (0, 1]", "use e.g. 0.65")


def _validate_conversion(c: RunConfig):
    if c.conversion_on_tpu and c.tpu_pools_per_run:
        yield Problem(
            "conversion_on_tpu",
            "the conversions would wait for TPU pools that tpu_pool_mode 'per_run' creates only around training",
            "set conversion_on_tpu to false (one pod on the CPU pool), or tpu_pool_mode to 'cluster' or 'existing'",
        )
    shape = SHAPES.get(c.pw_cpu_machine_type)
    if c.conversion_on_tpu or not c.creates_cluster or shape is None:
        return  # an existing pool is checked against its nodes before the conversion is submitted
    yield from conversion_fit_problems(
        c, shape.allocatable_cpu, shape.allocatable_memory_gib,
        where=f"one {c.pw_cpu_machine_type} node", larger="a larger pw_cpu_machine_type",
    )


def conversion_fit_problems(c: Any, cpu_left: float, memory_gib_left: float, where: str, larger: str):
    """A conversion pod asking more CPU or memory than a node leaves to pods stays Pending for ever. Used
    against GKE's allocatable of the machine type a created pool gets, and against an existing pool's nodes."""
    for name, wanted, left, unit in (
        ("conversion_memory", quantity_gib, memory_gib_left, "Gi"),
        ("conversion_cpu", quantity_cpu, cpu_left, " CPUs"),
    ):
        value = getattr(c, name)
        if _QUANTITY.fullmatch(value) and wanted(value) > left:
            yield Problem(
                name,
                f"{value} does not fit on {where} ({left:.0f}{unit} left to pods by GKE)",
                f"request at most {int(left)}{unit}, or {larger}",
            )


def _validate_slice(c: RunConfig):
    try:
        c.slice
    except SliceError as error:
        yield Problem(error.field, error.problem, error.fix)
        return
    if c.uses_flex_start and c.slice.generation.name in FLEX_START_UNSUPPORTED:
        # GKE docs "About flex-start" (kubernetes-engine/docs/concepts/dws): "TPU v3 and v4 are not supported".
        yield Problem("capacity_type", f"flex_start does not offer TPU {c.slice.generation.name}",
                      "use on_demand, spot or reservation, or a v5e, v5p or v6e slice")
    for name in ("trainer_devices_fraction", "sampler_devices_fraction"):
        fraction = getattr(c, name)
        devices = c.chips * fraction
        if not 0 < fraction <= 1:
            yield Problem(name, f"{fraction} is outside (0, 1]", "use a fraction such as 0.5")
        elif not devices.is_integer():
            yield Problem(name, f"gives {devices:g} of {c.chips} chips", "choose a fraction that gives whole chips")
    if c.trainer_devices_fraction + c.sampler_devices_fraction > 1:
        yield Problem(
            "sampler_devices_fraction",
            f"trainer and sampler fractions add up to {c.trainer_devices_fraction + c.sampler_devices_fraction:g}",
            "make them add up to at most 1",
        )
    # ici_fsdp_parallelism and rollout_data_parallelism default to -1 (auto-filled), so the explicit axes
    # only have to divide the devices of their side.
    yield from _axes_divide(c, "trainer", "ICI", "ici_tensor_parallelism", "ici_expert_parallelism", blame=1)
    yield from _axes_divide(c, "sampler", "rollout", "rollout_tensor_parallelism", "rollout_expert_parallelism", blame=0)
    for key in sorted(set(c.extra_train_args) & _OWN_TRAIN_KEYS):
        yield Problem("extra_train_args", f"sets '{key}', which has its own parameter", f"set '{key}' with its parameter")


def _axes_divide(c: RunConfig, side: str, kind: str, *fields: str, blame: int):
    """The product of two parallelism params must divide the devices of one side; ``blame`` picks the
    field the message names."""
    devices = getattr(c, f"{side}_devices")
    product = getattr(c, fields[0]) * getattr(c, fields[1])
    if devices.is_integer() and (product < 1 or devices % product):
        yield Problem(
            fields[blame],
            f"{fields[0]} x {fields[1]} = {product} does not divide the {devices:g} {side} devices",
            f"choose {kind} parallelisms whose product divides the {side} devices",
        )


#: The MaxText 0.2.4 keys that say what a run trains on (configs/base.yml, configs/post_train/rl.yml): a
#: Hugging Face split, which takes slices such as train[0:200], or the data files of a partition.
INTERVAL_DATA_KEYS = ("train_split", "hf_train_files")


#: MaxText 0.2.4's recipe for a Hub dataset other than its default (trainers/post_train/rl/scripts/
#: run_qwen3_30b_rl.sh): the training files and split, and the evaluation on the same dataset.
DATASET_RECIPE = ("hf_train_files=hf://datasets/nvidia/OpenMathInstruct-2/data/train_1M-*.parquet, "
                  "train_split=train_1M, eval_dataset_name=nvidia/OpenMathInstruct-2")


def _validate_dataset(c: RunConfig):
    """What train_rl (MaxText 0.2.4 get_dataset, prepare_datasets) does with the dataset keys: without files it
    loads ``dataset_name`` with ``hf_subset`` ('main' in rl.yml, GSM8K's config; OpenMathInstruct-2 has only
    'default': "BuilderConfig 'main' not found"), and it evaluates on ``eval_dataset_name`` (GSM8K unless set);
    with files, the split is the name of a parquet split, which refuses a slice such as train[0:200]."""
    data = {**c.extra_train_args, **c.interval_data}
    if c.dataset_name and c.dataset_name != MAXTEXT_DEFAULT_DATASET:
        reasons = []
        if not data.get("hf_train_files") and "hf_subset" not in data:
            reasons.append(f"{c.dataset_name} alone is loaded with MaxText's hf_subset 'main' (GSM8K's config, which "
                           "another dataset may not have: OpenMathInstruct-2 has only 'default')")
        if c.evaluation_batches and "eval_dataset_name" not in data:
            reasons.append(f"the model would be evaluated on {MAXTEXT_DEFAULT_DATASET}, MaxText's eval_dataset_name")
        if reasons:
            yield Problem("dataset_name", "; ".join(reasons),
                          f"set extra_train_args (or interval_data) as MaxText's run_qwen3_30b_rl.sh does: {DATASET_RECIPE} "
                          "(or give the dataset's hf_subset, and eval_dataset_name to evaluate on another set)")
    split = data.get("train_split")
    if data.get("hf_train_files") and isinstance(split, str) and "[" in split:
        yield Problem("interval_data" if "train_split" in c.interval_data else "extra_train_args",
                      f"train_split '{split}' is a slice, and with hf_train_files it names a parquet split, which "
                      "refuses slices", "slice with train_split alone (a Hub split), or pick the interval's files with hf_train_files")


def _validate_interval_data(c: RunConfig):
    """The per-interval data keys: known keys, templates with known fields, enough examples per interval."""
    for key, template in c.interval_data.items():
        if key not in INTERVAL_DATA_KEYS:
            yield Problem("interval_data", f"'{key}' is not a data key", f"use {' or '.join(INTERVAL_DATA_KEYS)}")
            continue
        if key in c.extra_train_args:
            yield Problem("interval_data", f"'{key}' is also in extra_train_args", f"set '{key}' in one of them")
        if not isinstance(template, str):
            yield Problem("interval_data", f"'{key}' must be a string template", f"e.g. \"train[{{first}}:{{stop}}]\"")
            continue
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as error:
            yield Problem("interval_data", f"'{key}': {error}", "write fields as {ds}, and braces as {{ }}")
            continue
        unknown = sorted(names - set(INTERVAL_FIELDS))
        if unknown:
            yield Problem("interval_data", f"'{key}' uses unknown field(s) {unknown}",
                          f"use {', '.join('{' + f + '}' for f in INTERVAL_FIELDS)}")
        if names & {"first", "stop"} and not c.examples_per_interval:
            yield Problem("examples_per_interval", f"is 0, and interval_data '{key}' uses {{first}}/{{stop}}",
                          f"set it to the prompts each interval trains on (at least {c.num_batches * c.batch_size})")
    needed = c.num_batches * c.batch_size
    if 0 < c.examples_per_interval < needed:
        yield Problem(
            "examples_per_interval",
            f"{c.examples_per_interval} prompts are fewer than num_batches x batch_size = {needed} (MaxText would "
            "train fewer steps than planned, and the run would wait for a final step that never comes)",
            f"set it to at least {needed}, or lower num_batches",
        )


def _validate_notification(c: RunConfig):
    """A notification needs both its connection and its recipients."""
    if c.notify_conn_id.strip() and not c.notify_to.strip():
        yield Problem("notify_to", "is empty, so the summary sent through notify_conn_id has no recipient",
                      "give one or more addresses separated by commas, or clear notify_conn_id")
    elif c.notify_to.strip() and not c.notify_conn_id.strip():
        yield Problem("notify_conn_id", "is empty, so nothing sends the summary to notify_to",
                      "name an SMTP connection, or clear notify_to")


#: extra_train_args keys that change the planned steps, their type and bounds (MaxText 0.2.4 configs/types.py:
#: RL.num_iterations ge=1, RLDataset.train_fraction gt=0 le=1, RLConfig.num_epoch ge=1).
_STEP_KEYS = {"num_iterations": (int, 1, None), "rl.num_iterations": (int, 1, None),
              "train_fraction": (float, 0.0, 1.0), "num_epoch": (int, 1, None)}


def _validate_planned_steps(c: RunConfig):
    """The keys MaxText computes the planned steps from are numbers it accepts, and the plan has a step."""
    for key, (kind, low, high) in _STEP_KEYS.items():
        if key not in c.extra_train_args:
            continue
        value = c.extra_train_args[key]
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value))
        if bad or value < low or (kind is float and value == low) or (high is not None and value > high):
            bounds = "above 0 and at most 1" if kind is float else f"a whole number of at least {low}"
            yield Problem("extra_train_args", f"{key} is {value!r}", f"give {key} as {bounds}")
            return
    if c.train_steps < 1:
        yield Problem("extra_train_args", "num_batches x iterations x train_fraction x num_epoch plans no step",
                      "raise train_fraction or num_batches")


def _validate_evaluation(c: RunConfig):
    """The quality gate needs the trainer's evaluation (the bounds of the percentage and the price are checked
    with every field's, in _validate_required)."""
    batches = c.extra_train_args.get("num_test_batches", MAXTEXT_DEFAULT_TEST_BATCHES)
    if isinstance(batches, bool) or not str(batches).isdigit():
        yield Problem("extra_train_args", f"num_test_batches is {batches!r}, not a whole number of batches",
                      "give num_test_batches as an integer >= 0 (0: no evaluation)")
    elif int(batches) == 0 and c.has_quality_gate:
        gate = [name for name in ("min_post_accuracy", "require_no_regression") if getattr(c, name)]
        yield Problem(gate[0], "is a quality gate on the trainer's evaluation, but extra_train_args sets "
                      "num_test_batches to 0 (no evaluation)",
                      f"remove num_test_batches from extra_train_args (MaxText's default is "
                      f"{MAXTEXT_DEFAULT_TEST_BATCHES}) or clear {' and '.join(gate)}")
