"""The run's Training tab in a real browser: headless Chromium on the local Airflow's UI, after a finished
simulated run of the pipeline that created its cluster and TPU pool (so it has a cost).

The page's curves must hold exactly the scalars of the run's event files in the simulation's GCS emulator,
and its evaluation, chip-hours and cost the run's XComs. Screenshots of the run page and of the tab are kept
as test artifacts in test-artifacts/ (TPU_RL_TEST_ARTIFACTS names another folder). The view is as closed as
Airflow's REST API: a forged token is refused, and an anonymous request gets what the REST API gives it
(refused, unless the stack makes everyone an admin, as scripts/airflow-stack.sh does for the local UI).
"""

from __future__ import annotations

import os
import struct
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tpu_rl import training_metrics as tm
from tpu_rl.run import DAG_ID, RunIdentity
from tpu_rl.run_scope import RunScope
from tpu_rl_testing import REPO

pytestmark = pytest.mark.e2e
expect.set_options(timeout=30_000)

ARTIFACTS = Path(os.environ.get("TPU_RL_TEST_ARTIFACTS", REPO / "test-artifacts"))


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file (its IHDR chunk); fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def finished_run(airflow, training_runs):
    """(run id, conf) of a successful run on a small slice that created its cluster and pool (shared with
    test_training_metrics_e2e.py: conftest.py's ``training_runs``)."""
    run_id, conf, state = training_runs["trained"]
    assert state == "success", {t: ti["state"] for t, ti in airflow.task_instances(DAG_ID, run_id).items()}
    return run_id, conf


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.scenario("trained")
def test_the_training_tab_shows_the_event_files_curves_evaluation_and_cost(airflow, finished_run, gcs, page):
    run_id, conf = finished_run
    layout = RunScope(conf, RunIdentity(DAG_ID, run_id)).layout
    blobs = sorted(gcs.list_blobs(conf["gcs_bucket"], prefix=layout.tensorboard_prefix), key=lambda b: b.name)
    written = tm.read_scalars([b.download_as_bytes() for b in blobs if tm.is_event_file(b.name)])
    assert written.get(tm.LOSS_TAG), [b.name for b in blobs]

    page.goto(f"{airflow.base_url}/dags/{DAG_ID}/runs/{run_id}/plugin/tpu-rl-training", wait_until="domcontentloaded")
    view = page.frame_locator("iframe")
    expect(view.locator(f"figure[data-tag='{tm.REWARD_TAG}'] svg circle").first).to_be_attached()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / "run-view-page.png", full_page=True)
    page.locator("iframe").screenshot(path=ARTIFACTS / "run-view-tab.png")
    width, height = png_size(ARTIFACTS / "run-view-tab.png")
    assert width >= 600 and height >= 400, (width, height)  # the tab, not an empty frame

    for tag in (tm.REWARD_TAG, tm.LOSS_TAG, tm.KL_TAG):
        shown = view.locator(f"figure[data-tag='{tag}'] svg circle").evaluate_all(
            "marks => marks.map(m => [m.dataset.step, m.dataset.value])"
        )
        assert [(int(step), float(value)) for step, value in shown] == written[tag], tag

    expect(view.locator("#final-step")).to_have_text(str(conf["num_batches"]))
    evaluation = airflow.xcom(DAG_ID, run_id, "train_rl", key="evaluation")
    for when in ("before", "after"):
        score = evaluation[when]
        expect(view.locator(f"#evaluation-{when}")).to_contain_text(f"{score['accuracy']:.1f}%")
        expect(view.locator(f"#evaluation-{when}")).to_contain_text(f"{score['correct']:g}/{score['total']}")
    cost = tm.tpu_cost(airflow.xcom(DAG_ID, run_id, "delete_tpu_pools", key="tpu_slices"), layout.config)
    assert cost["chip_hours"] > 0
    expect(view.locator("#chip-hours")).to_have_text(f"{cost['chip_hours']:.3f}")
    expect(view.locator("#cost-usd")).to_have_text(f"{cost['cost_usd']:.2f}")
    outputs = view.locator("#outputs")
    expect(outputs).to_contain_text(layout.uri(layout.actor_checkpoints_prefix))
    expect(outputs).to_contain_text(airflow.xcom(DAG_ID, run_id, "publish_export"))


@pytest.mark.scenario("trained")
def test_the_view_is_as_closed_as_airflows_rest_api(airflow, finished_run):
    run_id, _ = finished_run
    view = f"{airflow.base_url}/tpu-rl/runs/{DAG_ID}/{run_id}"

    assert status_of(view, {"Authorization": "Bearer forged"}) == 403
    rest_api = status_of(f"{airflow.base_url}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")
    assert status_of(view) == rest_api
    assert rest_api in (200, 401)  # 200 only where every request is an admin's


def test_the_api_server_has_the_tab_and_the_provider_from_the_installed_distribution(airflow_stack):
    """As on Cloud Composer 3: no plugins folder; the Training tab and the provider metadata come from the
    wheel's entry points, with the distribution's version."""
    import tpu_rl

    plugins = airflow_stack.request("GET", "/api/v2/plugins")["plugins"]
    (tab,) = [p for p in plugins if p["name"] == "tpu_rl_run_view"]
    assert tab["source"].startswith(f"tpu-rl=={tpu_rl.__version__}: EntryPoint(") and "airflow.plugins" in tab["source"]
    assert [v["name"] for v in tab["external_views"]] == ["Training"]
    providers = airflow_stack.request("GET", "/api/v2/providers?limit=100")["providers"]
    assert {"package_name": "tpu-rl", "version": tpu_rl.__version__} in [
        {k: p[k] for k in ("package_name", "version")} for p in providers
    ]
