"""What a run shows of its training: curves read from the event files the MaxText emulator writes with
MaxText's writer, the trainer's evaluation lines, the progress line, the TPU cost and the quality gate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from sim.maxtext_outputs import (
    GROWING_FLUSHES,
    evaluation_line,
    growing_event_file,
    put_event_file,
    tensorboard_event_file,
    training_scalars,
)
from sim.maxtext_stages import train_rl
from tpu_rl import training_metrics as tm
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl_testing import jobset_trigger

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

RUN = "gs://tpu-rl-sim/qwen3-30b-a3b/trained/run-1/rl"
PRE = (
    "W1201 10:02:11.482113 139872 train_rl.py:786] Pre RL Training: corr=8, total=20, accuracy=40.0%, "
    "partial_accuracy=50.0%, format_accuracy=95.0%, mean_reward=0.4950"
)
POST = (
    "W1201 11:14:52.015220 139872 train_rl.py:824] Post RL Training: corr=12, total=20, accuracy=60.0%, "
    "partial_accuracy=70.0%, format_accuracy=100.0%, mean_reward=0.7000"
)


def test_event_files_of_the_emulated_trainer_read_back_as_written():
    written = training_scalars(RUN, 50, range(1, 51))
    name, data = tensorboard_event_file(written)

    read = tm.read_scalars([data])

    assert tm.is_event_file(f"{RUN}/tensorboard/{name}")
    assert read.keys() == written.keys() | {tm.STEP_TIMES}
    for tag, points in written.items():
        assert [step for step, _ in read[tag]] == [step for step, _ in points], tag
        assert [value for _, value in read[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag
    assert [step for step, _ in read[tm.STEP_TIMES]] == list(range(1, 51))  # one per logged loss


def test_the_step_times_are_when_the_trainer_logged_each_loss_and_merge_like_the_curves():
    crashed = tensorboard_event_file({tm.LOSS_TAG: [(1, 0.875), (2, 0.75), (3, 0.625)]}, lambda s: 1000.5 + 60 * s)
    resumed = tensorboard_event_file({tm.LOSS_TAG: [(3, 0.5), (4, 0.25)]}, lambda s: 5000.25 + 90 * s)
    files = {name: tm.read_scalars([data]) for name, data in (("a", crashed[1]), ("b", resumed[1]))}

    assert files["a"][tm.STEP_TIMES] == [(1, 1060.5), (2, 1120.5), (3, 1180.5)]
    merged = tm.merge_scalars(files)
    assert merged[tm.STEP_TIMES] == [(1, 1060.5), (2, 1120.5), (3, 5270.25), (4, 5360.25)]  # the later attempt's
    assert merged == tm.read_scalars([crashed[1], resumed[1]])


def test_the_emulated_curves_move_like_a_training_run():
    curves = tm.read_scalars([tensorboard_event_file(training_scalars(RUN, 50, range(1, 51)))[1]])
    reward = [value for _, value in curves[tm.REWARD_TAG]]
    loss = [value for _, value in curves[tm.LOSS_TAG]]

    assert [step for step, _ in curves[tm.LOSS_TAG]] == list(range(1, 51))  # one scalar per update
    assert [step for step, _ in curves[tm.REWARD_TAG]] == list(range(0, 50))  # the learner's 0-based step
    assert sum(reward[-10:]) > sum(reward[:10]) + 1.5  # rising...
    assert any(later < earlier for earlier, later in pairwise(reward))  # ...noisily
    assert sum(loss[-10:]) < sum(loss[:10]) / 2
    assert curves[tm.KL_TAG]


def test_a_resumed_run_shows_the_resumed_attempts_values_for_the_steps_it_logged_again(tmp_path):
    crashed = {tm.LOSS_TAG: [(1, 0.875), (2, 0.75), (3, 0.625)]}  # exact in float32, as the files store them
    resumed = {tm.LOSS_TAG: [(3, 0.5), (4, 0.25)]}
    for data in (tensorboard_event_file(crashed)[1], tensorboard_event_file(resumed)[1]):
        (tmp_path / f"events.out.tfevents.{len(list(tmp_path.iterdir())) + 1700000000}.head").write_bytes(data)

    curves = tm.read_scalars(sorted(tmp_path.iterdir()))

    assert curves[tm.LOSS_TAG] == [(1, 0.875), (2, 0.75), (3, 0.5), (4, 0.25)]


def test_a_file_cut_short_while_it_is_written_gives_the_steps_before_the_cut():
    data = tensorboard_event_file({tm.LOSS_TAG: [(1, 0.875), (2, 0.75), (3, 0.625)]})[1]

    assert tm.read_scalars([data[:-5]])[tm.LOSS_TAG] == [(1, 0.875), (2, 0.75)]


def test_evaluation_lines_are_read_from_the_trainers_log():
    log = [
        "I1201 10:00:00 train_rl.py:799] Starting RL training...",
        PRE,
        "...",
        "W1201 11:14:50 train_rl.py:810] RL Training Completed Successfully!",
        POST,
    ]

    evaluation = tm.parse_evaluation(log)

    assert evaluation.before == tm.Score(
        correct=8, total=20, accuracy=40.0, partial_accuracy=50.0, format_accuracy=95.0, mean_reward=0.495
    )
    assert evaluation.after.accuracy == 60.0 and evaluation.after.format_accuracy == 100.0
    assert evaluation.after.mean_reward == 0.7


def test_evaluation_lines_with_pass_at_1_scores_or_no_test_prompts():
    """eval_mode pass_at_1 makes corr a float; an empty test set gives the int 0 for every accuracy."""
    fractional = (
        "Pre RL Training: corr=7.5, total=20, accuracy=37.5%, partial_accuracy=40.0%, format_accuracy=90.0%, "
        "mean_reward=-0.1250"
    )
    empty = (
        "Post RL Training: corr=0, total=0, accuracy=0%, partial_accuracy=0%, format_accuracy=0%, mean_reward=0.0000"
    )

    evaluation = tm.parse_evaluation([fractional, empty])

    assert evaluation.before.correct == 7.5 and evaluation.before.mean_reward == -0.125
    assert evaluation.after.total == 0 and evaluation.after.accuracy == 0


def test_the_emulators_evaluation_lines_read_back():
    lines = [evaluation_line("Pre", RUN, 20, 0.4), evaluation_line("Post", RUN, 20, 0.25)]

    evaluation = tm.parse_evaluation(lines)

    assert (evaluation.before.total, evaluation.before.accuracy, evaluation.after.accuracy) == (20, 40.0, 25.0)


class MemoryBucket:
    """The few google-cloud-storage calls the emulator's train_rl makes, in memory."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def get_bucket(self, name):
        return self

    def blob(self, key):
        bucket = self

        class Blob:
            name = key

            def upload_from_string(self, data, content_type=None):
                bucket.objects[key] = data

            def exists(self):
                return key in bucket.objects

            def delete(self):
                del bucket.objects[key]

        return Blob()

    def list_blobs(self, prefix=""):
        return [self.blob(key) for key in sorted(self.objects) if key.startswith(prefix)]


def emulated_training(*faults, **args):
    storage = MemoryBucket()
    args = {
        "base_output_directory": "gs://b/trained/run-1",
        "run_name": "rl",
        "num_batches": "10",
        "batch_size": "4",
        "checkpoint_period": "5",
        **args,
    }
    lines, _ = train_rl(storage, args, {}, list(faults))
    return lines, storage.objects


def test_the_emulated_trainer_evaluates_around_training_and_writes_its_curves():
    lines, objects = emulated_training()

    evaluation = tm.parse_evaluation(lines)
    assert lines.index("RL Training Completed Successfully!") < len(lines) - 1  # Post comes after it
    assert evaluation.before.total == 5 * 4  # num_test_batches (MaxText's default 5) x batch_size
    assert evaluation.after.accuracy > evaluation.before.accuracy
    (events,) = [data for key, data in objects.items() if key.startswith("trained/run-1/rl/tensorboard/")]
    assert [step for step, _ in tm.read_scalars([events])[tm.LOSS_TAG]] == list(range(1, 11))


def test_the_emulators_fault_makes_the_trained_model_worse_and_no_test_batches_no_evaluation(tutorial_conf):
    regressed = tm.parse_evaluation(emulated_training("eval-regression")[0])
    assert regressed.after.accuracy < regressed.before.accuracy
    gated = RunConfig.from_params({**tutorial_conf, "require_no_regression": True})
    assert "beyond chance" in tm.quality_gate(regressed, gated)[0]  # the e2e scenario's gate fails

    assert tm.parse_evaluation(emulated_training(num_test_batches="0")[0]) is None


def test_a_log_without_evaluation_gives_none_and_a_crash_leaves_no_after():
    assert tm.parse_evaluation(["Starting RL training...", "RL Training Completed Successfully!"]) is None
    assert tm.parse_evaluation([PRE, "training crashed at step 30"]).after is None


def test_a_run_without_evaluation_says_so(tutorial_conf):
    config = RunConfig.from_params({**tutorial_conf, "extra_train_args": {"num_test_batches": 0}})

    assert tm.describe_evaluation(None, config) == "no evaluation: extra_train_args sets num_test_batches to 0"
    assert tm.quality_gate(None, config) == []


def test_evaluation_is_described_with_both_sets_of_figures(tutorial_config):
    line = tm.describe_evaluation(tm.parse_evaluation([PRE, POST]), tutorial_config)

    assert "before training: accuracy 40.0% (8/20)" in line and "after: accuracy 60.0% (12/20)" in line


# --- progress -----------------------------------------------------------------------------------------------


#: When the attempt's writer started (POSIX seconds; its event file's name holds it).
STARTED = 1_800_000_000


def step_times(steps, first_step_after: float, seconds_per_step: float, started: float = STARTED) -> list:
    """The times an attempt logged ``steps``: its first ``first_step_after`` seconds after its writer started
    (loading the model, evaluating it, compiling), then one every ``seconds_per_step``."""
    return [(s, started + first_step_after + i * seconds_per_step) for i, s in enumerate(steps)]


def curves(steps: int, first_reward: float, last_reward: float) -> dict:
    """Steps 1..``steps``, the first 14 minutes after the writer started, then one every 2 minutes."""
    return {
        tm.LOSS_TAG: [(s, 1 / s) for s in range(1, steps + 1)],
        tm.REWARD_TAG: [(0, first_reward), *[(s, 0.3) for s in range(1, steps - 1)], (steps - 1, last_reward)],
        tm.STEP_TIMES: step_times(range(1, steps + 1), 14 * 60, 120),
    }


def test_progress_line_shows_step_elapsed_eta_and_reward_change():
    line = tm.progress_line(curves(30, 0.29, 0.41), train_steps=50, elapsed_seconds=72 * 60)

    # 20 steps left at 2 minutes a step; the 14 minutes before the first step are not training.
    assert line == "step 30/50 (60%), 1h12m elapsed, ETA 40m, reward 0.41 (+0.12 since start)"


def test_progress_of_a_resumed_attempt_counts_only_its_own_steps():
    scalars = curves(30, 0.3, 0.3)
    # Steps 1..20 were an earlier attempt's, 3 minutes each; this one logs a step a minute from a minute in.
    scalars[tm.STEP_TIMES] = step_times(range(1, 21), 900, 180, STARTED - 7200) + step_times(range(21, 31), 60, 60)

    line = tm.progress_line(scalars, train_steps=50, elapsed_seconds=10 * 60, resumed_from=20)

    assert line.startswith("step 30/50 (60%), 10m elapsed, ETA 20m,")


def test_progress_before_the_second_step_and_at_the_end():
    assert tm.progress_line({}, 50, 40) == "step 0/50 (0%), 40s elapsed, ETA after the second logged step"
    first = {tm.LOSS_TAG: [(1, 0.5)], tm.STEP_TIMES: step_times([1], 30 * 60, 0)}
    assert tm.progress_line(first, 50, 31 * 60) == "step 1/50 (2%), 31m elapsed, ETA after the second logged step"
    resumed = curves(21, 0.3, 0.3)  # its first step of its own, after 20 of an earlier attempt: still no pace
    assert tm.progress_line(resumed, 50, 600, resumed_from=20).startswith("step 21/50 (42%), 10m elapsed, ETA after")
    assert tm.progress_line(curves(50, 0.2, 0.6), 50, 3 * 3600 + 5 * 60) == (
        "step 50/50 (100%), 3h05m elapsed, reward 0.60 (+0.40 since start)"
    )


# --- cost ---------------------------------------------------------------------------------------------------


def test_chip_hours_count_every_slice_from_its_nodes_present_to_gone():
    t0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
    slices = [(t0, t0 + timedelta(hours=2, minutes=5)), (t0 + timedelta(hours=1), t0 + timedelta(hours=1, minutes=30))]

    hours = tm.chip_hours(slices, chips_per_slice=64)

    assert hours == pytest.approx(64 * (2 + 5 / 60) + 64 * 0.5)
    assert tm.cost_line(64 * 2.5, 2.70) == "160.0 chip-hours, about $432.00 at $2.70 per chip-hour"
    assert tm.cost_line(160.0, 0) == "160.0 chip-hours (no price: tpu_price_per_chip_hour is 0)"


def test_the_default_price_is_the_v6e_on_demand_list_price(tutorial_config):
    assert tutorial_config.tpu_price_per_chip_hour == 2.70


# --- quality gate -------------------------------------------------------------------------------------------


def gated(conf: dict, **gate) -> RunConfig:
    return RunConfig.from_params({**conf, **gate})


def test_a_regression_fails_the_gate_only_beyond_chance_with_both_sets_of_figures(tutorial_conf):
    """The same fall (40% -> 25%) fails on 200 prompts and passes on 20, where one prompt is 5 points."""

    def lines(total):
        before = PRE.replace("corr=8, total=20", f"corr={total * 2 // 5}, total={total}")
        after = POST.replace("corr=12, total=20", f"corr={total // 4}, total={total}").replace(
            "accuracy=60.0%", "accuracy=25.0%", 1
        )
        return tm.parse_evaluation([before, after])

    config = gated(tutorial_conf, require_no_regression=True)
    [reason] = tm.quality_gate(lines(200), config)
    assert reason.startswith(
        "accuracy fell from 40.0% (80/200) to 25.0% (50/200), beyond chance: the 95% interval of "
        "the change, -23.8 to -5.8 points"
    )
    assert "before training: accuracy 40.0% (80/200)" in reason and "after: accuracy 25.0% (50/200)" in reason
    assert tm.quality_gate(lines(20), config) == []
    assert "within chance" in tm.regression_note(lines(20))


def test_the_change_interval_is_newcombes():
    """Newcombe (1998), Table II, example (a): 56/70 vs 48/80, method 10 gives 0.0524 to 0.3339."""

    def score(correct, total):
        return tm.Score(correct, total, 100 * correct / total, 0, 0, 0)

    low, high = tm.accuracy_change(score(48, 80), score(56, 70))
    assert (round(low / 100, 4), round(high / 100, 4)) == (0.0524, 0.3339)


def test_accuracy_below_the_minimum_fails_the_gate(tutorial_conf):
    reasons = tm.quality_gate(tm.parse_evaluation([PRE, POST]), gated(tutorial_conf, min_post_accuracy=65))

    assert [r.split(" (")[0] for r in reasons] == ["accuracy after training 60.0% is below min_post_accuracy 65%"]


def test_an_improved_model_passes_and_no_gate_checks_nothing(tutorial_conf, tutorial_config):
    evaluation = tm.parse_evaluation([PRE, POST])

    assert tm.quality_gate(evaluation, gated(tutorial_conf, min_post_accuracy=60, require_no_regression=True)) == []
    assert tm.quality_gate(tm.parse_evaluation([PRE]), tutorial_config) == []


def test_a_gate_without_the_after_figures_fails_rather_than_passing(tutorial_conf):
    reasons = tm.quality_gate(tm.parse_evaluation([PRE]), gated(tutorial_conf, min_post_accuracy=50))

    assert reasons == [
        "the trainer logged no 'Post RL Training' line, so the quality gate cannot be checked "
        "(before training: accuracy 40.0% (8/20), partial 50.0% (10/20), format 95.0% (19/20), "
        "mean reward 0.4950; "
        "after: not logged)"
    ]


def test_an_empty_evaluation_is_no_evaluation_to_the_gate_not_a_crash(tutorial_conf):
    """MaxText's length filter and drop_remainder can leave no whole test batch: ``total=0``. The gate crashed with
    ZeroDivisionError; it now says the evaluation scored no prompt, as for a missing line."""
    empty = (
        "Post RL Training: corr=0, total=0, accuracy=0.0%, partial_accuracy=0.0%, format_accuracy=0.0%, mean_reward=0.0"
    )
    evaluation = tm.parse_evaluation([PRE, empty])
    config = gated(tutorial_conf, min_post_accuracy=50, require_no_regression=True)

    [reason] = tm.quality_gate(evaluation, config)
    assert reason.startswith("the evaluation after training scored no prompt, so the quality gate cannot be checked")
    assert "after: no prompt scored (total=0)" in reason
    assert tm.regression_note(evaluation) is None
    empty_before = tm.parse_evaluation([empty.replace("Post", "Pre"), POST])
    [reason] = tm.quality_gate(empty_before, gated(tutorial_conf, require_no_regression=True))
    assert reason.startswith("require_no_regression: the trainer logged no 'Pre RL Training' line with a scored")


def test_the_gate_says_at_validation_what_its_prompts_can_tell_apart(tutorial_conf):
    """The tutorial's evaluation: 5 batches of 4 prompts. On 20, only a fall of 35 points from 60% is beyond chance
    (12/20 to 6/20 passes); on 200 prompts, 10 points."""
    note = tm.gate_resolution(gated(tutorial_conf, require_no_regression=True))
    assert note.startswith("the quality gate decides on at most 20 test prompts, one prompt 5.0 points")
    assert "require_no_regression fails only on a fall beyond chance (from 60%: 35 points or more)" in note
    assert tm.quality_gate(_counted_evaluation(12, 6, 20), gated(tutorial_conf, require_no_regression=True)) == []
    larger = gated(tutorial_conf, require_no_regression=True, extra_train_args={"eval_batch_size": 40})
    assert "at most 200 test prompts" in tm.gate_resolution(larger) and "10 points or more" in tm.gate_resolution(
        larger
    )
    assert tm.gate_resolution(gated(tutorial_conf)) is None


def _counted_evaluation(before: int, after: int, total: int) -> tm.Evaluation:
    def score(correct):
        return tm.Score(correct, total, 100 * correct / total, 0, 0, 0)

    return tm.Evaluation(score(before), score(after))


def test_a_gate_on_a_run_without_evaluation_is_refused_before_anything_starts(tutorial_conf):
    with pytest.raises(ConfigError) as error:
        gated(tutorial_conf, min_post_accuracy=50, extra_train_args={"num_test_batches": 0})

    assert error.value.fields == ["min_post_accuracy"]
    assert "num_test_batches to 0" in str(error.value)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"min_post_accuracy": 120}, "min_post_accuracy"),
        ({"tpu_price_per_chip_hour": -1}, "tpu_price_per_chip_hour"),
        ({"extra_train_args": {"num_test_batches": -2}}, "extra_train_args"),
    ],
)
def test_evaluation_and_cost_params_out_of_range_are_refused(tutorial_conf, params, field):
    with pytest.raises(ConfigError) as error:
        RunConfig.from_params({**tutorial_conf, **params})

    assert error.value.fields == [field]


# --- what the pipeline shows: progress of the current attempt, evaluation in XCom, cost, summary -------------


def event_file(
    name_time: int, steps, train_steps: int = 50, first_step_after: float = 60, seconds_per_step: float = 60
) -> tuple[str, dict]:
    """An emulated attempt's event file: its name (the writer's start time in it) and its scalars; its first
    step logged ``first_step_after`` seconds after its writer started, then one every ``seconds_per_step``."""

    def logged_at(step: int) -> float:  # a reward, logged at its update's step less one, gets that step's time
        return name_time + first_step_after + max(0, step - steps[0]) * seconds_per_step

    _, data = tensorboard_event_file(training_scalars(RUN, train_steps, steps), logged_at)
    return f"events.out.tfevents.{name_time}.head-0", tm.read_scalars([data])


def test_progress_of_the_current_attempt_after_a_restart_counts_its_own_time_and_steps():
    earlier = event_file(1_800_000_000, range(1, 21), seconds_per_step=180)
    files = dict([earlier, event_file(1_800_003_000, range(21, 31))])

    line = tm.attempt_progress(files, train_steps=50, now=1_800_003_000 + 10 * 60)

    # The second attempt logs a step a minute (the first attempt took 3): 20 more take 20 minutes.
    assert line.startswith("step 30/50 (60%), 10m elapsed, ETA 20m, reward ")
    assert tm.attempt_progress({}, 50, now=0) is None  # before the trainer wrote anything: no line


def test_the_eta_comes_from_the_pace_of_the_steps_not_from_the_half_hour_before_the_first():
    """A 30B model's trainer starts its writer, then loads the model, evaluates it and compiles for half an hour
    before its first step; then it logs a step a minute. 45 steps left take 45 minutes, not 5 hours."""
    name, scalars = event_file(STARTED, range(1, 6), first_step_after=30 * 60, seconds_per_step=60)

    line = tm.attempt_progress({name: scalars}, train_steps=50, now=STARTED + 34 * 60 + 20)

    assert line.startswith("step 5/50 (10%), 34m elapsed, ETA 45m, reward ")
    name, first = event_file(STARTED, range(1, 2), first_step_after=30 * 60)
    assert tm.attempt_progress({name: first}, 50, now=STARTED + 31 * 60) == (
        f"step 1/50 (2%), 31m elapsed, ETA after the second logged step, reward {first[tm.REWARD_TAG][0][1]:.2f} "
        "(+0.00 since start)"
    )


def test_only_the_trainers_evaluation_and_success_lines_are_kept_while_its_log_streams():
    assert tm.kept_line_kind(PRE) == "Pre" and tm.kept_line_kind(POST) == "Post"
    assert tm.kept_line_kind("W1201 train_rl.py:810] RL Training Completed Successfully!") == "Completed"
    assert tm.kept_line_kind("I1201 train_rl.py:700] step 3 loss 0.2") is None
    assert tm.kept_line_kind("Post RL Training: pending") is None


def test_the_evaluation_goes_through_xcom_and_back_unchanged():
    evaluation = tm.parse_evaluation([PRE, POST])

    assert tm.Evaluation.from_dict(json_round_trip(evaluation.to_dict())) == evaluation
    assert tm.Evaluation.from_dict(None) is None
    assert tm.Evaluation.from_dict({"before": evaluation.to_dict()["before"], "after": None}).after is None


def json_round_trip(value):
    import json

    return json.loads(json.dumps(value))


def test_the_cost_counts_each_slice_the_run_created(tutorial_config):
    slices = [{"pool": "tpu-0", "nodes_from": "2026-12-01T10:00:00+00:00", "nodes_gone": "2026-12-01T12:30:00+00:00"}]

    cost = tm.tpu_cost(slices, tutorial_config)

    assert cost["chip_hours"] == 160.0 and cost["cost_usd"] == 432.0 and cost["price_per_chip_hour"] == 2.70
    assert tm.describe_cost(cost, tutorial_config) == (
        "160.0 chip-hours, about $432.00 at $2.70 per chip-hour, 1 slice(s)"
    )


def test_a_slice_the_run_did_not_create_is_not_counted(tutorial_conf):
    config = RunConfig.from_params({**tutorial_conf, "tpu_pool_mode": "existing", "cluster_mode": "existing"})

    assert tm.describe_cost(None, config).startswith("not counted: tpu_pool_mode is 'existing'")


def test_the_summary_names_step_evaluation_cost_and_model(tutorial_config):
    slices = [{"pool": "tpu-0", "nodes_from": "2026-12-01T10:00:00+00:00", "nodes_gone": "2026-12-01T11:00:00+00:00"}]

    summary = tm.run_summary(
        final_step=50,
        evaluation=tm.parse_evaluation([PRE, POST]),
        cost=tm.tpu_cost(slices, tutorial_config),
        model_uri="gs://b/m/hf-trained/r/",
        config=tutorial_config,
    )

    assert summary.splitlines() == [
        "Run summary",
        "  final step   50/50",
        "  evaluation   before accuracy 40.0% (8/20), partial 50.0% (10/20), format 95.0% (19/20), mean reward 0.4950",
        (
            "               after  accuracy 60.0% (12/20), partial 70.0% (14/20), format 100.0% (20/20), "
            "mean reward 0.7000"
        ),
        "  TPU          64.0 chip-hours, about $172.80 at $2.70 per chip-hour, 1 slice(s)",
        "  preemptions  none",
        "  model        gs://b/m/hf-trained/r/",
    ]


def test_a_summary_without_evaluation_says_so_instead_of_figures(tutorial_conf):
    config = RunConfig.from_params({**tutorial_conf, "extra_train_args": {"num_test_batches": 0}})

    summary = tm.run_summary(final_step=47, evaluation=None, cost=None, model_uri="gs://b/m/", config=config)

    assert "  evaluation   no evaluation: extra_train_args sets num_test_batches to 0" in summary.splitlines()
    assert "final step   47/50" in summary and "accuracy" not in summary


def test_the_success_line_is_kept_with_the_evaluation_lines_however_much_the_evaluation_prints():
    """MaxText prints its success line before the evaluation after training, which logs as it goes: a log
    tail of 100 lines loses it, and an early end on a checkpoint boundary would then count as interrupted."""
    import asyncio
    from types import SimpleNamespace

    from tpu_rl.triggers.wait_progress import Progress
    from tpu_rl.triggers.workload_log import LogCursor, LogPrinter

    lines = [
        PRE,
        "I1201 11:14:00.1 1 train_rl.py:810] RL Training Completed Successfully!",
        *[f"vLLM engine: processed prompt {i}" for i in range(150)],
        POST,
    ]

    class Hook:
        async def follow_log(self, pod, namespace, container, since):
            for i, text in enumerate(lines):
                yield f"2026-12-01T11:14:{i // 100:02d}.{i % 100:02d}Z {text}"

    trigger = jobset_trigger()
    progress = Progress(tail_lines=100)
    follower = trigger.log_follower(LogPrinter(trigger.log))
    asyncio.run(follower.read(Hook(), SimpleNamespace(name="head-0", uid="u0"), LogCursor(), progress))
    kept = list(progress.evaluation.values())
    assert not any("Completed Successfully" in line for line in progress.tail)
    assert tm.trainer_completed(kept) and tm.parse_evaluation(kept).after.correct == 12
    assert not tm.trainer_completed([PRE, POST])


def test_the_eta_is_never_an_earlier_attempts_while_the_resumed_trainer_loads_the_model():
    """A resumed trainer writes its first event file only after minutes of loading the 30B model: until then
    the newest file is the preempted attempt's, whose ETA no longer holds."""
    steps = range(1, 31)
    earlier = {
        "events.out.tfevents.1764583200.head-0": {
            tm.LOSS_TAG: [(s, 0.5) for s in steps],
            tm.STEP_TIMES: step_times(steps, 600, 60, 1764583200),
        }
    }
    resubmitted_at, now = 1764583200 + 3600, 1764583200 + 3700

    line = tm.attempt_progress(earlier, 50, now, attempt_started=resubmitted_at)
    assert line == "step 30/50 (60%) before this attempt, which has not logged a step yet (it loads the model)"
    assert "ETA 20m" in tm.attempt_progress(earlier, 50, now)  # without the attempt's start, as before

    resumed = {**earlier, "events.out.tfevents.1764586900.head-0": {tm.LOSS_TAG: [(s, 0.4) for s in range(25, 29)]}}
    assert tm.attempt_progress(resumed, 50, resubmitted_at + 300, attempt_started=resubmitted_at).startswith(
        "step 28/50"
    )


def test_the_emulated_trainer_grows_its_event_file_as_the_real_one_flushes():
    """Each version of the file the emulator uploads holds whole records up to a step: what a reader of the
    growing file (the trigger's progress, the Training tab) sees of a real trainer between flushes."""
    written = training_scalars(RUN, 50, range(1, 51))
    name, data, sizes = growing_event_file(written)

    assert [step for step, _ in sizes] == list(range(0, 51)) and sizes[-1][1] == len(data)  # rewards from step 0
    for step, size in sizes[1::7]:
        losses = tm.read_scalars([data[:size]])[tm.LOSS_TAG]
        assert losses[-1][0] == step and len(losses) == step


def test_the_emulated_training_uploads_growing_versions_then_the_whole_file():
    """Over a training of some minutes: nothing before the first flush, longer versions, the whole file last."""
    import time as clock

    uploads = []

    class Blob:
        def upload_from_string(self, data):
            uploads.append((clock.monotonic(), data))

    out = type(
        "Out",
        (),
        {"written": [], "key": lambda self, rel: rel, "bucket": type("B", (), {"blob": lambda self, key: Blob()})()},
    )()
    name, data, sizes = growing_event_file(training_scalars(RUN, 12, range(1, 13)))
    started = clock.monotonic()
    put_event_file(out, f"tensorboard/{name}", data, sizes, duration=20.0)
    assert uploads == [] and out.written == [f"tensorboard/{name}"]  # nothing before the first flush
    clock.sleep(19.5)
    assert len(uploads) == GROWING_FLUSHES
    lengths = [len(d) for _, d in uploads]
    assert lengths == sorted(lengths) and lengths[-1] == len(data) and lengths[0] < len(data)
    assert uploads[0][0] - started >= 2.5 and uploads[-1][0] - started <= 19
