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


# -- two Airflow environments share the bucket (tpu_rl.environment) --------------------------------------------


def of(environment: str, name: str, slices: int = 0) -> Holder:
    return Holder.of(RunIdentity("daily", name, environment=environment), "2026-12-01T00:00:00+00:00", slices)


def gone(run: RunIdentity) -> str:
    """This Airflow knows none of the runs: another environment's live run looks the same to it."""
    return "missing"


def test_a_capacity_group_stays_bounded_by_the_slices_another_environment_holds():
    prod = of("us-east5/prod", "scheduled__2026-12-01", 2)
    for here in ("us-east5/staging", ""):  # an unnamed environment leaves a marked holder alone too
        refused = take_capacity(Lease((prod,)), of(here, "me", 1), limit=2, state=gone)
        assert not refused.result.taken and refused.result.lease.holders == (prod,)
        assert refused.lease is None  # nothing dropped, nothing written
        assert [note.split(" holds slices of the group: ")[0] for note in refused.notes] == [prod.describe()]
        assert "of Airflow environment us-east5/prod" in refused.notes[0]
        assert f"this Airflow environment ({here or 'unnamed'}) never expires" in refused.notes[0]
        assert "if us-east5/prod was deleted, remove its entry" in refused.notes[0]


def test_a_named_environment_expires_its_own_and_the_unmarked_holders_by_its_airflow():
    """Unmarked: written by this environment before holders named theirs (or by an unnamed one)."""
    mine, unmarked = of("us-east5/staging", "ended", 1), of("", "older", 1)
    freed = take_capacity(Lease((mine, unmarked)), of("us-east5/staging", "me", 1), limit=1, state=gone)
    assert freed.result.taken and [h.run_id for h in freed.lease.holders] == ["me"]
    assert len(freed.notes) == 2 and all("expired" in note for note in freed.notes)


def test_the_same_run_key_in_two_environments_is_two_holders():
    """A scheduled run has the same DAG and run id, so the same key, in both environments: each takes its own
    slices. An unmarked entry with the run's key is the run itself (it took them before holders were marked)."""
    prod, staging = of("us-east5/prod", "scheduled__2026-12-01", 1), of("us-east5/staging", "scheduled__2026-12-01", 1)
    assert prod.key == staging.key and not prod.is_(staging)
    assert not take_capacity(Lease((prod,)), staging, limit=1, state=state).result.taken
    assert take_capacity(Lease((prod,)), staging, limit=2, state=state).lease.holders == (prod, staging)
    unmarked = of("", "scheduled__2026-12-01", 1)
    assert take_capacity(Lease((unmarked,)), staging, limit=1, state=state).result.taken
    assert not take_capacity(Lease((staging,)), unmarked, limit=1, state=state).result.taken


def test_a_shared_cluster_stays_while_another_environment_holds_its_lease_and_its_delete_is_waited_for():
    prod, me = of("us-east5/prod", "training"), of("us-east5/staging", "me")
    stays = leave_cluster(Lease((prod, me)), me, gone, closing=True)
    assert stays.result.held and not stays.result.last and stays.result.still_used_by == (prod,)
    assert stays.lease.holders == (prod,) and not stays.lease.closing
    assert len(stays.notes) == 1 and stays.notes[0].startswith(f"{prod.describe()} keeps the cluster: ")

    deleting = Lease().closed_by(prod)  # prod's last run deletes the cluster: staging waits, whatever its Airflow says
    waiting = join_cluster(deleting, me, gone, cluster_exists=True)
    assert waiting.result is None and waiting.lease is None
    assert waiting.notes[0].startswith(f"{prod.describe()} is deleting the cluster: ")
    # this environment's own closer whose run is gone is taken over, as before
    assert join_cluster(Lease().closed_by(of("us-east5/staging", "x")), me, gone, cluster_exists=True).result


def test_holders_record_their_environment_and_documents_of_unnamed_or_earlier_runs_read_as_before():
    named = Lease((of("us-east5/prod", "a", 1),), closing=False)
    assert Lease.parse(named.dump().encode()) == named
    assert '"environment": "us-east5/prod"' in named.dump()
    unnamed = Lease((holder("a", 1),), closing=True, closer=holder("b"))
    assert "environment" not in unnamed.dump()  # what earlier versions of the package write and read
    earlier = b'{"holders": [{"dag_id": "d", "run_id": "r", "key": "k", "since": "s", "slices": 1}]}'
    assert Lease.parse(earlier).holders[0].environment == ""
