"""The run's Training tab (tpu_rl.run_view_plugin, registered through the entry point airflow.plugins): its app
answered through FastAPI's test client with Airflow's own authentication (the simple auth manager's JWTs),
the run read from a fixture or (last test) from a run of the pipeline's DAG in the metadata database, and
its event files written by the MaxText emulator with tensorboardX. tests/unit also runs on Airflow 3.1.7
(make test-compat), so both versions' api-server modules are exercised."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tpu_rl
from sim.maxtext_outputs import tensorboard_event_file, training_scalars
from tpu_rl import training_metrics as tm
from tpu_rl.run import DAG_ID, RunIdentity
from tpu_rl.run_scope import RunScope
from tpu_rl_testing import TUTORIAL_CONF

REPO = Path(__file__).resolve().parents[2]

RUN_ID = "manual__2026-11-29T10:00:00+00:00"
CONF = {**TUTORIAL_CONF, "num_batches": 20, "notify_conn_id": "smtp_team", "notify_to": "team@example.com"}
EVALUATION = {
    "before": {
        "correct": 8,
        "total": 20,
        "accuracy": 40.0,
        "partial_accuracy": 50.0,
        "format_accuracy": 95.0,
        "mean_reward": 0.495,
    },
    "after": {
        "correct": 12,
        "total": 20,
        "accuracy": 60.0,
        "partial_accuracy": 70.0,
        "format_accuracy": 100.0,
        "mean_reward": 0.7,
    },
}
SLICES = [{"pool": "tpu-0", "nodes_from": "2026-11-29T10:10:00+00:00", "nodes_gone": "2026-11-29T11:40:00+00:00"}]
MODEL_URI = f"gs://{CONF['gcs_bucket']}/qwen3-30b-a3b/hf-trained/run/"


@pytest.fixture(scope="module")
def event_files(tmp_path_factory) -> list[Path]:
    """Two attempts of a trainer, a step every 90 s: a preempted one up to step 12, and its resume from step 10 to
    the end."""
    folder = tmp_path_factory.mktemp("tensorboard")
    paths = []
    for seed, steps in (("first", range(1, 13)), ("resumed", range(11, 21))):
        name, data = tensorboard_event_file(training_scalars(seed, 20, steps), lambda step: 1_764_583_200 + 90 * step)
        paths.append(folder / f"{name}.{seed}")
        paths[-1].write_bytes(data)
    return paths


@pytest.fixture(scope="module")
def tokens(metadata_db) -> dict[str, str]:
    """JWTs the api-server would accept: a viewer's, and one of a user with no role (no permission)."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    manager = init_auth_manager()
    return {
        "viewer": manager.generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer")),
        "nobody": manager.generate_jwt(SimpleAuthManagerUser(username="nobody", role=None)),
    }


def client_for(state: str, xcoms: dict, files: list[Path]):
    from fastapi.testclient import TestClient

    from tpu_rl.run_view import RunXComs
    from tpu_rl.run_view_app import RunRecord, event_reader, read_run
    from tpu_rl.run_view_plugin import TpuRlRunViewPlugin

    (mounted,) = TpuRlRunViewPlugin().fastapi_apps
    app = mounted["app"]
    record = RunRecord(RunScope(CONF, RunIdentity(DAG_ID, RUN_ID)), state, RunXComs(**xcoms))

    async def read_events(bucket: str, prefix: str, gcp_conn_id: str) -> dict[str, tm.Scalars]:
        assert (bucket, prefix) == (CONF["gcs_bucket"], record.scope.layout.tensorboard_prefix)
        return {path.name: tm.read_scalars([path]) for path in files}

    app.dependency_overrides = {read_run: lambda: record, event_reader: lambda: read_events}
    return TestClient(app)


def page_of(client, token: str | None, cookie: bool = False):
    url = f"/runs/{DAG_ID}/{RUN_ID}"
    if token is None:
        return client.get(url)
    if cookie:
        client.cookies.set("_token", token)
        return client.get(url)
    return client.get(url, headers={"Authorization": f"Bearer {token}"})


def curves_on(html: str) -> dict[str, list[tuple[int, float]]]:
    """The points of each curve, from the markers' data attributes."""
    return {
        tag: [(int(s), float(v)) for s, v in re.findall(r'data-step="(\d+)" data-value="([^"]+)"', body)]
        for tag, body in re.findall(r'<figure data-tag="([^"]+)">(.*?)</figure>', html, re.S)
    }


FINISHED = {
    "evaluation": EVALUATION,
    "slices": SLICES,
    "final_step": 20,
    "model_uri": MODEL_URI,
    "preemptions": {"count": 1, "max_preemptions": 3, "seconds_lost": 600, "steps_recomputed": 2},
}


def test_a_finished_run_shows_its_curves_evaluation_cost_and_outputs(tokens, event_files):
    response = page_of(client_for("success", FINISHED, event_files), tokens["viewer"])

    assert response.status_code == 200
    html = response.text
    expected = tm.read_scalars(event_files)  # the resumed attempt's values win for steps 11 and 12
    assert curves_on(html) == {tag: expected[tag] for tag in (tm.REWARD_TAG, tm.LOSS_TAG, tm.KL_TAG)}
    assert [step for step, _ in expected[tm.LOSS_TAG]] == list(range(1, 21))
    assert 'id="final-step">20</strong>/20' in html
    assert f'id="version">tpu-rl {tpu_rl.__version__}<' in html  # the package version that drew it
    assert re.search(r'id="evaluation-before">.*40\.0%.*8/20.*0\.4950', html)
    assert re.search(r'id="evaluation-after">.*60\.0%.*12/20.*0\.7000', html)
    # 90 minutes of a 64-chip slice at the default $2.70 per chip-hour.
    assert 'id="chip-hours">96.000<' in html and 'id="cost-usd">259.20<' in html
    assert "1 of at most 3, 10 min lost, 2 step(s) recomputed" in html
    layout = RunScope(CONF, RunIdentity(DAG_ID, RUN_ID)).layout
    assert layout.uri(layout.actor_checkpoints_prefix) in html and MODEL_URI in html
    assert (
        f"https://console.cloud.google.com/storage/browser/{CONF['gcs_bucket']}/"
        f"qwen3-30b-a3b/hf-trained/run/?project={CONF['project']}"
    ) in html
    assert "Training progress" not in html and "http-equiv" not in html  # nothing moves any more
    # Nothing of the run's connections or recipients, and nothing loaded from elsewhere.
    for private in ("huggingface_default", "smtp_team", "team@example.com", "<script", "src="):
        assert private not in html


def test_a_running_run_shows_its_progress_and_reloads_itself(tokens, event_files):
    html = page_of(client_for("running", {}, event_files[:1]), tokens["viewer"]).text

    assert re.search(r'id="progress">step 12/20 \(60%\), .* elapsed, ETA 12m, reward ', html)  # 8 steps of 90 s
    assert tm.STEP_TIMES not in html  # the times the ETA comes from are no curve
    assert '<meta http-equiv="refresh" content="60">' in html
    assert "final step not resolved yet (of 20 planned)" in html
    assert "no evaluation logged yet" in html and "unknown: delete_tpu_pools recorded no slice times" in html
    assert 'Exported model</th><td class="note">not published' in html


def test_a_resumed_attempt_that_has_not_logged_yet_shows_no_eta_of_the_attempt_before(tokens, event_files):
    """Resubmitted after its first attempt's file was written (a retry, a clear, a preemption's resume): while the
    new trainer loads the model, the step reached is shown without the earlier attempt's ETA."""
    from datetime import UTC, datetime, timedelta

    created = (datetime.now(UTC) + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    xcoms = {"training_jobset": {"name": "qwen-train-x", "namespace": "default", "uid": "u", "created": created}}
    html = page_of(client_for("running", xcoms, event_files[:1]), tokens["viewer"]).text

    assert 'id="progress">step 12/20 (60%) before this attempt, which has not logged a step yet' in html
    assert "ETA" not in html


def test_a_run_before_its_first_event_file_says_so(tokens):
    html = page_of(client_for("running", {}, []), tokens["viewer"]).text

    assert "the trainer has written no event file yet" in html and 'id="no-curves"' in html


def test_the_uis_cookie_is_accepted_like_a_bearer_token(tokens, event_files):
    assert page_of(client_for("success", FINISHED, event_files), tokens["viewer"], cookie=True).status_code == 200


def test_anonymous_forged_and_unprivileged_requests_are_refused_before_the_run_is_read(tokens, event_files):
    from tpu_rl.run_view_app import read_run

    client = client_for("success", FINISHED, event_files)

    def never_read() -> None:
        raise AssertionError("the run was read for a request that is refused")

    client.app.dependency_overrides[read_run] = never_read

    assert page_of(client, None).status_code == 401
    assert page_of(client, "not-a-jwt").status_code == 403
    refused = page_of(client, tokens["nobody"])
    assert refused.status_code == 403 and "tpu-rl" not in refused.text and CONF["gcs_bucket"] not in refused.text


def test_the_view_is_declared_as_a_tab_of_the_run_page():
    """A tab of the run page (destination dag_run, with a url_route), its address templated by the UI."""
    from tpu_rl.run_view_plugin import TpuRlRunViewPlugin

    (view,) = TpuRlRunViewPlugin.external_views
    assert view["destination"] == "dag_run" and view["url_route"]
    assert view["href"] == "/tpu-rl/runs/{DAG_ID}/{RUN_ID}"


def test_the_page_of_a_run_in_the_metadata_database_shows_its_xcoms(tokens, event_files):
    """The run, its DAG's serialized params and its XComs as the api-server reads them (no fixture between):
    a run of the pipeline through dag.test(), each task replaced by one that pushes what the real one would."""
    from fastapi.testclient import TestClient

    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag

    from tpu_rl.contract import XCOM_EVALUATION, XCOM_TPU_SLICES
    from tpu_rl.run_view_app import event_reader
    from tpu_rl.run_view_plugin import TpuRlRunViewPlugin

    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag(DAG_ID)
    pushed = {"train_rl": {XCOM_EVALUATION: EVALUATION}, "delete_tpu_pools": {XCOM_TPU_SLICES: SLICES}}
    returned = {"verify_training": 20, "publish_export": MODEL_URI}
    for task in dag.tasks:

        def execute(context, task_id=task.task_id):
            for key, value in pushed.get(task_id, {}).items():
                context["ti"].xcom_push(key=key, value=value)
            return returned.get(task_id)

        task.execute = execute
    conf = {**TUTORIAL_CONF, "num_batches": 20}
    run = dag.test(run_conf=conf)
    assert run.state == "success"

    (mounted,) = TpuRlRunViewPlugin().fastapi_apps
    app = mounted["app"]
    layout = RunScope(conf, RunIdentity(DAG_ID, run.run_id)).layout

    async def read_events(bucket: str, prefix: str, gcp_conn_id: str) -> dict[str, tm.Scalars]:
        assert (bucket, prefix) == (layout.bucket, layout.tensorboard_prefix)
        return {path.name: tm.read_scalars([path]) for path in event_files}

    app.dependency_overrides = {event_reader: lambda: read_events}
    client = TestClient(app)
    response = client.get(f"/runs/{DAG_ID}/{run.run_id}", headers={"Authorization": f"Bearer {tokens['viewer']}"})

    assert response.status_code == 200, response.text[-2000:]
    html = response.text
    assert 'id="final-step">20</strong>/20' in html and MODEL_URI in html
    assert re.search(r'id="evaluation-after">.*60\.0%.*12/20', html)
    assert 'id="chip-hours">96.000<' in html
    missing = client.get(f"/runs/{DAG_ID}/no-such-run", headers={"Authorization": f"Bearer {tokens['viewer']}"})
    assert missing.status_code == 404
