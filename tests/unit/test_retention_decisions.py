"""keep_checkpoints: which of a run's checkpoint folders go once its export is published and verified (the pure
decision of tpu_rl.retention), the setting's validation, and where prune_checkpoints sits in the DAG."""

import pytest

from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.contract import Task
from tpu_rl.layout import GcsLayout
from tpu_rl.retention import (
    KEEP_ALL,
    KEEP_EXPORTED,
    KEEP_NONE,
    Kept,
    RetentionPlan,
    checkpoint_folders,
    plan_retention,
    removal_order,
)

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

ASIDE = "50-20261201T100000Z/"


def removed(plan: RetentionPlan) -> list[str]:
    return [r.folder for r in plan.remove]


def kept(plan: RetentionPlan) -> dict[str, str]:
    return {k.folder: k.why for k in plan.keep}


def decide(keep, exported_step=50, export_verified=True, steps=(10, 20, 50), set_aside=(ASIDE,)):
    return plan_retention(
        keep, exported_step=exported_step, export_verified=export_verified, steps=steps, set_aside=set_aside
    )


def test_all_keeps_everything():
    plan = decide(KEEP_ALL)
    assert removed(plan) == []
    assert set(kept(plan)) == {"actor/10/", "actor/20/", "actor/50/", f"_set_aside/{ASIDE}"}


def test_exported_removes_the_superseded_saves_and_keeps_the_step_exported():
    plan = decide(KEEP_EXPORTED)
    assert removed(plan) == ["actor/10/", "actor/20/", f"_set_aside/{ASIDE}"]
    assert kept(plan) == {"actor/50/": "the step exported (keep_checkpoints 'exported')"}
    assert "superseded by the step exported (50)" in plan.remove[0].why


def test_none_removes_the_step_exported_too_once_the_export_is_verified():
    plan = decide(KEEP_NONE)
    assert removed(plan) == ["actor/10/", "actor/20/", "actor/50/", f"_set_aside/{ASIDE}"]
    assert plan.keep == ()


@pytest.mark.parametrize("keep", [KEEP_EXPORTED, KEEP_NONE])
def test_nothing_goes_when_the_export_is_not_verified(keep):
    plan = decide(keep, export_verified=False)
    assert removed(plan) == []
    assert set(kept(plan).values()) == {"the published export is not verified"}


@pytest.mark.parametrize("keep", [KEEP_EXPORTED, KEEP_NONE])
def test_nothing_goes_when_the_step_exported_is_unknown(keep):
    plan = decide(keep, exported_step=None)
    assert removed(plan) == [] and set(kept(plan).values()) == {"the step exported is not known"}


def test_a_step_newer_than_the_one_exported_is_never_removed():
    """Something trained after the export's step was resolved (a train_rl cleared meanwhile): not superseded."""
    plan = decide(KEEP_NONE, exported_step=20)
    assert removed(plan) == ["actor/10/", "actor/20/", f"_set_aside/{ASIDE}"]
    assert kept(plan) == {"actor/50/": "newer than the step exported (20): not superseded by the export"}


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="keep_checkpoints 'some'"):
        decide("some")


def test_only_step_folders_and_set_aside_folders_are_candidates():
    names = [
        "actor/10/commit_success.txt",
        "actor/10/model_params/_METADATA",
        "actor/50/optimizer_state/x/.zarray",
        "actor/60.orbax-checkpoint-tmp-17/model_params/_METADATA",  # an Orbax save under way: not a step
        "actor/README",
        f"_set_aside/{ASIDE}model_params/_METADATA",
        "other/3/x",
    ]
    assert checkpoint_folders(names) == ([10, 50], [ASIDE])


def test_a_step_loses_its_commit_marker_first():
    names = ["model_params/a/.zarray", "commit_success.txt", "_CHECKPOINT_METADATA", "optimizer_state/_METADATA"]
    order = removal_order("actor/10/", names)
    assert order[:2] == ["actor/10/commit_success.txt", "actor/10/_CHECKPOINT_METADATA"]
    assert sorted(order[2:]) == ["actor/10/model_params/a/.zarray", "actor/10/optimizer_state/_METADATA"]


def test_the_candidates_are_the_runs_own(tutorial_config, run):
    """Listed under the run's checkpoints/: its actor/ and its set-aside folders, nothing of another run."""
    from tpu_rl.run import RunIdentity

    layout = GcsLayout(tutorial_config, run)
    other = GcsLayout(tutorial_config, RunIdentity(run.dag_id, run.run_id + "0"))
    assert layout.actor_checkpoints_prefix == f"{layout.checkpoints_prefix}actor/"
    assert layout.set_aside_prefix == f"{layout.checkpoints_prefix}_set_aside/"
    assert not other.checkpoints_prefix.startswith(layout.checkpoints_prefix)
    assert not layout.checkpoints_prefix.startswith(other.checkpoints_prefix)


def test_the_default_keeps_what_2_3_0_kept(tutorial_config):
    assert tutorial_config.keep_checkpoints == KEEP_ALL


def test_validation_names_the_field_and_its_choices(tutorial_conf):
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_params({**tutorial_conf, "keep_checkpoints": "latest"})
    [problem] = raised.value.problems
    assert problem.field == "keep_checkpoints" and "'all' or 'exported' or 'none'" in problem.fix
    assert RunConfig.from_params({**tutorial_conf, "keep_checkpoints": KEEP_NONE}).keep_checkpoints == KEEP_NONE


def test_the_plan_command_refuses_it_too(tutorial_conf, tmp_path, capsys):
    import json

    from tpu_rl import plan

    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({**tutorial_conf, "keep_checkpoints": "latest"}))
    assert plan.main(["--conf", str(conf)]) == 2
    assert "keep_checkpoints: 'latest' is not one of its choices" in capsys.readouterr().err


def test_prune_checkpoints_runs_only_after_the_export_is_published():
    """Its place in the DAG: downstream of publish_export (so of verify_export), before pipeline_done."""
    from tpu_rl.pipeline import build_pipeline

    dag = build_pipeline("retention_wiring", doc_md="")
    prune = dag.get_task(Task.PRUNE_CHECKPOINTS)
    assert [t.task_id for t in prune.upstream_list] == [Task.PUBLISH_EXPORT]
    assert prune.trigger_rule == "all_success"
    assert Task.VERIFY_EXPORT in {t.task_id for t in prune.get_flat_relatives(upstream=True)}
    assert Task.PIPELINE_DONE in {t.task_id for t in prune.downstream_list}


def test_kept_is_typed():
    assert decide(KEEP_EXPORTED).keep == (Kept("actor/50/", "the step exported (keep_checkpoints 'exported')"),)
