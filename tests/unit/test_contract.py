"""The contract between the pipeline's tasks (``tpu_rl.contract``) checked against the DAG the factory builds:
a renamed task or key, or a consumer wired before its producer, reads None at run time (a summary without
its cost, an export of no step); here it fails before any run."""

import re

import pytest

from tpu_rl import contract
from tpu_rl.contract import PULLED, Task
from tpu_rl.pipeline import build_pipeline

PULL_EXPRESSION = re.compile(r"ti\.xcom_pull\(task_ids='([^']+)'(?:, key='([^']+)')?\)")


@pytest.fixture(scope="module")
def dag():
    return build_pipeline("contract_probe", doc_md="probe")


def templated_pulls(dag):
    """(consumer task, Pull) for every XCom a templated field of the DAG reads."""
    for task in dag.tasks:
        for field in task.template_fields:
            value = getattr(task, field, None)
            for pushed_by, key in PULL_EXPRESSION.findall(value if isinstance(value, str) else ""):
                yield task.task_id, contract.Pull(pushed_by, key or contract.RETURN_VALUE)


def test_the_task_ids_of_the_contract_are_the_tasks_of_the_dag(dag):
    named = {value for name, value in vars(Task).items() if name.isupper()}
    assert named == set(dag.task_ids)


def test_every_xcom_pulled_across_tasks_is_pushed_by_a_task_of_the_dag(dag):
    assert {pulled.task for pulled in PULLED} <= set(dag.task_ids)


def test_every_xcom_the_training_tab_shows_is_in_the_contract():
    from tpu_rl.run_view import RunXComs

    assert set(RunXComs.pulls().values()) <= set(PULLED)


def test_every_templated_pull_is_in_the_contract_and_reads_a_task_that_runs_before_it(dag):
    pulls = list(templated_pulls(dag))
    # verify_training (trainer_completed), verify_export (prefix, not_before), publish_export (prefix, step)
    assert len(pulls) == 5
    for consumer, pulled in pulls:
        assert pulled in PULLED, f"{consumer} reads {pulled}, which the contract does not list"
        upstream = dag.get_task(consumer).get_flat_relative_ids(upstream=True)
        assert pulled.task in upstream, f"{consumer} reads {pulled.task}'s XCom but does not run after it"


def test_a_templated_pull_renders_as_airflow_reads_it():
    assert contract.FINAL_STEP.template() == "{{ ti.xcom_pull(task_ids='verify_training') }}"
    assert contract.EXPORT_SUBMITTED_AT.template() == (
        "{{ ti.xcom_pull(task_ids='maxtext_to_hf', key='submitted_at') }}"
    )


#: The XComs operators read in code (the preflight's left-out candidates, the export's step,
#: ``run_report.TrainingFigures``, ``RunSummaryOperator``), by reader.
READ_IN_CODE = {
    Task.CREATE_TPU_POOLS: (contract.PREFLIGHT_RESULT,),
    Task.TRAIN_RL: (contract.PREFLIGHT_RESULT,),
    Task.MAXTEXT_TO_HF: (contract.FINAL_STEP,),
    Task.QUALITY_GATE: (contract.TRAINING_EVALUATION,),
    Task.PUBLISH_EXPORT: (contract.TRAINING_EVALUATION, contract.SLICE_TIMES),
    Task.PIPELINE_DONE: (
        contract.TRAINING_EVALUATION,
        contract.SLICE_TIMES,
        contract.FINAL_STEP,
        contract.PUBLISHED_MODEL,
        contract.TRAINING_PREEMPTIONS,
    ),
}


@pytest.mark.parametrize("consumer", sorted(READ_IN_CODE))
def test_the_report_tasks_run_after_every_task_whose_xcom_they_read(dag, consumer):
    upstream = dag.get_task(consumer).get_flat_relative_ids(upstream=True)
    for pulled in READ_IN_CODE[consumer]:
        assert pulled in PULLED and pulled.task in upstream, (consumer, pulled)
