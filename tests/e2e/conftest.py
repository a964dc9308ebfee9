"""End-to-end fixtures: the local Airflow stack (scripts/airflow-stack.sh) and a headless Chromium.

``airflow_stack`` (session) reuses a stack that already runs (a demo's, say) and never stops it; otherwise
it starts what is missing: the stack's PostgreSQL (``scripts/airflow-stack.sh postgres``) and the stack (which
migrates its own database), with the simulated cluster's connections in its environment when the simulation is up
(``.sim/airflow.env`` exists and ``sim/status.sh`` exits 0; the fixture never starts the simulation).
At the end it stops only what it started.

``browser`` (module) is Debian's Chromium (scripts/install-browser.sh installs it) driven by Playwright;
``page`` is a new page for each test (in one context for the module, so the UI's scripts are cached).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from scripts.local_airflow import AirflowApiError, LocalAirflow
from tpu_rl_testing import environ, read_env, selected_scenarios, stack_answer

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
#: As root, on a machine whose only network is the package registries: no sandbox, no GPU, and none of
#: Chromium's own background connections (refused here, and slow to fail).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class AirflowStack(LocalAirflow):
    """The running stack: its REST client (all of LocalAirflow's methods), its base URL, and what this
    session did to it."""

    def __init__(self, base_url: str, started: bool, with_sim: bool | None):
        super().__init__(base_url)
        #: True when this session started the stack (and stops it); False when it reused a running one.
        self.started = started
        #: Whether the stack has the simulated cluster's connections: None for a reused stack (not known).
        self.with_sim = with_sim

    @property
    def client(self) -> LocalAirflow:
        return self

    def script(self, *args: str, background: bool = False, log: Path | None = None, check: bool = True):
        """scripts/airflow-stack.sh with the environment the stack's components were started with (the
        simulation's connections when it is up): ``stop triggerer``, ``start``, ``exec ...``; ``check=False``
        returns a failed command's result (``status`` exits 1 when a component is down)."""
        env = {**os.environ, **_sim_env()}
        command = ["scripts/airflow-stack.sh", *args]
        if background:
            with open(log or os.devnull, "w") as out:
                return subprocess.Popen(
                    command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
        return _run(shlex.join(command), env=env, check=check)

    def wait_for_healthy_dag(self, dag_id: str, timeout: float = 180) -> None:
        """Until the DAG is parsed, not stale, and its file has no import error (the dag-processor
        re-parses the checkout, which may be edited while the stack runs)."""
        deadline = time.monotonic() + timeout
        problem = ""
        while time.monotonic() < deadline:
            try:
                dag = self.request("GET", f"/api/v2/dags/{dag_id}")
            except AirflowApiError as error:
                if error.status != 404:
                    raise
                errors = self.request("GET", "/api/v2/importErrors?limit=100")["import_errors"]
                problem = "not parsed yet" + "".join(f"\n{e['filename']}: {e['stack_trace'][-1000:]}" for e in errors)
            else:
                errors = self.request("GET", "/api/v2/importErrors?limit=100")["import_errors"]
                dag_file = Path(dag["relative_fileloc"] or dag["fileloc"]).name
                mine = [e for e in errors if e["filename"] and Path(e["filename"]).name == dag_file]
                if not mine and not dag.get("is_stale") and not dag.get("has_import_errors"):
                    return
                problem = mine[0]["stack_trace"][-2000:] if mine else "stale"
            time.sleep(2)
        raise TimeoutError(f"DAG {dag_id} not healthy after {timeout:.0f} s: {problem}")


def _run(command: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, check=check, timeout=600
    )


def _sim_env() -> dict[str, str]:
    """The variables of .sim/airflow.env when the simulation is up, else nothing."""
    env_file = REPO / ".sim" / "airflow.env"
    if not env_file.exists() or _run("sim/status.sh", check=False).returncode != 0:
        return {}
    out = _run(f"set -a; source {env_file}; env -0").stdout
    current = dict(os.environ)
    values = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    return {key: value for key, value in values.items() if current.get(key) != value}


@pytest.fixture(scope="session")
def airflow_stack():
    status = _run("scripts/airflow-stack.sh status", check=False)
    base_url = stack_answer("url")
    if status.returncode == 0:
        yield AirflowStack(base_url, started=False, with_sim=None)
        return
    # Some components may run (not all): start fills in the missing ones; then stop only if none ran before.
    partly_running = ": running" in status.stdout
    started_postgres = _run("scripts/airflow-stack.sh postgres start").stdout.startswith("started")
    sim_env = _sim_env()
    env = {**os.environ, **sim_env}
    try:
        start = _run("scripts/airflow-stack.sh start", env=env, check=False)
        if start.returncode != 0:
            raise RuntimeError(f"scripts/airflow-stack.sh start failed:\n{start.stdout}\n{start.stderr}")
        yield AirflowStack(base_url, started=not partly_running, with_sim=bool(sim_env))
    finally:
        if not partly_running:
            _run("scripts/airflow-stack.sh stop", check=False)
        if started_postgres:
            _run("scripts/airflow-stack.sh postgres stop", check=False)


@contextlib.contextmanager
def _gke_client():
    """The GKE API as the pipeline reaches it: gRPC through the simulation's egress proxy, a service-account key."""
    from sim import clients

    env = read_env(REPO / ".sim/airflow.env")
    with environ({k: env[k] for k in ("grpc_proxy", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")}):
        yield clients.gke_client(env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])


@pytest.fixture(scope="module")
def gke():
    with _gke_client() as client:
        yield client


@pytest.fixture(scope="session")
def session_gke():
    """:func:`gke` for a scenario that runs through the whole e2e session."""
    with _gke_client() as client:
        yield client


@pytest.fixture(scope="module")
def gcs():
    """The simulation's GCS emulator, as its env file names it."""
    from sim import clients

    return clients.gcs_client(read_env(REPO / ".sim/airflow.env")["STORAGE_EMULATOR_HOST"])


def pytest_collection_modifyitems(config, items):
    """Tests marked ``e2e_first`` run before every other e2e test (they replace the stack's triggerer for a
    moment, when no other run may defer); then the tests marked ``e2e_start``, which start the long scenarios
    (their runs go on while the other tests run on the same stack); tests marked ``e2e_last`` at the very end,
    after any tests of the session that follow e2e (gke, jobset, sim: ``make test`` runs those in a session of
    their own beside), so the scenarios run on while the others do and are checked last. Those tests remove only
    the fault rules they added, so the scenarios' rules stay in place. Tests marked ``e2e_alone`` come after all of
    them: what they do to the stack would strike the other scenarios."""
    here = Path(__file__).parent
    e2e = [item for item in items if Path(item.path).parent == here]
    if not e2e:
        return
    first, starters, last, alone = (
        [item for item in e2e if item.get_closest_marker(m)]
        for m in ("e2e_first", "e2e_start", "e2e_last", "e2e_alone")
    )
    middle = [item for item in e2e if item not in (*first, *starters, *last, *alone)]
    start = items.index(e2e[0])
    others = [item for item in items if item not in e2e]
    items[:] = others[:start] + first + starters + middle + others[start:] + last + alone


@pytest.fixture(scope="module")
def airflow(airflow_stack):
    """The stack with the pipeline's DAG parsed, healthy and unpaused."""
    airflow_stack.wait_for_healthy_dag("maxtext_rl_tpu")
    airflow_stack.unpause("maxtext_rl_tpu")
    return airflow_stack


# Module scope: while Playwright's sync API is open it keeps an event loop running in the main thread, and
# any later test that calls asyncio.run() (the JobSet and checkpoint tests do) would fail.
@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-browser.sh (Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _anonymous_is_refused(base_url: str) -> bool:
    """Whether the REST API refuses a request without a token (Airflow 3.1's simple auth manager does even when
    everyone is admin)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{base_url}/api/v2/dags?limit=1", timeout=60).close()
    except urllib.error.HTTPError as error:
        return error.code == 401
    return False


@pytest.fixture(scope="module")
def browser_context(browser, airflow_stack):
    """One context for the module, so the UI's scripts are cached after the first page; signed in first, as a
    person's first visit is (Airflow 3.1's simple auth manager sends it through its login, which lands on the home
    page, not on the page asked for; 3.3's lets it through)."""
    context = browser.new_context(viewport={"width": 1400, "height": 2200})
    context.set_default_timeout(60_000)
    if _anonymous_is_refused(airflow_stack.base_url):
        first = context.new_page()
        first.goto(airflow_stack.base_url)
        deadline = time.monotonic() + 60
        while not any(cookie["name"] == "_token" for cookie in context.cookies()):
            assert time.monotonic() < deadline, "the UI's login set no _token cookie in 60 s"
            first.wait_for_timeout(500)
        first.close()
    yield context
    context.close()


@pytest.fixture
def page(browser_context):
    """A new page for each test, tall enough for a form."""
    page = browser_context.new_page()
    yield page
    page.close()


#: How long the trained run's emulated trainer trains (its event file growing meanwhile).
TRAINED_SECONDS = 80


@pytest.fixture(scope="session")
def training_runs(airflow_stack, request):
    """Two runs triggered at once and shared by the modules that read what a run reports
    (test_training_metrics_e2e.py, test_run_view_e2e.py): {scenario: (run_id, conf, final state)}, for the
    scenarios the selected tests read.

    ``trained``: the tutorial's path on a small slice (the run creates its cluster and TPU pool, so it has a
    cost). ``regressed``: the standing cluster's slice, a gate that refuses a worse model, and a trainer made
    worse by the emulator's fault ``eval-regression`` on that run's training JobSet only (removed after).
    """
    import uuid

    from sim import faults
    from tpu_rl.run import DAG_ID, RunIdentity
    from tpu_rl_testing import SIM_CONF, SIM_CREATE_CONF, SMALL_SLICE

    airflow_stack.wait_for_healthy_dag(DAG_ID)
    airflow_stack.unpause(DAG_ID)
    suffix = uuid.uuid4().hex[:6]
    scenarios = {
        "trained": {**SIM_CREATE_CONF, **SMALL_SLICE, "cluster_name": f"e2e-metrics-{suffix}"},
        "regressed": {**SIM_CONF, "require_no_regression": True},
    }
    run_ids = {name: f"e2e__metrics_{name}__{suffix}" for name in scenarios}
    api, rule, trains = faults.core_api(), f"e2e-metrics-regression-{suffix}", f"e2e-metrics-trains-{suffix}"
    regressed = RunIdentity(DAG_ID, run_ids["regressed"])
    faults.set_fault(
        api,
        rule,
        stage="train_rl",
        maxtext_fault="eval-regression",
        prefix=regressed.jobset_name(SIM_CONF.get("workload_prefix", "qwen"), "train"),
    )
    # The trained run's trainer trains long enough for a progress line (one a minute) while its event file grows.
    faults.set_fault(
        api,
        trains,
        stage="train_rl",
        run_seconds=TRAINED_SECONDS,
        prefix=RunIdentity(DAG_ID, run_ids["trained"]).jobset_name(
            SIM_CREATE_CONF.get("workload_prefix", "qwen"), "train"
        ),
    )
    read = selected_scenarios(request)
    selected = [name for name in scenarios if name in read]
    try:
        for name in selected:
            airflow_stack.trigger(DAG_ID, scenarios[name], run_id=run_ids[name])
        yield {
            name: (run_ids[name], scenarios[name], airflow_stack.wait_for_run(DAG_ID, run_ids[name], 1200))
            for name in selected
        }
    finally:
        faults.clear_faults(api, rule)
        faults.clear_faults(api, trains)
