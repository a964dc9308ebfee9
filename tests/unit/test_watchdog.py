"""The watchdog's decisions (tpu_rl.watchdog): a workload that holds its nodes without progress is found stuck
within its window, with the pods' own reasons and the fix; one that runs as it should, waits for capacity that is
not the run's, or is unwatched (a trigger of an earlier release) is left alone. Pods are read from the API objects
a kubelet and a scheduler write (jobset_status.PodRecord)."""

from __future__ import annotations

import pytest

from tpu_rl import jobset_status as st
from tpu_rl import watchdog
from tpu_rl.watchdog import FIRST_STEP, STALL, START, Seen, Windows

pytestmark = pytest.mark.core

T0 = 1_800_000_000.0  # the attempt's creation, POSIX seconds
MINUTE = 60.0
IMAGE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4-typo"
WINDOWS = Windows(start_seconds=30 * MINUTE, first_step_seconds=120 * MINUTE, stall_seconds=60 * MINUTE)


def stamp(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def pod(name: str, *, phase="Running", scheduled_at: float | None = T0, waiting=None, unschedulable=None, index="0"):
    """A pod as the API returns it: a kubelet's container statuses, the scheduler's PodScheduled condition."""
    conditions = []
    if scheduled_at is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(scheduled_at)})
    elif unschedulable:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    if phase == "Running" and not waiting:
        conditions.append({"type": "Ready", "status": "True"})
    state = {"waiting": waiting} if waiting else {"running": {"startedAt": stamp(T0)}}
    statuses = [] if unschedulable else [{"name": "pathways-worker", "image": IMAGE, "state": state}]
    return st.PodRecord.from_pod(
        {
            "metadata": {
                "name": name,
                "uid": name,
                "labels": {"jobset.sigs.k8s.io/replicatedjob-name": "worker", "jobset.sigs.k8s.io/job-index": index},
            },
            "spec": {"nodeName": "" if unschedulable else "gke-tpu-node"},
            "status": {"phase": phase, "conditions": conditions, "containerStatuses": statuses},
        }
    )


def seen(pods, **kw) -> Seen:
    return Seen(created=T0, pods=pods, expected_pods=len(pods), **kw)


def test_an_image_that_cannot_be_pulled_ends_the_start_window_with_the_image_and_the_fix():
    pods = [
        pod("w-0"),
        pod(
            "w-1",
            phase="Pending",
            waiting={"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'},
        ),
    ]
    assert watchdog.check(WINDOWS, seen(pods), T0 + 29 * MINUTE) is None
    stuck = watchdog.check(WINDOWS, seen(pods), T0 + 31 * MINUTE)
    assert stuck.kind == START and stuck.step is None
    assert "did not all run within 30 min (1 of 2 running)" in stuck.message
    assert f'ImagePullBackOff: Back-off pulling image "{IMAGE}"' in stuck.message
    assert "fix: check that the image exists" in stuck.message and "artifactregistry.reader" in stuck.message


def test_the_start_window_counts_from_each_pods_node_not_from_a_queue_before_it():
    """A pod that got its node 5 minutes ago, after an hour's wait for a slice that is not the run's own, has 25
    minutes left."""
    late = pod("w-0", phase="Pending", scheduled_at=T0 + 60 * MINUTE, waiting={"reason": "ContainerCreating"})
    assert watchdog.check(WINDOWS, seen([late]), T0 + 65 * MINUTE) is None
    assert watchdog.check(WINDOWS, seen([late]), T0 + 91 * MINUTE).kind == START


@pytest.mark.parametrize("own_slice, stuck", [(True, True), (False, False)])
def test_an_unschedulable_pod_counts_only_where_the_slice_is_the_runs_own(own_slice, stuck):
    """On pools the run created, a pod the scheduler cannot place will never run; on flex-start (the autoscaler),
    Kueue or an existing pool another workload holds, it waits for capacity the watchdog does not bound."""
    windows = Windows(start_seconds=30 * MINUTE, bound_scheduling=own_slice)
    message = "0/19 nodes are available: 16 node(s) didn't match Pod's node affinity/selector."
    pending = pod("w-0", phase="Pending", scheduled_at=None, unschedulable=message)
    found = watchdog.check(windows, seen([pending]), T0 + 31 * MINUTE)
    assert (found is not None) == stuck
    if stuck:
        assert f"unschedulable: {message}" in found.message and "fix: the run's TPU pools cannot hold" in found.message


def test_pods_the_job_has_not_created_count_on_the_runs_own_slice():
    running = [pod("w-0")]
    windows = Windows(start_seconds=30 * MINUTE, bound_scheduling=True)
    stuck = watchdog.check(windows, Seen(created=T0, pods=running, expected_pods=16), T0 + 31 * MINUTE)
    assert stuck.kind == START and "1 of 16 running" in stuck.message and "not created by its Job" in stuck.message


@pytest.mark.parametrize(
    "reason, fix",
    [
        ("CrashLoopBackOff", "the container exits at start"),
        ("CreateContainerConfigError", "a Secret or ConfigMap the pods name is missing"),
    ],
)
def test_each_kubelet_reason_gets_its_own_fix(reason, fix):
    stuck = watchdog.check(WINDOWS, seen([pod("w-0", phase="Pending", waiting={"reason": reason})]), T0 + 31 * MINUTE)
    assert reason in stuck.message and f"fix: {fix}" in stuck.message


def test_a_trainer_without_a_first_step_is_stuck_after_the_first_step_window_from_its_pods_running():
    running = [pod("w-0"), pod("w-1")]
    look = seen(running, all_running_since=T0 + 10 * MINUTE, training=True)
    assert watchdog.check(WINDOWS, look, T0 + 129 * MINUTE) is None
    stuck = watchdog.check(WINDOWS, look, T0 + 131 * MINUTE)
    assert stuck.kind == FIRST_STEP and "no step within 120 min of its pods running" in stuck.message
    assert watchdog.check(WINDOWS, seen(running, all_running_since=T0), T0 + 500 * MINUTE) is None  # a conversion


def test_a_training_stalls_when_neither_a_step_nor_a_log_line_came_within_the_stall_window():
    running = [pod("w-0")]
    quiet = seen(running, all_running_since=T0, training=True, last_step=30, last_step_seen=T0 + 100 * MINUTE)
    assert watchdog.check(WINDOWS, quiet, T0 + 159 * MINUTE) is None
    stuck = watchdog.check(WINDOWS, quiet, T0 + 161 * MINUTE)
    assert (stuck.kind, stuck.step) == (STALL, 30)
    assert "stalled at step 30: no new step and no log line for 60 min" in stuck.message
    logging = seen(
        running,
        all_running_since=T0,
        training=True,
        last_step=30,
        last_step_seen=T0 + 100 * MINUTE,
        last_log_line=T0 + 150 * MINUTE,  # a checkpoint save, an evaluation: it logs
    )
    assert watchdog.check(WINDOWS, logging, T0 + 161 * MINUTE) is None


def test_a_suspended_jobset_an_unread_one_and_windows_off_are_left_alone():
    waiting = [pod("w-0", phase="Pending", waiting={"reason": "ImagePullBackOff"})]
    assert watchdog.check(WINDOWS, seen(waiting, suspended=True), T0 + 300 * MINUTE) is None
    assert watchdog.check(WINDOWS, Seen(created=None, pods=waiting), T0 + 300 * MINUTE) is None
    assert watchdog.check(Windows(), seen(waiting), T0 + 3000 * MINUTE) is None
    assert not Windows.from_dict(None).on  # a trigger serialised before the watchdog: none
    assert Windows.from_dict(WINDOWS.to_dict()) == WINDOWS


def test_the_same_stall_again_is_repeated_another_one_is_not():
    earlier = [{"kind": STALL, "step": 30}, {"kind": START, "step": None}]
    assert watchdog.repeated(earlier, {"kind": STALL, "step": 30})
    assert watchdog.repeated(earlier, {"kind": START, "step": None})
    assert not watchdog.repeated(earlier, {"kind": STALL, "step": 40})
    assert not watchdog.repeated(earlier, {"kind": FIRST_STEP, "step": None})


def test_a_jobsets_expected_pods_are_its_replicas_times_their_parallelism():
    jobset = {
        "spec": {
            "replicatedJobs": [
                {"name": "pathways-head", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
                {"name": "worker", "replicas": 1, "template": {"spec": {"parallelism": 16}}},
            ]
        }
    }
    assert st.expected_pods(jobset) == 17
    assert st.expected_pods({}) is None
