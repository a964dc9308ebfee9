"""How the fault campaign (scripts/chaos.py) deals its faults: what ``make chaos`` promises about a seed."""

from __future__ import annotations

from scripts.chaos import CATALOGUE, deal


def test_a_campaign_with_a_place_for_each_kind_draws_every_kind():
    for seed in range(20):
        hands = deal(seed, 7, 3)  # 21 places, 21 kinds
        assert {kind for hand in hands for kind in hand} == set(CATALOGUE), seed
        assert all(len(hand) == 3 for hand in hands), hands


def test_the_seed_decides_the_deal():
    assert deal(7, 4, 3) == deal(7, 4, 3)
    assert deal(7, 4, 3) != deal(8, 4, 3)


def test_a_run_meets_one_fatal_or_trainer_fault_at_most():
    """A fatal fault stops the run before it trains; the emulator applies one rule to a trainer's attempt."""
    for seed in range(50):
        for hand in deal(seed, 5, 4):
            assert len(set(hand)) == len(hand)
            assert sum(1 for kind in hand if CATALOGUE[kind].fatal or CATALOGUE[kind].trainer) <= 1, hand
