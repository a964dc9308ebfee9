"""Identity of one DAG run: the names and Cloud Storage paths that every stage of it derives.

Everything here is a pure function of (dag_id, run_id) and the validated config, so a retried or
cleared task finds what an earlier try of the same run created, and two runs never share outputs. A run
of a recurring program (scheduled or backfilled) is keyed by its data interval instead of its run id:
whichever run trains an interval finds that interval's checkpoints, and no other interval's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpu_rl.checkpoints import SET_ASIDE_FOLDER

# The label keys that tie cloud and Kubernetes objects to the run that created them; imported from here too.
from tpu_rl.vocabulary import (  # noqa: F401 (GKE_LABEL_RUN_KEY)
    ANNOTATION_DAG_ID,
    ANNOTATION_RUN_ID,
    GKE_LABEL_RUN_KEY,
    LABEL_DAG_ID,
    LABEL_RUN_KEY,
)

if TYPE_CHECKING:
    from tpu_rl.config import RunConfig

#: The DAG's id; the plan derives the same names as a run of it.
DAG_ID = "maxtext_rl_tpu"
#: The reaper of what dead runs left (dags/maxtext_rl_tpu_reaper.py).
REAPER_DAG_ID = "maxtext_rl_tpu_reaper"

#: Workload stages and the short word each contributes to its JobSet name.
STAGE_WORDS = {"hf_to_maxtext": "hf2mt", "train": "train", "maxtext_to_hf": "mt2hf"}
#: Hex digits of a run key.
RUN_KEY_LENGTH = 8


def slug(text: str) -> str:
    """Lowercase letters, digits and single dashes: safe in object names and GCS paths."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


@dataclass(frozen=True)
class RunIdentity:
    """A DAG run; ``interval``: the start of its data interval (ISO 8601) when its outputs are the interval's."""

    dag_id: str
    run_id: str
    interval: str | None = None

    @property
    def key(self) -> str:
        """Eight hex digits, stable for the run: short enough for every Kubernetes and GKE name."""
        name = f"interval {self.interval}" if self.interval else self.run_id
        return hashlib.sha256(f"{self.dag_id}\n{name}".encode()).hexdigest()[:RUN_KEY_LENGTH]

    @property
    def slug(self) -> str:
        """Readable and unique folder name for the run's outputs."""
        name = f"interval-{self.interval[:10]}" if self.interval else self.run_id
        return f"{slug(name)[:60]}-{self.key}"

    def labels(self) -> dict[str, str]:
        return {LABEL_RUN_KEY: self.key, LABEL_DAG_ID: slug(self.dag_id)[:63]}

    def annotations(self) -> dict[str, str]:
        """The run's full identity, which labels (slugs) cannot hold: the reaper asks Airflow about it."""
        return {ANNOTATION_DAG_ID: self.dag_id, ANNOTATION_RUN_ID: self.run_id}

    def jobset_name(self, prefix: str, stage: str) -> str:
        return f"{prefix}-{STAGE_WORDS[stage]}-{self.key}"

    @staticmethod
    def longest_jobset_name(prefix: str) -> str:
        """The longest name :meth:`jobset_name` gives any run and stage with this prefix."""
        return max((f"{prefix}-{word}-{'0' * RUN_KEY_LENGTH}" for word in STAGE_WORDS.values()), key=len)

    def secret_name(self) -> str:
        return f"tpu-rl-hf-token-{self.key}"

    def tpu_pool_name(self, slice_index: int) -> str:
        return f"tpu-{self.key}-{slice_index}"


#: The fields an ``interval_data`` template may use (see :meth:`DataInterval.template_values`).
INTERVAL_FIELDS = ("ds", "ds_nodash", "start", "end", "index", "first", "stop")


@dataclass(frozen=True)
class DataInterval:
    """The data interval a scheduled or backfilled run trains on; ``index``: intervals since the program's
    start date (0 for the first)."""

    start: datetime
    end: datetime
    index: int

    def template_values(self, examples_per_interval: int) -> dict[str, Any]:
        return {
            "ds": self.start.strftime("%Y-%m-%d"),
            "ds_nodash": self.start.strftime("%Y%m%d"),
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "index": self.index,
            "first": self.index * examples_per_interval,
            "stop": (self.index + 1) * examples_per_interval,
        }


#: Name of the lock object next to the converted checkpoint's step folder (Orbax ignores non-step names).
CONVERSION_LOCK_NAME = "_tpu_rl_conversion.lock"


def conversion_id(config: RunConfig) -> str:
    """The folder of a converted base checkpoint: the same for every run of the same model and settings."""
    scan = "scanned" if config.scan_layers else "unscanned"
    return f"{slug(config.hf_model_path.split('/')[-1])}-{scan}"


def converted_prefix(config: RunConfig) -> str:
    return f"{config.model_name}/max-text-format/{conversion_id(config)}/"


def training_record(config: RunConfig) -> dict[str, Any]:
    """The parameters a training run must keep across all its attempts, as plain JSON values.

    ``train_rl`` resumes from the run's latest checkpoint and fast-forwards the data; a change in any of
    these under the same run corrupts it silently. Both the ``check_training_record`` task and every
    submission of ``train_rl`` compare them with the record stored next to the checkpoints.
    """
    return {
        "model_name": config.model_name,
        "load_parameters_path": f"{converted_prefix(config)}0/items/",
        "num_batches": config.num_batches,
        "batch_size": config.batch_size,
        "dataset": config.effective_dataset,
        "data_template_path": config.data_template_path,
        "train_steps": config.train_steps,
        # What the run's interval trains on (only programs have it; older records do not).
        **({"interval_data": {k: config.extra_train_args[k] for k in config.interval_data}} if config.interval_data else {}),
    }


@dataclass(frozen=True)
class GcsLayout:
    """Where each stage reads and writes, under ``gs://<bucket>/<model_name>/``.

    The converted base checkpoint is keyed by the conversion settings, not by the run, so runs of the
    same model and conversion share it; training and export outputs are per run.
    """

    config: RunConfig
    run: RunIdentity

    @property
    def bucket(self) -> str:
        return self.config.gcs_bucket

    def _model_prefix(self) -> str:
        return self.config.model_name

    @property
    def conversion_id(self) -> str:
        return conversion_id(self.config)

    @property
    def converted_prefix(self) -> str:
        """Object prefix of the MaxText base checkpoint (``to_maxtext``'s base_output_directory)."""
        return converted_prefix(self.config)

    @property
    def converted_step_prefix(self) -> str:
        """The step folder the conversion writes and every run checks: ``.../0/``."""
        return f"{self.converted_prefix}0/"

    @property
    def converted_items_prefix(self) -> str:
        return f"{self.converted_step_prefix}items/"

    @property
    def conversion_lock_object(self) -> str:
        """The cross-run lock on the shared conversion: at most one run converts into ``converted_prefix``."""
        return f"{self.converted_prefix}{CONVERSION_LOCK_NAME}"

    @property
    def training_prefix(self) -> str:
        """``train_rl``'s base_output_directory: one folder per run, so a retry resumes its own run."""
        return f"{self._model_prefix()}/trained/{self.run.slug}/"

    @property
    def actor_checkpoints_prefix(self) -> str:
        return f"{self.training_prefix}{self.config.run_name}/checkpoints/actor/"

    @property
    def set_aside_prefix(self) -> str:
        """Where half-written or broken step folders go before a resume: beside ``actor/``, outside Orbax's view."""
        return f"{self.training_prefix}{self.config.run_name}/checkpoints/{SET_ASIDE_FOLDER}/"

    @property
    def tensorboard_prefix(self) -> str:
        """Where train_rl writes its TensorBoard event files: ``<base_output_directory>/<run_name>/tensorboard/``
        (MaxText 0.2.4, docs/training-metrics.md)."""
        return f"{self.training_prefix}{self.config.run_name}/tensorboard/"

    @property
    def training_record_object(self) -> str:
        """The record of the parameters the run trains with, checked before every resume."""
        return f"{self.training_prefix}{self.config.run_name}/tpu_rl_training_record.json"

    def model_params_prefix(self, step: int) -> str:
        return f"{self.actor_checkpoints_prefix}{step}/model_params/"

    def export_attempt_prefix(self, try_number: int) -> str:
        """Each export attempt writes to a fresh prefix; only a verified one is published."""
        return f"{self._model_prefix()}/hf-staging/{self.run.slug}/attempt-{try_number}/"

    @property
    def export_prefix(self) -> str:
        """The published Hugging Face model of the run."""
        return f"{self._model_prefix()}/hf-trained/{self.run.slug}/"

    @property
    def pathways_scratch_prefix(self) -> str:
        return f"pathways/{self.run.slug}/"

    def uri(self, prefix: str) -> str:
        return f"gs://{self.bucket}/{prefix}"
