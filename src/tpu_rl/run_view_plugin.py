"""Airflow plugin: a "Training" tab on every run page of the pipeline's DAGs, which shows the run's reward
and loss curves, its progress and ETA while it trains, its evaluation before and after, its TPU cost and
where its checkpoints and exported model are (``tpu_rl.run_view``; the app: ``tpu_rl.run_view_app``).

Registered through the distribution's entry point ``airflow.plugins`` (no file in a plugins folder). The
plugin manager imports this module in every Airflow component; only the api-server mounts the app. So the
app, with FastAPI and the rest of the package, is built the first time the api-server asks for it, never at
import.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

#: Where the api-server mounts the app.
URL_PREFIX = "/tpu-rl"


@cache
def _fastapi_apps() -> list[dict[str, Any]]:
    from tpu_rl.run_view_app import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "tpu-rl run view"}]


class _BuiltWhenRead:
    """``fastapi_apps``, built on first read (the same app after)."""

    def __get__(self, plugin: Any, owner: type) -> list[dict[str, Any]]:
        return _fastapi_apps()


class TpuRlRunViewPlugin(AirflowPlugin):
    name = "tpu_rl_run_view"
    fastapi_apps = _BuiltWhenRead()
    # The UI fills in {DAG_ID} and {RUN_ID} and shows the page in the run's "Training" tab.
    external_views = [
        {
            "name": "Training",
            "href": URL_PREFIX + "/runs/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "tpu-rl-training",
        }
    ]
