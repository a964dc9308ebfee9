"""Preemptions: which failures count, the budget of resumes, what they cost, and which step folders are set
aside before a resume (pure rules; the end-to-end scenarios are in tests/e2e/test_preemption.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from tpu_rl import checkpoints as ck
from tpu_rl import jobset_status as st
from tpu_rl import preemption as pr
from tpu_rl.config import RunConfig
from tpu_rl.layout import GcsLayout
from tpu_rl.run import RunIdentity
from tpu_rl_testing import SIM_CONF

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

NAME = "qwen-train-1a2b3c4d"
FIRST_FAILED_HEAD = f"{NAME}-pathways-head-0"


def failed_jobset(first_failed=FIRST_FAILED_HEAD, restarts=0):
    message = f"jobset failed due to reaching max number of restarts (first failed job: {first_failed})"
    return {
        "metadata": {"name": NAME, "namespace": "default", "uid": "u1"},
        "spec": {"replicatedJobs": [{"name": "pathways-head"}, {"name": "worker"}]},
        "status": {
            "restarts": restarts,
            "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": message}],
        },
    }


def pod(name, *, rj="pathways-head", attempt=0, node="cpu-np-0", exit_code=None, disruption=None, reason=""):
    conditions = (
        [{"type": "DisruptionTarget", "status": "True", "reason": disruption, "message": "m"}] if disruption else []
    )
    statuses = (
        [{"name": "workload-container", "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}]
        if exit_code is not None
        else []
    )
    status = {"phase": "Failed", "conditions": conditions, "containerStatuses": statuses}
    if reason:
        status.update(reason=reason, message="Pod was terminated in response to imminent node shutdown.")
    return st.PodRecord.from_pod(
        {
            "metadata": {
                "name": name,
                "uid": name,
                "labels": {
                    st.REPLICATED_JOB_LABEL: rj,
                    st.JOB_INDEX_LABEL: "0",
                    st.COMPLETION_INDEX_LABEL: "0",
                    st.RESTART_ATTEMPT_LABEL: str(attempt),
                },
            },
            "spec": {"nodeName": node},
            "status": status,
        }
    )


def test_a_preempted_tpu_worker_makes_the_trainers_crash_a_preemption():
    pods = [
        pod("head", exit_code=1),
        pod("worker-3", rj="worker", node="tpu-3", exit_code=143, disruption="TerminationByKubelet"),
    ]
    found = st.preemption(failed_jobset(), pods)
    assert found == {
        "reason": ("DisruptionTarget TerminationByKubelet: " + st.DISRUPTION_REASONS["TerminationByKubelet"]),
        "pod": "worker-3",
        "node": "tpu-3",
    }
    assert "Spot VM" in found["reason"]


@pytest.mark.parametrize(
    "signal, expected",
    [
        (dict(reason="Terminated"), "pod Terminated: Pod was terminated in response to imminent node shutdown."),
        (dict(exit_code=143), "exit code 143"),
        (dict(disruption="DeletionByTaintManager"), "DisruptionTarget DeletionByTaintManager"),
        (dict(disruption="EvictionByEvictionAPI"), "DisruptionTarget EvictionByEvictionAPI"),
        (dict(disruption="PreemptionByScheduler"), "DisruptionTarget PreemptionByScheduler"),
    ],
)
def test_each_named_signal_counts_as_a_preemption(signal, expected):
    found = st.preemption(failed_jobset(), [pod("head", **{"exit_code": 1, **signal})])
    assert found is not None and found["reason"].startswith(expected)


def test_a_lost_host_counts_as_a_preemption():
    found = st.preemption(failed_jobset(), [pod("worker-0", rj="worker", node="tpu-0")], lost_nodes=["tpu-0"])
    assert found["reason"] == "host lost: node tpu-0 no longer exists"


def test_a_crash_is_not_a_preemption():
    assert st.preemption(failed_jobset(), [pod("head", exit_code=3)]) is None


def test_exit_143_of_a_pod_that_jobset_tore_down_is_not_a_preemption():
    """The head crashed (exit 1); JobSet's teardown SIGTERMed a worker: the failure is the workload's own."""
    pods = [pod("head", exit_code=1), pod("worker-0", rj="worker", node="tpu-0", exit_code=143)]
    assert st.preemption(failed_jobset(), pods) is None


def test_only_the_last_attempt_counts():
    """A disruption the JobSet already restarted from (maxRestarts) does not explain the last attempt's crash."""
    pods = [pod("old", attempt=0, disruption="TerminationByKubelet"), pod("head", attempt=1, exit_code=3)]
    assert st.preemption(failed_jobset(restarts=1), pods) is None


def test_the_budget_is_per_run_and_separate_from_retries():
    assert [pr.within_budget(recorded, 3) for recorded in range(5)] == [True, True, True, False, False]
    assert not pr.within_budget(0, 0)  # max_preemptions 0: every preemption fails the task


def record(number=1, step=30, resumed_from=20, lost=120.0, set_aside=()):
    return pr.PreemptionRecord(
        number,
        "DisruptionTarget TerminationByKubelet: Spot",
        "2026-01-01T00:00:00+00:00",
        step,
        resumed_from,
        lost,
        set_aside,
    )


def test_messages_say_where_the_training_resumes_and_when_the_budget_is_spent():
    assert pr.resume_message(record(), 3) == (
        "preempted (DisruptionTarget TerminationByKubelet: Spot) at step 30: resuming from step 20 (preemption 1 of 3)"
    )
    spent = pr.budget_spent_message(record(number=3, resumed_from=None), 2, 20)
    assert "preemption 3 is beyond max_preemptions 2, so the training is not resumed" in spent
    assert "newest complete step: 20" in spent


def test_accounting_counts_preemptions_time_lost_and_steps_recomputed():
    records = [
        record(step=30, resumed_from=24, lost=90.5),
        record(2, step=40, resumed_from=40, lost=10.0),
        record(3, step=45, resumed_from=None, lost=30.0),
    ]
    summary = pr.accounting(records, 2)
    assert {k: summary[k] for k in ("count", "max_preemptions", "seconds_lost", "steps_recomputed")} == {
        "count": 3,
        "max_preemptions": 2,
        "seconds_lost": 130.5,
        "steps_recomputed": 6,
    }
    assert [e["steps_recomputed"] for e in summary["events"]] == [6, 0, 0]
    assert pr.PreemptionRecord.from_json(summary["events"][0]) == records[0]
    assert pr.describe_accounting(summary) == "3 of at most 2, 2 min lost, 6 step(s) recomputed"
    assert pr.describe_accounting(pr.accounting([], 3)) == "none"


def test_time_lost_runs_from_the_last_complete_checkpoint_to_the_resume():
    saved = datetime(2026, 1, 1, tzinfo=UTC)
    assert pr.seconds_lost(saved, saved + timedelta(minutes=3)) == 180.0
    assert pr.seconds_lost(None, saved) == 0.0


ITEMS = ["model_params"]
META = b'{"commit_timestamp_nsecs": 1}'
ITEM_META = b'{"tree_metadata": {"k": {"key_metadata": [{"key": "w"}], "value_metadata": {"value_type": "jax.Array"}}}}'


def verdict(step, *, committed=True, leaf=True):
    names = ["_CHECKPOINT_METADATA", "model_params/_METADATA"] + (["model_params/w/.zarray"] if leaf else [])
    names += ["commit_success.txt"] if committed else []
    documents = {
        "_CHECKPOINT_METADATA": META if committed else b'{"commit_timestamp_nsecs": null}',
        "model_params/_METADATA": ITEM_META,
    }
    return step, ck.check_orbax_step(f"actor/{step}/", names, documents, ITEMS)


def test_a_half_written_step_is_set_aside_and_the_resume_starts_from_the_step_before_it():
    plan = ck.plan_resume([verdict(30, committed=False), verdict(20), verdict(10)])
    assert plan.resume_from == 20
    assert [step for step, _ in plan.set_aside] == [30]
    assert "no commit_success.txt in actor/30/" in plan.set_aside[0][1]


def test_a_committed_step_that_fails_the_leaf_check_is_resumed_from_with_a_warning():
    """Orbax restores any committed step; the leaf layout Pathways' persistence writes is not documented, so a
    failed leaf check must not throw away a committed step (every preemption would restart from step 0)."""
    plan = ck.plan_resume([verdict(40, committed=False), verdict(30, leaf=False), verdict(20)])
    assert plan.resume_from == 30 and [step for step, _ in plan.set_aside] == [40]
    assert plan.committed_warnings == ((30, "leaf actor/30/model_params/w/ has no .zarray"),)


def test_the_final_step_check_reads_a_committed_step_as_the_resume_does():
    """verify_training failed a committed final step on the leaf check that a resume treats as a warning: the
    run then failed on a checkpoint Orbax restores. Both read a step through checkpoints.as_restored."""
    _, leafless = verdict(50, leaf=False)
    accepted, warning = ck.as_restored(leafless)
    assert accepted.complete and warning == "leaf actor/50/model_params/w/ has no .zarray"
    _, uncommitted = verdict(50, committed=False)
    assert ck.as_restored(uncommitted) == (uncommitted, None) and not uncommitted.complete
    _, whole = verdict(50)
    assert ck.as_restored(whole) == (whole, None)
    no_item = ck.check_orbax_step(
        "actor/50/", ["commit_success.txt", "_CHECKPOINT_METADATA"], {"_CHECKPOINT_METADATA": META}, ITEMS
    )
    assert ck.as_restored(no_item) == (no_item, None) and not no_item.complete  # an item missing is no leaf layout


def test_a_complete_newest_step_sets_nothing_aside_and_no_step_means_the_base_checkpoint():
    assert ck.plan_resume([verdict(30), verdict(20, committed=False)]) == ck.ResumePlan(30)
    assert ck.plan_resume([verdict(10, committed=False)]).resume_from == 0


def test_set_aside_steps_go_outside_the_checkpoint_managers_folder():
    config = RunConfig.from_params(SIM_CONF)
    layout = GcsLayout(config, RunIdentity("maxtext_rl_tpu", "manual__1"))
    destination = layout.set_aside_prefix + ck.set_aside_folder(30, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert not destination.startswith(layout.actor_checkpoints_prefix)
    assert destination == layout.actor_checkpoints_prefix.removesuffix("actor/") + "_set_aside/30-20260102T030405Z/"
    assert not ck.step_numbers(["_set_aside/"])  # never a step to Orbax or to the final-step check


def decide(**changes):
    """The decision for a training of 50 steps saved every 10, preempted at 10:00 after reaching step 34, whose
    attempt started at 09:00 and whose newest complete step was committed at 09:40."""
    at = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    facts = {
        "steps": [verdict(30, committed=False), verdict(20)],
        "committed_at": at - timedelta(minutes=20),
        "last_step": 34,
        "attempt_started": at - timedelta(hours=1),
        "trainer_completed": False,
        "recorded": 0,
        "cause": {"reason": "DisruptionTarget TerminationByKubelet", "pod": "head-0"},
        "now": at,
        "train_steps": 50,
        "checkpoint_period": 10,
        "max_preemptions": 3,
        "set_aside_root": "gs://b/run/checkpoints/_set_aside/",
    }
    return pr.decide(**{**facts, **changes})


def test_a_preemption_is_resumed_from_the_newest_complete_step_with_what_it_cost():
    decision = decide()
    assert isinstance(decision, pr.ResumeTraining)
    assert decision.moves == ((30, decision.moves[0][1], "30-20261204T100000Z/"),)
    record = decision.record
    assert (record.number, record.resumed_from, record.preempted_at_step, record.steps_recomputed) == (1, 20, 34, 14)
    assert record.seconds_lost == 1200.0  # since the newest complete step was committed, not the attempt's start
    assert record.set_aside == ("gs://b/run/checkpoints/_set_aside/30-20261204T100000Z/",)
    assert record.reason == "DisruptionTarget TerminationByKubelet; pod head-0"


def test_a_preemption_beyond_the_budget_is_recorded_and_not_resumed():
    decision = decide(recorded=3)
    assert isinstance(decision, pr.BudgetSpent)
    assert decision.record.number == 4 and decision.record.resumed_from is None and decision.newest_complete == 20
    assert decision.moves  # the half-written step is set aside all the same, for a clear to resume past it


def test_a_preemption_after_the_final_save_completes_the_training():
    assert decide(steps=[verdict(50), verdict(40)]) == pr.TrainingComplete(50)
    # An early end on a save boundary counts only when the trainer said it was done.
    assert decide(steps=[verdict(40)], trainer_completed=True) == pr.TrainingComplete(40)
    assert isinstance(decide(steps=[verdict(40)]), pr.ResumeTraining)


def test_a_doubted_committed_step_is_resumed_from_and_named():
    decision = decide(steps=[verdict(30, leaf=False), verdict(20)])
    assert decision.record.resumed_from == 30 and decision.doubted == (
        (30, "leaf actor/30/model_params/w/ has no .zarray"),
    )


def test_a_preemption_record_names_the_candidate_its_slices_came_from():
    record = decide(candidate=2).record
    assert record.candidate == 2 and record.to_json()["candidate"] == 2
    assert pr.PreemptionRecord.from_json(record.to_json()) == record
    # One candidate (and a record written before candidates existed): as before, no candidate.
    alone = decide().record.to_json()
    assert "candidate" not in alone and pr.PreemptionRecord.from_json(alone).candidate is None
