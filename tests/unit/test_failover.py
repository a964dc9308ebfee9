"""Failing over between capacity candidates: where the slices come from next, and the TPU cost on each."""

import pytest

from tpu_rl.candidates import Candidate
from tpu_rl.failover import Attempt, GiveUp, Outcome, TryCandidate, describe_attempts, next_candidate
from tpu_rl.training_metrics import cost_by_candidate, describe_costs

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

CANDIDATES = (
    Candidate("us-east5-b", "on_demand"),
    Candidate("us-east5-b", "spot", price_per_chip_hour=1.1),
    Candidate("us-east5-a", "reservation", "my-v6e"),
)


def test_the_first_candidate_comes_first():
    decision = next_candidate(CANDIDATES, [], 0)
    assert decision == TryCandidate(0, CANDIDATES[0], "candidate 0 (on_demand in us-east5-b) first")


def test_a_stockout_then_missing_quota_move_on_to_the_third_candidate_and_then_give_up():
    attempts = [Attempt(0, Outcome.STOCKOUT, "GCE_STOCKOUT")]
    second = next_candidate(CANDIDATES, attempts, 0)
    assert (second.index, second.leaving) == (1, 0)
    assert "candidate 0 (on_demand in us-east5-b) left: stockout (GCE_STOCKOUT)" in second.why
    attempts.append(Attempt(1, Outcome.QUOTA, "TPUS_PER_TPU_FAMILY"))
    third = next_candidate(CANDIDATES, attempts, 0)
    assert (third.index, third.leaving, third.candidate) == (2, 1, CANDIDATES[2])
    attempts.append(Attempt(2, Outcome.WAIT_EXPIRED, "30 min"))
    gave_up = next_candidate(CANDIDATES, attempts, 0)
    assert isinstance(gave_up, GiveUp)
    assert gave_up.tried == (
        "candidate 0 (on_demand in us-east5-b): left, stockout (GCE_STOCKOUT)",
        "candidate 1 (spot in us-east5-b): left, quota (TPUS_PER_TPU_FAMILY)",
        "candidate 2 (reservation 'my-v6e' in us-east5-a): left, wait-expired (30 min)",
    )
    assert gave_up.message().startswith("no capacity candidate gave the run its slices: candidate 0")


def test_a_preempted_run_stays_until_its_budget_on_the_candidate_is_spent():
    attempts = [Attempt(0, Outcome.STOCKOUT), Attempt(1, Outcome.PREEMPTED, "spot reclaimed")]
    stay = next_candidate(CANDIDATES, attempts, 2)
    assert (stay.index, stay.leaving) == (1, None)
    assert stay.why == "preemption 1 of 2 on candidate 1: resuming there"
    attempts.append(Attempt(1, Outcome.PREEMPTED, "spot reclaimed"))
    move = next_candidate(CANDIDATES, attempts, 2)
    assert (move.index, move.leaving) == (2, 1)


def test_without_a_budget_per_candidate_a_preempted_run_never_moves():
    attempts = [Attempt(1, Outcome.PREEMPTED)] * 5
    assert next_candidate(CANDIDATES, attempts, 0).index == 1


def test_the_last_candidate_preempted_past_its_budget_gives_up():
    decision = next_candidate(CANDIDATES, [Attempt(2, Outcome.PREEMPTED)], 1)
    assert isinstance(decision, GiveUp)
    assert decision.tried == ("candidate 2 (reservation 'my-v6e' in us-east5-a): left, preempted",)


def test_attempts_survive_the_record():
    attempt = Attempt(1, Outcome.WAIT_EXPIRED, "no capacity", "2026-12-05T10:00:00+00:00")
    assert attempt.to_json()["outcome"] == "wait-expired"
    assert Attempt.from_json(attempt.to_json()) == attempt


def test_the_log_says_why_each_candidate_was_left_and_which_one_served():
    attempts = [Attempt(0, Outcome.STOCKOUT), Attempt(1, Outcome.QUOTA), Attempt(2, Outcome.PREEMPTED)]
    assert describe_attempts(CANDIDATES, attempts, serving=2) == [
        "candidate 0 (on_demand in us-east5-b): left, stockout",
        "candidate 1 (spot in us-east5-b): left, quota",
        "candidate 2 (reservation 'my-v6e' in us-east5-a): the slices came from it after 1 preemption(s)",
    ]


def test_the_cost_is_split_by_candidate_at_each_ones_price():
    spans = [
        {
            "candidate": 1,
            "pool": "tpu-k-0",
            "nodes_from": "2026-12-05T10:00:00+00:00",
            "nodes_gone": "2026-12-05T12:00:00+00:00",
        },
        {
            "candidate": 2,
            "pool": "tpu-k-0",
            "nodes_from": "2026-12-05T12:30:00+00:00",
            "nodes_gone": "2026-12-05T13:30:00+00:00",
        },
    ]
    costs = cost_by_candidate(spans, CANDIDATES, chips_per_slice=64, default_price=2.7)
    assert [(c["candidate"], c["chip_hours"], c["price_per_chip_hour"], c["cost_usd"]) for c in costs] == [
        (1, 128.0, 1.1, 140.8),
        (2, 64.0, 2.7, 172.8),
    ]
    assert describe_costs(costs) == (
        "candidate 1 (spot in us-east5-b): 128.0 chip-hours, about $140.80 at $1.10 per chip-hour; "
        "candidate 2 (reservation 'my-v6e' in us-east5-a): 64.0 chip-hours, about $172.80 at $2.70 per chip-hour; "
        "in all 192.0 chip-hours, about $313.60"
    )


def test_candidates_the_preflight_left_out_are_never_tried():
    left_out = [Attempt(0, Outcome.PREFLIGHT, "reservation too small"), Attempt(2, Outcome.PREFLIGHT, "no quota")]
    first = next_candidate(CANDIDATES, left_out, 0)
    assert (first.index, first.leaving) == (1, None)
    gave_up = next_candidate(CANDIDATES, [*left_out, Attempt(1, Outcome.STOCKOUT, "GCE_STOCKOUT")], 0)
    assert isinstance(gave_up, GiveUp)
    assert gave_up.tried == (
        "candidate 0 (on_demand in us-east5-b): left, left out by the preflight (reservation too small)",
        "candidate 1 (spot in us-east5-b): left, stockout (GCE_STOCKOUT)",
        "candidate 2 (reservation 'my-v6e' in us-east5-a): left, left out by the preflight (no quota)",
    )
    everything = [Attempt(i, Outcome.PREFLIGHT, "no") for i in range(3)]
    assert isinstance(next_candidate(CANDIDATES, everything, 0), GiveUp)
