"""Reading JobSet and pod objects (pure functions): state, progress line and the failure explanation.

The objects have the shapes JobSet v0.10.1 and Kubernetes 1.34 write (field names and the condition
messages are copied from their sources); tests/jobset/test_operator_sim.py checks the same functions on
objects from the simulated cluster.
"""

import json
from pathlib import Path

from tpu_rl import jobset_status as st


def jobset(conditions=(), restarts=0, replicated=("main-job",), suspend=False, rj_status=()):
    return {
        "metadata": {"name": "qwen-hf2mt-1a2b3c4d", "namespace": "default", "uid": "u1"},
        "spec": {
            "suspend": suspend,
            "replicatedJobs": [
                {
                    "name": n,
                    "template": {"spec": {"template": {"spec": {"containers": [{"name": "workload-container"}]}}}},
                }
                for n in replicated
            ],
        },
        "status": {"conditions": list(conditions), "restarts": restarts, "replicatedJobsStatus": list(rj_status)},
    }


def pod(
    name, *, rj="main-job", attempt=0, node="tpu-node-3", phase="Failed", exit_code=None, disruption=None, ready=False
):
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption, "message": "m"})
    statuses = []
    if exit_code is not None:
        statuses.append(
            {
                "name": "workload-container",
                "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": "boom"}},
            }
        )
    return {
        "metadata": {
            "name": name,
            "uid": name + "-uid",
            "labels": {
                st.REPLICATED_JOB_LABEL: rj,
                st.JOB_INDEX_LABEL: "0",
                st.COMPLETION_INDEX_LABEL: "0",
                st.RESTART_ATTEMPT_LABEL: str(attempt),
            },
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase, "conditions": conditions, "containerStatuses": statuses},
    }


FAILED = {
    "type": "Failed",
    "status": "True",
    "reason": "ReachedMaxRestarts",
    "message": (
        "jobset failed due to reaching max number of restarts (first failed job: qwen-hf2mt-1a2b3c4d-main-job-0)"
    ),
}


def test_terminal_condition_and_kind():
    assert st.terminal_condition(jobset()) is None
    assert st.terminal_condition(jobset([{"type": "Completed", "status": "True"}]))["type"] == "Completed"
    assert st.terminal_condition(jobset([{"type": "Failed", "status": "False"}])) is None
    assert st.log_source(jobset()) == ("main-job", "workload-container")
    assert st.log_source(jobset(replicated=("pathways-head", "worker"))) == ("pathways-head", "workload-container")


def test_failure_names_condition_job_exit_code_and_log_tail():
    message = st.explain_failure(
        jobset([FAILED], restarts=1),
        [st.PodRecord.from_pod(pod("p0", attempt=1, exit_code=3)), st.PodRecord.from_pod(pod("ok", phase="Running"))],
        log_tail=["step 10 loss 1.2", "Traceback: OOM"],
        log_pod="p0",
    )
    assert "Failed (ReachedMaxRestarts)" in message
    assert "Failed replicated job: main-job (child Job qwen-hf2mt-1a2b3c4d-main-job-0)" in message
    assert "attempt 1, main-job: 1 pod(s): workload-container exited 3 (Error): boom (e.g. pod p0" in message
    assert "pod ok" not in message
    assert message.rstrip().endswith("| Traceback: OOM")


def test_pods_failing_alike_are_reported_together():
    pods = [st.PodRecord.from_pod(pod(f"p{i}", exit_code=42, node=f"n{i}")) for i in range(16)]
    message = st.explain_failure(jobset([FAILED]), pods)
    assert "attempt 0, main-job: 16 pod(s): workload-container exited 42 (Error): boom" in message
    assert "16 nodes" in message and message.count("exited 42") == 1


def test_disruption_is_maintenance_and_missing_node_is_host_loss():
    maintenance = st.explain_failure(
        jobset([FAILED]), [st.PodRecord.from_pod(pod("p0", disruption="TerminationByKubelet"))]
    )
    assert "TPU host maintenance or preemption" in maintenance
    lost = st.explain_failure(
        jobset([FAILED]), [st.PodRecord.from_pod(pod("p0", exit_code=137))], lost_nodes=["tpu-node-3"]
    )
    assert "TPU host lost (node gone: tpu-node-3)" in lost
    assert "host lost: its node no longer exists" in lost
    gc = st.explain_failure(jobset([FAILED]), [st.PodRecord.from_pod(pod("p0", disruption="DeletionByPodGC"))])
    assert "TPU host lost" in gc


def test_progress_line_counts_current_attempt_and_suspension():
    status = [{"name": "main-job", "active": 1, "ready": 1, "succeeded": 0, "failed": 0}]
    pods = [
        st.PodRecord.from_pod(pod("a", attempt=1, phase="Running", ready=True)),
        st.PodRecord.from_pod(pod("old", attempt=0, phase="Failed")),
    ]
    line = st.progress_line(jobset(restarts=1, rj_status=status), pods)
    assert line == "running; restarts 1; main-job: jobs active 1, ready 1, succeeded 0, failed 0; pods 1 ready"
    suspended = st.progress_line(jobset(suspend=True), [], "resource memory unavailable in ClusterQueue")
    assert suspended.startswith("suspended (waiting for Kueue admission: resource memory unavailable")


def test_kueue_note_reads_pending_conditions():
    workload = {
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "couldn't assign flavors"}
            ]
        }
    }
    assert st.kueue_note([workload]) == "couldn't assign flavors"


def replay(kind):
    """A failed JobSet and the last state seen of each of its pods, captured from the simulated cluster
    (JobSet v0.10.1 controller, Kubernetes 1.34 Job controller and pod GC)."""
    captured = json.loads((Path(__file__).parent / "data" / f"{kind}.json").read_text())
    return captured["jobset"], [st.PodRecord.from_pod(p) for p in captured["pods"]], captured["lost_nodes"]


def test_captured_exit_code_failure():
    jobset, pods, _ = replay("failed_exit_code")
    message = st.explain_failure(jobset, pods)
    assert "Failed (ReachedMaxRestarts)" in message and "[restarts: 1]" in message
    assert "Failed replicated job: main-job (child Job cap-exit-main-job-0)" in message
    assert "workload-container exited 42 (Error)" in message
    assert "TPU host" not in message


def test_captured_lost_host():
    jobset, pods, lost = replay("failed_host_lost")
    message = st.explain_failure(jobset, pods, lost_nodes=lost)
    assert f"Cause: TPU host lost (node gone: {lost[0]})" in message
    assert "DisruptionTarget DeletionByPodGC" in message  # what the pod GC wrote before deleting the pod


def test_a_captured_lost_host_is_a_preemption_and_a_captured_crash_is_not():
    """What the real controllers left after a host went away resumes the training; a workload's own exit code
    fails it (Airflow's retries, not the preemption budget)."""
    jobset, pods, lost = replay("failed_host_lost")
    found = st.preemption(jobset, pods, lost_nodes=lost)
    assert found is not None and found["reason"].startswith("DisruptionTarget DeletionByPodGC"), found
    assert st.preemption(*replay("failed_exit_code")[:2]) is None
