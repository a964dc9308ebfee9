"""The three MaxText command lines of the tutorial, as argument lists built from the config.

The Hugging Face token is never an argument: MaxText 0.2.4 reads ``HF_TOKEN`` from the environment
when ``hf_access_token`` is not given (``maxtext/configs/pyconfig.py``), and the pods get it from a Secret.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from tpu_rl.config import RunConfig
from tpu_rl.config_rules import ships_generation_config
from tpu_rl.layout import GcsLayout

TO_MAXTEXT = "maxtext.checkpoint_conversion.to_maxtext"
TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"
TO_HUGGINGFACE = "maxtext.checkpoint_conversion.to_huggingface"


@dataclass(frozen=True)
class MaxTextCommand:
    module: str
    #: ``key=value`` config overrides, parsed by MaxText's pyconfig.
    config: tuple[tuple[str, str], ...]
    #: ``--flag=value`` arguments of the module's own argument parser.
    flags: tuple[tuple[str, str], ...] = ()
    #: Shell words run before python (environment set-up).
    preamble: str = ""
    env_prefix: tuple[tuple[str, str], ...] = ()
    #: A command run after the module succeeded (``&&``), e.g. :func:`copy_generation_config`'s.
    then: str = ""

    def words(self) -> list[str]:
        env = [f"{k}={v}" for k, v in self.env_prefix]
        args = [f"{k}={v}" for k, v in self.config] + [f"--{k}={v}" for k, v in self.flags]
        return [*env, "python3", "-m", self.module, *args]

    def script(self, only_index_zero: bool = False) -> str:
        """The bash script of the container; ``only_index_zero`` lets the other hosts of a slice exit at once."""
        line = " ".join(_quote_word(word) for word in self.words())
        if self.then:
            line = f"{line} && {self.then}"
        if only_index_zero:
            # Braced when a command follows, so that the other hosts skip both.
            line = '[ "$JOB_COMPLETION_INDEX" != "0" ] || ' + (f"{{ {line}; }}" if self.then else line)
        return f"{self.preamble}{line}"


def _quote_word(word: str) -> str:
    """Quotes only the value of ``key=value`` and ``--key=value``, so scripts read like the tutorial's."""
    key, sep, value = word.partition("=")
    if sep and key.lstrip("-").replace(".", "_").isidentifier():
        return f"{key}={_quote(value)}"
    return _quote(word)


def _quote(text: str) -> str:
    """shlex.quote, but double quotes for values with single quotes and nothing the shell expands in them."""
    if "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


def _flag(value: bool) -> str:
    return "True" if value else "False"


def to_maxtext(config: RunConfig, layout: GcsLayout) -> MaxTextCommand:
    return MaxTextCommand(
        TO_MAXTEXT,
        config=(
            ("model_name", config.model_name),
            ("base_output_directory", layout.uri(layout.converted_prefix)),
            ("scan_layers", _flag(config.scan_layers)),
            ("use_multimodal", "False"),
            ("skip_jax_distributed_system", "true"),
            ("checkpoint_storage_use_zarr3", "0"),
            ("checkpoint_storage_use_ocdbt", "0"),
            ("hardware", "cpu"),
        ),
        flags=(("hf_model_path", config.hf_model_path), ("lazy_load_tensors", "True")),
    )


def vllm_additional_config(config: RunConfig) -> str:
    maxtext_config = {
        "model_name": config.model_name,
        "allow_split_physical_axes": str(config.allow_split_physical_axes).lower(),
        "use_ragged_sort": "false",
        "ragged_gather_reduce_fallback": str(config.ragged_gather_reduce_fallback).lower(),
        "prefuse_moe_weights": "true",
        "weight_dtype": "bfloat16",
    }
    return str({"maxtext_config": maxtext_config})


def train_rl(config: RunConfig, layout: GcsLayout) -> MaxTextCommand:
    pairs = [
        ("run_name", config.run_name),
        ("base_output_directory", layout.uri(layout.training_prefix)),
        ("model_name", config.model_name),
        ("load_parameters_path", layout.uri(layout.converted_items_prefix)),
        ("data_template_path", config.data_template_path),
        ("reshard_chunk_size", str(config.reshard_chunk_size)),
        ("num_batches", str(config.num_batches)),
        ("batch_size", str(config.batch_size)),
        ("rollout_tensor_parallelism", str(config.rollout_tensor_parallelism)),
        ("rollout_expert_parallelism", str(config.rollout_expert_parallelism)),
        ("trainer_devices_fraction", f"{config.trainer_devices_fraction:g}"),
        ("sampler_devices_fraction", f"{config.sampler_devices_fraction:g}"),
        ("tokenizer_path", config.tokenizer_path),
        ("ici_tensor_parallelism", str(config.ici_tensor_parallelism)),
        ("ici_expert_parallelism", str(config.ici_expert_parallelism)),
        ("hbm_utilization_vllm", f"{config.hbm_utilization_vllm:g}"),
        ("remat_policy", config.remat_policy),
        ("async_scheduling", _flag(config.async_scheduling)),
        ("allow_split_physical_axes", _flag(config.allow_split_physical_axes)),
        ("ragged_gather_reduce_fallback", _flag(config.ragged_gather_reduce_fallback)),
        ("vllm_hf_overrides", '{architectures: ["MaxTextForCausalLM"]}'),
        ("vllm_additional_config", vllm_additional_config(config)),
        ("scan_layers", _flag(config.scan_layers)),
        ("checkpoint_period", str(config.checkpoint_period)),
    ]
    if config.dataset_name:
        pairs.append(("dataset_name", config.dataset_name))
    pairs += _slice_pairs(config)
    pairs += [(key, _value(value)) for key, value in config.extra_train_args.items()]
    return MaxTextCommand(
        TRAIN_RL,
        config=tuple(pairs),
        preamble="export VLLM_HOST_IP=$(hostname -I | awk '{print $1}'); ",
        env_prefix=(("JAX_PLATFORMS", "proxy,cpu"), ("ENABLE_PATHWAYS_PERSISTENCE", "1")),
    )


def _slice_pairs(config: RunConfig) -> list[tuple[str, str]]:
    """On several slices, the slices of each role, which send train_rl down MaxText 0.2.4's multislice branch
    (utils/model_creation_utils.py:691-745: whole slices per role, ``num_slices`` and ``dcn_data_parallelism`` set
    from them, a slice sharded FSDP x tensor). One slice keeps MaxText's default -1 and its single-slice branch
    (:671-689), which splits the slice's chips by the device fractions."""
    if not config.multislice:
        return []
    return [
        ("num_trainer_slices", str(int(config.trainer_slices))),
        ("num_samplers_slices", str(int(config.sampler_slices))),
    ]


def to_huggingface(config: RunConfig, layout: GcsLayout, step: int, attempt_prefix: str) -> MaxTextCommand:
    """``--hf_model_path`` ships the tokenizer of the model that was trained (the converter's default for
    qwen3-30b-a3b is the Thinking variant), instead of the tutorial's ``--override_model_architecture``. Then the
    model's ``generation_config.json``, which the converter does not write, is copied beside it."""
    return MaxTextCommand(
        TO_HUGGINGFACE,
        config=(
            ("model_name", config.model_name),
            ("load_parameters_path", layout.uri(layout.model_params_prefix(step))),
            ("base_output_directory", layout.uri(attempt_prefix)),
            ("skip_jax_distributed_system", "true"),
            ("hardware", "cpu"),
            ("scan_layers", _flag(config.scan_layers)),
            ("use_multimodal", "False"),
            ("weight_dtype", "bfloat16"),
        ),
        flags=(("hf_model_path", config.hf_model_path),),
        then=copy_generation_config(config.hf_model_path, layout.uri(attempt_prefix)),
    )


#: The Hugging Face file that carries a model's sampling defaults (an Instruct model's temperature, top_p, top_k),
#: which MaxText 0.2.4's to_huggingface does not write: ``checkpoint_conversion/utils/utils.py``
#: ``save_model_files`` (line 623) saves the tokenizer's files, ``config.json`` and the shards, nothing else.
GENERATION_CONFIG = "generation_config.json"


def export_files_beyond_the_converters(config: RunConfig) -> list[str]:
    """The files the run's export must hold besides what MaxText's converter writes: the model's
    :data:`GENERATION_CONFIG` when its repository has one (``verify_export`` and ``prune_checkpoints`` both ask)."""
    return [GENERATION_CONFIG] if ships_generation_config(config.hf_model_path) else []


#: The container's environment variable that holds :data:`COPY_GENERATION_CONFIG_PROGRAM` (the script stays short).
COPY_GENERATION_CONFIG_ENV = "TPU_RL_COPY_GENERATION_CONFIG"

#: Run in the export's container after the conversion, with the repository and the export folder as arguments:
#: copies the repository's generation_config.json (its main revision, as the conversions download it) into the
#: folder, through the image's huggingface_hub (which reads HF_TOKEN from the environment) and google-cloud-storage
#: (MaxText 0.2.4's dependencies: huggingface-hub>=1.27, whose RemoteEntryNotFoundError is the Hub's 404 for the file).
#: A repository without one leaves the export without one, and says so; any other failure (the network, the token)
#: fails the export's pod, and the export is tried again.
COPY_GENERATION_CONFIG_PROGRAM = f"""\
import sys
from google.cloud import storage
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import RemoteEntryNotFoundError

repo, folder = sys.argv[1], sys.argv[2]
try:
    path = hf_hub_download(repo, "{GENERATION_CONFIG}")
except RemoteEntryNotFoundError:
    print(f"{{repo}} has no {GENERATION_CONFIG}: the export has none")
    sys.exit(0)
bucket, _, prefix = folder.removeprefix("gs://").partition("/")
blob = storage.Client().bucket(bucket).blob(prefix + "{GENERATION_CONFIG}")
blob.upload_from_filename(path, content_type="application/json")
print(f"Copied {GENERATION_CONFIG} of {{repo}} to {{folder}}")
"""


def copy_generation_config(repo: str, folder_uri: str) -> str:
    """The shell command that runs :data:`COPY_GENERATION_CONFIG_PROGRAM` from its environment variable."""
    return f'python3 -c "${COPY_GENERATION_CONFIG_ENV}" {_quote(repo)} {_quote(folder_uri)}'


def _value(value: object) -> str:
    return _flag(value) if isinstance(value, bool) else str(value)
