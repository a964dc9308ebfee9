"""The preflight stage against the GKE emulator's Compute Engine stand-in, reached as compute.googleapis.com through
google-cloud-compute and the provider's credentials: a reservation of the wrong machine type, in another zone, too
small or not shared, and a quota of 0 for the capacity type each fail the run before any bucket, cluster or pool
exists, with the fix; what the identity may not read is a warning, never a silent pass."""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager

import pytest

from sim.gke_settings import GKE_DIR
from tpu_rl.operators.preflight import PreflightOperator
from tpu_rl_testing import GKE_TEST_CONF, TaskInstanceStandIn, task_context

try:  # Airflow 3.1+
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # pragma: no cover - Airflow 3.0
    from airflow.exceptions import AirflowFailException

pytestmark = pytest.mark.gke

DAG_ID = "maxtext_rl_tpu"
SMALL = GKE_TEST_CONF


@contextmanager
def written(name: str, content):
    """$SIM/gke/<name> holds ``content`` (the emulator reads it on each request), then what it held before."""
    path = GKE_DIR / name
    before = path.read_text() if path.exists() else None
    path.write_text(json.dumps(content))
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)


def preflight(**params):
    """Runs the stage for a run of ``params``: what it pushed, and the context (its stand-in task instance)."""
    run_id = f"preflight__{uuid.uuid4().hex[:8]}"
    conf = {**SMALL, "cluster_name": f"pf-{uuid.uuid4().hex[:6]}", **params}
    ti = TaskInstanceStandIn(DAG_ID, run_id, "preflight")
    return PreflightOperator(task_id="preflight").execute(task_context(ti, conf)), conf


def reservation(name="v6e-b", **fields):
    return {
        "name": f"projects/tpu-rl-sim/reservations/{name}",
        "zone": "us-east5-b",
        "machine_type": "ct6e-standard-4t",
        "vm_count": 4,
        **fields,
    }


def refusal(**params) -> str:
    with pytest.raises(AirflowFailException) as failed:
        preflight(**params)
    message = str(failed.value)
    assert message.startswith("the project cannot give this run what it needs")
    assert "nothing was created" in message
    return message


RESERVED = {"capacity_type": "reservation", "reservation": "v6e-b"}


def test_a_reservation_that_holds_the_slice_passes(gke_sim):
    with written("reservations.json", [reservation()]):
        pushed, _ = preflight(**RESERVED)
    assert pushed["skipped"] == {}
    assert not [w for w in pushed["warnings"] if "reservation" in w]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            reservation(machine_type="ct5lp-hightpu-4t"),
            "reservation: reservation projects/tpu-rl-sim/reservations/v6e-b holds ct5lp-hightpu-4t VMs; the run's "
            "v6e-16 slice needs ct6e-standard-4t; fix: use a reservation of ct6e-standard-4t",
        ),
        (
            reservation(zone="us-east5-a"),
            "reservation: reservation projects/tpu-rl-sim/reservations/v6e-b is in us-east5-a, not in us-east5-b (a "
            "reservation is zonal); fix: set zone to us-east5-a",
        ),
        (
            reservation(vm_count=2),
            "reservation: reservation projects/tpu-rl-sim/reservations/v6e-b has 2 of 2 VMs not in use; the run's 1 "
            "slice(s) of 4 host(s) need 4",
        ),
        (
            reservation(name="other"),
            "reservation: reservation projects/tpu-rl-sim/reservations/v6e-b does not exist in us-east5-b",
        ),
    ],
    ids=["machine type", "zone", "too small", "missing"],
)
def test_a_reservation_that_cannot_hold_the_slice_fails_the_run_with_the_fix(gke_sim, entry, expected):
    with written("reservations.json", [entry]):
        message = refusal(**RESERVED)
    assert expected in message


def test_a_reservation_another_project_does_not_share_is_refused(gke_sim):
    owned = {**reservation(), "name": "projects/tpu-rl-sim/reservations/v6e-b", "shared_with": ["someone-else"]}
    policy = json.loads((GKE_DIR / "iam.json").read_text())
    member = "serviceAccount:tpu-rl-sim@tpu-rl-sim.iam.gserviceaccount.com"
    # The run's project is another one the same identity works in; the reservation stays tpu-rl-sim's.
    policy["projects"].setdefault("consumer-project", {})[member] = ["roles/compute.viewer"]
    with written("reservations.json", [owned]), written("iam.json", policy):
        message = refusal(
            project="consumer-project",
            capacity_type="reservation",
            reservation="projects/tpu-rl-sim/reservations/v6e-b",
            cluster_mode="existing",
            tpu_pool_mode="per_run",
        )
    assert "belongs to project tpu-rl-sim and is not shared with consumer-project" in message
    assert "--add-share-with consumer-project" in message


def test_no_quota_for_the_capacity_type_fails_the_run(gke_sim):
    with written("quotas.json", {"us-east5": {"TPUS_PER_TPU_FAMILY": 0}}):
        message = refusal()
    assert "capacity_type: quota TPUS_PER_TPU_FAMILY in us-east5 is 0 with" in message
    assert "request more TPUS_PER_TPU_FAMILY on the Quotas page" in message


def test_a_candidate_the_project_cannot_serve_is_left_out_and_the_run_goes_on(gke_sim):
    candidates = [
        {"zone": "us-east5-b", "capacity_type": "reservation", "reservation": "v6e-b"},
        {"zone": "us-east5-b", "capacity_type": "on_demand"},
    ]
    with written("reservations.json", [reservation(vm_count=2)]):
        pushed, _ = preflight(capacity_candidates=candidates)
    assert list(pushed["skipped"]) == ["0"]
    assert (
        "capacity_candidates[0].reservation: reservation projects/tpu-rl-sim/reservations/v6e-b has 2 of 2"
        in (pushed["skipped"]["0"])
    )


def test_what_the_identity_may_not_read_is_a_warning_not_a_silent_pass(gke_sim):
    policy = json.loads((GKE_DIR / "iam.json").read_text())
    member = "serviceAccount:tpu-rl-sim@tpu-rl-sim.iam.gserviceaccount.com"
    policy["projects"]["tpu-rl-sim"][member] = [
        r for r in policy["projects"]["tpu-rl-sim"][member] if r != "roles/compute.viewer"
    ]
    with written("reservations.json", [reservation()]), written("iam.json", policy):
        pushed, _ = preflight(**RESERVED)
    assert pushed["skipped"] == {}
    warnings = "\n".join(pushed["warnings"])
    assert "could not read reservation projects/tpu-rl-sim/reservations/v6e-b in us-east5-b (403" in warnings
    assert "Required 'compute.reservations.get' permission" in warnings
    assert "could not read the quotas of us-east5 (403" in warnings
    assert "roles/compute.viewer" in warnings


def test_the_command_runs_the_same_check_with_application_default_credentials(gke_sim, tmp_path):
    """``make preflight``: Application Default Credentials (here the simulation's key), the same verdicts, exit 1
    when the run would fail its preflight."""
    import os
    import subprocess
    import sys

    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({**SMALL, "cluster_name": "pf-command", **RESERVED}))
    env = {
        **os.environ,
        "GOOGLE_APPLICATION_CREDENTIALS": str(GKE_DIR / "service-account.json"),
        "REQUESTS_CA_BUNDLE": gke_sim["REQUESTS_CA_BUNDLE"],
    }
    command = [sys.executable, "-m", "tpu_rl.project_check", "--conf", str(conf)]
    with written("reservations.json", [reservation()]):
        passed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert passed.returncode == 0, passed.stderr
    assert "candidate 0 (reservation 'v6e-b' in us-east5-b): ok" in passed.stdout
    assert passed.stdout.rstrip().endswith("preflight passed")
    with written("reservations.json", [reservation(vm_count=2)]):
        failed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1
    assert "has 2 of 2 VMs not in use" in failed.stdout
    assert failed.stderr.startswith("the project cannot give this run what it needs (1 problem(s))")
