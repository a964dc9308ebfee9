"""Airflow version compatibility, in one place (in the style of ``airflow.providers.common.compat``).

Airflow 3.3 moved the task exceptions to ``airflow.sdk.exceptions`` and keeps the ``airflow.exceptions``
names as deprecated aliases of the same classes. Airflow 3.1 (Cloud Composer 3) has only
``AirflowException`` in the SDK: the others live in ``airflow.exceptions``, and 3.1's base operator raises
``airflow.exceptions.TaskDeferralTimeout``. So all of them come from one module or the other, together.

So does the cron timetable with data intervals, which is in the SDK only from 3.2 on. Other version
differences are detected where they are used; see docs/reference/versions.md.
"""

from __future__ import annotations

try:
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
        TaskDeferralTimeout,
        TaskDeferred,
    )
except ImportError:  # Airflow 3.1 (Composer 3)
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowException,
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
        TaskDeferralTimeout,
        TaskDeferred,
    )

try:
    from airflow.sdk import CronDataIntervalTimetable
except ImportError:  # Airflow 3.1 (Composer 3): the timetable is core's
    from airflow.timetables.interval import CronDataIntervalTimetable  # type: ignore[no-redef]


def cron_expression(timetable: object) -> str:
    """A cron timetable's expression (3.3's SDK definition names it ``expression``, 3.1's core class
    ``_expression``)."""
    return getattr(timetable, "expression", None) or timetable._expression


__all__ = [
    "CronDataIntervalTimetable",
    "AirflowException",
    "AirflowFailException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "TaskDeferralTimeout",
    "TaskDeferred",
]
