"""A fault campaign: pipeline runs at once on the local stack (scripts/airflow-stack.sh) and the simulation, each
meeting faults drawn at random (seeded) from :data:`CATALOGUE` at random moments, then the invariants a user pays
for, checked run by run, and a table.

Each run creates its own cluster and TPU pool (the tutorial's path on a v6e-16 slice), so every GKE fault can be
aimed at it alone. A fault is *armed* (a rule of the GKE emulator, sim/gke_faults.py, or of the MaxText emulator,
sim/faults.py, scoped to the run's cluster or training JobSet) or *struck* (done to the stack: a component killed,
paused, restarted) while a task of the run, drawn at random, runs. After a strike every component that died is
started again, as Composer's Kubernetes restarts a container that exited.

The invariants, per run:
  outcome       success when every fault it met is survivable; else failed, and the failed task's log names the
                fault (its words in the catalogue) and the fix
  left behind   the run's cluster is gone (its pools, JobSets and Secrets with its control plane)
  trainings     the training JobSets the trainer ran (each submission has its own uid: the MaxText emulator records
                them) are one more than the preemptions the run resumed: no JobSet was deleted and submitted again
                while its task waited (one name per run: two never run at once)
  checkpoints   every step folder of a successful run is complete (commit_success.txt), every folder set aside is
                not (none complete discarded), a half-written step was set aside, and the training's last step is
                the one verified

  make chaos ARGS="--seed 11 --runs 6 --faults 3"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scripts.local_airflow import AirflowApiError, LocalAirflow
from sim import clients, faults, gke_faults, storage_faults

REPO = Path(__file__).resolve().parents[1]

DAG_ID = "maxtext_rl_tpu"
#: The tutorial's path on a small slice: 8 steps, a checkpoint every 2, a minute of training (room for a strike).
RUN_CONF = {
    **json.loads((REPO / "include/examples/simulation.json").read_text()),
    "tpu_type": "v6e-16",
    "topology": "4x4",
    "ici_tensor_parallelism": 2,
    "ici_expert_parallelism": 2,
    "rollout_tensor_parallelism": 4,
    "num_batches": 8,
    "checkpoint_period": 2,
}
LAST_STEP = 8
TRAINING_SECONDS = 60
#: The tasks of a run during which a strike may come, in the order they run (the conversion to MaxText is done once
#: for every run of a model: most runs skip it). A triggerer holds the waits of the first three.
PHASES = ("create_cluster", "create_tpu_pools", "train_rl", "maxtext_to_hf", "delete_cluster")
WORK = PHASES[:4]
WAITS = PHASES[:3]
#: The tasks before a fatal fault (a pool GKE cannot create) ends the run.
BEFORE_FATAL = ("create_cluster", "create_tpu_pools")
RUN_TIMEOUT = 3600
ENDED = ("success", "failed")


@dataclass(frozen=True)
class FaultKind:
    """What a fault stands for, and what a run that meets it must end as: ``fatal`` holds the words the failure
    message must say (empty: the run must succeed)."""

    stands_for: str
    #: The GKE emulator's rule armed for the run's cluster (sim/gke_faults.py: its ``kind`` and fields).
    gke: dict = field(default_factory=dict)
    #: The Cloud Storage front's rule armed for the run's training folder (sim/storage_faults.py).
    storage: dict = field(default_factory=dict)
    strike: Callable[[Campaign, Run], str] | None = None
    #: The tasks during which it may strike.
    phases: tuple[str, ...] = WORK
    fatal: tuple[str, ...] = ()
    #: The MaxText emulator's faults of the run's first training attempt (sim/faults.py): a run's are one rule.
    trainer: str = ""
    #: What the run's params change for it.
    conf: dict = field(default_factory=dict)


@dataclass
class Run:
    index: int
    token: str
    kinds: list[str]
    phases: dict[str, str] = field(default_factory=dict)
    struck: dict[str, str] = field(default_factory=dict)
    state: str = ""
    problems: list[str] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)
    injected: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return f"chaos__{self.token}__{self.index}"

    @property
    def cluster(self) -> str:
        return f"chaos-{self.token}-{self.index}"

    @property
    def conf(self) -> dict:
        changes = {key: value for kind in self.kinds for key, value in CATALOGUE[kind].conf.items()}
        return {**RUN_CONF, **changes, "cluster_name": self.cluster}

    @property
    def rule(self) -> str:
        """The prefix of this run's fault rules, its cluster's name (sorted: the MaxText rule of a fault before the
        training's)."""
        return self.cluster

    @property
    def training_jobset(self) -> str:
        from tpu_rl.run import RunIdentity

        return RunIdentity(DAG_ID, self.run_id).jobset_name(RUN_CONF.get("workload_prefix", "qwen"), "train")

    @property
    def training_folder(self) -> str:
        """Where the run's training writes in its bucket (its checkpoints, event files, record)."""
        from tpu_rl.config import RunConfig
        from tpu_rl.layout import GcsLayout
        from tpu_rl.run import RunIdentity

        return GcsLayout(RunConfig.from_params(self.conf), RunIdentity(DAG_ID, self.run_id)).training_prefix

    @property
    def survivable(self) -> bool:
        return not any(CATALOGUE[kind].fatal for kind in self.kinds)


CATALOGUE: dict[str, FaultKind] = {}  # filled below, once the strikes are defined


def deal(seed: int, runs: int, per_run: int) -> list[list[str]]:
    """The faults of each run: the catalogue shuffled and dealt round by round, so that every kind is drawn once
    there are as many places as kinds and runs as :func:`_solo` kinds; no kind twice in a run, one solo kind at most
    (a kind that fits no hand left is not dealt this round)."""
    rng, hands = random.Random(seed), [[] for _ in range(runs)]
    deck: list[str] = []
    for _ in range(10 * runs * per_run):
        if all(len(hand) == per_run for hand in hands):
            break
        if not deck:  # each round deals the kinds a run may meet one of first, so that each finds a run
            solo, others = ([k for k in sorted(CATALOGUE) if _solo(k) == flag] for flag in (True, False))
            rng.shuffle(solo)
            rng.shuffle(others)
            deck = others + solo
        kind = deck.pop()
        open_hands = [h for h in hands if len(h) < per_run and kind not in h and _compatible(kind, h)]
        if open_hands:
            min(open_hands, key=len).append(kind)
    return hands


def _solo(kind: str) -> bool:
    """A fault a run meets no other of its kind beside: a fatal one (it stops the run before it trains), or one of
    the trainer (the emulator applies one rule to an attempt, and prints no log of a preempted one)."""
    return bool(CATALOGUE[kind].fatal or CATALOGUE[kind].trainer)


def _compatible(kind: str, hand: list[str]) -> bool:
    return not (_solo(kind) and any(_solo(other) for other in hand))


class Campaign:
    """The runs, driven from one thread each; ``stack(*args)`` runs scripts/airflow-stack.sh."""

    def __init__(
        self,
        airflow: LocalAirflow,
        stack: Callable[..., subprocess.CompletedProcess],
        gke,
        gcs,
        seed: int,
        hands: list[list[str]],
    ):
        self.airflow, self._stack, self.gke, self.gcs = airflow, stack, gke, gcs
        self.rng, self.token = random.Random(seed), uuid.uuid4().hex[:5]
        self.runs = [Run(i, self.token, kinds) for i, kinds in enumerate(hands)]
        for run in self.runs:
            for kind in run.kinds:
                if CATALOGUE[kind].strike:
                    phases = CATALOGUE[kind].phases
                    if not run.survivable:
                        phases = tuple(phase for phase in phases if phase in BEFORE_FATAL)
                    run.phases[kind] = self.rng.choice(phases)
        #: One command to the stack at a time (a strike's pause or down time does not hold it: strikes overlap).
        self.commanding = threading.Lock()

    def start(self) -> None:
        for run in self.runs:
            for kind in run.kinds:
                if CATALOGUE[kind].gke:
                    gke_faults.set_fault(f"{run.rule}-{kind}", cluster=run.cluster, **CATALOGUE[kind].gke)
                if CATALOGUE[kind].storage:
                    storage_faults.set_fault(
                        f"{run.rule}-{kind}", contains=run.training_folder, **CATALOGUE[kind].storage
                    )
            # The emulator applies a pod's first matching rule: the faults of the first attempt, then the others'.
            trainer = ",".join(CATALOGUE[kind].trainer for kind in run.kinds if CATALOGUE[kind].trainer)
            for rule, times, maxtext_fault in (("a-faults", 1, trainer or None), ("b-train", None, None)):
                faults.set_fault(
                    faults.core_api(), f"{run.rule}-{rule}", stage="train_rl", prefix=run.training_jobset,
                    run_seconds=TRAINING_SECONDS, maxtext_fault=maxtext_fault, times=times,
                )  # fmt: skip
            self.airflow.trigger(DAG_ID, run.conf, run_id=run.run_id)

    def drive(self) -> None:
        """Every run to its end, its strikes made, then its invariants checked."""
        threads = [threading.Thread(target=self._drive, args=(run,), daemon=True) for run in self.runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _drive(self, run: Run) -> None:
        try:
            strikes = [
                threading.Thread(target=self._strike_during, args=(run, kind, phase), daemon=True)
                for kind, phase in run.phases.items()
            ]
            for strike in strikes:
                strike.start()
            for strike in strikes:
                strike.join()
            run.state = self._until_ended(run)
            check(self, run)
        except Exception:
            run.problems.append(traceback.format_exc(limit=3))

    def _strike_during(self, run: Run, kind: str, phase: str) -> None:
        """Waits for the phase's task to run (or defer), then strikes; at once when the run passed it; not at all
        when the run ended. What it did goes to ``run.struck``."""
        try:
            run.struck[kind] = self._strike(run, kind, phase)
        except Exception:
            run.struck[kind] = "not struck: the strike failed"
            run.problems.append(f"{kind}: {traceback.format_exc(limit=3)}")

    def _strike(self, run: Run, kind: str, phase: str) -> str:
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline:
            state = self.tasks(run).get(phase, {}).get("state")
            if state in ("running", "deferred", "success", "failed", "upstream_failed", "skipped"):
                if self._ended(run):
                    return f"not struck: the run ended before {phase}"
                late = "" if state in ("running", "deferred") else " (late)"
                return CATALOGUE[kind].strike(self, run) + late
            time.sleep(2)
        return f"not struck: {phase} never ran"

    def tasks(self, run: Run) -> dict:
        return self._patiently(lambda: self.airflow.task_instances(DAG_ID, run.run_id))

    def _ended(self, run: Run) -> bool:
        return self._state(run) in ENDED

    def _state(self, run: Run) -> str:
        return self._patiently(lambda: self.airflow.run(DAG_ID, run.run_id))["state"]

    def _until_ended(self, run: Run) -> str:
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline:
            if (state := self._state(run)) in ENDED:
                return state
            time.sleep(5)
        return "timed out"

    @staticmethod
    def _patiently(call, attempts: int = 40):
        """A REST call that outlives a restart of the API server or of its database."""
        for attempt in range(attempts):
            try:
                return call()
            except (AirflowApiError, OSError) as error:
                if isinstance(error, AirflowApiError) and error.status < 500:
                    raise
                if attempt == attempts - 1:
                    raise
                time.sleep(5)

    def stack(self, *args: str) -> subprocess.CompletedProcess:
        with self.commanding:
            return self._stack(*args)

    def postgres(self, command: str) -> None:
        with self.commanding:
            done = self._stack("postgres", command)
        if done.returncode:
            raise RuntimeError(f"the stack's PostgreSQL did not {command}: {done.stdout}{done.stderr}")

    def revive(self) -> str:
        """Starts what died (as Kubernetes restarts an exited container): the components it started, if any."""
        status = self.stack("status").stdout
        dead = sorted(line.split(":")[0] for line in status.splitlines() if ": running" not in line and ":" in line)
        self.stack("start")
        return f"; restarted {', '.join(dead)}" if dead else ""

    def clear_rules(self) -> None:
        for run in self.runs:
            for name in faults.list_faults(faults.core_api()):
                if name.startswith(run.rule + "-"):
                    faults.clear_faults(faults.core_api(), name)
            for rules in (gke_faults, storage_faults):
                for name in rules.list_faults():
                    if name.startswith(run.rule + "-"):
                        rules.clear_faults(name)


# The strikes: each returns what it did.


def _kill(component: Callable[[Campaign, Run], str]) -> Callable[[Campaign, Run], str]:
    def strike(campaign: Campaign, run: Run) -> str:
        target = component(campaign, run)
        campaign.stack("stop", "--kill", target)
        return f"killed {target}{campaign.revive()}"

    return strike


def _pause_triggerer(campaign: Campaign, run: Run) -> str:
    """SIGSTOP for longer than a triggerer's heartbeat may lapse (30 s), so the other takes its triggers over."""
    target = _holder(campaign, run)
    campaign.stack("pause", target)
    try:
        time.sleep(75)
    finally:
        campaign.stack("resume", target)
    return f"paused {target} 75 s"


def _restart(component: str, down_seconds: float) -> Callable[[Campaign, Run], str]:
    def strike(campaign: Campaign, run: Run) -> str:
        if component == "postgres":
            campaign.postgres("stop")
            time.sleep(down_seconds)
            campaign.postgres("start")
        else:
            campaign.stack("stop", component)
            time.sleep(down_seconds)
            campaign.stack("start", component)
        return f"restarted {component} ({down_seconds:.0f} s down){campaign.revive()}"

    return strike


def _holder(campaign: Campaign, run: Run) -> str:
    """The triggerer that holds a deferred task of the run, else one drawn at random."""
    jobs = campaign._patiently(
        lambda: campaign.airflow.request("GET", "/api/v2/jobs?job_type=TriggererJob&is_alive=true&limit=100")
    )["jobs"]
    names = {job["id"]: job["unixname"] for job in jobs}
    for task in campaign.tasks(run).values():
        holder = (task.get("triggerer_job") or {}).get("id")
        if task.get("state") == "deferred" and holder in names:
            return names[holder]
    return campaign.rng.choice(("triggerer", "triggerer-2"))


def _worker_of(campaign: Campaign, run: Run) -> str:
    return campaign.rng.choice(("worker-a", "worker-b"))


def _scheduler(campaign: Campaign, run: Run) -> str:
    return campaign.rng.choice(("scheduler", "scheduler-2"))


CATALOGUE.update(
    {
        # GKE (sim/gke_faults.py: each kind's source there)
        "gke-throttle": FaultKind("GKE 429: the project's API requests a minute", gke={"kind": "throttle", "times": 2}),
        "gke-upgrade": FaultKind(
            "GKE upgrading the control plane on its own", gke={"kind": "upgrade", "seconds": 40, "times": 1}
        ),
        "gke-unavailable": FaultKind("GKE 503 UNAVAILABLE", gke={"kind": "unavailable", "times": 3}),
        "gke-slow-reply": FaultKind(
            "a pool create answered late (the caller may die first)",
            gke={"kind": "slow-reply", "pool_prefix": "tpu-", "seconds": 20, "times": 1},
        ),
        "gke-held-create": FaultKind(
            "a pool create held for capacity",
            gke={"kind": "capacity-held", "pool_prefix": "tpu-", "seconds": 90, "times": 1},
        ),
        "gke-slow-create": FaultKind(
            "a slow pool create, its pool in ERROR meanwhile",
            gke={"kind": "slow-create", "pool_prefix": "tpu-", "seconds": 60, "times": 1},
        ),
        "stockout": FaultKind(
            "no TPU capacity in the zone",
            gke={"kind": "stockout", "pool_prefix": "tpu-"},
            fatal=("GCE_STOCKOUT", "fix:"),
        ),
        "quota": FaultKind("no TPU quota", gke={"kind": "quota", "pool_prefix": "tpu-"}, fatal=("quota", "fix:")),
        # The Kubernetes API through GKE's front end (sim/gke_faults.py) and Cloud Storage (sim/storage_faults.py)
        "kube-unavailable": FaultKind(
            "the cluster's front end answering 503 (a control-plane replica away)",
            gke={"kind": "kube-unavailable", "times": 6},
        ),
        "kube-reset": FaultKind("the cluster's API dropping connections", gke={"kind": "kube-reset", "times": 6}),
        "gcs-unavailable": FaultKind(
            "Cloud Storage 503s on the reads of the run's training folder",
            storage={"kind": "unavailable", "method": "GET", "times": 6},
        ),
        # The trainer (sim/faults.py)
        "preemption": FaultKind("a Spot VM reclaimed mid-training", trainer="preempt-at-step=5"),
        "half-written": FaultKind("a preemption during a save", trainer="preempt-at-step=6,skip-commit"),
        "log-flood": FaultKind(
            "a trainer logging every rollout (Tunix), its log rotated by the kubelet",
            trainer="flood=12",
            conf={"require_no_regression": True},  # the evaluation before training must be found
        ),
        # The stack (scripts/airflow-stack.sh: its components and its PostgreSQL server)
        "kill-worker": FaultKind("a Celery worker's machine lost", strike=_kill(_worker_of)),
        "kill-scheduler": FaultKind("a scheduler lost", strike=_kill(_scheduler)),
        "kill-triggerer": FaultKind("a triggerer lost", strike=_kill(_holder), phases=WAITS),
        "pause-triggerer": FaultKind(
            "a triggerer stalled (GC, CPU throttling, network)", strike=_pause_triggerer, phases=WAITS
        ),
        "restart-redis": FaultKind("the Celery broker restarted", strike=_restart("redis", 10)),
        "restart-postgres": FaultKind("the metadata database failed over", strike=_restart("postgres", 15)),
        "restart-api-server": FaultKind("the API server restarted", strike=_restart("api-server", 10)),
    }
)


# The invariants.


def check(campaign: Campaign, run: Run) -> None:
    """Each invariant's verdict in ``run.checks`` ("ok" or what broke it), each break also in ``run.problems``;
    the faults the run really met in ``run.injected``."""
    run.injected = [kind for kind in run.kinds if _injected(run, kind)]
    tasks = campaign.tasks(run)
    for name, verdict in (
        ("outcome", _outcome(campaign, run, tasks)),
        ("left behind", _left_behind(campaign, run)),
        ("trainings", _trainings(campaign, run, tasks)),
        ("checkpoints", _checkpoints(campaign, run) if run.state == "success" else "ok"),
    ):
        run.checks[name] = verdict
        if verdict != "ok":
            run.problems.append(f"{name}: {verdict}")


def _outcome(campaign: Campaign, run: Run, tasks: dict) -> str:
    expected = "success" if run.survivable else "failed"
    failed = sorted(task_id for task_id, ti in tasks.items() if ti["state"] == "failed")
    if run.state != expected:
        last = failed[0] if failed else ""
        tail = campaign.airflow.task_log(DAG_ID, run.run_id, last, tasks[last]["try_number"])[-1500:] if last else ""
        return f"{run.state}, not {expected} (failed: {', '.join(failed) or 'none'})\n{tail}"
    if "log-flood" in run.kinds:
        train_log = campaign.airflow.task_log(DAG_ID, run.run_id, "train_rl", tasks["train_rl"]["try_number"])
        if len(train_log) > 2**20 or "of the workload's log not copied here" not in train_log:
            return f"train_rl's log of a flooded trainer is {len(train_log) / 2**20:.1f} MiB, with no line on the rest"
    if expected == "failed":
        words = next(CATALOGUE[kind].fatal for kind in run.kinds if CATALOGUE[kind].fatal)
        logs = "".join(campaign.airflow.task_log(DAG_ID, run.run_id, t, tasks[t]["try_number"]) for t in failed)
        missing = [word for word in words if word not in logs]
        if missing:
            return f"the failure message ({', '.join(failed)}) does not say {missing}"
    return "ok"


def _left_behind(campaign: Campaign, run: Run) -> str:
    from google.api_core.exceptions import NotFound

    name = f"projects/{RUN_CONF['project']}/locations/{RUN_CONF['region']}/clusters/{run.cluster}"
    try:
        cluster = campaign.gke.get_cluster(name=name)
    except NotFound:
        return "ok"
    return f"cluster {run.cluster} is still there ({cluster.status.name}, pools {[p.name for p in cluster.node_pools]})"


def _trainings(campaign: Campaign, run: Run, tasks: dict) -> str:
    """The training JobSets the trainer ran against the preemptions the run resumed."""
    applied = [
        attempt
        for name, rule in faults.list_faults(faults.core_api()).items()
        if name.startswith(run.rule + "-")
        for attempt in rule["applied"]
    ]
    submitted = {attempt.split("/attempt-")[0] for attempt in applied}
    try:
        accounting = campaign.airflow.xcom(DAG_ID, run.run_id, "train_rl", "preemptions") or {}
    except AirflowApiError:
        accounting = {}
    resumed = sum(1 for event in accounting.get("events", []) if event.get("resumed_from") is not None)
    trained = tasks.get("train_rl", {}).get("state") in ENDED
    expected = 1 + resumed if submitted or trained else 0
    if len(submitted) != expected:
        return f"{len(submitted)} training JobSets ran, {expected} expected ({resumed} preemptions resumed)"
    return "ok"


def _checkpoints(campaign: Campaign, run: Run) -> str:
    from tpu_rl.config import RunConfig
    from tpu_rl.layout import GcsLayout
    from tpu_rl.run import RunIdentity

    layout = GcsLayout(RunConfig.from_params(run.conf), RunIdentity(DAG_ID, run.run_id))

    def folders(prefix: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for blob in campaign.gcs.list_blobs(layout.bucket, prefix=prefix):
            folder, _, rest = blob.name[len(prefix) :].partition("/")
            found.setdefault(folder, set()).add(rest)
        return found

    steps = {k: v for k, v in folders(layout.actor_checkpoints_prefix).items() if k.isdigit()}
    set_aside = folders(layout.set_aside_prefix)
    incomplete = sorted(k for k, files in steps.items() if "commit_success.txt" not in files)
    discarded = sorted(k for k, files in set_aside.items() if "commit_success.txt" in files)
    verified = campaign.airflow.xcom(DAG_ID, run.run_id, "verify_training")
    problems = [f"incomplete step folders kept: {incomplete}"] if incomplete else []
    problems += [f"complete steps set aside: {discarded}"] if discarded else []
    if verified != LAST_STEP or str(LAST_STEP) not in steps:
        problems.append(f"verified step {verified}, trained to {LAST_STEP}")
    if _applied(run, "half-written") and not set_aside:
        problems.append("the half-written step was not set aside")
    return "; ".join(problems) or "ok"


def _injected(run: Run, kind: str) -> bool:
    if kind in run.struck:
        return not run.struck[kind].startswith("not struck")
    if kind in run.phases:
        return False
    for armed, rules in ((CATALOGUE[kind].gke, gke_faults), (CATALOGUE[kind].storage, storage_faults)):
        if armed:
            return bool(rules.list_faults().get(f"{run.rule}-{kind}", {}).get("applied"))
    return _applied(run, kind)


def _applied(run: Run, kind: str) -> bool:
    """Whether the trainer met the run's MaxText fault of this kind."""
    rule = faults.list_faults(faults.core_api()).get(f"{run.rule}-a-faults", {})
    return kind in run.kinds and bool(CATALOGUE[kind].trainer and rule.get("applied"))


# The table.


def table(campaign: Campaign) -> str:
    names = ("outcome", "left behind", "trainings", "checkpoints")
    rows = ["| run | faults (when struck) | state | " + " | ".join(names) + " |", "|---" * (3 + len(names)) + "|"]
    for run in campaign.runs:
        drawn = ", ".join(f"{kind}@{run.phases[kind]}" if kind in run.phases else kind for kind in run.kinds)
        marks = " | ".join("held" if run.checks.get(n) == "ok" else "BROKEN" if n in run.checks else "?" for n in names)
        rows.append(f"| {run.index} | {drawn} | {run.state or '?'} | {marks} |")
    kinds = Counter(kind for run in campaign.runs for kind in run.injected)
    held = sum(verdict == "ok" for run in campaign.runs for verdict in run.checks.values())
    total = len(names) * len(campaign.runs)
    rows.append("")
    rows.append("faults injected: " + ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())))
    rows.append(f"invariants held: {held} of {total}")
    for run in campaign.runs:
        for kind, what in run.struck.items():
            rows.append(f"run {run.index} {kind}: {what}")
        for problem in run.problems:
            rows.append(f"run {run.index} PROBLEM {problem}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("TPU_RL_CHAOS_SEED", "1")))
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--faults", type=int, default=3, help="faults per run")
    parser.add_argument(
        "--hand", action="append", help="a run's faults, comma-separated (repeat for more runs): no draw"
    )
    args = parser.parse_args(argv)
    hands = [hand.split(",") for hand in args.hand] if args.hand else deal(args.seed, args.runs, args.faults)
    unknown = sorted({kind for hand in hands for kind in hand} - set(CATALOGUE))
    if unknown:
        parser.error(f"unknown fault kinds {unknown}: the catalogue has {', '.join(sorted(CATALOGUE))}")
    airflow = LocalAirflow(_stack("url").stdout.strip())
    airflow.wait_for_dag(DAG_ID)
    airflow.unpause(DAG_ID)
    gke = clients.gke_client(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    campaign = Campaign(airflow, _stack, gke, clients.gcs_client(os.environ["STORAGE_EMULATOR_HOST"]), args.seed, hands)
    started = time.monotonic()
    try:
        campaign.start()
        campaign.drive()
    finally:
        campaign.clear_rules()
    print(f"seed {args.seed}, {len(hands)} runs at once, {time.monotonic() - started:.0f} s")
    print(table(campaign))
    return 1 if any(run.problems for run in campaign.runs) else 0


def _stack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts/airflow-stack.sh"), *args], capture_output=True, text=True, check=False)


if __name__ == "__main__":
    sys.exit(main())
