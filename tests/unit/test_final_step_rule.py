"""The rule that tells the end-of-run checkpoint from a periodic one (maxtext.md, stage b)."""

import pytest

from tpu_rl.checkpoints import check_final_step

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core


def test_planned_end_and_early_end_off_the_period_are_final():
    assert check_final_step(50, train_steps=50, checkpoint_period=10).complete
    assert check_final_step(47, train_steps=50, checkpoint_period=10).complete


def test_a_periodic_save_is_not_final_without_the_trainers_word():
    verdict = check_final_step(40, train_steps=50, checkpoint_period=10)
    assert not verdict.complete
    assert "highest committed step 40 of 50 is a periodic save" in verdict.describe()


def test_an_early_end_on_the_period_is_final_when_the_trainer_reported_success():
    assert check_final_step(40, train_steps=50, checkpoint_period=10, trainer_completed=True).complete


def test_the_trainers_word_does_not_cover_an_interrupted_save():
    verdict = check_final_step(40, train_steps=50, checkpoint_period=10, uncommitted=[50], trainer_completed=True)
    assert not verdict.complete and "no commit_success.txt in actor/50/" in verdict.describe()
