"""The DAG's structure, and its setup/teardown wiring run through Airflow with failures injected.

The wiring tests replace each task's work with "succeed" or "raise" (the GKE API has no local stand-in,
and the wiring is what is under test); the dependencies, trigger rules, setup/teardown flags and the
run's final state are Airflow's own, from ``dag.test()`` on the PostgreSQL metadata database.
"""

from datetime import timedelta

import pytest

try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.1 (Composer 3); later versions moved DagBag to airflow.dag_processing
    from airflow.models.dagbag import DagBag
from airflow.exceptions import AirflowException

from tpu_rl_testing import REPO, TUTORIAL_CONF

WORK = ["ensure_bucket", "hf_to_maxtext", "train_rl", "maxtext_to_hf", "publish_export"]


@pytest.fixture(scope="module")
def dag(metadata_db):
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.get_dag("maxtext_rl_tpu")


def test_dag_imports_without_errors_and_has_no_cycles(dag):
    from airflow.utils.dag_cycle_tester import check_cycle

    check_cycle(dag)
    assert len(dag.tasks) == 25


def test_the_training_tab_loads_from_the_installed_distribution_without_importing_the_package():
    """As on Cloud Composer 3: an empty plugins folder, and the plugin found through the wheel's entry point
    ``airflow.plugins``. Every component loads it (the scheduler, each task), so loading it imports neither
    the rest of the package nor FastAPI; the package comes from site-packages, not from this checkout."""
    import ast
    import subprocess
    import sys

    probe = (
        "from airflow import plugins_manager as pm; from airflow import settings; import os, sys; "
        "plugins = pm._get_plugins()[0] if hasattr(pm, '_get_plugins') "
        "else (pm.ensure_plugins_loaded() or pm.plugins); "
        "print(os.listdir(settings.PLUGINS_FOLDER)); "
        "print([(p.name, str(p.source)) for p in plugins]); "
        "print(sorted(m for m in sys.modules if m.startswith('tpu_rl.') or m == 'fastapi')); "
        "import tpu_rl; print(tpu_rl.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-W", "ignore", "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    folder, plugins, imported, package = out.stdout.strip().splitlines()[-4:]
    assert folder == "[]"
    assert plugins.startswith("[('tpu_rl_run_view', \"tpu-rl==") and "group='airflow.plugins'" in plugins
    # the plugin's module and, where the plugin manager also reads providers, the provider metadata
    assert "'tpu_rl.run_view_plugin'" in imported
    assert set(ast.literal_eval(imported)) <= {"tpu_rl.run_view_plugin", "tpu_rl.provider"}
    assert "site-packages" in package and not package.startswith(str(REPO / "src"))


def test_the_provider_metadata_lists_the_version_hooks_and_extra_links():
    """The UI's Providers page and every component's providers manager read the entry point
    ``apache_airflow_provider``: the distribution, its one version, and the JobSet task's extra links."""
    from airflow.providers_manager import ProvidersManager

    import tpu_rl

    manager = ProvidersManager()
    info = manager.providers["tpu-rl"]
    assert info.version == tpu_rl.__version__ == info.data["versions"][0]
    hook_modules = {m for entry in info.data["hooks"] for m in entry["python-modules"]}
    assert {"tpu_rl.hooks.gke", "tpu_rl.hooks.kubernetes", "tpu_rl.hooks.gcs"} <= hook_modules
    assert {"tpu_rl.links.JobSetWorkloadLink", "tpu_rl.links.JobSetLogsLink"} <= set(manager.extra_links_class_names)


def test_conversion_checks_and_locks_itself_and_training_checks_its_record(dag):
    """hf_to_maxtext skips a complete checkpoint itself (no separate check task); the record's values are typed."""
    from tpu_rl.operators.training_record import RunTrainingRecordCheckOperator

    assert "check_converted" not in dag.task_ids
    assert [t.task_id for t in dag.get_task("hf_to_maxtext").upstream_list] == ["hf_token_secret"]
    assert dag.get_task("verify_converted").trigger_rule == "none_failed"
    assert isinstance(dag.get_task("check_training_record"), RunTrainingRecordCheckOperator)
    assert [t.task_id for t in dag.get_task("tpu_pools_guard").upstream_list] == ["check_training_record"]
    assert [t.task_id for t in dag.get_task("wait_for_tpu_capacity").upstream_list] == ["tpu_pools_guard"]
    assert [t.task_id for t in dag.get_task("create_tpu_pools").upstream_list] == ["wait_for_tpu_capacity"]


def test_the_gate_comes_before_the_export_and_publishing_after_the_slices_are_gone(dag):
    """The Asset event can carry the slices' TPU time only once delete_tpu_pools has counted it."""
    from tpu_rl.operators.run_report import QualityGateOperator, RunSummaryOperator

    assert isinstance(dag.get_task("quality_gate"), QualityGateOperator)
    assert [t.task_id for t in dag.get_task("maxtext_to_hf").upstream_list] == ["quality_gate"]
    assert [t.task_id for t in dag.get_task("quality_gate").upstream_list] == ["verify_training"]
    assert {t.task_id for t in dag.get_task("publish_export").upstream_list} == {"verify_export", "delete_tpu_pools"}
    assert isinstance(dag.get_task("pipeline_done"), RunSummaryOperator)


def test_every_task_retries_and_has_a_time_limit(dag):
    for task in dag.tasks:
        limit = task.execution_timeout or getattr(task, "timeout", None)
        assert limit and limit <= timedelta(hours=72), task.task_id
        if task.task_id != "validate_config":
            assert task.retries >= 1, task.task_id
    assert dag.get_task("validate_config").retries == 0  # bad params do not get better on retry


def test_the_triggerer_is_proven_before_anything_billable_is_created(dag):
    """Every task that creates something in the cloud (the bucket, the cluster, the pools) runs after it."""
    check = dag.get_task("check_triggerer")
    assert [t.task_id for t in check.upstream_list] == ["validate_config"]
    downstream = check.get_flat_relative_ids(upstream=False)
    assert {"guard", "ensure_bucket", "create_cluster", "create_tpu_pools", "train_rl"} <= downstream
    assert set(dag.task_ids) - downstream == {"validate_config", "check_triggerer"}


def test_the_preflight_reads_the_project_after_the_triggerer_check_and_before_anything_is_created(dag):
    preflight = dag.get_task("preflight")
    assert [t.task_id for t in preflight.upstream_list] == ["check_triggerer"]
    assert [t.task_id for t in preflight.downstream_list] == ["guard"]


def test_the_slice_teardown_is_queued_first_when_worker_slots_are_short(dag):
    """A waiting TPU slice bills by the hour: its deletion outranks every other task (the scheduler queues
    scheduled tasks by priority when the executor is full). The others keep Airflow's default rule, under
    which a task weighs at most the number of tasks."""
    teardown = dag.get_task("delete_tpu_pools")
    rule = teardown.weight_rule  # 'absolute' on 3.3, a strategy object on 3.1
    assert "absolute" in f"{getattr(rule, 'value', rule)} {type(rule).__name__}".lower()
    assert teardown.priority_weight > len(dag.tasks)
    assert all(t.priority_weight == 1 for t in dag.tasks if t is not teardown)


def test_trigger_form_has_sections_and_tutorial_defaults(dag):
    params = dag.params
    sections = {params.get_param(name).schema.get("section") for name in params}
    assert sections == {"Cloud", "Cluster", "TPU slice", "Model", "Training", "Evaluation and cost", "Advanced"}
    assert params["topology"] == "8x8" and params["tpu_type"] == "v6e-64" and params["num_batches"] == 50
    for required in ("project", "region", "zone", "cluster_name", "gcs_bucket"):
        assert not params.get_param(required).has_value, required  # the form asks for it


def test_clearing_training_reruns_its_setups_and_teardowns_not_the_conversion(dag):
    train = dag.get_task("train_rl")
    related = {t.task_id for t in train.get_upstreams_only_setups_and_teardowns()}
    assert related == {
        "guard",
        "create_cluster",
        "wait_for_cluster",
        "ensure_jobset",
        "hf_token_secret",
        "tpu_pools_guard",
        "wait_for_tpu_capacity",
        "create_tpu_pools",
        "delete_tpu_pools",
        "delete_cluster",
    }
    assert "hf_to_maxtext" not in related


def run_with_failure(dag, failing: str | None):
    for task in dag.tasks:

        def execute(context, task_id=task.task_id):
            if task_id == failing:
                raise AirflowException(f"injected failure in {task_id}")
            return 50 if task_id == "verify_training" else None

        task.execute = execute
        task.retries = 0
    run = dag.test(run_conf=dict(TUTORIAL_CONF))
    return run.state, {ti.task_id: ti.state for ti in run.get_task_instances()}


@pytest.mark.parametrize(
    "failing, run_state, must_run, must_not_run",
    [
        # A triggerer that cannot import the package: nothing is created, so nothing is torn down.
        ("check_triggerer", "failed", [], ["guard", "ensure_bucket", "create_cluster", "delete_cluster"]),
        # The project cannot give the run its slices: nothing is created, so nothing is torn down.
        ("preflight", "failed", [], ["guard", "ensure_bucket", "create_cluster", "delete_cluster"]),
        ("create_cluster", "failed", ["delete_cluster"], ["train_rl", "delete_tpu_pools"]),
        # A stockout at the pool create: the pool left in ERROR is deleted, then the cluster.
        ("create_tpu_pools", "failed", ["delete_tpu_pools", "delete_cluster"], ["train_rl", "maxtext_to_hf"]),
        ("train_rl", "failed", ["delete_tpu_pools", "delete_cluster"], ["maxtext_to_hf"]),
        # A model that fails the quality gate is never exported or published; everything is torn down.
        (
            "quality_gate",
            "failed",
            ["delete_tpu_pools", "delete_cluster"],
            ["maxtext_to_hf", "publish_export", "pipeline_done"],
        ),
        ("delete_cluster", "failed", ["publish_export", "pipeline_done"], []),
        # An export that is not verified is never published, and no checkpoint is removed.
        ("verify_export", "failed", ["delete_tpu_pools", "delete_cluster"], ["publish_export", "prune_checkpoints"]),
        (None, "success", ["delete_tpu_pools", "delete_cluster", "prune_checkpoints", "pipeline_done"], []),
    ],
    ids=[
        "triggerer check fails",
        "preflight refuses",
        "create fails",
        "pool create fails",
        "training fails",
        "gate fails",
        "teardown fails",
        "export not verified",
        "all succeed",
    ],
)
def test_teardown_wiring(dag, failing, run_state, must_run, must_not_run):
    state, tasks = run_with_failure(dag, failing)
    assert state == run_state, tasks
    for task_id in must_run:
        assert tasks[task_id] == "success", (task_id, tasks)
    for task_id in must_not_run:
        assert tasks[task_id] in ("upstream_failed", "skipped", None), (task_id, tasks)
    if failing:
        assert tasks[failing] == "failed"
