"""
### Recurring MaxText RL programs

One DAG per program declared in `include/programs.yaml` (deployed beside this file as
`maxtext_rl_tpu_programs.yaml`, or the file `TPU_RL_PROGRAMS` names), built by
the same code as `maxtext_rl_tpu`: a schedule, one run per data interval, backfill from the CLI or the UI,
and the capacity its trainings may hold. A declaration that cannot work fails this file's import, naming
the program and the field.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG  # also what Airflow's safe mode looks for before it parses a file

from tpu_rl.compat import CronDataIntervalTimetable
from tpu_rl.pipeline import build_pipeline
from tpu_rl.programs import load_programs, programs_file

_file = programs_file(Path(__file__).parent)
for _program in load_programs(_file) if _file else []:
    _dag: DAG = build_pipeline(
        _program.dag_id,
        doc_md=_program.doc_md,
        description=_program.description or f"Recurring MaxText RL program ({_program.schedule})",
        # Each run's data interval spans from one schedule time to the next (Airflow 3's cron default gives
        # runs a zero-length interval).
        schedule=CronDataIntervalTimetable(_program.schedule, timezone="UTC"),
        start_date=_program.start_date,
        end_date=_program.end_date,  # the last interval's start: Airflow schedules none after it
        catchup=_program.catchup,
        max_active_runs=_program.max_active_runs,
        param_defaults=_program.params,
        is_paused_upon_creation=True,
    )
    globals()[_program.dag_id] = _dag
