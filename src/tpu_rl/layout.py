"""Where each stage of a run reads and writes in Cloud Storage, and what a training must keep across attempts.

Pure functions of the validated config and the run's identity (``tpu_rl.run``): a retried or cleared task
finds what an earlier try of the same run wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_rl.checkpoints import SET_ASIDE_FOLDER
from tpu_rl.config import RunConfig
from tpu_rl.run import RunIdentity, slug

#: Name of the lock object next to the converted checkpoint's step folder (Orbax ignores non-step names).
CONVERSION_LOCK_NAME = "_tpu_rl_conversion.lock"


def conversion_id(config: RunConfig) -> str:
    """The folder of a converted base checkpoint: the same for every run of the same model and settings."""
    scan = "scanned" if config.scan_layers else "unscanned"
    return f"{slug(config.hf_model_path.split('/')[-1])}-{scan}"


def converted_prefix(config: RunConfig) -> str:
    return f"{config.model_name}/max-text-format/{conversion_id(config)}/"


#: The MaxText settings that decide which prompts a training step reads, and in what order: the split or its slice
#: (``train_split``), the files (``hf_train_files``), the dataset's configuration (``hf_subset``), the shuffle
#: (``data_shuffle_seed``) and the length filter that drops prompts (``max_prefill_predict_length``; MaxText
#: 0.2.4 ``configs/rl.yml`` and its input pipeline). A resume fast-forwards the data by steps: under other values
#: it would train on other prompts than the steps before it.
TRAINING_DATA_KEYS = ("train_split", "hf_train_files", "hf_subset", "data_shuffle_seed", "max_prefill_predict_length")


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
        **(
            {"interval_data": {k: config.extra_train_args[k] for k in config.interval_data}}
            if config.interval_data
            else {}
        ),
        # The data settings given in extra_train_args (a record written before 2.4.0 lacks them: see
        # checkpoints.training_record_changes).
        "training_data": _training_data(config),
    }


def _training_data(config: RunConfig) -> dict[str, Any]:
    """The :data:`TRAINING_DATA_KEYS` the run sets in extra_train_args, but for the interval's (recorded apart)."""
    return {
        key: config.extra_train_args[key]
        for key in TRAINING_DATA_KEYS
        if key in config.extra_train_args and key not in config.interval_data
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
    def checkpoints_prefix(self) -> str:
        """The run's checkpoint folders: ``actor/`` (Orbax's steps) and the steps set aside."""
        return f"{self.training_prefix}{self.config.run_name}/checkpoints/"

    @property
    def actor_checkpoints_prefix(self) -> str:
        return f"{self.checkpoints_prefix}actor/"

    @property
    def set_aside_prefix(self) -> str:
        """Where half-written or broken step folders go before a resume: beside ``actor/``, outside Orbax's view."""
        return f"{self.checkpoints_prefix}{SET_ASIDE_FOLDER}/"

    @property
    def tensorboard_prefix(self) -> str:
        """Where train_rl writes its TensorBoard event files: ``<base_output_directory>/<run_name>/tensorboard/``
        (MaxText 0.2.4, docs/reference/training-metrics.md)."""
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
