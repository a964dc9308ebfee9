"""Capacity candidates: an ordered list of zones and capacity types in place of the single choice, each checked
before anything is created with the single choice's rules, its problems naming ``capacity_candidates[i].key``."""

import json
from datetime import date

import pytest
from jsonschema import Draft202012Validator

from tpu_rl import gke, plan
from tpu_rl.candidates import Candidate
from tpu_rl.config import ConfigError, RunConfig, field_specs

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

#: The issue's example: on demand first, then Spot at its own price, then a reservation in the other v6e zone.
THREE = [
    {"zone": "us-east5-b", "capacity_type": "on_demand"},
    {"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": 1.1, "wait_minutes": 20},
    {"zone": "us-east5-a", "capacity_type": "reservation", "reservation": "my-v6e"},
]


def problems_for(conf: dict, **overrides) -> dict[str, str]:
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_params({**conf, **overrides})
    return {p.field: str(p) for p in raised.value.problems}


def test_without_candidates_the_run_has_the_single_choice_as_its_one_candidate(tutorial_conf):
    config = RunConfig.from_params(
        {**tutorial_conf, "capacity_type": "reservation", "reservation": "my-v6e", "capacity_wait_minutes": 30}
    )
    assert config.candidates == (Candidate("us-east5-b", "reservation", "my-v6e", None, 30),)
    assert config.on_candidate(config.candidates[0]) == config


def test_candidates_are_kept_in_order_with_their_prices_and_waits(tutorial_conf):
    config = RunConfig.from_params({**tutorial_conf, "capacity_candidates": THREE, "tpu_price_per_chip_hour": 2.7})
    assert [c.describe() for c in config.candidates] == [
        "on_demand in us-east5-b",
        "spot in us-east5-b",
        "reservation 'my-v6e' in us-east5-a",
    ]
    assert [c.price(config.tpu_price_per_chip_hour) for c in config.candidates] == [2.7, 1.1, 2.7]
    assert [c.wait_minutes for c in config.candidates] == [0, 20, 0]


def test_a_candidates_pool_request_is_in_its_zone_with_its_capacity_fields(tutorial_conf, run):
    config = RunConfig.from_params({**tutorial_conf, "capacity_candidates": THREE})
    first = gke.tpu_node_pool(config, run, 0)
    assert first["locations"] == ["us-east5-b"] and "spot" not in first["config"]
    spot = gke.tpu_node_pool(config, run, 0, config.candidates[1])
    assert spot["locations"] == ["us-east5-b"] and spot["config"]["spot"] is True
    reserved = gke.tpu_node_pool(config, run, 0, config.candidates[2])
    assert reserved["locations"] == ["us-east5-a"]
    assert reserved["config"]["reservation_affinity"]["values"] == ["projects/my-project/reservations/my-v6e"]
    assert gke.cpu_pool(config)["locations"] == ["us-east5-b"]  # the CPU pool stays in the run's zone


def test_each_candidate_meets_the_single_choices_rules_named_by_its_index(tutorial_conf):
    candidates = [
        {"zone": "us-east5-c", "capacity_type": "on_demand"},
        {"zone": "us-east5-b", "capacity_type": "reservation"},
        {"zone": "us-east5-b", "capacity_type": "flex_start", "wait_minutes": 10},
        {"zone": "us-east5-a", "capacity_type": "spot", "reservation": "my-v6e"},
    ]
    problems = problems_for(tutorial_conf, capacity_candidates=candidates)
    assert problems["capacity_candidates[0].zone"] == (
        "capacity_candidates[0].zone: TPU v6e is not offered in us-east5-c; fix: use a zone that offers it "
        "(us-central1-b, us-east1-d, us-east5-a, us-east5-b, europe-west4-a or asia-northeast1-b) with its region."
    )
    assert problems["capacity_candidates[1].reservation"] == (
        "capacity_candidates[1].reservation: is required when capacity_candidates[1].capacity_type is "
        "'reservation'; fix: name the reservation to consume, or choose another capacity_candidates[1].capacity_type."
    )
    assert "a flex_start pool is created empty at once" in problems["capacity_candidates[2].wait_minutes"]
    assert "which consumes no reservation" in problems["capacity_candidates[3].reservation"]


def test_flex_start_and_generations_are_checked_per_candidate(tutorial_conf):
    central = {"region": "us-central1", "zone": "us-central1-b"}
    problems = problems_for(
        tutorial_conf, **central, capacity_candidates=[{"zone": "us-central1-b", "capacity_type": "flex_start"}]
    )
    assert problems["capacity_candidates[0].zone"].endswith(
        'us-east5-b (GKE "About flex-start") with its region, or another capacity_candidates[0].capacity_type.'
    )
    v4 = {"tpu_type": "v4-128", "topology": "4x4x4", "compute_type": "ct4p-hightpu-4t"}
    v4 |= {"region": "us-central2", "zone": "us-central2-b"}
    problems = problems_for(
        tutorial_conf, **v4, capacity_candidates=[{"zone": "us-central2-b", "capacity_type": "flex_start"}]
    )
    assert "flex_start does not offer TPU v4" in problems["capacity_candidates[0].capacity_type"]


def test_a_candidate_in_another_region_is_refused_saying_what_it_would_need(tutorial_conf):
    problems = problems_for(
        tutorial_conf, capacity_candidates=[*THREE, {"zone": "us-central1-b", "capacity_type": "spot"}]
    )
    message = problems["capacity_candidates[3].zone"]
    assert "'us-central1-b' is not in region 'us-east5'" in message
    assert "a cluster there and the checkpoints in a bucket both regions reach" in message


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ("us-east5-b", "[0]", "is not an object"),
        ({"zone": "us-east5-b", "capacity_type": "spot", "region": "x"}, "[0]", "'region' is not a key"),
        ({"capacity_type": "spot"}, "[0].zone", "is required"),
        ({"zone": "us-east5-b", "capacity_type": "preemptible"}, "[0].capacity_type", "one of on_demand"),
        ({"zone": "us-east5-b", "capacity_type": "spot", "wait_minutes": -1}, "[0].wait_minutes", "-1 is not valid"),
        ({"zone": "us-east5-b", "capacity_type": "spot", "price_per_chip_hour": "1"}, "[0].price_per_chip_hour", "'1'"),
    ],
)
def test_an_entry_that_is_not_a_candidate_is_refused(tutorial_conf, entry, field, words):
    problems = problems_for(tutorial_conf, capacity_candidates=[entry])
    assert words in problems[f"capacity_candidates{field}"], problems


def test_candidates_replace_the_single_choice_and_are_not_set_beside_it(tutorial_conf):
    problems = problems_for(tutorial_conf, capacity_candidates=THREE, capacity_type="spot", capacity_wait_minutes=5)
    assert problems["capacity_type"] == (
        "capacity_type: is set beside capacity_candidates, which replace it; fix: set it in each candidate (its key "
        "capacity_type), or clear capacity_candidates."
    )
    assert "its key wait_minutes" in problems["capacity_wait_minutes"]


def test_failing_over_needs_pools_the_run_creates(tutorial_conf):
    problems = problems_for(tutorial_conf, capacity_candidates=THREE, tpu_pool_mode="cluster")
    assert "tpu_pool_mode is 'cluster'" in problems["capacity_candidates"]
    one = [{"zone": "us-east5-a", "capacity_type": "spot"}]
    assert RunConfig.from_params({**tutorial_conf, "capacity_candidates": one, "tpu_pool_mode": "cluster"})


def test_a_candidate_listed_twice_and_waits_past_the_timeout_are_refused(tutorial_conf):
    twice = [*THREE, {"zone": "us-east5-b", "capacity_type": "spot", "wait_minutes": 60}]
    assert (
        "spot in us-east5-b is candidate 1 already"
        in problems_for(tutorial_conf, capacity_candidates=twice)["capacity_candidates[3].zone"]
    )
    long = [{**c, "wait_minutes": 750} for c in THREE[:2]]
    assert (
        "wait 1500 minutes in all, and GKE may hold each one's last create about 35 minutes more: 1570"
        in (problems_for(tutorial_conf, capacity_candidates=long)["capacity_candidates"])
    )
    fits = [{**c, "wait_minutes": 700} for c in THREE[:2]]  # 1400 + 2 x 35 <= 24 h + 2 h
    assert RunConfig.from_params({**tutorial_conf, "capacity_candidates": fits})


def test_moving_on_preemption_needs_a_next_candidate(tutorial_conf):
    problems = problems_for(tutorial_conf, capacity_type="spot", max_preemptions_per_candidate=2)
    assert problems["max_preemptions_per_candidate"] == (
        "max_preemptions_per_candidate: moves a preempted run to the next capacity candidate, but the run has one; "
        "fix: list more capacity_candidates, or set it to 0."
    )
    # Within the run's budget: beyond it, the run would stop resuming before a candidate's preemptions move it.
    problems = problems_for(
        tutorial_conf, capacity_candidates=THREE, max_preemptions=3, max_preemptions_per_candidate=4
    )
    assert problems["max_preemptions_per_candidate"].startswith(
        "max_preemptions_per_candidate: is above max_preemptions (3)"
    )
    moves = RunConfig.from_params({**tutorial_conf, "capacity_candidates": THREE, "max_preemptions_per_candidate": 2})
    assert moves.max_preemptions_per_candidate == 2


def test_the_forms_schema_takes_a_list_of_candidates_and_refuses_other_keys():
    spec = next(s for s in field_specs() if s.name == "capacity_candidates")
    schema = {"type": "array", **spec.metadata["schema"]}
    validator = Draft202012Validator(schema)
    assert not list(validator.iter_errors(THREE)) and not list(validator.iter_errors([]))
    assert list(validator.iter_errors([{"zone": "us-east5-b", "capacity_type": "spot", "region": "us-east5"}]))
    assert list(validator.iter_errors([{"zone": "us-east5-b"}]))


def test_the_plan_lists_the_candidates_with_their_prices(tutorial_conf, tmp_path, capsys):
    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({**tutorial_conf, "capacity_candidates": THREE}))
    assert plan.main(["--conf", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "#   0: on_demand in us-east5-b, $2.70 per chip-hour, wait 0 min: no capacity field" in out
    assert "#   1: spot in us-east5-b, $1.10 per chip-hour, wait 20 min: config.spot true" in out
    assert "#   2: reservation 'my-v6e' in us-east5-a, $2.70 per chip-hour, wait 0 min" in out
    assert "# GKE: create TPU node pool 0 before training (deleted right after it); candidate 0" in out
    conf.write_text(json.dumps({**tutorial_conf, "capacity_candidates": THREE, "max_preemptions_per_candidate": 2}))
    assert plan.main(["--conf", str(conf)]) == 0
    assert "#   after 2 preemption(s) on a candidate, the resume moves to the next" in capsys.readouterr().out


def test_a_programs_candidates_are_checked_when_its_file_is_parsed(tutorial_conf):
    from tpu_rl.programs import ProgramError, parse_program

    body = {"schedule": "@daily", "start_date": date(2026, 11, 1), "params": {**tutorial_conf}}
    body["params"]["capacity_candidates"] = [THREE[1], {"zone": "us-east5-c", "capacity_type": "spot"}]
    with pytest.raises(ProgramError, match=r"params\.capacity_candidates\[1\]\.zone: TPU v6e is not offered"):
        parse_program("programs.yaml", "p", body)
    body["params"]["capacity_candidates"] = THREE
    assert parse_program("programs.yaml", "p", body).params["capacity_candidates"] == THREE


def test_the_training_tab_shows_the_candidates_tried_and_the_cost_on_each(tutorial_conf, run):
    from tpu_rl import run_view
    from tpu_rl.layout import GcsLayout

    candidates = [THREE[0], THREE[1]]
    config = RunConfig.from_params({**tutorial_conf, "capacity_candidates": candidates})
    capacity = {
        "serving": 1,
        "attempts": [{"candidate": 0, "outcome": "stockout", "detail": "", "at": ""}],
        "lines": [
            "candidate 0 (on_demand in us-east5-b): left, stockout",
            "candidate 1 (spot in us-east5-b): the slices",
        ],
    }
    slices = [{"pool": "p", "nodes_from": "2026-12-01T10:00:00+00:00", "nodes_gone": "2026-12-01T11:30:00+00:00"}]
    page = run_view.run_page(
        dag_id=run.dag_id,
        run_id=run.run_id,
        state="success",
        config=config,
        layout=GcsLayout(config, run),
        files={},
        xcoms=run_view.RunXComs(slices=[{**slices[0], "candidate": 1}], capacity=capacity),
        now=0.0,
    )
    html = run_view.render(page)
    assert '<ul id="capacity"><li>candidate 0 (on_demand in us-east5-b): left, stockout</li>' in html
    assert '<table id="cost-by-candidate">' in html
    assert "<th>candidate 1 (spot in us-east5-b)</th><td" in html and ">105.60<" in html
    single = run_view.run_page(
        dag_id=run.dag_id,
        run_id=run.run_id,
        state="success",
        config=RunConfig.from_params(tutorial_conf),
        layout=GcsLayout(RunConfig.from_params(tutorial_conf), run),
        files={},
        xcoms=run_view.RunXComs(slices=slices),
        now=0.0,
    )
    assert 'id="capacity"' not in run_view.render(single) and "cost-by-candidate" not in run_view.render(single)
