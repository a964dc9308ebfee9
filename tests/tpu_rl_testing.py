"""Constants shared by the test folders (imported by name: each folder has its own conftest.py)."""

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TUTORIAL_CONF = json.loads((REPO / "include/examples/tutorial.json").read_text())
#: The tutorial's path on the simulation: the GKE emulator creates the cluster and the TPU pool (make demo).
SIM_CREATE_CONF = json.loads((REPO / "include/examples/simulation.json").read_text())
#: The simulation's standing cluster through a Kubernetes connection, its slice already there.
SIM_CONF = json.loads((REPO / "include/examples/simulation-existing-cluster.json").read_text())
#: A v6e-16 slice (4 hosts) keeps the simulated clusters small; the tutorial's 8x8 runs in make demo.
SMALL_SLICE = {
    "tpu_type": "v6e-16",
    "topology": "4x4",
    "ici_tensor_parallelism": 2,
    "ici_expert_parallelism": 2,
    "rollout_tensor_parallelism": 4,
    "num_batches": 4,
    "checkpoint_period": 2,
}
#: The GKE emulator's project, on a v6e-16 slice: what the GKE operator and preflight tests run (their cluster name
#: their own).
GKE_TEST_CONF = {
    "project": "tpu-rl-sim",
    "region": "us-east5",
    "zone": "us-east5-b",
    "gcs_bucket": "tpu-rl-sim",
    "node_service_account": "tpu-rl-nodes@tpu-rl-sim.iam.gserviceaccount.com",
    "tpu_type": "v6e-16",
    "topology": "4x4",
    "ici_tensor_parallelism": 2,
    "ici_expert_parallelism": 2,
    "rollout_tensor_parallelism": 4,
}
#: Where the simulation's runs create clusters.
GKE_PARENT = f"projects/{SIM_CREATE_CONF['project']}/locations/{SIM_CREATE_CONF['region']}"


class TaskInstanceStandIn:
    """The task instance of a context, as far as the package's operators use it: identity, try, start, the
    run's XComs by (task id, key), and the states of other DAG runs that the leases ask the task API about
    (``get_dr_count``, ``get_dagrun_state``). Tests that need Airflow's own task runner use ``dag.test()``."""

    def __init__(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        try_number: int = 1,
        xcoms: dict[tuple[str, str], Any] | None = None,
    ) -> None:
        self.dag_id, self.run_id, self.task_id, self.try_number = dag_id, run_id, task_id, try_number
        self.map_index = -1
        self.start_date = datetime.now(UTC)
        self.xcoms: dict[tuple[str, str], Any] = dict(xcoms or {})
        self.run_states: dict[str, str] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[self.task_id, key] = value

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids or self.task_id, key))

    def pushed(self, key: str) -> Any:
        """What this task pushed under ``key``."""
        return self.xcoms[self.task_id, key]

    def get_dr_count(self, dag_id: str, run_ids: list[str]) -> int:
        return sum(run_id in self.run_states for run_id in run_ids)

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        return self.run_states[run_id]


def task_context(ti: TaskInstanceStandIn, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The context Airflow's task runner hands an operator, as far as ``RunScope.of`` and the operators read it."""
    return {
        "ti": ti,
        "task_instance": ti,
        "dag": SimpleNamespace(dag_id=ti.dag_id),
        "run_id": ti.run_id,
        "params": dict(params or {}),
    }


def selected_scenarios(request, module=None) -> set[str]:
    """The labels of the ``scenario`` marks of the session's selected tests (of ``module``'s only, when given): a
    fixture that starts scenarios starts only those the selected tests read, so a session that selects a few tests
    (the 3.1.7 stack's, in scripts/test.sh) triggers no DAG run that nothing reads."""
    return {
        label
        for item in request.session.items
        if module is None or item.module is module
        for mark in item.iter_markers("scenario")
        for label in mark.args
    }


def stack_answer(question: str) -> str:
    """What scripts/airflow-stack.sh answers (``state``, ``redis-port``, ``db``, ``url``) for the stack it runs, the
    one ``TPU_RL_STACK`` picks (main, or af31: Airflow 3.1.7)."""
    done = subprocess.run(["scripts/airflow-stack.sh", question], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def cluster_or_none(gke, name: str):
    """The cluster through a ClusterManagerClient, or None."""
    from google.api_core.exceptions import NotFound

    try:
        return gke.get_cluster(name=f"{GKE_PARENT}/clusters/{name}")
    except NotFound:
        return None


def wait_until(what: str, predicate, timeout: float = 60, interval: float = 0.5):
    """``predicate()``'s first true value, asked every ``interval`` seconds; AssertionError after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """The process's environment with ``values`` set, restored after (a fixture wider than a test cannot use
    pytest's monkeypatch)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def read_env(path: Path) -> dict[str, str]:
    """The `export NAME=value` lines of the simulation's env file (.sim/airflow.env)."""
    env = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env


#: A GKE cluster as the JobSet operator hands it to its trigger (endpoint resolved).
TRIGGER_CLUSTER = {
    "project_id": "p",
    "location": "us-east5",
    "cluster_name": "c",
    "use_dns_endpoint": True,
    "cluster_url": "https://gke-1.us-east5.gke.goog",
    "ssl_ca_cert": None,
}


def jobset_trigger(**changes: Any):
    """A JobSetTrigger of a JobSet ``ns/n`` (uid ``u``) whose log is its Pathways head's container ``c``, on a
    cluster reached through a Kubernetes connection; ``changes`` replace or add keywords."""
    from tpu_rl.hooks.kubernetes import ClusterTarget
    from tpu_rl.triggers.jobset import JobSetTrigger

    keywords = {
        "name": "n",
        "namespace": "ns",
        "uid": "u",
        "log_replicated_job": "pathways-head",
        "log_container": "c",
        "cluster": ClusterTarget(kubernetes_conn_id="k"),
    }
    return JobSetTrigger(**{**keywords, **changes})


def trigger_samples() -> list:
    """One instance of every trigger the package defers on, with every kind of output check, built as its
    operator builds it."""
    from tpu_rl import __version__
    from tpu_rl.output_checks import ConversionLockWait, FinalTrainingStep, HfExport, OrbaxStep
    from tpu_rl.triggers.checkpoints import GcsOutputTrigger
    from tpu_rl.triggers.gke import GkeOperationTrigger, TpuPoolCreateTrigger
    from tpu_rl.triggers.jobset import JobSetTrigger
    from tpu_rl.triggers.triggerer import TriggererCheckTrigger

    step = "m/max-text-format/x/0/"
    checks = [
        OrbaxStep(prefix=step),
        ConversionLockWait(prefix=step, lock_object="m/lock", holder={"run_id": "r"}, stale_after=60.0),
        FinalTrainingStep(prefix="m/rl/checkpoints/actor/", train_steps=50, checkpoint_period=10),
        HfExport(prefix="m/hf/attempt-1/", not_before="2026-12-01T00:00:00+00:00"),
    ]
    return [
        TriggererCheckTrigger(sent_by=__version__),
        *(GcsOutputTrigger("b", check, deadline=1.8e9) for check in checks),
        GkeOperationTrigger(operation_name="operation-1", project_id="p", location="us-east5"),
        TpuPoolCreateTrigger(
            operation_name="operation-1",
            project_id="p",
            location="us-east5",
            gcp_conn_id="google_cloud_default",
            pool_path="projects/p/locations/us-east5/clusters/c/nodePools/tpu",
            capacity_deadline=1.8e9,
        ),
        JobSetTrigger(
            name="qwen-train-1",
            namespace="default",
            uid="u",
            log_replicated_job="pathways-head",
            log_container="pathways-head",
            cluster=TRIGGER_CLUSTER,
            training={"bucket": "b", "prefix": "m/rl/tensorboard/", "train_steps": 50},
        ),
    ]


#: Run by a fresh interpreter: imports each (classpath, kwargs) read from stdin as the triggerer does, then what
#: check_triggerer imports there (every module the triggers import when they run), and prints the module files
#: and sys.path.
TRIGGER_IMPORT_PROBE = """
import json, sys
try:
    from airflow._shared.module_loading import import_string  # what the triggerer uses (3.3)
except ImportError:  # Airflow 3.1
    from airflow.utils.module_loading import import_string
triggers = json.loads(sys.stdin.read())
files = []
for classpath, kwargs in triggers:
    trigger = import_string(classpath)(**kwargs)
    again = trigger.serialize()
    assert json.loads(json.dumps(list(again))) == [classpath, kwargs], (classpath, again)
    files.append(sys.modules[type(trigger).__module__].__file__)
from tpu_rl.triggers.triggerer import import_all, trigger_modules
_, failed = import_all(trigger_modules())
assert failed == [], failed
print(json.dumps({"files": files, "path": sys.path}))
"""


def checkout_copy(target: Path, names: tuple[str, ...], umask: int, version: str | None = None) -> Path:
    """A copy of ``names`` (files and folders of this repository) with the modes a checkout made under ``umask``
    has, and ``version`` as the package's ``__version__`` when given: another checkout of a commit."""
    target.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in names:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, target / name, ignore=ignore, copy_function=shutil.copyfile)
        else:
            shutil.copyfile(REPO / name, target / name)
    if version:
        init = target / "src/tpu_rl/__init__.py"
        init.write_text(re.sub(r'(?m)^__version__ = ".*"$', f'__version__ = "{version}"', init.read_text()))
    for path in target.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
    return target


#: What ``make wheel`` reads.
WHEEL_BUILD_INPUTS = ("Makefile", "pyproject.toml", "LICENSE", "src", "scripts")


def make_wheel(checkout: Path, umask: int) -> Path:
    """``make wheel`` in ``checkout`` under ``umask``, with this interpreter; the wheel it built."""
    built = subprocess.run(
        ["make", "-s", "-C", str(checkout), "wheel", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        umask=umask,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    (wheel,) = (checkout / "dist").glob("tpu_rl-*.whl")
    return wheel


#: The labels of a spare pool's hosts: TPU v6e, with a topology of their own, so that no workload aimed at the
#: standing 8x8 slice lands there.
SPARE_TOPOLOGY = "2x4"


@contextlib.contextmanager
def spare_tpu_pool(core, hosts: int = 2):
    """``hosts`` extra TPU-like nodes in a pool of their own (``(pool, node names)``), deleted afterwards: a test
    that loses a host loses one of these, never one of the standing slice, which the end-to-end scenarios use
    beside it in make test."""
    from kubernetes.client.exceptions import ApiException

    from sim import nodes

    pool = f"sim-spare-{uuid.uuid4().hex[:4]}"
    names = [f"{pool}-{i}" for i in range(hosts)]
    for name in names:
        core.create_node(
            nodes.node(
                name,
                pool,
                "ct6e-standard-4t",
                {"cpu": "180", "memory": "720Gi", "pods": "110", "google.com/tpu": "4"},
                {
                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                    "cloud.google.com/gke-tpu-topology": SPARE_TOPOLOGY,
                },
                [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}],
            )
        )
    try:
        yield pool, names
    finally:
        for name in names:
            try:
                core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
