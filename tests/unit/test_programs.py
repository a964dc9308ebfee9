"""Recurring programs: declarations checked at parse time, one run per data interval, and the leases that let
runs share a cluster and a group of TPU capacity."""

from datetime import UTC, datetime

import pytest
import yaml

from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.config_rules import INTERVAL_DATA_KEYS, is_maxtext_key
from tpu_rl.layout import GcsLayout, training_record
from tpu_rl.leases import Holder, Lease
from tpu_rl.maxtext import train_rl
from tpu_rl.programs import ProgramError, load_programs, parse_program
from tpu_rl.run import DataInterval, RunIdentity
from tpu_rl_testing import REPO, TUTORIAL_CONF

EXAMPLE = REPO / "include/examples/programs.yaml"
DAY = DataInterval(datetime(2026, 11, 3, tzinfo=UTC), datetime(2026, 11, 4, tzinfo=UTC), 2)


def example_body() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["programs"]["maxtext_rl_tpu_daily"]


def test_the_shipped_example_declares_a_daily_program_with_capacity_and_data():
    program = {p.dag_id: p for p in load_programs(EXAMPLE)}["maxtext_rl_tpu_daily"]
    assert (program.dag_id, program.schedule, program.max_active_runs) == ("maxtext_rl_tpu_daily", "@daily", 3)
    assert program.start_date == datetime(2026, 11, 1, tzinfo=UTC)
    config = RunConfig.from_params(program.params)
    assert (config.capacity_group, config.capacity_slices, config.cluster_mode) == ("v6e-64-us-east5", 1, "shared")
    assert config.interval_data == {"train_split": "train[{first}:{stop}]"}


def test_a_bad_declaration_names_the_program_and_every_bad_field():
    body = {**example_body(), "schedule": "every day", "max_active_runs": 0, "colour": "blue"}
    body["params"] = {**body["params"], "zone": "europe-west4-a"}
    with pytest.raises(ProgramError) as raised:
        parse_program("programs.yaml", "maxtext_rl_tpu_daily", body)
    message = str(raised.value)
    assert "program 'maxtext_rl_tpu_daily'" in message
    for field in ("schedule:", "max_active_runs:", "colour: is not a field", "params.zone:"):
        assert field in message


@pytest.mark.parametrize("schedule", ["99 * * * *", "0 6 * * 8", "@fortnightly", "0 0 * *"])
def test_a_schedule_airflow_could_not_run_is_refused_at_parse_time(schedule):
    with pytest.raises(ProgramError, match=r"program 'p' cannot be scheduled:\n  - schedule: "):
        parse_program("programs.yaml", "p", {**example_body(), "schedule": schedule})


@pytest.mark.parametrize("schedule", ["@quarterly", "0 6 * * 1", "*/30 * * * *"])
def test_airflow_presets_and_cron_expressions_are_accepted(schedule):
    body = {**example_body(), "schedule": schedule, "end_date": example_body()["start_date"]}  # 37 intervals of data
    assert parse_program("programs.yaml", "p", body).schedule == schedule


def test_a_program_declared_twice_is_refused_instead_of_the_first_one_vanishing(tmp_path):
    body = EXAMPLE.read_text()
    daily = body[body.index("  maxtext_rl_tpu_daily:") : body.index("  maxtext_rl_tpu_weekly:")]
    doubled = tmp_path / "programs.yaml"
    doubled.write_text(body + "\n" + daily)
    with pytest.raises(ProgramError, match=r"program 'maxtext_rl_tpu_daily' cannot be scheduled:\n  - declared twice"):
        load_programs(doubled)


@pytest.mark.parametrize("dag_id", ["maxtext_rl_tpu", "maxtext_rl_tpu_reaper"])
def test_a_program_cannot_take_the_id_of_one_of_the_packages_dags(dag_id):
    with pytest.raises(ProgramError, match="dag id: .* not one of the package's own DAGs"):
        parse_program("programs.yaml", dag_id, example_body())


def test_a_program_must_give_the_required_params_because_no_form_is_filled_for_a_scheduled_run():
    body = {**example_body(), "params": {"project": "tpu-rl-sim"}}
    with pytest.raises(ProgramError, match=r"params.region: is required"):
        parse_program("programs.yaml", "p", body)


def test_interval_data_templates_are_checked():
    conf = {**TUTORIAL_CONF, "num_batches": 50, "batch_size": 4}
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_params({**conf, "interval_data": {"train_split": "train[{first}:{stop}]", "shuffle": "x"}})
    text = str(raised.value)
    assert "examples_per_interval: is 0" in text and "'shuffle' is not a data key" in text
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['day'\]"):
        RunConfig.from_params({**conf, "interval_data": {"hf_train_files": "gs://b/{day}/*.parquet"}})
    with pytest.raises(ConfigError, match="fewer than num_batches x batch_size = 200"):
        RunConfig.from_params(
            {**conf, "interval_data": {"train_split": "train[{first}:{stop}]"}, "examples_per_interval": 100}
        )


def test_a_programs_maxtext_keys_are_checked_at_parse_time():
    """A program's extra_train_args and data keys reach train_rl as MaxText keys: a typo would fail each interval's
    run on its TPU slice, so the DAG file refuses it; the data keys it allows are MaxText 0.2.4's."""
    body = example_body()
    body["params"] = {**body["params"], "extra_train_args": {"eval_dataset_nam": "openai/gsm8k"}}
    with pytest.raises(ProgramError) as raised:
        parse_program("programs.yaml", "p", body)
    assert (
        "params.extra_train_args: 'eval_dataset_nam' is not a MaxText 0.2.4 setting; fix: did you mean "
        "'eval_dataset_name'?" in str(raised.value)
    )
    with pytest.raises(ProgramError, match="params.interval_data: 'train_splt' is not a data key"):
        parse_program("programs.yaml", "p", {**example_body(), "data": {"train_splt": "train[{first}:{stop}]"}})
    assert all(is_maxtext_key(key) for key in INTERVAL_DATA_KEYS)


def test_each_interval_trains_on_its_own_slice_of_the_data_and_records_it():
    config = RunConfig.from_params(
        {
            **TUTORIAL_CONF,
            "interval_data": {"train_split": "train[{first}:{stop}]", "hf_train_files": ""},
            "examples_per_interval": 200,
        }
    )
    day = config.for_interval(DAY)
    assert day.extra_train_args["train_split"] == "train[400:600]"
    run = RunIdentity("maxtext_rl_tpu_daily", "backfill__2026-11-03T00:00:00+00:00", DAY.start.isoformat())
    command = train_rl(day, GcsLayout(day, run)).config
    assert ("train_split", "train[400:600]") in command
    assert training_record(day)["interval_data"] == {"train_split": "train[400:600]", "hf_train_files": ""}
    with pytest.raises(ConfigError, match="interval_data: needs the run's data interval"):
        config.for_interval(None)


def test_outputs_belong_to_the_interval_whichever_run_trains_it():
    interval = DAY.start.isoformat()
    scheduled = RunIdentity("maxtext_rl_tpu_daily", "scheduled__2026-11-03T00:00:00+00:00", interval)
    backfill = RunIdentity("maxtext_rl_tpu_daily", "backfill__2026-11-03T00:00:00+00:00", interval)
    next_day = RunIdentity("maxtext_rl_tpu_daily", "scheduled__2026-11-04T00:00:00+00:00", "2026-11-04T00:00:00+00:00")
    assert scheduled.key == backfill.key != next_day.key
    assert scheduled.slug == f"interval-2026-11-03-{scheduled.key}"
    manual = RunIdentity("maxtext_rl_tpu", "manual__2026-11-03T00:00:00+00:00")
    assert manual.slug.startswith("manual-2026-11-03")


def test_capacity_needs_per_run_pools_and_room_for_the_run():
    with pytest.raises(ConfigError, match="capacity_group: limits the slices"):
        RunConfig.from_params({**TUTORIAL_CONF, "capacity_group": "v6e", "tpu_pool_mode": "cluster"})
    with pytest.raises(ConfigError, match="capacity_slices: the group has 1 slice"):
        RunConfig.from_params({**TUTORIAL_CONF, "capacity_group": "v6e", "cluster_nodepool_count": 2})


def holder(name: str, slices: int = 1) -> Holder:
    return Holder.of(RunIdentity("daily", name), "2026-11-30T00:00:00+00:00", slices)


def test_a_capacity_lease_admits_runs_while_their_slices_fit_and_a_retry_re_enters():
    lease = Lease().admit(holder("a"), limit=1)
    assert [h.run_id for h in lease.holders] == ["a"]
    assert lease.admit(holder("b"), limit=1) is None
    assert lease.admit(holder("a"), limit=1) is lease
    assert [h.run_id for h in lease.without(holder("a")).admit(holder("b"), limit=1).holders] == ["b"]
    assert Lease.parse(lease.dump()) == lease


def test_a_holder_whose_run_ended_or_vanished_expires_and_a_live_or_own_one_stays():
    lease = Lease((holder("ended"), holder("gone"), holder("running"), holder("me")))
    states = {"ended": "failed", "gone": "missing", "running": "running", "me": "success"}
    left, expired = lease.expire(lambda run: states[run.run_id], holder("me"))
    assert [h.run_id for h in left.holders] == ["running", "me"]
    assert [h.run_id for h in expired] == ["ended", "gone"]


def test_a_closing_lease_holds_joiners_back_only_while_the_run_deleting_the_cluster_lives():
    closing = Lease((holder("last"),)).without(holder("last")).closed_by(holder("last"))
    assert closing.closing and not closing.holders
    assert Lease.parse(closing.dump()) == closing
    assert not closing.closing_expired(lambda run: "running")
    assert closing.closing_expired(lambda run: "failed") and closing.closing_expired(lambda run: "missing")
    # A lease written before the closer was recorded keeps waiting for the delete.
    assert Lease.parse(b'{"holders": [], "closing": true}').closer is None
    assert not Lease(closing=True).closing_expired(lambda run: "failed")
    joined = closing.admit(holder("next"))
    assert not joined.closing and joined.closer is None and [h.run_id for h in joined.holders] == ["next"]


def test_a_shared_cluster_names_its_lease_and_its_creator_in_its_description():
    from tpu_rl import gke

    config = RunConfig.from_params({**TUTORIAL_CONF, "cluster_mode": "shared"})
    run = RunIdentity("daily", "scheduled__2026-11-30T00:00:00+00:00")
    description = gke.cluster_body(config, run, datetime(2026, 12, 1, tzinfo=UTC))["description"]
    assert gke.cluster_owner(description) == run
    assert gke.cluster_lease_uri(description) == (
        f"gs://{config.gcs_bucket}/tpu-rl/leases/cluster/{config.project}-{config.region}-{config.cluster_name}.json"
    )
    assert gke.cluster_lease_uri(gke.owner_description(run)) is None


def test_the_programs_file_is_found_beside_the_dag_file_as_composer_gets_it(tmp_path, monkeypatch):
    """make deploy-composer puts include/programs.yaml beside the DAG file (dags/ is what Composer gives the DAG
    processor); in this repository it is include/programs.yaml; without either there are no programs."""
    from tpu_rl.programs import programs_file

    monkeypatch.delenv("TPU_RL_PROGRAMS", raising=False)
    dags = tmp_path / "dags"
    dags.mkdir()
    assert programs_file(dags) is None
    (tmp_path / "include").mkdir()
    (tmp_path / "include/programs.yaml").write_text("programs: {}\n")
    assert programs_file(dags) == dags / "../include/programs.yaml"
    (dags / "maxtext_rl_tpu_programs.yaml").write_text("programs: {}\n")
    assert programs_file(dags) == dags / "maxtext_rl_tpu_programs.yaml"


def test_a_declared_programs_file_that_is_missing_is_an_import_error(tmp_path, monkeypatch):
    """Not zero DAGs in silence: the DAG file's import error names the variable, the file and the fix."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag

    monkeypatch.setenv("TPU_RL_PROGRAMS", str(tmp_path / "gone.yaml"))
    bag = DagBag(dag_folder=str(REPO / "dags/maxtext_rl_tpu_programs.py"))
    (error,) = bag.import_errors.values()
    assert "TPU_RL_PROGRAMS names" in error and "gone.yaml, which does not exist" in error


def test_a_dags_folder_as_deployed_parses_the_programs_beside_the_dag_file(tmp_path, monkeypatch):
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag

    monkeypatch.delenv("TPU_RL_PROGRAMS", raising=False)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "maxtext_rl_tpu_programs.py").write_bytes((REPO / "dags/maxtext_rl_tpu_programs.py").read_bytes())
    (dags / "maxtext_rl_tpu_programs.yaml").write_bytes(EXAMPLE.read_bytes())
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == set(yaml.safe_load(EXAMPLE.read_text())["programs"])


def test_a_scheduled_pipeline_refuses_defaults_its_form_would_refuse():
    """Airflow refuses a scheduled DAG whose param defaults fail their schema or leave a required one empty; the
    pipeline checks the same before it hands the form to the DAG (after its tasks: see build_pipeline)."""
    from tpu_rl.pipeline import build_pipeline

    program = load_programs(EXAMPLE)[0]
    with pytest.raises(ValueError, match=r"num_batches: 'many' is not valid: 'many' is not of type 'integer'"):
        build_pipeline(
            "p_bad",
            doc_md="",
            schedule="@daily",
            start_date=program.start_date,
            param_defaults={**program.params, "num_batches": "many"},
        )
    with pytest.raises(ValueError, match=r"project: required"):
        build_pipeline(
            "p_missing",
            doc_md="",
            schedule="@daily",
            start_date=program.start_date,
            param_defaults={k: v for k, v in program.params.items() if k != "project"},
        )


def test_programs_share_no_param_and_their_tasks_hold_no_copy_of_the_form():
    """Each DAG gets its own Params (no mutable object shared between DAGs); the tasks read them from the DAG
    when they run (Airflow's process_params), so they do not each carry a copy."""
    from tpu_rl.pipeline import build_pipeline

    daily, weekly = (
        build_pipeline(p.dag_id, doc_md="", schedule="@daily", start_date=p.start_date, param_defaults=p.params)
        for p in load_programs(EXAMPLE)
    )
    assert daily.params.get_param("cluster_name") is not weekly.params.get_param("cluster_name")
    assert (
        daily.params["dataset_name"] == "openai/gsm8k" and weekly.params["dataset_name"] == "nvidia/OpenMathInstruct-2"
    )
    assert len(daily.params) == len(weekly.params) > 60
    assert all(len(task.params) == 0 for task in daily.tasks)
