"""Recurring training programs, declared as data (``include/programs.yaml``): each becomes a DAG of the
pipeline (``tpu_rl.pipeline``) with a schedule, one run per data interval, that can be backfilled.

Pure: reading and checking the declarations. A declaration that cannot work raises :class:`ProgramError`,
naming the program and the field, when the DAG file is parsed: an import error in the UI, never a DAG that
is silently missing or a run that fails on its first interval.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.run import DAG_ID, REAPER_DAG_ID, DataInterval

#: Where the DAG file looks for declarations when TPU_RL_PROGRAMS does not name a file, relative to its
#: folder: beside it (where ``make deploy-composer`` puts them: Cloud Composer gives its DAG processor the
#: dags/ folder), then this repository's include/.
DEFAULT_LOCATIONS = ("maxtext_rl_tpu_programs.yaml", "../include/programs.yaml")
_DAG_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")
#: Airflow's cron presets (airflow.utils.dates.cron_presets), which its cron timetables expand.
CRON_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}
#: The package's own DAGs (dags/): a program of the same id would replace one of them.
RESERVED_DAG_IDS = (DAG_ID, REAPER_DAG_ID)
FIELDS = (
    "description",
    "schedule",
    "start_date",
    "end_date",
    "catchup",
    "max_active_runs",
    "capacity",
    "data",
    "examples_per_interval",
    "params",
)


class ProgramError(ValueError):
    def __init__(self, source: str, program: str, problems: list[str]):
        self.program = program
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: program '{program}' cannot be scheduled:\n{lines}")


@dataclass(frozen=True)
class Program:
    """One recurring program: a DAG id, its schedule, and the run params that differ from the form's."""

    dag_id: str
    schedule: str
    start_date: datetime
    catchup: bool = False
    max_active_runs: int = 1
    description: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    end_date: datetime | None = None

    @property
    def doc_md(self) -> str:
        params = "\n".join(f"| `{k}` | `{v}` |" for k, v in sorted(self.params.items()))
        return (
            f"### Recurring MaxText RL program `{self.dag_id}`\n\n{self.description}\n\n"
            f"Declared in `include/programs.yaml`; built by the same code as `{DAG_ID}` (its tasks are "
            f"described there). Schedule `{self.schedule}` from {self.start_date:%Y-%m-%d}"
            f"{f' to {self.end_date:%Y-%m-%d}' if self.end_date else ''}; one run per data "
            "interval, whose outputs (checkpoints, export, Asset event) belong to the interval. Backfill: "
            f"`airflow backfill create --dag-id {self.dag_id} --from-date ... --to-date ... "
            "--reprocess-behavior failed`, or the UI's backfill dialog.\n\n"
            f"| param | value |\n|---|---|\n{params}\n"
        )


def programs_file(dag_folder: Path) -> Path | None:
    """The declarations file: the one TPU_RL_PROGRAMS names, which must exist (a declared file that is missing
    is an import error, not zero programs in silence); else the first default location that exists; else none."""
    named = os.environ.get("TPU_RL_PROGRAMS")
    if named:
        if not Path(named).is_file():
            raise ProgramError(
                named,
                "*",
                [
                    f"TPU_RL_PROGRAMS names {named}, which does not exist; fix: deploy the "
                    "programs file there, or unset TPU_RL_PROGRAMS"
                ],
            )
        return Path(named)
    return next((dag_folder / path for path in DEFAULT_LOCATIONS if (dag_folder / path).is_file()), None)


def load_programs(path: Path) -> list[Program]:
    import yaml

    with path.open() as stream:
        document = yaml.load(stream, Loader=_unique_key_loader()) or {}
    declared = document.get("programs") if isinstance(document, dict) else None
    if not isinstance(declared, dict):
        raise ProgramError(str(path), "*", ["the file must have a mapping 'programs: {<dag id>: {...}}'"])
    return [parse_program(str(path), dag_id, body) for dag_id, body in declared.items()]


def _unique_key_loader() -> type:
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently: a
    program declared twice would be a DAG missing without a word)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ProgramError(
                        str(self.name),
                        str(key),
                        [
                            f"declared twice (line {key_node.start_mark.line + 1}); fix: give each program and "
                            "field once"
                        ],
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def _is_schedule(schedule: Any) -> bool:
    from croniter import croniter

    if not isinstance(schedule, str):
        return False
    expression = CRON_PRESETS.get(schedule, schedule)
    return len(expression.split()) == 5 and croniter.is_valid(expression)


def parse_program(source: str, dag_id: Any, body: Any) -> Program:
    """One declaration, checked: every problem is collected, each naming its field."""
    problems: list[str] = []
    name = str(dag_id)
    if not isinstance(body, dict):
        raise ProgramError(source, name, ["the declaration must be a mapping of the fields " + ", ".join(FIELDS)])
    if not _DAG_ID.fullmatch(name) or name in RESERVED_DAG_IDS:
        problems.append(
            f"dag id: '{name}' must be letters, digits, '_', '.', '-', and not one of the package's "
            f"own DAGs ({', '.join(RESERVED_DAG_IDS)})"
        )
    problems += [
        f"{key}: is not a field of a program; fix: use {', '.join(FIELDS)}" for key in body if key not in FIELDS
    ]

    schedule = body.get("schedule")
    if not _is_schedule(schedule):
        problems.append(
            f"schedule: {schedule!r} is not a five-field cron expression or one of Airflow's presets "
            f"({', '.join(CRON_PRESETS)}); fix: use e.g. '@daily' or '0 6 * * 1'"
        )
    start = _date_field(body.get("start_date"))
    if start is None:
        problems.append(
            f"start_date: {body.get('start_date')!r} is not a date; fix: write it as a YAML date, unquoted: "
            "start_date: 2026-11-01"
        )
    end = _date_field(body.get("end_date"))
    if "end_date" in body and end is None:
        problems.append(f"end_date: {body['end_date']!r} is not a date; fix: write it unquoted: end_date: 2026-12-07")
    catchup = body.get("catchup", False)
    if not isinstance(catchup, bool):
        problems.append(f"catchup: {catchup!r} must be true or false")
    max_active = body.get("max_active_runs", 1)
    if not isinstance(max_active, int) or isinstance(max_active, bool) or max_active < 1:
        problems.append(f"max_active_runs: {max_active!r} must be a whole number of at least 1")

    params = dict(body.get("params") or {})
    capacity = body.get("capacity")
    if capacity is not None:
        if not isinstance(capacity, dict) or set(capacity) - {"group", "slices"} or "group" not in capacity:
            problems.append(
                "capacity: must be {group: <name>, slices: <count>}; fix: e.g. {group: v6e-64-us-east5, slices: 1}"
            )
        else:
            params.update(capacity_group=capacity["group"], capacity_slices=capacity.get("slices", 1))
    if "data" in body:
        params["interval_data"] = body["data"]
    if "examples_per_interval" in body:
        params["examples_per_interval"] = body["examples_per_interval"]
    try:
        config = RunConfig.from_params(params)
    except ConfigError as error:
        problems += [f"params.{p.field}: {p.message}; fix: {p.fix}" for p in error.problems]
    if problems:
        raise ProgramError(source, name, problems)
    problems += _data_end_problems(config, schedule, start, end)
    if problems:
        raise ProgramError(source, name, problems)
    return Program(name, schedule, start, catchup, max_active, str(body.get("description", "")), params, end)


def _date_field(value: Any) -> datetime | None:
    """A YAML date or datetime as a UTC datetime; None for anything else."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return None


def _data_end_problems(config: RunConfig, schedule: str, start: datetime, end: datetime | None) -> list[str]:
    """A program whose Hub split runs out (each interval taking the next examples_per_interval rows) must end
    before it does: each later interval would fail at validate_config. The first interval without its prompts
    is found by bisection over the interval index (the rows an interval selects shrink as its index grows)."""
    if not _interval_fails(config, MAX_DATA_INTERVALS):
        return []
    low, high = 0, MAX_DATA_INTERVALS  # the first interval without its prompts is in low..high
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _interval_fails(config, middle) else (middle + 1, high)
    if low == 0:
        return []  # the first interval is refused with its own problem when it runs
    final = _interval_start(schedule, start, low - 1)
    if end is not None and end <= final:
        return []
    return [
        f"end_date: the data runs out after {low} interval(s): the interval of "
        f"{_moment(_interval_start(schedule, start, low))} would get fewer prompts than a run needs; fix: set "
        f"end_date: {_moment(final)} (the last interval with its prompts), or give the program more data"
    ]


def _moment(when: datetime) -> str:
    """A date as YAML reads it back: the day, or the day and time when the schedule fires within days."""
    return f"{when:%Y-%m-%d}" if when.time() == datetime.min.time() else when.isoformat().replace("+00:00", "Z")


#: Intervals a program's data is checked for (about 27 years of a daily schedule).
MAX_DATA_INTERVALS = 10_000


def _interval_fails(config: RunConfig, index: int) -> bool:
    """The interval of ``index`` is refused for its data (its dates do not matter to a Hub split's rows)."""
    day = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        config.for_interval(DataInterval(day, day, index))
    except ConfigError:
        return True
    return False


def _interval_start(schedule: str, start: datetime, index: int) -> datetime:
    """The start of the program's interval ``index`` (its schedule's fire times from its start date)."""
    from croniter import croniter

    fire_times = croniter(CRON_PRESETS.get(schedule, schedule), start - timedelta(microseconds=1))
    return [fire_times.get_next(datetime) for _ in range(index + 1)][-1]
