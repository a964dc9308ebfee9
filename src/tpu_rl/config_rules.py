"""The rules a run's configuration must meet, rule group by rule group; each problem names the field and the fix.

``RunConfig.from_params`` (``tpu_rl.config``) runs them all before anything is created in the cloud. A rule
group is a generator over the config (``c``: the ``RunConfig`` being validated) and the constants it is
checked against; this module does not import ``tpu_rl.config``, which imports it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from tpu_rl import candidates, hub_datasets
from tpu_rl.candidates import Candidate
from tpu_rl.capacity import CAPACITY, DEFAULT_CAPACITY
from tpu_rl.jobset_release import shipped_versions
from tpu_rl.machines import SHAPES, quantity_cpu, quantity_gib
from tpu_rl.run import INTERVAL_FIELDS, RunIdentity
from tpu_rl.tpu import GENERATIONS, SliceError
from tpu_rl.vocabulary import PATHWAYS_JOBSET_NAME_MAX

#: The capacity types that consume a reservation (``reservation`` names it).
RESERVING = tuple(name for name, kind in CAPACITY.items() if kind.needs_reservation)
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

#: Hugging Face checkpoints (lowercase) and the MaxText model whose config (``configs/models/<model>.yml``: its layers,
#: heads and RoPE base) they fit. One per model is MaxText 0.2.4's own pairing (``utils/globals.py`` HF_IDS); the
#: others are the same release family's other variants, same architecture and ``rope_theta``. A model paired with
#: other weights converts without error into a wrong model: ``qwen3-30b-a3b-base.yml`` has ``rope_max_timescale``
#: 1_000_000, the 2507 weights' config ``rope_theta`` 10_000_000 (``qwen3-30b-a3b.yml``'s). A repository not listed
#: here (a fine-tune of one's own) is not checked.
MODEL_OF_WEIGHTS = {
    "qwen/qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b",
    "qwen/qwen3-30b-a3b-thinking-2507": "qwen3-30b-a3b",
    "qwen/qwen3-30b-a3b-base": "qwen3-30b-a3b-base",
    "qwen/qwen3-30b-a3b": "qwen3-30b-a3b-base",
    "qwen/qwen3-235b-a22b-instruct-2507": "qwen3-235b-a22b",
    "qwen/qwen3-235b-a22b-thinking-2507": "qwen3-235b-a22b",
    **{
        f"qwen/qwen3-{size}{variant}": f"qwen3-{size}"
        for size in ("0.6b", "4b", "8b", "14b", "32b")
        for variant in ("", "-base")
    },
    **{
        f"meta-llama/llama-3.1-{size}{variant}": f"llama3.1-{size}"
        for size in ("8b", "70b")
        for variant in ("", "-instruct")
    },
}


def ships_generation_config(hf_model_path: str) -> bool:
    """Whether the export of a model trained from these weights must hold their ``generation_config.json`` (the
    sampling defaults): the repositories of :data:`MODEL_OF_WEIGHTS`, the Qwen3 and Llama 3.1 releases, each have
    one; a repository not listed may have none, and its export is not held to it."""
    return hf_model_path.lower() in MODEL_OF_WEIGHTS


#: The dataset ``train_rl`` uses when ``dataset_name`` is not given (MaxText 0.2.4, configs/post_train/rl.yml).
MAXTEXT_DEFAULT_DATASET = "openai/gsm8k"
#: Test batches ``train_rl`` evaluates before and after training unless extra_train_args sets
#: ``num_test_batches`` (MaxText 0.2.4, configs/post_train/rl.yml:120); 0 turns the evaluation off.
MAXTEXT_DEFAULT_TEST_BATCHES = 5


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        end = "" if self.fix.endswith(("?", ".")) else "."
        return f"{self.field}: {self.message}; fix: {self.fix}{end}"


class ConfigError(ValueError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"The run's parameters are invalid ({len(problems)} problem(s)):\n{lines}")

    @property
    def fields(self) -> list[str]:
        return [p.field for p in self.problems]


_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list}


def coerce(value: Any, type_name: str) -> Any:
    """A field's value as its declared type (``type_name``), accepting what JSON and the trigger form send:
    numbers as strings, ints for floats. Raises TypeError or ValueError for anything else."""
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
    if kind in (dict, list) and not isinstance(value, kind):
        raise TypeError(value)
    if kind is str and not isinstance(value, str):
        raise TypeError(value)
    return kind(value)


_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_REGION = re.compile(r"[a-z]+-[a-z]+\d+")
#: A GKE cluster's or node pool's name (GKE API reference, Cluster.name; the same rule for NodePool.name).
_CLUSTER = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
#: A reservation: a Compute Engine name (RFC 1035) in the run's project, or the path of one another project owns
#: (shared), optionally down to a block and sub-block (Compute API ReservationAffinity; xpk core/reservation.py).
_RESOURCE_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_RESERVATION = re.compile(
    rf"(?:projects/[a-z][a-z0-9-]{{4,28}}[a-z0-9]/reservations/)?{_RESOURCE_NAME}"
    rf"(?:/reservationBlocks/{_RESOURCE_NAME}(?:/reservationSubBlocks/{_RESOURCE_NAME})?)?"
)
#: A Kueue LocalQueue's name as the workloads' label value carries it: an object name (DNS subdomain) that is also a
#: label value (at most 63 characters, beginning and ending with a letter or digit).
_LOCAL_QUEUE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?")
_SERVICE_ACCOUNT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9.-]+\.gserviceaccount\.com")
#: train_rl keys that have their own param; extra_train_args must not set them twice.
_OWN_TRAIN_KEYS = {
    "run_name",
    "base_output_directory",
    "model_name",
    "load_parameters_path",
    "hf_access_token",
    "num_batches",
    "batch_size",
    "rollout_tensor_parallelism",
    "rollout_expert_parallelism",
    "trainer_devices_fraction",
    "sampler_devices_fraction",
    "tokenizer_path",
    "ici_tensor_parallelism",
    "ici_expert_parallelism",
    "hbm_utilization_vllm",
    "reshard_chunk_size",
    "remat_policy",
    "async_scheduling",
    "allow_split_physical_axes",
    "ragged_gather_reduce_fallback",
    "data_template_path",
    "dataset_name",
    "checkpoint_period",
    "scan_layers",
}


def problems(c: Any) -> Iterator[Problem]:
    """Every problem of the config, rule group by rule group (always in the same order)."""
    for rules in (
        _validate_required,
        _validate_cloud_names,
        _validate_cluster_access,
        _validate_capacity,
        _validate_model,
        _validate_node_identity,
        _validate_conversion,
        _validate_workloads,
        _validate_slice,
        _validate_multislice,
        _validate_maxtext_keys,
        _validate_interval_data,
        _validate_dataset,
        validate_training_rows,
        _validate_planned_steps,
        _validate_evaluation,
        _validate_notification,
    ):
        yield from rules(c)


def _validate_required(c: Any):
    """Fields without a default, fields with a fixed set of choices and numbers with bounds (the form checks
    them; the plan command and the REST API do not)."""
    for spec in dataclasses.fields(c):
        if spec.default is None and not getattr(c, spec.name):
            yield Problem(spec.name, "is required", f"set {spec.name} ({spec.metadata['description']})")
        schema, value = spec.metadata["schema"], getattr(c, spec.name)
        choices = schema.get("enum")
        if choices and value not in choices:
            yield Problem(
                spec.name, f"'{value}' is not one of its choices", f"use {' or '.join(repr(x) for x in choices)}"
            )
        low, high = schema.get("minimum"), schema.get("maximum")
        numeric = isinstance(value, (int, float))
        if numeric and ((low is not None and value < low) or (high is not None and value > high)):
            bounds = f"at least {low}" if high is None else f"from {low} to {high}"
            yield Problem(spec.name, f"{value} is out of range", f"use a value {bounds}")


def _validate_cloud_names(c: Any):
    """Project, region, zone, cluster, CPU pool, Kueue queue and bucket: names GCP and Kubernetes accept."""
    if c.project and not _PROJECT.fullmatch(c.project):
        yield Problem("project", f"'{c.project}' is not a project ID", "use 6-30 lowercase letters, digits, dashes")
    if c.region and not _REGION.fullmatch(c.region):
        yield Problem("region", f"'{c.region}' is not a region", "use a region such as us-east5")
    if c.zone and c.region and not c.zone.startswith(f"{c.region}-"):
        yield Problem(
            "zone", f"'{c.zone}' is not in region '{c.region}'", f"use a zone of {c.region}, e.g. {c.region}-b"
        )
    for index, candidate in _listed_candidates(c):
        if c.region and not candidate.zone.startswith(f"{c.region}-"):
            yield Problem(
                candidates.field_name(index, "zone"),
                f"'{candidate.zone}' is not in region '{c.region}', the region of the run's cluster and of the "
                "bucket its checkpoints stay in",
                f"use a zone of {c.region}: a candidate in another region would need a cluster there and the "
                "checkpoints in a bucket both regions reach (a dual- or multi-region bucket, or a copy at the move), "
                "which the package does not do yet",
            )
    if c.cluster_name and not _CLUSTER.fullmatch(c.cluster_name):
        yield Problem(
            "cluster_name",
            f"'{c.cluster_name}' is not a GKE cluster name",
            "use at most 40 lowercase letters, digits and dashes, starting with a letter",
        )
    if c.cpu_pool_name and not _CLUSTER.fullmatch(c.cpu_pool_name):
        yield Problem(
            "cpu_pool_name",
            f"'{c.cpu_pool_name}' is not a GKE node pool name",
            "use at most 40 lowercase letters, digits and dashes, starting with a letter, e.g. cpu-np",
        )
    if c.kueue_queue_name and not _LOCAL_QUEUE.fullmatch(c.kueue_queue_name):
        yield Problem(
            "kueue_queue_name",
            f"'{c.kueue_queue_name}' is not a LocalQueue name a label can carry",
            "use at most 63 lowercase letters, digits, dashes and dots, starting and ending with a letter or digit",
        )
    bucket = c.gcs_bucket
    if bucket and (not _BUCKET.fullmatch(bucket) or bucket.startswith("goog") or ".." in bucket):
        yield Problem(
            "gcs_bucket",
            f"'{c.gcs_bucket}' is not a valid bucket name",
            "use 3-63 lowercase letters, digits, dashes, underscores or dots, starting and ending with a letter "
            "or digit, not starting with 'goog'",
        )


def _validate_cluster_access(c: Any):
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
    if not _K8S_NAME.fullmatch(c.namespace):
        yield Problem(
            "namespace", f"'{c.namespace}' is not a Kubernetes namespace name", "use lowercase letters, digits, dashes"
        )
    if c.kueue_queue_name and c.tpu_pools_per_run:
        yield Problem(
            "kueue_queue_name",
            "queues the run's workloads in Kueue, but tpu_pool_mode is 'per_run': the run creates its slice before "
            "it submits the training, and Kueue may hold the JobSet suspended for hours while the slice bills",
            "use Kueue with a standing slice (tpu_pool_mode 'cluster' or 'existing'), or clear kueue_queue_name "
            "(capacity_group queues runs before their slices exist)",
        )


def _validate_capacity(c: Any):
    """Where the TPU pools' VMs come from: a capacity group, a reservation, flex-start, how long to wait."""
    if c.capacity_limited and not c.tpu_pools_per_run:
        yield Problem(
            "capacity_group",
            f"limits the slices runs create, but tpu_pool_mode is '{c.tpu_pool_mode}' (the run creates none)",
            "set tpu_pool_mode to 'per_run', or clear capacity_group",
        )
    elif c.capacity_limited and c.cluster_nodepool_count > c.capacity_slices:
        yield Problem(
            "capacity_slices",
            f"the group has {c.capacity_slices} slice(s), and a run needs {c.cluster_nodepool_count} "
            "(it would wait for ever)",
            f"set capacity_slices to at least {c.cluster_nodepool_count}",
        )
    for candidate, name in _named_candidates(c):
        yield from _candidate_reservation(candidate, name)
    if c.uses_existing_tpu_pools and c.capacity_type != DEFAULT_CAPACITY:
        yield Problem(
            "capacity_type",
            f"'{c.capacity_type}' says how the TPU pools the run creates get their VMs, but "
            "tpu_pool_mode is 'existing' (the run creates none; preemptions are resumed on any capacity)",
            "leave capacity_type 'on_demand', or set tpu_pool_mode to 'per_run'",
        )
    for candidate, name in _named_candidates(c):
        yield from _candidate_wait(c, candidate, name)
    yield from _candidate_list(c)


#: The single choice's field of each key of a candidate (``tpu_rl.candidates.KEYS``).
_SINGLE_FIELDS = {"wait_minutes": "capacity_wait_minutes", "price_per_chip_hour": "tpu_price_per_chip_hour"}


def _named_candidates(c: Any) -> Iterator[tuple[Candidate, Callable[[str], str]]]:
    """Each candidate with how its problems name its keys: the single choice's own fields (``zone``,
    ``capacity_wait_minutes``), or ``capacity_candidates[i].zone``; so one rule checks both."""
    if not c.capacity_candidates:
        yield c.candidates[0], lambda key: _SINGLE_FIELDS.get(key, key)
        return
    for index, candidate in _listed_candidates(c):
        yield candidate, lambda key, index=index: candidates.field_name(index, key)


def _listed_candidates(c: Any) -> Iterator[tuple[int, Candidate]]:
    """The well-formed entries of ``capacity_candidates`` with their index in the list (the others are refused by
    their shape, in :func:`_candidate_list`)."""
    for index, entry in enumerate(c.capacity_candidates):
        if not candidates.shape_problems([entry]):
            yield index, candidates.parse([entry])[0]


def _candidate_reservation(candidate: Candidate, name: Callable[[str], str]):
    """One candidate's reservation: the single choice's rules, for it."""
    capacity_type = name("capacity_type")
    needs_reservation = candidate.capacity_type in RESERVING
    if needs_reservation and not candidate.reservation:
        yield Problem(
            name("reservation"),
            f"is required when {capacity_type} is '{candidate.capacity_type}'",
            f"name the reservation to consume, or choose another {capacity_type}",
        )
    if candidate.reservation and not _RESERVATION.fullmatch(candidate.reservation):
        yield Problem(
            name("reservation"),
            f"'{candidate.reservation}' is not a reservation name or path",
            "give its name (lowercase letters, digits, dashes) for one in the run's project, or "
            "projects/OWNER/reservations/NAME for one another project shares with it",
        )
    if candidate.reservation and not needs_reservation:
        yield Problem(
            name("reservation"),
            f"is set, but {capacity_type} is '{candidate.capacity_type}', which consumes no reservation",
            f"set {capacity_type} to {' or '.join(repr(n) for n in RESERVING)}, or clear reservation",
        )


def _candidate_wait(c: Any, candidate: Candidate, name: Callable[[str], str]):
    """One candidate's capacity wait: only for a pool create GKE may hold."""
    kind = CAPACITY.get(candidate.capacity_type)
    starts_empty = bool(kind and kind.starts_empty)
    if candidate.wait_minutes and (c.uses_existing_tpu_pools or c.tpu_pools_with_cluster or starts_empty):
        if c.uses_existing_tpu_pools:
            reason = "tpu_pool_mode is 'existing' (the run creates no pool)"
        elif c.tpu_pools_with_cluster:
            reason = (
                "tpu_pool_mode is 'cluster': the TPU pools are created inside the cluster's create, which a "
                "stockout fails whole (use tpu_pool_mode 'per_run' to wait for a scarce slice)"
            )
        else:
            reason = (
                "a flex_start pool is created empty at once: its slice comes when train_rl's pods ask for it, "
                "and train_rl waits for it"
            )
        yield Problem(
            name("wait_minutes"),
            f"bounds the wait of a pool create that GKE holds for capacity, but {reason}",
            "set it to 0",
        )


def _candidate_list(c: Any):
    """``capacity_candidates`` as a whole: well-formed entries, in place of the single choice, each once, with a
    run that creates its pools (failing over is deleting them and creating them elsewhere), and waits that fit
    create_tpu_pools's timeout; ``max_preemptions_per_candidate`` only with somewhere to move to, within the run's
    ``max_preemptions``."""
    listed = c.capacity_candidates
    for field_, problem, fix in candidates.shape_problems(listed):
        yield Problem(field_, problem, fix)
    if len(c.candidates) < 2 and c.max_preemptions_per_candidate:
        yield Problem(
            "max_preemptions_per_candidate",
            "moves a preempted run to the next capacity candidate, but the run has one",
            "list more capacity_candidates, or set it to 0",
        )
    elif c.max_preemptions_per_candidate > c.max_preemptions:  # the run's budget is spent before any move
        yield Problem(
            "max_preemptions_per_candidate",
            f"is above max_preemptions ({c.max_preemptions}): the run stops resuming before a candidate's "
            "preemptions would move it",
            f"set it to at most {c.max_preemptions}, or raise max_preemptions",
        )
    if not listed:
        return
    beside = [f for f, default in _SINGLE_CHOICE.items() if getattr(c, f) != default]
    for field_ in beside:
        yield Problem(
            field_,
            "is set beside capacity_candidates, which replace it",
            f"set it in each candidate (its key {_candidate_key(field_)}), or clear capacity_candidates",
        )
    if not c.tpu_pools_per_run and len(listed) > 1:
        yield Problem(
            candidates.PARAM,
            f"lists {len(listed)} candidates, but tpu_pool_mode is '{c.tpu_pool_mode}': moving to the next one "
            "deletes the run's TPU pools and creates them elsewhere, and the run creates no pool of its own",
            "set tpu_pool_mode to 'per_run', or give one candidate",
        )
    seen: dict[Candidate, int] = {}
    for index, candidate in _listed_candidates(c):
        key = dataclasses.replace(candidate, price_per_chip_hour=None, wait_minutes=0)
        if key in seen:
            yield Problem(
                candidates.field_name(index, "zone"),
                f"{candidate.describe()} is candidate {seen[key]} already",
                "list each zone and capacity type once (its wait_minutes gives it longer)",
            )
        seen.setdefault(key, index)
    waits = sum(candidate.wait_minutes for candidate in c.candidates)
    worst = waits + candidates.GKE_HELD_CREATE_MINUTES * len(c.candidates)
    if worst > candidates.CREATE_TPU_POOLS_TIMEOUT_MINUTES:
        yield Problem(
            candidates.PARAM,
            f"the candidates wait {waits} minutes in all, and GKE may hold each one's last create about "
            f"{candidates.GKE_HELD_CREATE_MINUTES} minutes more: {worst} minutes, beyond create_tpu_pools's "
            f"timeout of {candidates.CREATE_TPU_POOLS_TIMEOUT_MINUTES}",
            "shorten their wait_minutes, or list fewer candidates",
        )


#: The single choice's fields capacity_candidates replace, with their defaults (set: a contradiction).
_SINGLE_CHOICE = {"capacity_type": DEFAULT_CAPACITY, "reservation": "", "capacity_wait_minutes": 0}


def _candidate_key(field_: str) -> str:
    return next((key for key, single in _SINGLE_FIELDS.items() if single == field_), field_)


def _validate_model(c: Any):
    """The model MaxText knows, its Hugging Face repo, the conversion pod's resources."""
    if c.model_name not in SUPPORTED_MODELS:
        yield Problem(
            "model_name",
            f"'{c.model_name}' is not a supported MaxText model",
            f"use one of {', '.join(SUPPORTED_MODELS)}",
        )
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", c.hf_model_path):
        yield Problem("hf_model_path", f"'{c.hf_model_path}' is not a Hugging Face repo id", "use owner/name")
    fits = MODEL_OF_WEIGHTS.get(c.hf_model_path.lower())
    if fits and c.model_name in SUPPORTED_MODELS and fits != c.model_name:
        yield Problem(
            "model_name",
            f"'{c.model_name}' does not fit the weights of {c.hf_model_path}, which are {fits}'s (its layers and RoPE "
            "base: the conversion would succeed into a wrong model, or fail after the download)",
            f"set model_name to '{fits}', or hf_model_path to weights of {c.model_name}",
        )
    for name in ("conversion_cpu", "conversion_memory"):
        if not _QUANTITY.fullmatch(getattr(c, name)):
            yield Problem(name, f"'{getattr(c, name)}' is not a Kubernetes quantity", "use e.g. 32 or 256Gi")


def _validate_node_identity(c: Any):
    """The service account of the nodes this run creates."""
    if c.creates_node_pools and not c.kubernetes_conn_id and not _SERVICE_ACCOUNT.fullmatch(c.node_service_account):
        yield Problem(
            "node_service_account",
            "is required when the run creates a cluster or node pools"
            + (f" ('{c.node_service_account}' is not a service account email)" if c.node_service_account else ""),
            "give the email of a service account with bucket access that the Airflow identity may act as "
            "(roles/iam.serviceAccountUser); the Compute Engine default account is refused on purpose",
        )


def _validate_workloads(c: Any):
    """The JobSet release installed, the JobSet names Pathways accepts, vLLM's HBM share."""
    if c.jobset_version not in shipped_versions():
        yield Problem(
            "jobset_version",
            f"'{c.jobset_version}' is not shipped with this package",
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


def _validate_conversion(c: Any):
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
        c,
        shape.allocatable_cpu,
        shape.allocatable_memory_gib,
        where=f"one {c.pw_cpu_machine_type} node",
        larger="a larger pw_cpu_machine_type",
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


def _validate_slice(c: Any):
    try:
        _ = c.slice  # resolving it checks the TPU type against the topology
    except SliceError as error:
        yield Problem(error.field, error.problem, error.fix)
        return
    for candidate, name in _named_candidates(c):
        yield from _candidate_slice(c, candidate, name)
    for name in ("trainer_devices_fraction", "sampler_devices_fraction"):
        fraction = getattr(c, name)
        devices = c.chips * fraction
        if not 0 < fraction <= 1:
            yield Problem(name, f"{fraction} is outside (0, 1]", "use a fraction such as 0.5")
        elif not c.multislice and not devices.is_integer():
            yield Problem(name, f"gives {devices:g} of {c.chips} chips", "choose a fraction that gives whole chips")
    if c.trainer_devices_fraction + c.sampler_devices_fraction > 1:
        yield Problem(
            "sampler_devices_fraction",
            f"trainer and sampler fractions add up to {c.trainer_devices_fraction + c.sampler_devices_fraction:g}",
            "make them add up to at most 1",
        )
    # ici_fsdp_parallelism and rollout_data_parallelism default to -1 (auto-filled), so the explicit axes
    # only have to divide the devices of their side.
    trainer_axes = list(_axes_divide(c, "trainer", "ICI", "ici_tensor_parallelism", "ici_expert_parallelism", blame=1))
    yield from trainer_axes
    if not trainer_axes and not c.multislice:  # one slice: the sampler's mesh has the same ICI axes
        # (MaxText 0.2.4 utils/model_creation_utils.py:689 sampler_config = config, :770 its mesh)
        yield from _axes_divide(c, "sampler", "ICI", "ici_tensor_parallelism", "ici_expert_parallelism", blame=1)
    yield from _axes_divide(
        c, "sampler", "rollout", "rollout_tensor_parallelism", "rollout_expert_parallelism", blame=0
    )
    for key in sorted(set(c.extra_train_args) & _OWN_TRAIN_KEYS):
        if key in _DERIVED_TRAIN_KEYS:
            yield Problem("extra_train_args", f"sets '{key}', which the run sets itself", _DERIVED_TRAIN_KEYS[key])
        else:
            yield Problem(
                "extra_train_args", f"sets '{key}', which has its own parameter", f"set '{key}' with its parameter"
            )


#: The train_rl keys of _OWN_TRAIN_KEYS that no parameter names: where the run takes each from.
_DERIVED_TRAIN_KEYS = {
    "base_output_directory": "remove it: the run writes under gcs_bucket, in a folder of its own",
    "load_parameters_path": "remove it: the run trains from the checkpoint its conversion made from hf_model_path",
    "hf_access_token": "remove it: the token comes from the Airflow connection hf_token_conn_id names, as a "
    "Kubernetes Secret, never on a command line",
}


#: What the package sets from ``cluster_nodepool_count`` and the device fractions (``tpu_rl.maxtext.train_rl``).
_SLICE_KEYS = ("num_slices", "num_trainer_slices", "num_samplers_slices")
_AXIS_KEY = re.compile(r"(ici|dcn)_(\w+)_parallelism")
#: MaxText 0.2.4's multislice branch of ``setup_configs_and_devices`` (utils/model_creation_utils.py:691-745).
_MULTISLICE = "MaxText 0.2.4's multislice branch (utils/model_creation_utils.py)"


def _validate_multislice(c: Any):
    """On several slices train_rl must take MaxText's multislice branch: its single-slice branch (both slice counts
    -1, model_creation_utils.py:671-689) splits ``jax.devices()`` by fraction with no DCN axis. The multislice branch
    gives each role whole slices (:698-707), lays a slice out as FSDP x tensor (:709-731, the sampler's tensor axis
    derived, :733-741) and the DCN axis as data parallelism over the role's slices; nothing else runs there."""
    for key in [k for k in _SLICE_KEYS if k in c.extra_train_args]:
        yield Problem(
            "extra_train_args",
            f"sets '{key}', which the run sets from cluster_nodepool_count and the device fractions",
            f"remove '{key}'; set cluster_nodepool_count, trainer_devices_fraction and sampler_devices_fraction",
        )
    if not c.multislice or not _slice_resolves(c):
        return
    yield from _whole_slices(c)
    yield from _multislice_trainer_axes(c)
    yield from _multislice_extra_axes(c)


def _slice_resolves(c: Any) -> bool:
    try:
        _ = c.slice
    except SliceError:
        return False
    return True


def _whole_slices(c: Any):
    """num_trainer_slices and num_samplers_slices are whole numbers of at least one (model_creation_utils.py:691,
    :748)."""
    count = c.cluster_nodepool_count
    for side in ("trainer", "sampler"):
        name, slices = f"{side}_devices_fraction", getattr(c, f"{side}_slices")
        if 0 < getattr(c, name) <= 1 and not (slices.is_integer() and slices >= 1):
            yield Problem(
                name,
                f"gives {slices:g} of the {count} slices; {_MULTISLICE} runs the trainer and the sampler each on "
                "whole slices",
                f"choose a multiple of 1/{count} ({1 / count:.6g}) that gives at least one slice",
            )


def _multislice_trainer_axes(c: Any):
    """A trainer slice is FSDP x tensor (model_creation_utils.py:709-731): any expert axis makes the ICI axes
    multiply past the slice's chips (utils/max_utils.py:479-482), and the sampler's derived tensor axis below one
    (max_utils.py:469-474)."""
    chips = c.slice.chips
    if c.ici_expert_parallelism != 1:
        yield Problem(
            "ici_expert_parallelism",
            f"is {c.ici_expert_parallelism} on {c.cluster_nodepool_count} slices; {_MULTISLICE} lays each slice out "
            "as FSDP x tensor only, with no expert axis",
            "set ici_expert_parallelism to 1 (FSDP then shards the experts), or train on one slice",
        )
    tensor = c.ici_tensor_parallelism
    refused_already = tensor * c.ici_expert_parallelism < 1 or c.trainer_devices % (tensor * c.ici_expert_parallelism)
    if not refused_already and chips % tensor:
        yield Problem(
            "ici_tensor_parallelism",
            f"{tensor} does not divide the {chips} chips of a slice; {_MULTISLICE} needs the trainer's devices per "
            "slice divisible by tensor parallelism",
            f"choose a tensor parallelism that divides {chips}",
        )


def _multislice_extra_axes(c: Any):
    """ICI and DCN axes given in extra_train_args that the multislice branch does not set (it sets ici_fsdp,
    ici_tensor and dcn_data) must be 1, and ici_fsdp_parallelism what the branch computes
    (model_creation_utils.py:717-721)."""
    tensor, chips = c.ici_tensor_parallelism, c.slice.chips
    fsdp = chips // tensor if tensor >= 1 and chips % tensor == 0 else 0  # 0: refused by the tensor rule
    for key, value in c.extra_train_args.items():
        axis = _AXIS_KEY.fullmatch(key)
        number = _integer(value)
        if not axis or number is None or key == "dcn_data_parallelism":
            continue
        if key == "ici_fsdp_parallelism" and tensor == 1:
            continue  # the branch checks it only with a tensor axis, and replaces it (:717-731)
        wanted = (-1, fsdp) if key == "ici_fsdp_parallelism" else (1,)
        if number not in wanted:
            yield Problem(
                "extra_train_args",
                f"sets {key}={value}; on {c.cluster_nodepool_count} slices {_MULTISLICE} shards each slice by FSDP x "
                "tensor and the slices by data parallelism",
                f"remove '{key}'" + (f" or set it to {fsdp}" if key == "ici_fsdp_parallelism" and fsdp else ""),
            )


def _integer(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _axes_divide(c: Any, side: str, kind: str, *fields: str, blame: int):
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


#: The MaxText release whose train_rl keys extra_train_args is checked against: the default image's (cloud_image_name,
#: tpu_post_training:0.2.4). Its key file ships with the package, written from the release's wheel by
#: scripts/maxtext_keys.py.
MAXTEXT_RELEASE = "0.2.4"


@cache
def maxtext_keys() -> dict[str, Any]:
    """MaxText's train_rl keys as shipped: ``keys`` (what its pyconfig accepts), ``nested`` (the fields of the
    models nested in its config, such as ``rl``), ``mappings`` (fields holding a free mapping) and ``defaults`` (the
    keys of the rl.yml it loads)."""
    return json.loads(resources.files("tpu_rl").joinpath(f"maxtext_keys_{MAXTEXT_RELEASE}.json").read_text())


@cache
def _maxtext_spellings() -> frozenset[str]:
    """Every key train_rl takes as written: the top-level keys, and ``outer.inner`` for a nested model's field."""
    known = maxtext_keys()
    dotted = {f"{outer}.{inner}" for outer, fields in known["nested"].items() for inner in fields}
    return frozenset(known["keys"]) | dotted


def is_maxtext_key(key: str) -> bool:
    """Whether MaxText's train_rl knows ``key``: a field of its config, ``outer.inner`` for a model nested in it
    (``rl.num_iterations``), or anything under a field holding a free mapping (``generation_configs.greedy.x``)."""
    return key in _maxtext_spellings() or any(key.startswith(f"{m}.") for m in maxtext_keys()["mappings"])


_RL_CONFIG = f"train_rl's config (MaxText {MAXTEXT_RELEASE}: configs/types.py RLConfig)"


def _flat_over(key: str) -> str:
    """The flat key MaxText copies over the nested ``key`` (``dataset.num_batches``: ``num_batches``), when rl.yml or
    the run sets it; else ''."""
    outer, _, inner = key.partition(".")
    given = inner in _OWN_TRAIN_KEYS or inner in maxtext_keys()["defaults"]
    return inner if given and inner in maxtext_keys()["nested"].get(outer, ()) else ""


@cache
def _suggestions() -> tuple[str, ...]:
    """The keys a fix may name: not a nested model as a whole (``dataset``), nor a nested key MaxText replaces."""
    return tuple(sorted(k for k in _maxtext_spellings() if k not in maxtext_keys()["nested"] and not _flat_over(k)))


def _closest_keys(key: str) -> list[str]:
    """The keys nearest ``key`` (difflib's ratio) that MaxText would use as given, the runners-up only when nearly
    as near as the nearest."""
    ratio = {k: difflib.SequenceMatcher(None, key, k).ratio() for k in difflib.get_close_matches(key, _suggestions())}
    return [k for k in ratio if ratio[k] >= max(ratio.values()) - 0.1]


def _validate_maxtext_keys(c: Any):
    """Each extra_train_args key is one MaxText's train_rl knows. Its pyconfig refuses any other top-level key when
    train_rl starts (MaxText 0.2.4 configs/pyconfig.py:271, "MAXTEXT CONFIG ERROR", exit code 2): on the TPU slice
    the run created, and again on every retry. An unknown key inside a nested model (rl.num_iteratons) it would
    drop without a word, and a nested key given flat as well (dataset.num_test_batches: rl.yml sets
    num_test_batches) it replaces by the flat one (configs/types.py:4585, map_flat_fields_to_nested_models)."""
    for key in sorted(map(str, c.extra_train_args)):
        if not is_maxtext_key(key):
            close = [repr(k) for k in _closest_keys(key)]
            fix = f"did you mean {_either(close)}?" if close else f"remove it, or use a key of {_RL_CONFIG}"
            yield Problem("extra_train_args", f"'{key}' is not a MaxText {MAXTEXT_RELEASE} setting", fix)
            continue
        flat = _flat_over(key)
        if flat:
            own = flat in _OWN_TRAIN_KEYS
            setter = "the run" if own else "MaxText's rl.yml"
            yield Problem(
                "extra_train_args",
                f"'{key}' is replaced by the flat '{flat}' that {setter} sets (MaxText {MAXTEXT_RELEASE} copies a "
                "flat key over the nested one)",
                f"set '{flat}' with its parameter" if own else f"set '{flat}' instead",
            )


#: The MaxText 0.2.4 keys that say what a run trains on (configs/base.yml, configs/post_train/rl.yml): a
#: Hugging Face split, which takes slices such as train[0:200], or the data files of a partition.
INTERVAL_DATA_KEYS = ("train_split", "hf_train_files")


#: MaxText 0.2.4's recipe for a Hub dataset other than its default (trainers/post_train/rl/scripts/
#: run_qwen3_30b_rl.sh): the training files and split, and the evaluation on the same dataset.
DATASET_RECIPE = (
    "hf_train_files=hf://datasets/nvidia/OpenMathInstruct-2/data/train_1M-*.parquet, "
    "train_split=train_1M, eval_dataset_name=nvidia/OpenMathInstruct-2"
)


def _validate_dataset(c: Any):
    """What train_rl (MaxText 0.2.4 get_dataset, prepare_datasets) does with the dataset keys: without files it
    loads ``dataset_name`` with ``hf_subset`` ('main' in rl.yml, GSM8K's config; OpenMathInstruct-2 has only
    'default': "BuilderConfig 'main' not found"), and it evaluates on ``eval_dataset_name`` (GSM8K unless set);
    with files, the split is the name of a parquet split, which refuses a slice such as train[0:200]."""
    data = {**c.extra_train_args, **c.interval_data}
    if c.dataset_name and c.dataset_name != MAXTEXT_DEFAULT_DATASET:
        reasons = []
        if not data.get("hf_train_files") and "hf_subset" not in data:
            reasons.append(
                f"{c.dataset_name} alone is loaded with MaxText's hf_subset 'main' (GSM8K's config, which "
                "another dataset may not have: OpenMathInstruct-2 has only 'default')"
            )
        if c.evaluation_batches and "eval_dataset_name" not in data:
            reasons.append(f"the model would be evaluated on {MAXTEXT_DEFAULT_DATASET}, MaxText's eval_dataset_name")
        if reasons:
            yield Problem(
                "dataset_name",
                "; ".join(reasons),
                "set extra_train_args (or interval_data) as MaxText's run_qwen3_30b_rl.sh does: "
                f"{DATASET_RECIPE} "
                "(or give the dataset's hf_subset, and eval_dataset_name to evaluate on another set)",
            )
    split = data.get("train_split")
    if data.get("hf_train_files") and isinstance(split, str) and "[" in split:
        yield Problem(
            "interval_data" if "train_split" in c.interval_data else "extra_train_args",
            f"train_split '{split}' is a slice, and with hf_train_files it names a parquet split, which refuses slices",
            "slice with train_split alone (a Hub split), or pick the interval's files with hf_train_files",
        )


def validate_training_rows(c: Any):
    """The prompts the Hub split instruction gives train_rl: none (``datasets`` raises "corresponds to no data!")
    or fewer than the run plans (it trains fewer steps) is refused; a split the package knows no size of is
    not checked (``data_resolution`` says so). Runs again on each interval's rendered instruction."""
    known = hub_datasets.training_data(c)
    if known is None:
        return
    instruction, subset, rows = known
    field = "interval_data" if "train_split" in c.interval_data else "extra_train_args"
    sizes = ", ".join(f"{name} {count:,}" for name, count in rows.items())
    split = f"{c.effective_dataset} ({subset}: {sizes})"
    try:
        selected = hub_datasets.selected_rows(instruction, rows)
    except ValueError as error:
        yield Problem(
            field, f"train_split '{instruction}' of {split}: {str(error).rstrip('.')}", "use one of its splits"
        )
        return
    trained, needed = hub_datasets.trained_rows(c, selected), prompts_needed(c)
    fix = (
        "this interval is past the end of the data: end the program before it (its end_date), or give it more "
        "data (another split or dataset)"
        if c.interval_data
        else f"select at least {hub_datasets.rows_for(c, needed)} rows"
    )
    if selected == 0:
        yield Problem(
            field,
            f"train_split '{instruction}' selects no row of {split}: Hugging Face refuses it "
            '("corresponds to no data!") once the model is loaded on the slice',
            fix,
        )
    elif trained < needed:
        held = " after the 5% train_rl holds out to evaluate" if trained < selected else ""
        yield Problem(
            field,
            f"train_split '{instruction}' gives {trained} prompts{held} of {split}, fewer than the {needed} the run "
            f"plans (num_batches x batch_size): MaxText would train {trained // c.batch_size} batches, not "
            f"{c.num_batches}, and end before the planned final step",
            fix,
        )


def prompts_needed(c: Any) -> int:
    """The prompts train_rl takes for its planned steps: num_batches x batch_size x train_fraction (MaxText 0.2.4
    train_rl.prepare_datasets' dataset_size)."""
    return int(c.num_batches * c.batch_size * float(c.extra_train_args.get("train_fraction", 1.0)))


def _validate_interval_data(c: Any):
    """The per-interval data keys: known keys, templates with known fields, enough examples per interval."""
    for key, template in c.interval_data.items():
        if key not in INTERVAL_DATA_KEYS:
            yield Problem("interval_data", f"'{key}' is not a data key", f"use {' or '.join(INTERVAL_DATA_KEYS)}")
            continue
        if key in c.extra_train_args:
            yield Problem("interval_data", f"'{key}' is also in extra_train_args", f"set '{key}' in one of them")
        if not isinstance(template, str):
            yield Problem("interval_data", f"'{key}' must be a string template", 'e.g. "train[{first}:{stop}]"')
            continue
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as error:
            yield Problem("interval_data", f"'{key}': {error}", "write fields as {ds}, and braces as {{ }}")
            continue
        unknown = sorted(names - set(INTERVAL_FIELDS))
        if unknown:
            yield Problem(
                "interval_data",
                f"'{key}' uses unknown field(s) {unknown}",
                f"use {', '.join('{' + f + '}' for f in INTERVAL_FIELDS)}",
            )
        if names & {"first", "stop"} and not c.examples_per_interval:
            yield Problem(
                "examples_per_interval",
                f"is 0, and interval_data '{key}' uses {{first}}/{{stop}}",
                f"set it to the prompts each interval trains on (at least {c.num_batches * c.batch_size})",
            )
    needed = prompts_needed(c)
    trained = hub_datasets.trained_rows(c, c.examples_per_interval)
    if 0 < c.examples_per_interval and trained < needed:
        left = f" ({trained} once train_rl holds 5% out to evaluate on)" if trained < c.examples_per_interval else ""
        yield Problem(
            "examples_per_interval",
            f"{c.examples_per_interval} prompts{left} are fewer than num_batches x batch_size = "
            f"{needed} (MaxText would train fewer steps than planned, and end before the planned final step)",
            f"set it to at least {hub_datasets.rows_for(c, needed)}, or lower num_batches",
        )


def _validate_notification(c: Any):
    """A notification needs both its connection and its recipients."""
    if c.notify_conn_id.strip() and not c.notify_to.strip():
        yield Problem(
            "notify_to",
            "is empty, so the summary sent through notify_conn_id has no recipient",
            "give one or more addresses separated by commas, or clear notify_conn_id",
        )
    elif c.notify_to.strip() and not c.notify_conn_id.strip():
        yield Problem(
            "notify_conn_id",
            "is empty, so nothing sends the summary to notify_to",
            "name an SMTP connection, or clear notify_to",
        )


#: extra_train_args keys that change the planned steps, their type and bounds (MaxText 0.2.4 configs/types.py:
#: RL.num_iterations ge=1, RLDataset.train_fraction gt=0 le=1, RLConfig.num_epoch ge=1).
_STEP_KEYS = {
    "num_iterations": (int, 1, None),
    "rl.num_iterations": (int, 1, None),
    "train_fraction": (float, 0.0, 1.0),
    "num_epoch": (int, 1, None),
}


def _validate_planned_steps(c: Any):
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
        yield Problem(
            "extra_train_args",
            "num_batches x iterations x train_fraction x num_epoch plans no step",
            "raise train_fraction or num_batches",
        )


def _validate_evaluation(c: Any):
    """The quality gate needs the trainer's evaluation (the bounds of the percentage and the price are checked
    with every field's, in _validate_required)."""
    batches = c.extra_train_args.get("num_test_batches", MAXTEXT_DEFAULT_TEST_BATCHES)
    if isinstance(batches, bool) or not str(batches).isdigit():
        yield Problem(
            "extra_train_args",
            f"num_test_batches is {batches!r}, not a whole number of batches",
            "give num_test_batches as an integer >= 0 (0: no evaluation)",
        )
    elif int(batches) == 0 and c.has_quality_gate:
        gate = [name for name in ("min_post_accuracy", "require_no_regression") if getattr(c, name)]
        yield Problem(
            gate[0],
            "is a quality gate on the trainer's evaluation, but extra_train_args sets "
            "num_test_batches to 0 (no evaluation)",
            f"remove num_test_batches from extra_train_args (MaxText's default is "
            f"{MAXTEXT_DEFAULT_TEST_BATCHES}) or clear {' and '.join(gate)}",
        )


def _candidate_slice(c: Any, candidate: Candidate, name: Callable[[str], str]):
    """One candidate's capacity type must offer the slice's generation, and its zone the generation and the type."""
    kind = CAPACITY.get(candidate.capacity_type)
    if kind and c.slice.generation.name in kind.unsupported_generations:
        generation = c.slice.generation.name
        others = [n for n, t in CAPACITY.items() if generation not in t.unsupported_generations]
        offered = [g for g in GENERATIONS if g not in kind.unsupported_generations]
        yield Problem(
            name("capacity_type"),
            f"{kind.name} does not offer TPU {generation}",
            f"use {_either(others)}, or a {_either(offered)} slice",
        )
    yield from _validate_tpu_zone(c, candidate, kind, name)


def _validate_tpu_zone(c: Any, candidate: Candidate, kind: Any, name: Callable[[str], str]):
    """The zone of the TPU pools the run creates must offer the slice's generation (tpu_rl.tpu: Cloud TPU "TPU
    regions and zones"), and, for a capacity type GKE offers in fewer zones (flex-start), the type too: GKE refuses
    the pool ('Invalid machine type "ct6e-standard-4t" in zone "us-east5-c": GCE_NOT_FOUND') after the cluster and
    the bucket exist. An existing pool is where it is."""
    zone = candidate.zone
    if c.uses_existing_tpu_pools or not zone or not zone.startswith(f"{c.region}-"):
        return  # a zone outside the region is refused on its own
    generation = c.slice.generation
    if zone not in generation.zones:
        here = [g.name for g in GENERATIONS.values() if zone in g.zones]
        yield Problem(
            name("zone"),
            f"TPU {generation.name} is not offered in {zone}",
            f"use a zone that offers it ({_either(list(generation.zones))}) with its region"
            + (f", or a {_either(here)} slice" if here else ""),
        )
        return
    offered = (kind.zones or {}).get(generation.name) if kind else None
    if offered is not None and zone not in offered:
        yield Problem(
            name("zone"),
            f"{kind.name} does not offer TPU {generation.name} in {zone}",
            f'use {_either(list(offered))} (GKE "About flex-start") with its region, or another '
            f"{name('capacity_type')}",
        )


def _either(names: list[str]) -> str:
    """``a, b or c``."""
    return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)
