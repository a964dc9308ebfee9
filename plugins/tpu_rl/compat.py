"""Airflow version compatibility, in one place (in the style of ``airflow.providers.common.compat``).

Airflow 3.3 moved the task exceptions to ``airflow.sdk.exceptions`` and keeps the ``airflow.exceptions``
names as deprecated aliases of the same classes. Airflow 3.1 (Cloud Composer 3) has only
``AirflowException`` in the SDK: the others live in ``airflow.exceptions``, and 3.1's base operator raises
``airflow.exceptions.TaskDeferralTimeout``. So all of them come from one module or the other, together.

Other version differences are detected where they are used; see docs/compatibility.md.
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

__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "TaskDeferralTimeout",
    "TaskDeferred",
]
