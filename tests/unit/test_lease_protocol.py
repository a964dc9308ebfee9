"""The lease protocol's decisions (``tpu_rl.leases``), as the operators apply them to what they read from the
bucket: which run creates, keeps or deletes a shared cluster, and which run holds a capacity group's slices."""

import pytest

from tpu_rl.leases import Holder, Lease, join_cluster, leave_cluster, take_capacity
from tpu_rl.run import RunIdentity

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

STATES = {"ended": "success", "gone": "missing", "running": "running", "deleter": "running"}


def holder(name: str, slices: int = 0) -> Holder:
    return Holder.of(RunIdentity("daily", name), "2026-12-01T00:00:00+00:00", slices)


def state(run: RunIdentity) -> str:
    return STATES.get(run.run_id, "running")


def test_a_run_joins_a_shared_cluster_and_holders_whose_run_ended_expire():
    change = join_cluster(Lease((holder("ended"), holder("running"))), holder("me"), state, cluster_exists=True)
    assert [h.run.run_id for h in change.result.holders] == ["running", "me"]
    assert change.lease == change.result
    assert change.notes == [f"lease of {holder('ended').describe()} expired: its run has ended or is gone"]


def test_a_run_waits_while_the_last_run_deletes_the_cluster_and_takes_it_over_once_that_run_ended():
    closing = Lease().closed_by(holder("deleter"))
    waiting = join_cluster(closing, holder("me"), state, cluster_exists=True)
    assert waiting.result is None and waiting.lease is None  # nothing written: it looks again later

    def deleter_failed(run: RunIdentity) -> str:
        return "failed" if run.run_id == "deleter" else "running"

    taken = join_cluster(closing, holder("me"), deleter_failed, cluster_exists=True)
    assert [h.run.run_id for h in taken.result.holders] == ["me"] and not taken.result.closing
    assert "takes the cluster over" in taken.notes[-1]
    # once the cluster is gone, a joiner creates it again at once
    assert join_cluster(closing, holder("me"), state, cluster_exists=False).result is not None


def test_the_last_run_to_leave_deletes_the_cluster_and_marks_the_lease_closing():
    me = holder("me")
    stays = leave_cluster(Lease((me, holder("running"))), me, state, closing=True)
    assert not stays.result.last and [h.run.run_id for h in stays.result.still_used_by] == ["running"]
    assert stays.lease.holders == (holder("running"),) and not stays.lease.closing

    last = leave_cluster(Lease((me, holder("ended"))), me, state, closing=True)
    assert last.result.last and last.lease.closing and last.lease.closer == me
    # its retried delete is the last again; a run that never held the lease deletes nothing
    assert leave_cluster(last.lease, me, state, closing=True).result.last
    stranger = leave_cluster(Lease((holder("running"),)), holder("other"), state, closing=True)
    assert not stranger.result.held and not stranger.result.last and stranger.lease is None


def test_kept_clusters_are_left_without_a_closing_mark():
    me = holder("me")
    kept = leave_cluster(Lease((me,)), me, state, closing=False)
    assert kept.result.last and kept.lease == Lease()


def test_a_capacity_group_admits_runs_while_their_slices_fit():
    full = Lease((holder("running", 2),))
    refused = take_capacity(full, holder("me", 1), limit=2, state=state)
    assert not refused.result.taken and refused.lease is None and refused.result.lease == full
    freed = take_capacity(Lease((holder("ended", 2),)), holder("me", 1), limit=2, state=state)
    assert freed.result.taken and freed.lease.holders == (holder("me", 1),)
    # a retried task re-enters with the slices it holds
    assert take_capacity(freed.lease, holder("me", 1), limit=1, state=state).result.taken
