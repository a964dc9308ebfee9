"""The run's configuration: one typed, validated object built from the trigger form's params.

Every field is declared once here with its default, form section, title and description; the DAG's
``Param``s (``tpu_rl.params``) and the plan command are generated from these declarations.
Defaults are the tutorial's values. Validation collects every problem, each naming the field and the
fix, and runs before anything is created in the cloud.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tpu_rl import config_rules
from tpu_rl.candidates import CAPACITY_WAIT_MAX_MINUTES, Candidate, form_schema
from tpu_rl.candidates import parse as parse_candidates
from tpu_rl.capacity import CAPACITY, DEFAULT_CAPACITY
from tpu_rl.config_rules import (
    MAXTEXT_DEFAULT_DATASET,
    MAXTEXT_DEFAULT_TEST_BATCHES,
    SUPPORTED_MODELS,
    ConfigError,
    Problem,
)
from tpu_rl.machines import POD_SHARE_OF_BOOT_DISK
from tpu_rl.retention import KEEP_ALL, KEEP_CHOICES
from tpu_rl.run import DataInterval
from tpu_rl.tpu import SliceShape, slice_shape

#: What converting a model downloads from Hugging Face, GB: MaxText's Qwen3-30B-A3B RL tutorial
#: (docs/tutorials/posttraining/rl_qwen3_30b.md: "approximately 62 GB of free disk space to download its
#: safetensors"); the others, the bf16 safetensors of their parameters (2 bytes each).
HF_DOWNLOAD_GB = {
    "qwen3-0.6b": 1.5,
    "qwen3-4b": 8.1,
    "qwen3-8b": 16.4,
    "qwen3-14b": 29.6,
    "qwen3-32b": 65.6,
    "qwen3-30b-a3b": 62,
    "qwen3-30b-a3b-base": 62,
    "qwen3-235b-a22b": 470,
    "llama3.1-8b": 16.1,
    "llama3.1-70b": 141,
}

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


#: The watchdog's windows (tpu_rl.watchdog), in minutes. Not measured on TPUs: chosen well above what the stages
#: are known to take, so that a slow start is never cut short while a stuck one costs hours, not days. Start: the
#: MaxText and Pathways images are pulled by 16 hosts at once (tens of GB each; GKE "Use Image streaming" gives
#: minutes for such images), a TPU node's own start a few minutes more. First step: the tutorial's trainer loads
#: two copies of a 30B model from Cloud Storage (61 GB each), evaluates 5 batches and compiles its steps. Stall: a
#: step of the tutorial's 4 prompts x 4 generations, an evaluation, or a 183 GB checkpoint save each log within
#: minutes. Before: only the task's timeout (72 h for train_rl) bounded them, on each of its tries.
WATCHDOG_START_MINUTES = 30.0
WATCHDOG_FIRST_STEP_MINUTES = 120.0
WATCHDOG_STALL_MINUTES = 60.0

#: The Pathways images' tag matching MaxText 0.2.4's image (its JAX 0.11.0): Pathways on GKE publishes its proxy and
#: server images with jax-<version> tags; xpk's default, :latest, drifts from the trainer's JAX.
PATHWAYS_IMAGE_TAG = "jax-0.11.0"


@dataclass(frozen=True)
class RunConfig:
    # Cloud
    project: str = _required("Cloud", "Project", "Google Cloud project ID that is billed for the run.")
    region: str = _required("Cloud", "Region", "Region of the cluster and the bucket, e.g. us-east5.")
    zone: str = _required(
        "Cloud",
        "Zone",
        "Zone of the TPU node pool (inside the region, one that offers the TPU generation), e.g. us-east5-b.",
    )
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
    compute_type: str = _param("ct6e-standard-4t", "TPU slice", "TPU machine type", "Machine type of the TPU hosts.")
    cluster_nodepool_count: int = _param(
        1,
        "TPU slice",
        "Number of slices",
        "TPU node pools (slices) the training uses. Above 1, MaxText's multislice branch: the device fractions must "
        "give whole slices and ici_expert_parallelism must be 1.",
        minimum=1,
    )
    capacity_type: str = _param(
        DEFAULT_CAPACITY,
        "TPU slice",
        "Capacity type",
        "How the TPU pools the run creates get their VMs. on_demand: standard VMs, created at once or not at "
        "all. reservation: your reservation (set reservation). spot: Spot VMs, cheaper, preemptible. "
        "flex_start: Dynamic Workload Scheduler's flex-start, the pool starts empty and the slice is "
        "provisioned when training asks for it (at most 7 days).",
        enum=list(CAPACITY),
    )
    reservation: str = _param(
        "",
        "TPU slice",
        "Reservation",
        "The TPU reservation to consume; only with capacity_type 'reservation'. Its name in the run's project, or "
        "projects/OWNER/reservations/NAME for a reservation another project owns and shares with the run's "
        "(optionally with /reservationBlocks/BLOCK, as xpk sends).",
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
    #: An array of objects: Airflow's trigger form shows a JSON editor for it (apache/airflow#32734: arrays of
    #: other items than strings), checked against the candidates' schema.
    capacity_candidates: list = _param(
        [],
        "TPU slice",
        "Capacity candidates",
        "Where the slices may come from, in order of preference, instead of zone, capacity_type, reservation and "
        'capacity_wait_minutes: e.g. [{"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": 1.0}, '
        '{"zone": "us-east5-a", "capacity_type": "reservation", "reservation": "my-v6e"}]. Each: zone (of the '
        "run's region), capacity_type, reservation (with 'reservation' only), price_per_chip_hour (default: "
        "tpu_price_per_chip_hour), wait_minutes (default 0). create_tpu_pools tries them in order: a stockout, "
        "missing quota or a wait run out moves to the next. All the run's slices come from one candidate (the "
        "DCN between slices stays in one zone). Empty: the one candidate of zone and capacity_type.",
        **form_schema(),
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
        "pools (docs/getting-started/composer.md has its roles and the actAs grant).",
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
    run_name: str = _param(
        "rl",
        "Training",
        "Run name",
        "run_name: folder of the run's checkpoints under the run's training output.",
        pattern=r"^[A-Za-z0-9_.-]+$",
    )
    num_batches: int = _param(
        50,
        "Training",
        "Batches",
        "num_batches: batches of prompts to train on; the planned steps are num_batches x rl.num_iterations x "
        "train_fraction x num_epoch, as MaxText computes them.",
        minimum=1,
    )
    batch_size: int = _param(
        4, "Training", "Batch size", "batch_size: prompts per batch; each gets rl.num_generations rollouts.", minimum=1
    )
    rollout_tensor_parallelism: int = _param(
        8,
        "Training",
        "Rollout tensor parallelism",
        "rollout_tensor_parallelism of the vLLM sampler; with expert parallelism it must divide the sampler chips.",
    )
    rollout_expert_parallelism: int = _param(
        1, "Training", "Rollout expert parallelism", "rollout_expert_parallelism of the vLLM sampler."
    )
    trainer_devices_fraction: float = _param(
        0.5,
        "Training",
        "Trainer devices fraction",
        "trainer_devices_fraction: share of the chips that train; must give whole chips (whole slices on several).",
    )
    sampler_devices_fraction: float = _param(
        0.5,
        "Training",
        "Sampler devices fraction",
        "sampler_devices_fraction: share of the chips that generate rollouts (vLLM).",
    )
    ici_tensor_parallelism: int = _param(
        4,
        "Training",
        "ICI tensor parallelism",
        "ici_tensor_parallelism of the trainer; FSDP takes the rest of the trainer chips.",
    )
    ici_expert_parallelism: int = _param(
        4, "Training", "ICI expert parallelism", "ici_expert_parallelism of the trainer (MoE experts across chips)."
    )
    hbm_utilization_vllm: float = _param(
        0.65,
        "Training",
        "vLLM HBM utilization",
        "hbm_utilization_vllm: share of sampler HBM vLLM may use (weights and KV cache).",
    )
    reshard_chunk_size: int = _param(
        8,
        "Training",
        "Reshard chunk size",
        "reshard_chunk_size: model keys per chunk when weights move from trainer to sampler; smaller uses less memory.",
        minimum=1,
    )
    remat_policy: str = _param(
        "full",
        "Training",
        "Remat policy",
        "remat_policy: activation rematerialization of the trainer (full recomputes the most, uses the least HBM).",
    )
    async_scheduling: bool = _param(False, "Training", "Async scheduling", "async_scheduling of vLLM.")
    allow_split_physical_axes: bool = _param(
        True,
        "Training",
        "Allow split physical axes",
        "allow_split_physical_axes: lets a mesh axis span parts of the physical torus.",
    )
    ragged_gather_reduce_fallback: bool = _param(
        True,
        "Training",
        "Ragged gather reduce fallback",
        "ragged_gather_reduce_fallback: the JAX reference MoE kernel instead of the fused one.",
    )
    data_template_path: str = _param(
        "maxtext/examples/chat_templates/openmathinstruct2_rl.json",
        "Training",
        "Data template",
        "data_template_path: chat template of the prompts, inside the image.",
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
        'e.g. {"train_split": "train[{first}:{stop}]"} or {"hf_train_files": '
        '"gs://my-bucket/prompts/dt={ds}/*.parquet"}. Fields: {ds}, {ds_nodash}, {start}, {end} (the '
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
        'More MaxText keys for train_rl, e.g. {"rl.num_iterations": 2}. A key MaxText 0.2.4 does not know is '
        "refused before anything is created (MaxText would fail at the trainer's start).",
    )

    # Evaluation and cost
    min_post_accuracy: float = _param(
        0.0,
        "Evaluation and cost",
        "Minimum accuracy after training",
        "Quality gate: the run fails when the accuracy of the trainer's evaluation after training (its "
        "'Post RL Training' line, in percent) is below this. It is measured on the test prompts (20 in the "
        "tutorial: a model with a true 60% shows under 50% one time in eight). 0: no minimum. Needs the evaluation "
        f"(num_test_batches, default {MAXTEXT_DEFAULT_TEST_BATCHES}, not 0 in extra_train_args).",
        minimum=0,
        maximum=100,
    )
    require_no_regression: bool = _param(
        False,
        "Evaluation and cost",
        "Require no regression",
        "Quality gate: the run fails when the accuracy after training is lower than before beyond chance: when "
        "the 95% interval of the change (Newcombe's, from the two counts) lies below 0. On the tutorial's 20 "
        "test prompts that takes a fall of about 35 points (12/20 to 6/20 passes); more test prompts make it "
        "finer (num_test_batches in extra_train_args).",
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
        "notify_to when the run succeeds; on Google Cloud its port must be 465 or 587 (port 25 is blocked). "
        "Empty: no notification.",
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
        PATHWAYS_IMAGE_TAG,
        "Advanced",
        "Pathways image tag",
        "Tag of the Pathways proxy and server images: jax-<version>, the JAX of the MaxText image "
        f"(cloud_image_name; {PATHWAYS_IMAGE_TAG} for MaxText 0.2.4's). Move it with the MaxText image: a Pathways "
        "server of another JAX than the trainer's fails at start or mid-run.",
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
    max_preemptions_per_candidate: int = _param(
        0,
        "Advanced",
        "Preemptions per candidate",
        "With several capacity_candidates: after this many preemptions on one candidate, train_rl's resume moves "
        "the slices to the next candidate instead of waiting for the same capacity again (0: never moves; at most "
        "max_preemptions, which counts the run's preemptions on every candidate).",
        minimum=0,
        maximum=100,
    )
    start_timeout_minutes: float = _param(
        WATCHDOG_START_MINUTES,
        "Advanced",
        "Start timeout (minutes)",
        "How long a stage's pods may take to run once they have a node (pulling the image, starting the "
        "container) and, on the TPU pools the run creates, to get one: past it the stage's JobSet is deleted, "
        "freeing its nodes, and the stage fails with each pod's reason (ImagePullBackOff and the image, the "
        "scheduler's message, CrashLoopBackOff). 0: no limit (the task's timeout, 72 hours for train_rl).",
        minimum=0,
    )
    first_step_timeout_minutes: float = _param(
        WATCHDOG_FIRST_STEP_MINUTES,
        "Advanced",
        "First step timeout (minutes)",
        "How long train_rl's trainer may take, once its pods run, to write its first step (loading the model, the "
        "evaluation before training, XLA's compilation): past it the training is ended as stuck and the task "
        "fails; a retry resumes from the newest complete checkpoint. 0: no limit.",
        minimum=0,
    )
    stall_timeout_minutes: float = _param(
        WATCHDOG_STALL_MINUTES,
        "Advanced",
        "Stall timeout (minutes)",
        "After train_rl's first step, how long it may go without a new step and without a log line (a step, an "
        "evaluation, a checkpoint save all log): past it the training is ended as stalled at its step and the "
        "task fails; a retry resumes from the newest complete checkpoint, and the same stall twice fails the task "
        "for good. 0: no limit.",
        minimum=0,
    )
    ttl_seconds_after_finished: int = _param(
        3600, "Advanced", "JobSet TTL", "Seconds a finished JobSet is kept (--gke-ttl-after-finished).", minimum=0
    )
    keep_cluster: bool = _param(
        False, "Advanced", "Keep the cluster", "Do not delete a cluster this run created (you pay for it)."
    )
    keep_checkpoints: str = _param(
        KEEP_ALL,
        "Advanced",
        "Checkpoints kept",
        "What of the run's training checkpoints stays once its export is published and verified (a saved step of "
        "Qwen3-30B-A3B is about 183 GB; a daily program keeps about 5.5 TB more a month). all: every saved step, as "
        "before 2.5.0. exported: the step exported (what a resume or a new export starts from); the earlier saves and "
        "the steps set aside before a resume are removed. none: those and the step exported (the published model is "
        "what stays; a cleared train_rl trains again from the base checkpoint). Only this run's steps, never a newer "
        "step than the one exported, nothing when the export is not verified.",
        enum=list(KEEP_CHOICES),
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
                values[name] = config_rules.coerce(value, spec.type)
            except (TypeError, ValueError):
                problems.append(Problem(name, f"must be {spec.type}, got {value!r}", f"give a {spec.type} value"))
                values[name] = _default_of(spec)
        config = cls(**values)
        problems += config.problems()
        if problems:
            raise ConfigError(problems)
        return config

    def problems(self) -> list[Problem]:
        return list(config_rules.problems(self))

    def for_interval(self, interval: DataInterval | None) -> RunConfig:
        """The config of a run that trains one data interval: ``interval_data`` filled in and passed to the
        trainer with the other MaxText keys. Raises ConfigError when the keys need an interval the run lacks, or
        when the interval is past the end of its data."""
        if not self.interval_data:
            return self
        if interval is None:
            raise ConfigError(
                [
                    Problem(
                        "interval_data",
                        "needs the run's data interval, and this run has none (a manual run)",
                        "run it through the program's schedule or a backfill, or clear interval_data",
                    )
                ]
            )
        values = interval.template_values(self.examples_per_interval)
        rendered = {key: template.format(**values) for key, template in self.interval_data.items()}
        config = dataclasses.replace(self, extra_train_args={**self.extra_train_args, **rendered})
        problems = [
            Problem(p.field, f"the interval of {interval.start:%Y-%m-%d} (index {interval.index}): {p.message}", p.fix)
            for p in config_rules.validate_training_rows(config)
        ]
        if problems:
            raise ConfigError(problems)
        return config

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
    def multislice(self) -> bool:
        """Whether train_rl runs MaxText's multislice branch: each role on whole slices, data parallel over DCN."""
        return self.cluster_nodepool_count > 1

    @property
    def trainer_slices(self) -> float:
        """The slices that train (MaxText's ``num_trainer_slices``): the trainer's fraction of the run's slices."""
        return _whole_if_near(self.cluster_nodepool_count * self.trainer_devices_fraction)

    @property
    def sampler_slices(self) -> float:
        """The slices that generate rollouts (MaxText's ``num_samplers_slices``)."""
        return _whole_if_near(self.cluster_nodepool_count * self.sampler_devices_fraction)

    @property
    def trainer_devices(self) -> float:
        if self.multislice:
            return self.trainer_slices * self.slice.chips
        return self.chips * self.trainer_devices_fraction

    @property
    def sampler_devices(self) -> float:
        if self.multislice:
            return self.sampler_slices * self.slice.chips
        return self.chips * self.sampler_devices_fraction

    @property
    def train_steps(self) -> int:
        """Steps train_rl plans, as MaxText 0.2.4 computes them (configs/types.py, RLConfig:
        ``int(num_batches * rl.num_iterations * train_fraction * num_epoch)``, Tunix's ``max_steps``). A flat
        ``num_iterations`` is accepted and wins over ``rl.num_iterations`` (pyconfig copies flat keys into the
        nested model)."""
        args = self.extra_train_args
        iterations = args.get("num_iterations", args.get("rl.num_iterations", 1))
        return int(
            self.num_batches * int(iterations) * float(args.get("train_fraction", 1.0)) * int(args.get("num_epoch", 1))
        )

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
        return max(500, math.ceil(self.conversion_disk_gib * 2**30 / 1e9 / POD_SHARE_OF_BOOT_DISK))

    @property
    def evaluation_batches(self) -> int:
        """Test batches train_rl evaluates before and after training (0: no evaluation lines)."""
        return int(self.extra_train_args.get("num_test_batches", MAXTEXT_DEFAULT_TEST_BATCHES))

    @property
    def reservation_path(self) -> str:
        """The reservation as GKE's ReservationAffinity takes it: ``projects/OWNER/reservations/NAME[/...]``, the
        run's project for a bare name."""
        if self.reservation.startswith("projects/"):
            return self.reservation
        return f"projects/{self.project}/reservations/{self.reservation}"

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """Where the run's slices may come from, in order: ``capacity_candidates``, or the one candidate of
        ``zone``, ``capacity_type``, ``reservation`` and ``capacity_wait_minutes`` (at tpu_price_per_chip_hour)."""
        if self.capacity_candidates:
            return parse_candidates(self.capacity_candidates)
        return (Candidate(self.zone, self.capacity_type, self.reservation, None, self.capacity_wait_minutes),)

    def on_candidate(self, candidate: Candidate) -> RunConfig:
        """The config as the TPU pools' requests and messages read it on ``candidate``: its zone, capacity type,
        reservation, wait and price in the single choice's fields (the CPU pool's zone is ``zone`` of the run's
        own config, not this one's)."""
        return dataclasses.replace(
            self,
            zone=candidate.zone,
            capacity_type=candidate.capacity_type,
            reservation=candidate.reservation,
            capacity_wait_minutes=candidate.wait_minutes,
            tpu_price_per_chip_hour=candidate.price(self.tpu_price_per_chip_hour),
            capacity_candidates=[],
        )

    @property
    def evaluation_prompts(self) -> int:
        """The most prompts train_rl's evaluation scores: ``num_test_batches`` batches of ``eval_batch_size`` (of
        ``batch_size`` when it is not above 0), before MaxText's length filter and ``drop_remainder`` take some."""
        size = self.extra_train_args.get("eval_batch_size", -1)
        per_batch = int(size) if isinstance(size, int) and size > 0 else self.batch_size
        return self.evaluation_batches * per_batch

    @property
    def has_quality_gate(self) -> bool:
        return bool(self.min_post_accuracy) or self.require_no_regression

    @property
    def effective_dataset(self) -> str:
        return self.dataset_name or MAXTEXT_DEFAULT_DATASET

    @property
    def evaluation_dataset(self) -> str:
        """train_rl's ``eval_dataset_name``: rl.yml's GSM8K unless extra_train_args sets it."""
        return self.extra_train_args.get("eval_dataset_name", MAXTEXT_DEFAULT_DATASET)

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
        kind = CAPACITY.get(self.capacity_type)
        return bool(kind and kind.starts_empty)

    @property
    def slice_is_the_runs_own(self) -> bool:
        """The training's pods should land on pools this run created, with their nodes there from the start: no
        autoscaler (flex-start), no queue (Kueue) and no other run's workload to wait for. The watchdog then
        counts a pod the scheduler cannot place against the start window."""
        return self.tpu_pools_per_run and not self.uses_flex_start and not self.kueue_queue_name

    @property
    def creates_node_pools(self) -> bool:
        return self.creates_cluster or self.tpu_pools_per_run

    def pathways_image(self, name: str) -> str:
        return f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/{name}:{self.pathways_image_tag}"


def field_specs() -> list[dataclasses.Field]:
    return list(dataclasses.fields(RunConfig))


def _default_of(spec: dataclasses.Field) -> Any:
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def _whole_if_near(share: float) -> float:
    """A role's share of the slices, made whole when a fraction written to a few decimals means it (0.333333 of
    three slices is one); any other share stays as it is, for validation to refuse."""
    nearest = round(share)
    return float(nearest) if abs(share - nearest) < 1e-4 else share
