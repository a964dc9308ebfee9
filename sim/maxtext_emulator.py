"""MaxText stage emulator of the simulated TPU cluster (part of the simulation, never imported by plugins/): the
pod controller, and the entry point (`python -m sim.maxtext_emulator`).

A controller started by sim/up.sh. It watches pods; when a pod that is meant to exit (not restartPolicy
Always, not a Pathways worker) starts Running, it handles the pod once (per pod uid). A pod of a JobSet with
Pathways workers waits until every worker of its attempt runs, as the Pathways head's job waits for its
workers to join: without its TPU slice (a flex-start pool still empty, workers pending) nothing trains.

1. Faults: merges the pod's own sim.tpu-rl.dev/* annotations with the first matching rule of the fault
   ConfigMap (sim/faults.py) and decides whether this attempt fails (sim/maxtext_access.py, which also
   checks the pod's bucket permissions and its HF_TOKEN Secret).
2. MaxText: if the pod's `workload-container` runs `python3 -m maxtext.<stage> ...` (inside
   `/bin/bash -c <script>`) and this pod is the one doing the work (the Pathways head; completion index 0
   of a multi-host job; any single pod), writes to the GCS emulator what that stage writes
   (/work/shared/reference/maxtext.md), with the faults asked for (sim/maxtext_stages.py, writing through
   sim/maxtext_outputs.py).
3. Releases the pod: annotation sim.tpu-rl.dev/exit-at (RFC 3339). The kwok stages in sim/kwok/ then end
   the pod at that time, Succeeded or Failed with the exit code.

Pod annotations read (on the pod template):
  sim.tpu-rl.dev/run-seconds    run time (default $TPU_RL_SIM_RUN_SECONDS, else 3)
  sim.tpu-rl.dev/exit-code      fail with this exit code
  sim.tpu-rl.dev/fail-attempts  fail only while label jobset.sigs.k8s.io/restart-attempt < N
  sim.tpu-rl.dev/maxtext-fault  comma-separated: skip-commit (last step has no commit_success.txt and a
                                null commit_timestamp_nsecs), drop-leaf (one leaf folder missing),
                                drop-shard (one safetensors shard missing), no-index (no
                                model.safetensors.index.json), stop-at-step=N (training ends early at N,
                                normal exit, end-of-run save at N), crash-at-step=N (training crashes at
                                N: only periodic saves before N, exit code 1 unless exit-code is set),
                                preempt-at-step=N (the host is reclaimed after step N, as a Spot VM is: the saves
                                up to N, the last one cut short with skip-commit; then the kubelet's SIGTERM, exit
                                code 143, and the pod condition DisruptionTarget TerminationByKubelet),
                                preempt-in-evaluation (the same preemption, after the training's final save and
                                its success line, during the evaluation after training),
                                eval-regression (the evaluation after training scores lower than before),
                                flood=M (the workload container logs M MiB of Tunix's per-step rollout lines,
                                "Rollout string metric prompts: [...]" as tunix/rl/rl_cluster.py _log_metrics prints a
                                numpy array of strings, one element a line: a trainer spreads them over its steps,
                                after its evaluation before training)
Annotations written: sim.tpu-rl.dev/exit-at, /emulated (what was done), /fault-rule, /warnings, and
exit-code / fail-attempts / run-seconds when a rule sets them; /disruption (a DisruptionTarget reason) for a
preempted pod, which the kwok stage pod-fail turns into the pod's condition and graceful-shutdown status.

Logs: for every running pod it writes what its containers would print (CRI format) to
.sim/podlogs/<ns>/<pod>/<container>.log (sim/maxtext_outputs.py) and creates a kwok Logs object pointing at
those files, so `kubectl logs` (and read_namespaced_pod_log) work; the workload container's log says what was
emulated.
"""

import math
import os
import time
import traceback
from datetime import UTC, datetime, timedelta

from .maxtext_access import (
    PREFIX,
    check_bucket_access,
    check_secrets,
    fault_rule_annotations,
    maxtext_faults,
    will_fail,
)
from .maxtext_outputs import SIM, PodFailure, PodHangs, write_container_logs
from .maxtext_stages import RUNNERS, copy_generation_config, generation_config_copy, parse_invocation, rollout_lines

RUN_SECONDS = float(os.environ.get("TPU_RL_SIM_RUN_SECONDS", "3"))
HEARTBEAT = SIM / "run" / "maxtext-emulator.heartbeat"
HANDLED = SIM / "run" / "maxtext-emulator-handled.txt"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def log(msg):
    print(f"{datetime.now(UTC).isoformat(timespec='milliseconds')} {msg}", flush=True)


def workload_attempt(meta):
    """(workload name, restart attempt, attempt key): a fault rule's `times` count attempts by their key. A JobSet
    submitted again under the same name (a resumed training) is a new workload: its uid tells."""
    labels = meta.labels or {}
    workload = labels.get(JOBSET_NAME_LABEL) or labels.get("batch.kubernetes.io/job-name") or meta.name
    attempt = labels.get("jobset.sigs.k8s.io/restart-attempt")
    incarnation = labels.get("jobset.sigs.k8s.io/jobset-uid", "")[:8]
    attempt_key = (
        f"{meta.namespace}/{workload}"
        + (f"@{incarnation}" if incarnation else "")
        + (f"/attempt-{attempt}" if attempt is not None else "")
    )
    return workload, attempt, attempt_key


def pathways_slices(pod):
    """(slices, chips per slice) of the Pathways job the pod heads, as its resource manager is told them
    (``--instance_count``, ``--instance_type=tpuv6e:8x8``: the chips are the topology's product); None without one."""
    flags = {}
    for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
        for arg in container.args or []:
            key, _, value = arg.partition("=")
            flags[key] = value
    if "--instance_count" not in flags or ":" not in flags.get("--instance_type", ""):
        return None
    topology = flags["--instance_type"].split(":", 1)[1]
    return int(flags["--instance_count"]), math.prod(int(n) for n in topology.split("x"))


def failure_annotations(error, effective, fails, attempt):
    """What makes the kwok stages fail the attempt as the emulated process failed: its exit code, unless the faults
    already fail it; for a host taken, the DisruptionTarget reason, and fail-attempts moved past this attempt so
    that a preemption fails it whatever the fault annotations say."""
    patch = {}
    if not fails:
        patch[PREFIX + "exit-code"] = str(error.exit_code)
    if error.disruption:
        patch[PREFIX + "disruption"] = error.disruption
        if PREFIX + "fail-attempts" in effective:
            patch[PREFIX + "fail-attempts"] = str(int(attempt or 0) + 1)
    return patch


class Emulator:
    def __init__(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from kubernetes import client, config

        kubeconfig = os.environ.get("KUBECONFIG", str(SIM / "kubeconfig"))
        api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        # The fault switch: this cluster's own ConfigMap, or the standing cluster's for a cluster the GKE
        # emulator created (sim/control_plane.py), so that one switch serves every cluster.
        faults_kubeconfig = os.environ.get("TPU_RL_SIM_FAULTS_KUBECONFIG")
        self.fault_switch = (
            client.CoreV1Api(config.new_client_from_config(faults_kubeconfig)) if faults_kubeconfig else self.core
        )
        self.logged = set()
        #: Pods of a Pathways JobSet that wait for its TPU workers, by (namespace, JobSet name).
        self.waiting = {}
        self.gcs = storage.Client(project="tpu-rl-sim", credentials=AnonymousCredentials())
        HANDLED.parent.mkdir(parents=True, exist_ok=True)
        self.handled = set(HANDLED.read_text().split()) if HANDLED.exists() else set()

    def run(self):
        from kubernetes import watch

        log(f"watching pods (default run time {RUN_SECONDS:g} s)")
        while True:
            try:
                pods = self.core.list_pod_for_all_namespaces()
                for pod in pods.items:
                    self.consider(pod)
                HEARTBEAT.touch()
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=pods.metadata.resource_version,
                    timeout_seconds=10,
                )
                for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.consider(event["object"])
                HEARTBEAT.touch()
            except Exception:  # the API may be restarting: log, wait, list again
                log("watch error:\n" + traceback.format_exc())
                time.sleep(2)

    def consider(self, pod):
        meta, spec = pod.metadata, pod.spec
        annotations = meta.annotations or {}
        if meta.deletion_timestamp or pod.status.phase != "Running":
            return
        never_ends = spec.restart_policy == "Always" or any(c.name == "pathways-worker" for c in spec.containers)
        try:
            if never_ends:
                if meta.uid not in self.handled and self.kept_waiting(pod):
                    return
                if meta.uid not in self.logged:
                    self.publish_logs(pod, None, [])
                waiting = self.waiting.get((meta.namespace, (meta.labels or {}).get(JOBSET_NAME_LABEL)))
                if waiting is not None:  # a worker came up: the head may start now
                    self.consider(waiting)
            elif PREFIX + "exit-at" not in annotations and meta.uid not in self.handled:
                if self.workers_ready(pod):
                    self.handle(pod)
                elif meta.uid not in self.logged:  # a running container has a log while it waits (kubelet)
                    self.publish_logs(pod, None, [])
        except Exception:
            log(f"error handling pod {meta.namespace}/{meta.name}, will retry:\n" + traceback.format_exc())

    def workers_ready(self, pod):
        """Whether every Pathways TPU worker of the pod's JobSet attempt runs. The Pathways head's job (the
        trainer) starts its work only once the workers have joined: without the slice (a flex-start pool
        still empty, a worker pending) nothing trains. Pods of JobSets without workers are always ready."""
        meta, labels = pod.metadata, pod.metadata.labels or {}
        name = labels.get(JOBSET_NAME_LABEL)
        if not name:
            return True
        try:
            jobset = self.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", meta.namespace, "jobsets", name
            )
        except Exception:  # gone, or not a JobSet of this API: nothing to wait for
            return True
        expected = sum(
            int(job.get("replicas", 1)) * int(job["template"]["spec"].get("parallelism", 1))
            for job in jobset["spec"]["replicatedJobs"]
            if any(c["name"] == "pathways-worker" for c in job["template"]["spec"]["template"]["spec"]["containers"])
        )
        if not expected:
            return True
        attempt = labels.get("jobset.sigs.k8s.io/restart-attempt")
        running = [
            w
            for w in self.core.list_namespaced_pod(meta.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
            if w.status.phase == "Running"
            and not w.metadata.deletion_timestamp
            and (w.metadata.labels or {}).get("jobset.sigs.k8s.io/restart-attempt") == attempt
            and any(c.name == "pathways-worker" for c in w.spec.containers)
        ]
        key = (meta.namespace, name)
        if len(running) < expected:
            if key not in self.waiting:
                log(
                    f"{meta.namespace}/{meta.name}: waiting for the JobSet's TPU workers "
                    f"({len(running)} of {expected} running)"
                )
            self.waiting[key] = pod
            return False
        self.waiting.pop(key, None)
        return True

    def handle(self, pod):
        """Handles a pod once: its faults, its MaxText stage, then its release (the module's steps 1 to 3)."""
        meta = pod.metadata
        annotations = dict(meta.annotations or {})
        ref = f"{meta.namespace}/{meta.name}"
        container = next((c for c in pod.spec.containers if c.name == "workload-container"), None)
        stage, args, flags = (
            parse_invocation((container.command or []) + (container.args or [])) if container else (None, {}, {})
        )
        workload, attempt, attempt_key = workload_attempt(meta)

        # 1. faults: pod annotations, overridden by the first matching sim-side rule
        rule_name, patch = fault_rule_annotations(self.fault_switch, pod, workload, stage, attempt_key)
        effective = {**annotations, **patch}
        stage_faults = maxtext_faults(effective)
        fails = will_fail(effective, int(attempt or 0))

        if effective.get(PREFIX + "waiting"):  # the kubelet never starts its container: kwok's pod-waiting stage
            self.keep_waiting(pod, patch, effective[PREFIX + "waiting"], rule_name)
            return
        # 2. the MaxText stage, in the pod that does the work
        warnings = check_secrets(self.core, pod, container, args)
        try:
            lines, summary = self.emulate(pod, (stage, args, flags), warnings, effective, stage_faults, fails)
        except PodFailure as e:
            lines, summary = [*e.lines, f"ERROR: {e}"], f"{stage or 'pod'}: failed: {e}"
            patch.update(failure_annotations(e, effective, fails, attempt))
        except PodHangs as e:  # runs on, silent, with no exit-at: kwok keeps it Running
            self.publish_logs(pod, stage, e.lines)
            self.release(pod, {**patch, PREFIX + "emulated": f"{stage}: {e}"[:1000]})
            log(f"{ref}: {stage}: {e}; runs on without progress" + (f"; rule {rule_name}" if rule_name else ""))
            return
        if stage_faults:
            summary += f" [faults: {','.join(stage_faults)}]"

        # 3. release the pod: kwok's stages end it at exit-at
        effective = {**annotations, **patch}
        run_seconds = float(effective.get(PREFIX + "run-seconds", RUN_SECONDS))
        exit_at = datetime.now(UTC) + timedelta(seconds=run_seconds)
        patch[PREFIX + "exit-at"] = exit_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        patch[PREFIX + "emulated"] = summary[:1000]
        if warnings:
            patch[PREFIX + "warnings"] = ",".join(warnings)
        self.publish_logs(pod, stage, lines, run_seconds)
        self.release(pod, patch)
        outcome = (
            f"fails with exit code {effective.get(PREFIX + 'exit-code', '1')}"
            if will_fail(effective, int(attempt or 0))
            else "succeeds"
        )
        log(
            f"{ref}: {summary}; {outcome} at {patch[PREFIX + 'exit-at']}"
            + (f"; rule {rule_name}" if rule_name else "")
            + (f"; warnings {warnings}" if warnings else "")
        )
        for line in lines:
            log(f"  {ref}: {line}")

    def kept_waiting(self, pod):
        """A never-ending pod (a Pathways worker) is handled only for a fault rule's ``waiting``: a worker whose
        containers never start (it never joins its head). Looked up once a pod; True when it now waits."""
        meta = pod.metadata
        self.handled.add(meta.uid)
        workload, _, attempt_key = workload_attempt(meta)
        rule_name, patch = fault_rule_annotations(self.fault_switch, pod, workload, None, attempt_key)
        reason = {**(meta.annotations or {}), **patch}.get(PREFIX + "waiting")
        if reason:
            self.keep_waiting(pod, patch, reason, rule_name)
        return bool(reason)

    def keep_waiting(self, pod, patch, reason, rule_name):
        """The pod's containers never start (an image that cannot be pulled, a container config error, a crash
        loop): kwok's pod-waiting stage shows it Pending with the kubelet's waiting reason; no stage runs."""
        patch[PREFIX + "emulated"] = f"containers waiting: {reason}"
        self.release(pod, patch)
        ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
        log(f"{ref}: waits with {reason}" + (f"; rule {rule_name}" if rule_name else ""))

    def emulate(self, pod, invocation, warnings, effective, stage_faults, fails):
        """Runs the pod's MaxText stage if this pod is the one doing the work. Returns (the lines it logs, a
        summary); raises PodFailure when the emulated process fails."""
        stage, args, flags = invocation
        labels = pod.metadata.labels or {}
        index = labels.get("batch.kubernetes.io/job-completion-index", "0")
        job_index = labels.get("jobset.sigs.k8s.io/job-index", "0")
        if warnings and warnings[0].startswith("missing-secret"):
            # A real kubelet would not start the container (CreateContainerConfigError).
            raise PodFailure(warnings[0])
        if not stage:
            lines = rollout_lines(stage_faults, []) if index == "0" and job_index == "0" else []
            return lines, "no MaxText stage in this pod"
        check_bucket_access(self.core, pod, stage, args, flags)
        if index != "0" or job_index != "0":
            return [], f"{stage}: skipped (completion index {index}, job index {job_index} does no work)"
        if fails and not stage_faults:
            return [], f"{stage}: nothing written (the pod fails before saving)"
        # The trainer runs for the pod's run seconds: its event file grows over them.
        timing = {}
        if stage == "train_rl":
            run_seconds = float(effective.get(PREFIX + "run-seconds", RUN_SECONDS))
            timing = {"duration": run_seconds, "slices": pathways_slices(pod)}
        lines, out = RUNNERS[stage](self.gcs, args, flags, stage_faults, **timing)
        # The copy follows the conversion with `&&`: only a conversion that exits 0 runs it.
        if stage == "to_huggingface" and not fails and (copy := self.generation_config_copy(pod)):
            lines += copy_generation_config(self.gcs, *copy)
        return lines, f"{stage}: wrote {len(out.written)} objects under {out.url}"

    @staticmethod
    def generation_config_copy(pod):
        """The export script's copy of generation_config.json (sim/maxtext_stages.py), or None."""
        container = next(c for c in pod.spec.containers if c.name == "workload-container")
        env = {e.name: e.value for e in container.env or [] if e.value}
        return generation_config_copy((container.command or []) + (container.args or []), env)

    def release(self, pod, patch):
        """Records the pod as handled (so a restarted emulator never redoes its stage), then sets its annotations:
        kwok's stages end it at exit-at."""
        meta = pod.metadata
        with HANDLED.open("a") as f:
            f.write(meta.uid + "\n")
        self.handled.add(meta.uid)
        self.core.patch_namespaced_pod(meta.name, meta.namespace, {"metadata": {"annotations": patch}})

    def publish_logs(self, pod, stage, lines, seconds=0.0):
        """What the containers would print, for `kubectl logs`: their files (written over the pod's ``seconds``
        when big: maxtext_outputs.write_container_logs) and a kwok Logs object (owned by the pod, so it goes with
        it) that points kwok at them."""
        from kubernetes.client.exceptions import ApiException

        meta = pod.metadata
        entries = write_container_logs(pod, stage, lines, seconds)
        logs = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": meta.name,
                "namespace": meta.namespace,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid}],
            },
            "spec": {"logs": entries},
        }
        try:
            self.custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", meta.namespace, "logs", logs)
        except ApiException as e:
            if e.status != 409:
                raise
        self.logged.add(meta.uid)


if __name__ == "__main__":
    Emulator().run()
