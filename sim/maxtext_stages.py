"""The three MaxText stages the simulation emulates (part of the simulation, never imported by plugins/): which
stage a container runs, and what that stage writes to the GCS emulator (/work/shared/reference/maxtext.md), with
the faults asked for. sim/maxtext_outputs.py writes it in the real layouts.

Stage contract (arguments read, `key=value` and `--flag=value`):
  to_maxtext      base_output_directory (required), scan_layers, checkpoint_storage_use_ocdbt/_zarr3,
                  model_name  ->  <base>/0/{items/, _CHECKPOINT_METADATA, commit_success.txt}
  train_rl        base_output_directory, run_name (required), num_batches (4), rl.num_iterations (1) or a
                  flat num_iterations, train_fraction (1.0), num_epoch (1),
                  checkpoint_period (50), max_num_checkpoints_to_keep (10), num_test_batches (5),
                  batch_size (1), load_parameters_path (must exist when given), the data keys
                  (sim/maxtext_data.py: a split instruction past its split ends the training early or fails
                  it, as Hugging Face datasets does); a key MaxText 0.2.4 does not
                  know fails it first, with MaxText's "MAXTEXT CONFIG ERROR" and exit code 2; then the
                  device split of the Pathways slices (num_trainer_slices, num_samplers_slices, the device
                  fractions, ici_*/dcn_*_parallelism: sim/maxtext_devices.py) fails it where MaxText fails
                  ->  <base>/<run>/checkpoints/actor/<step>/{model_params/, optimizer_state/, ...}
                      and one event file per attempt in <base>/<run>/tensorboard/ (MaxText's tags, one
                      scalar per trained step: docs/reference/training-metrics.md); resumes after the last
                      committed step like the real trainer; logs the Pre/Post RL Training evaluation
                      lines unless num_test_batches=0
  to_huggingface  base_output_directory (required), load_parameters_path (must exist when given),
                  weight_dtype (float32), --hf_model_path, model_name
                  ->  tokenizer files, config.json, model-0000i-of-00004.safetensors, index last; no
                      generation_config.json (MaxText 0.2.4 checkpoint_conversion/utils/utils.py save_model_files)
                  then, when the script goes on with the package's copy (`&& python3 -c "$TPU_RL_COPY_GENERATION_CONFIG"
                  <repo> <folder>`, the program in the container's environment), the repository's
                  generation_config.json into the folder, when the repository has one
A missing input (load_parameters_path with no objects) or a missing bucket fails the pod (exit code 1).

Each stage is called as ``stage(client, args, flags, faults)`` (train_rl also with the pod's run seconds) and
returns (the lines it logs, the :class:`~sim.maxtext_outputs.Bucket` it wrote), or raises
:class:`~sim.maxtext_outputs.PodFailure` (the process fails) or :class:`~sim.maxtext_outputs.PodHangs` (it never
ends: the ``hang-before-first-step`` and ``stall-at-step=N`` faults of train_rl).
"""

import json
import random
import shlex
import struct
import time
from functools import cache
from pathlib import Path

from .maxtext_data import load_data
from .maxtext_devices import device_split
from .maxtext_outputs import (
    LEAVES,
    Bucket,
    PodFailure,
    PodHangs,
    committed_steps,
    evaluation_line,
    growing_event_file,
    put_event_file,
    require_input,
    safetensors_file,
    training_scalars,
    write_step,
)

STAGES = {
    "maxtext.checkpoint_conversion.to_maxtext": "to_maxtext",
    "maxtext.trainers.post_train.rl.train_rl": "train_rl",
    "maxtext.checkpoint_conversion.to_huggingface": "to_huggingface",
}
HF_IDS = {"qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B-Thinking-2507"}  # MaxText's default tokenizer per model

#: The generation_config.json of the Hugging Face repositories the simulation converts, lower-cased names
#: (https://huggingface.co/<repo>/blob/main/generation_config.json; the sampling their model cards recommend). The Hub
#: answers 404 for a repository not listed here: huggingface_hub's RemoteEntryNotFoundError, after which the
#: package's copy writes nothing.
HF_GENERATION_CONFIGS = {
    "qwen/qwen3-30b-a3b-instruct-2507": {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    },
    "qwen/qwen3-30b-a3b-thinking-2507": {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    },
}
#: The environment variable the package's export script runs its copy of generation_config.json from
#: (src/tpu_rl/maxtext.py COPY_GENERATION_CONFIG_ENV).
COPY_GENERATION_CONFIG_ENV = "TPU_RL_COPY_GENERATION_CONFIG"


# ---------------------------------------------------------------- command parsing


def parse_invocation(command):
    """Finds `python3 -m maxtext.<module> args...` in a container command. Returns (stage, args, flags)."""
    parts = list(command or [])
    script = parts[2] if parts[:2] == ["/bin/bash", "-c"] and len(parts) > 2 else " ".join(map(shlex.quote, parts))
    lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=";&|()\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    tokens = list(lexer)
    for i, tok in enumerate(tokens[:-1]):
        if tok == "-m" and tokens[i + 1] in STAGES:
            args, flags = {}, {}
            for arg in tokens[i + 2 :]:
                if set(arg) <= set(";&|()\n"):
                    break
                if arg.startswith("--"):
                    key, _, value = arg[2:].partition("=")
                    flags[key] = value if _ else True
                elif "=" in arg:
                    key, _, value = arg.partition("=")
                    args[key] = value
            return STAGES[tokens[i + 1]], args, flags
    return None, {}, {}


#: The config keys MaxText 0.2.4's train_rl accepts: the package's data file (scripts/maxtext_keys.py writes it
#: from the release's wheel), read from the checkout the simulation runs from.
MAXTEXT_KEYS = Path(__file__).resolve().parents[1] / "src" / "tpu_rl" / "maxtext_keys_0.2.4.json"


@cache
def train_rl_keys():
    return json.loads(MAXTEXT_KEYS.read_text())["keys"]


def check_config_keys(args):
    """Refuses an unknown key as MaxText 0.2.4's pyconfig does, before a model or a dataset is loaded. OmegaConf
    makes a dotted override a nested mapping, so the part before the first dot is checked (configs/pyconfig.py:254
    _prepare_for_pydantic, :270 the warning, :271 the ValueError naming the key and every field, in RLConfig's
    field order where this lists them sorted); the error is logged between two rules of '=' (:385-387) and the
    process exits with 2 (:398, _handle_config_exception). The first unknown key of the command is the one named."""
    known = train_rl_keys()
    for key in args:
        head = key.split(".", 1)[0]
        if head not in known:
            error = f"MAXTEXT CONFIG ERROR: {head!r} not in {', '.join(map(repr, known))}."
            rule = "=" * 80
            lines = [f"W1204 pyconfig.py:270] Ignoring invalid/unsupported field from YAML/CLI: {head!r}"]
            lines += [f"E1204 pyconfig.py:{n}] {text}" for n, text in ((385, rule), (386, error), (387, rule))]
            raise PodFailure(error, exit_code=2, lines=lines)


def truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes")


# ---------------------------------------------------------------- the three stages


def to_maxtext(client, args, flags, faults_):
    """MaxText's HF->MaxText conversion: a checkpoint at step 0. A finished one is left alone, as the real converter
    skips the save."""
    out = Bucket(client, args["base_output_directory"])
    if out.exists("0/commit_success.txt"):
        return ["finished checkpoint 0/ exists: conversion ran, save skipped"], out
    if out.names("0"):
        out.delete_prefix("0")  # a new save over an unfinished step deletes it first
    keypaths = [("params", "params") + leaf for leaf in LEAVES]
    write_step(out, "0", {"items": keypaths}, {"scan_layers": truthy(args.get("scan_layers", "true"))}, faults_)
    return [f"Conversion complete. Checkpoint saved to {out.url}/0"], out


#: Lines the evaluation after training logs at least (more than a log tail of 100 lines holds).
EVALUATION_LOG_LINES = 150


def rollout_lines(faults_, steps) -> list[str]:
    """The ``flood=M`` fault's M MiB of Tunix's rollout lines, spread over ``steps``: each step's prompts, one numpy
    array element a line (tunix/rl/rl_cluster.py ``_log_metrics``: "Rollout string metric %s: %s" at INFO)."""
    mib = next((float(f.split("=", 1)[1]) for f in faults_ if f.startswith("flood=")), 0.0)
    steps = list(steps) or [0]
    element = " 'Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Reason step by step.'"  # noqa: E501
    per_step = int(mib * 2**20 / len(steps) / (len(element) + 40)) if mib else 0
    lines = []
    for step in steps if per_step else []:
        lines.append(f"I1204 rl_cluster.py:607] Rollout string metric prompts: [step {step}")
        lines += [f"{element[:-1]} (step {step}, prompt {i})'" for i in range(per_step)]
    return lines


#: Where train_rl saves the actor's checkpoints, under <base_output_directory>/<run_name>/.
ACTOR = "checkpoints/actor"


def train_rl(client, args, flags, faults_, duration=0.0, slices=None):
    """MaxText's RL trainer: splits the devices of ``slices`` (count, chips per slice) between trainer and sampler,
    resumes after the last committed step, saves the actor every checkpoint_period steps, writes its curves to an
    event file that grows over ``duration`` seconds, and evaluates before and after."""
    check_config_keys(args)
    split = device_split(args, *slices) if slices else []
    if args.get("load_parameters_path"):
        require_input(client, args["load_parameters_path"], "load_parameters_path")
    out = Bucket(client, args["base_output_directory"].rstrip("/") + "/" + args["run_name"])
    train_steps = train_steps_of(args)
    data = load_data(args)
    period = int(args.get("checkpoint_period", 50))
    keep = int(args.get("max_num_checkpoints_to_keep", 10))
    # The trainer ends when its data does: num_iterations steps a batch (MaxText 0.2.4 configs/types.py).
    last = min(train_steps, data.train_batches * int(args.get("num_iterations", args.get("rl.num_iterations", 1))))
    stop = min([last] + fault_steps(faults_, "stop-at-step"))
    crash, preempt = fault_steps(faults_, "crash-at-step"), fault_steps(faults_, "preempt-at-step")
    stall = fault_steps(faults_, "stall-at-step")
    test_batches = int(args.get("num_test_batches", 5))
    start = max(committed_steps(out, ACTOR), default=0)
    lines = split + start_lines(args, train_steps, period, start)
    # Evaluation on num_test_batches batches of test prompts, before and after training; none with 0.
    seed = out.url
    test_prompts = data.test_prompts
    accuracy_before, accuracy_after = evaluation_accuracies(seed, faults_)
    if test_batches > 0:  # a resumed attempt evaluates the weights it restored: part of the way trained
        restored = accuracy_before + (accuracy_after - accuracy_before) * start / max(train_steps, 1)
        lines.append(evaluation_line("Pre", f"{seed}/{start}" if start else seed, test_prompts, restored))
    if "hang-before-first-step" in faults_:  # e.g. a worker that never joined the Pathways head, a rollout hung
        raise PodHangs("the trainer hangs before its first step (simulated)", lines=lines)
    end = crash[0] if crash else max(preempt[0], start) if preempt else max(stall[0], start) if stall else stop
    lines += rollout_lines(faults_, range(start + 1, end + 1))
    trained = range(start + 1, end + (0 if crash else 1))
    lines += save_checkpoints(out, save_steps(trained, period, normal_exit=not (crash or preempt or stall)), faults_)
    lines += delete_old_checkpoints(out, keep)
    name, events, sizes = growing_event_file(
        training_scalars(seed, train_steps, trained), paced(start, trained, duration)
    )
    put_event_file(out, f"tensorboard/{name}", events, sizes, duration)
    end_early(crash, preempt, end, lines)
    if stall:
        raise PodHangs(f"the trainer stalls after step {end} (simulated)", lines=lines)
    lines.append("RL Training Completed Successfully!")
    if "preempt-in-evaluation" in faults_:  # the host goes during the evaluation after training
        raise PodFailure(
            "SIGTERM during the evaluation after training: the host is shutting down (simulated Spot VM preemption)",
            exit_code=143,
            disruption="TerminationByKubelet",
            lines=lines,
        )
    if test_batches > 0:
        lines += evaluation_after_training(seed, test_prompts, accuracy_after)
    return lines, out


def paced(start, trained, duration):
    """The time each trained step's records are stamped with: the steps spread over the training's duration as its
    event file's flushes are (a real trainer stamps each step when it logs it; its pace is what the ETA reads)."""
    began, pace = time.time(), duration * 0.9 / max(len(trained), 1)
    return lambda step: began + (step - start) * pace


def train_steps_of(args):
    """MaxText 0.2.4 configs/types.py (RLConfig): int(num_batches x rl.num_iterations x train_fraction x num_epoch);
    a flat num_iterations wins over rl.num_iterations (configs/pyconfig.py copies flat keys into the nested model)."""
    iterations = int(args.get("num_iterations", args.get("rl.num_iterations", 1)))
    return int(
        int(args.get("num_batches", 4))
        * iterations
        * float(args.get("train_fraction", 1.0))
        * int(args.get("num_epoch", 1))
    )


def fault_steps(faults_, name):
    """The steps N of the faults ``<name>=N``."""
    return [int(f.split("=")[1]) for f in faults_ if f.startswith(f"{name}=")]


def start_lines(args, train_steps, period, start):
    """What the trainer logs before it trains: its plan, its data and, when it resumes, what it restored."""
    lines = [
        f"train_steps={train_steps} checkpoint_period={period}",
        # train_rl.get_dataset's line (MaxText 0.2.4 logs it with debug=true): what this run trains on.
        f"Loaded Hugging Face dataset {args.get('dataset_name', 'openai/gsm8k')} with split "
        f"{args.get('train_split', 'train')}"
        + (f" from {args['hf_train_files']}" if args.get("hf_train_files") else ""),
    ]
    if start:
        # Tunix's own line (tunix/sft/checkpoint_manager.py:293 at c4ec573), then the data fast-forward
        # (rl_learner.py:400-407).
        lines.append(f"Restored params from step: {start} in 1.234 seconds")
        lines.append(f"Fast forwarded {start} micro-batches.")
    return lines


def evaluation_accuracies(seed, faults_):
    """The test accuracy before and after training. With eval-regression, a regression beyond chance on the default
    20 test prompts (30-45% before, 0-10% after), which require_no_regression refuses; a drop within chance passes
    it."""
    before = random.Random(seed).uniform(0.3, 0.45)
    return before, max(0.0, before + (-0.35 if "eval-regression" in faults_ else 0.2))


def save_steps(trained, period, normal_exit):
    """The steps saved: every checkpoint_period-th trained step, and the end-of-run save on a normal exit only."""
    saves = [s for s in trained if s % period == 0]
    if normal_exit and trained and trained[-1] not in saves:
        saves.append(trained[-1])
    return saves


def save_checkpoints(out, saves, faults_):
    """The actor's checkpoint at each step of ``saves``; the checkpoint faults hit the last one only."""
    lines = []
    for step in saves:
        if out.names(f"{ACTOR}/{step}"):
            out.delete_prefix(f"{ACTOR}/{step}")  # unfinished folder from a crashed save
        write_step(
            out,
            f"{ACTOR}/{step}",
            {
                "model_params": [("params",) + leaf for leaf in LEAVES],
                "optimizer_state": [("opt_state", "0", m) + leaf for m in ("mu", "nu") for leaf in LEAVES[:2]],
            },
            {"global_step": step},
            faults_ if step == saves[-1] else [],
        )
        lines.append(f"saved checkpoint at step {step}")
    return lines


def delete_old_checkpoints(out, keep):
    """Keeps the newest ``keep`` committed steps, as max_num_checkpoints_to_keep does (0 keeps all)."""
    lines = []
    for old in sorted(committed_steps(out, ACTOR))[:-keep] if keep > 0 else []:
        out.delete_prefix(f"{ACTOR}/{old}")
        lines.append(f"deleted old checkpoint {old} (keeping {keep})")
    return lines


def end_early(crash, preempt, end, lines):
    """The crash-at-step and preempt-at-step faults end the training after its saves and its event file, its log
    holding what it printed until then (its Pre line, its rollouts), as a real trainer's does."""
    if crash:
        raise PodFailure(f"training crashed at step {crash[0]} (simulated)", lines=lines)
    if preempt:
        raise PodFailure(
            f"SIGTERM after step {end}: the host is shutting down (simulated Spot VM preemption)",
            exit_code=143,
            disruption="TerminationByKubelet",
            lines=lines,
        )


def evaluation_after_training(seed, test_prompts, accuracy):
    """MaxText 0.2.4 train_rl.py prints its success line (810) before a whole second evaluation (812-827), whose
    vLLM engine logs as it goes: the success line is long out of a log's last lines when Post prints."""
    lines = [
        f"vLLM engine: processed prompt {i % test_prompts + 1}/{test_prompts} of evaluation pass "
        f"{i // test_prompts + 1}"
        for i in range(max(EVALUATION_LOG_LINES, test_prompts))
    ]
    lines.append(evaluation_line("Post", seed, test_prompts, accuracy))
    return lines


def to_huggingface(client, args, flags, faults_):
    """MaxText->HF: tokenizer files, config.json and four safetensors shards, the shards' index last."""
    if args.get("load_parameters_path"):
        require_input(client, args["load_parameters_path"], "load_parameters_path")
    out = Bucket(client, args["base_output_directory"])
    model = args.get("model_name", "qwen3-30b-a3b")
    tokenizer = flags.get("hf_model_path") or HF_IDS.get(model, model)
    dtype = {"bfloat16": "BF16"}.get(args.get("weight_dtype", "float32"), "F32")
    out.put(
        "tokenizer_config.json",
        {"name_or_path": tokenizer, "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144},
    )
    out.put("tokenizer.json", {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})
    out.put(
        "config.json",
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "torch_dtype": "bfloat16" if dtype == "BF16" else "float32",
            "sim_model_name": model,
        },
    )
    shards = 4
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensors = [f"model.layers.{i - 1}.self_attn.q_proj.weight", f"model.layers.{i - 1}.mlp.gate.weight"]
        if i == 1:
            tensors.insert(0, "model.embed_tokens.weight")
        if i == shards:
            tensors += ["model.norm.weight", "lm_head.weight"]
        data = safetensors_file(tensors, dtype)
        total += len(data) - 8 - struct.unpack("<Q", data[:8])[0]
        weight_map.update({t: name for t in tensors})
        if "drop-shard" in faults_ and i == 2:
            continue
        out.put(name, data)
    if "no-index" not in faults_:
        out.put("model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return [f"Saved Hugging Face model ({shards} shards, tokenizer {tokenizer}) to {out.url}"], out


def generation_config_copy(command, env):
    """(repo, folder) of the package's copy of generation_config.json in a container's script, or None. bash expands
    the variable: without it in the container's environment (``env``: name -> value), `python3 -c ""` copies
    nothing and succeeds."""
    parts = list(command or [])
    script = parts[2] if parts[:2] == ["/bin/bash", "-c"] and len(parts) > 2 else ""
    tokens = shlex.split(script.replace(";", " ; "), posix=True)
    for i in range(len(tokens) - 4):
        if tokens[i : i + 3] == ["python3", "-c", f"${COPY_GENERATION_CONFIG_ENV}"]:
            return (tokens[i + 3], tokens[i + 4]) if env.get(COPY_GENERATION_CONFIG_ENV) else None
    return None


def copy_generation_config(client, repo, folder):
    """What the copy does after a successful to_huggingface: the repository's file into the folder, if it has one."""
    found = HF_GENERATION_CONFIGS.get(repo.lower())
    if found is None:
        return [f"{repo} has no generation_config.json: the export has none"]
    Bucket(client, folder).put("generation_config.json", found)
    return [f"Copied generation_config.json of {repo} to {folder}"]


#: Each stage's emulation, by the stage's name in :data:`STAGES`.
RUNNERS = {"to_maxtext": to_maxtext, "train_rl": train_rl, "to_huggingface": to_huggingface}
