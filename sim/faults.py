"""Sim-side fault switch: rules in the ConfigMap `tpu-rl-sim-faults` (namespace `default`).

The workload's manifest is never touched: sim/maxtext_emulator.py reads these rules when a pod starts
running and turns a matching rule into the pod annotations the kwok stages act on.

A rule is one data key of the ConfigMap (the rule's name) whose value is a JSON object:

  match (all given fields must match; none given = every pod):
    "prefix"          the workload's name starts with it (JobSet name; else Job name; else pod name)
    "stage"           the pod runs that MaxText stage: "to_maxtext", "train_rl" or "to_huggingface"
    "replicated_job"  JobSet replicatedJob name, e.g. "pathways-head"
    "namespace"       the pod's namespace
    "job_index"       the pod's Job index in its replicated job (label jobset.sigs.k8s.io/job-index), e.g. "3":
                      one worker of a Pathways slice
  effect:
    "exit_code"       the pod fails with this exit code (annotation sim.tpu-rl.dev/exit-code)
    "fail_attempts"   fail only while the JobSet restart attempt < N (annotation sim.tpu-rl.dev/fail-attempts)
    "maxtext_fault"   emulator faults, comma-separated (annotation sim.tpu-rl.dev/maxtext-fault), see
                      sim/maxtext_emulator.py: skip-commit, drop-leaf, drop-shard, no-index,
                      stop-at-step=N, crash-at-step=N, preempt-at-step=N, preempt-in-evaluation, eval-regression,
                      hang-before-first-step, stall-at-step=N
    "run_seconds"     how long the pod runs before it exits
    "waiting"         the pod's containers never start: it stays Pending with this kubelet waiting reason
                      (ImagePullBackOff, ErrImagePull, CreateContainerConfigError, CrashLoopBackOff,
                      ContainerCreating; sim/kwok/pod-waiting.yaml), and its stage never runs
  "times"             how many workload attempts (JobSet name and uid + restart attempt, so a JobSet
                      submitted again under its name is a new one; or Job; or bare pod)
                      the rule applies to; absent = no limit. The emulator records the attempts it
                      used in the key "<rule>.applied" (JSON list).

CLI:
  faults.py set NAME [--prefix P] [--stage S] [--replicated-job R] [--namespace N] [--job-index I]
                     [--exit-code C] [--fail-attempts N] [--maxtext-fault F] [--run-seconds S] [--waiting W]
                     [--times T]
  faults.py list
  faults.py clear [NAME]
"""

import argparse
import contextlib
import json
import os
from pathlib import Path

NAMESPACE, NAME = "default", "tpu-rl-sim-faults"
MATCH_FIELDS = ("prefix", "stage", "replicated_job", "namespace", "job_index")
EFFECT_FIELDS = ("exit_code", "fail_attempts", "maxtext_fault", "run_seconds", "waiting")


def core_api(kubeconfig=None):
    from kubernetes import client, config

    sim = os.environ.get("SIM", str(Path(__file__).resolve().parent.parent / ".sim"))
    return client.CoreV1Api(config.new_client_from_config(kubeconfig or os.path.join(sim, "kubeconfig")))


def _update(api, mutate):
    """Read-modify-write of the ConfigMap's data with optimistic concurrency (creates it if missing)."""
    from kubernetes.client.exceptions import ApiException

    for _ in range(20):
        try:
            cm = api.read_namespaced_config_map(NAME, NAMESPACE)
        except ApiException as e:
            if e.status != 404:
                raise
            data = {}
            mutate(data)
            try:
                api.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": NAME}, "data": data})
                return data
            except ApiException as e2:
                if e2.status == 409:
                    continue
                raise
        data = dict(cm.data or {})
        mutate(data)
        body = {"metadata": {"name": NAME, "resourceVersion": cm.metadata.resource_version}, "data": data}
        try:
            api.replace_namespaced_config_map(NAME, NAMESPACE, body)
            return data
        except ApiException as e:
            if e.status != 409:
                raise
    raise RuntimeError(f"could not update ConfigMap {NAMESPACE}/{NAME}: too many conflicts")


#: The names this process set inside each open rules_removed_after block.
_open_blocks: list[set[str]] = []


def set_fault(api, name, **rule):
    """Adds or replaces rule NAME (and forgets the attempts it was applied to)."""
    unknown = set(rule) - set(MATCH_FIELDS) - set(EFFECT_FIELDS) - {"times"}
    if unknown:
        raise ValueError(f"unknown rule fields: {sorted(unknown)}")
    rule = {k: v for k, v in rule.items() if v is not None}

    def mutate(data):
        data[name] = json.dumps(rule, sort_keys=True)
        data.pop(f"{name}.applied", None)

    _update(api, mutate)
    for block in _open_blocks:
        block.add(name)


def clear_faults(api, name=None):
    """Deletes rule NAME, or every rule."""

    def mutate(data):
        for key in list(data):
            if name is None or key in (name, f"{name}.applied"):
                del data[key]

    _update(api, mutate)


def list_faults(api):
    """{rule name: rule dict with its "applied" list}."""
    from kubernetes.client.exceptions import ApiException

    try:
        data = api.read_namespaced_config_map(NAME, NAMESPACE).data or {}
    except ApiException as e:
        if e.status == 404:
            return {}
        raise
    rules = {}
    for key, value in sorted(data.items()):
        if key.endswith(".applied"):
            continue
        try:
            rules[key] = json.loads(value)
        except ValueError:
            rules[key] = {"invalid": value}
        rules[key]["applied"] = json.loads(data.get(f"{key}.applied", "[]"))
    return rules


@contextlib.contextmanager
def rules_removed_after(api):
    """The rules this process sets inside the block are deleted when it ends; every other rule stays: another
    test session on the same simulation (the 3.1.7 stack's beside the main one) sets its own meanwhile."""
    mine: set[str] = set()
    _open_blocks.append(mine)
    try:
        yield api
    finally:
        _open_blocks.remove(mine)
        for name in sorted(mine):
            clear_faults(api, name)


def record_applied(api, name, attempt_key):
    """Marks rule NAME as used for attempt_key; False if the rule is gone or its `times` are used up."""
    result = {}

    def mutate(data):
        result["ok"] = False
        if name not in data:
            return
        rule = json.loads(data[name])
        applied = json.loads(data.get(f"{name}.applied", "[]"))
        if attempt_key in applied:
            result["ok"] = True
            return
        if rule.get("times") is not None and len(applied) >= int(rule["times"]):
            return
        applied.append(attempt_key)
        data[f"{name}.applied"] = json.dumps(applied)
        result["ok"] = True

    _update(api, mutate)
    return result["ok"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("set")
    s.add_argument("name")
    for field in MATCH_FIELDS + EFFECT_FIELDS + ("times",):
        kind = int if field in ("exit_code", "fail_attempts", "times") else (float if field == "run_seconds" else str)
        s.add_argument("--" + field.replace("_", "-"), dest=field, type=kind)
    sub.add_parser("list")
    c = sub.add_parser("clear")
    c.add_argument("name", nargs="?")
    args = parser.parse_args()
    api = core_api(args.kubeconfig)
    if args.cmd == "set":
        set_fault(api, args.name, **{f: getattr(args, f) for f in MATCH_FIELDS + EFFECT_FIELDS + ("times",)})
    elif args.cmd == "clear":
        clear_faults(api, args.name)
    print(json.dumps(list_faults(api), indent=2))


if __name__ == "__main__":
    main()
