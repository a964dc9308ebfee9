"""The run view's web app, which Airflow's api-server mounts (``tpu_rl.run_view_plugin``):
``GET /runs/{dag_id}/{run_id}`` answers the page of ``tpu_rl.run_view``.

Authentication and authorisation are Airflow's own, as for its REST API: the route depends on the
api-server's ``requires_access_dag`` for the run and for its XComs, which reads the user from the JWT
in the Authorization header or the UI's ``_token`` cookie (``get_user``) and asks the configured auth
manager. A request without a valid token gets 401 or 403 before anything of the run is read.

The run's params, state and XComs come from the metadata database through the api-server's own session
(the DAG's serialized params merged with the run's conf, as a task sees them), not through the REST API:
no HTTP round trip to itself, no token to forward, and the same rows the REST API would read once the
same authorisation passed. The event files come from the bucket, read with the run's Google Cloud
connection as ``train_rl``'s progress reads them, and kept between views (``tpu_rl.run_view_events``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from tpu_rl import run_view
from tpu_rl.config import ConfigError
from tpu_rl.contract import Pull
from tpu_rl.run_scope import RunScope
from tpu_rl.run_view_events import EventFileCache
from tpu_rl.training_metrics import Scalars


@dataclass(frozen=True)
class RunRecord:
    """A run as the page needs it: its scope (params, identity, data interval), its state, its XComs."""

    scope: RunScope
    state: str
    xcoms: run_view.RunXComs


def read_run(dag_id: str, run_id: str, session: SessionDep) -> RunRecord:
    """The run from the metadata database; 404 for a run that does not exist, or of a DAG that is not the
    pipeline's."""
    from airflow.models.dagbag import DBDagBag
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if dag_run is None:
        raise HTTPException(404, f"No run {run_id!r} of DAG {dag_id!r}")
    dag = DBDagBag().get_dag_for_run(dag_run, session=session)
    if dag is None:
        raise HTTPException(404, f"The DAG {dag_id!r} of run {run_id!r} is not serialized")
    params = {**dag.params.dump(), **(dag_run.conf or {})}
    if not run_view.is_pipeline_params(params):
        raise HTTPException(404, f"{dag_id!r} is not a DAG of the tpu-rl pipeline: its runs have no training view")
    rows = session.execute(
        select(XComModel.task_id, XComModel.key, XComModel.value).where(
            XComModel.dag_id == dag_id,
            XComModel.run_id == run_id,
            XComModel.map_index == -1,
            XComModel.task_id.in_({pulled.task for pulled in run_view.RunXComs.pulls().values()}),
        )
    ).all()
    stored = {Pull(row.task_id, row.key): XComModel.deserialize_value(row) for row in rows}
    context = {
        "params": params,
        "dag": dag,
        "run_id": run_id,
        "dag_run": dag_run,
        "data_interval_start": dag_run.data_interval_start,
        "data_interval_end": dag_run.data_interval_end,
    }
    state = str(getattr(dag_run.state, "value", dag_run.state))
    return RunRecord(RunScope.of(context), state, run_view.RunXComs.of(stored))


#: Reads a run's event files: (bucket, tensorboard prefix, Google Cloud connection) -> scalars by file name.
EventReader = Callable[[str, str, str], Awaitable[dict[str, Scalars]]]


#: The runs' event files as the last view read them (``tpu_rl.run_view_events``: why a kept folder is right).
EVENT_FILES = EventFileCache()


async def read_event_files(bucket: str, prefix: str, gcp_conn_id: str) -> dict[str, Scalars]:
    """Every event file under the prefix, as the training's progress reads them: of a run viewed before, only the
    listing and the bytes added since."""
    from tpu_rl.hooks.gcs import GcsReadHook

    async with EVENT_FILES.folder(gcp_conn_id, bucket, prefix) as folder:
        await GcsReadHook(gcp_conn_id).run(bucket, folder.refresh)
        return folder.scalars()


def event_reader() -> EventReader:
    return read_event_files


def create_app() -> FastAPI:
    app = FastAPI(title="tpu-rl run view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(
        "/runs/{dag_id}/{run_id}",
        response_class=HTMLResponse,
        dependencies=[
            Depends(requires_access_dag("GET", DagAccessEntity.RUN)),
            Depends(requires_access_dag("GET", DagAccessEntity.XCOM)),
        ],
    )
    async def run_page(
        run: Annotated[RunRecord, Depends(read_run)], read_events: Annotated[EventReader, Depends(event_reader)]
    ) -> HTMLResponse:
        """The page of a run: its curves and figures, or why it has none (params that fail validation,
        with the messages ``validate_config`` logs)."""
        scope = run.scope
        try:
            config, layout = scope.config, scope.layout
        except ConfigError as error:
            return HTMLResponse(
                run_view.render_message(f"{scope.run.run_id}: the run's params fail validation", str(error))
            )
        files = await read_events(layout.bucket, layout.tensorboard_prefix, config.gcp_conn_id)
        page = run_view.run_page(
            dag_id=scope.run.dag_id,
            run_id=scope.run.run_id,
            state=run.state,
            config=config,
            layout=layout,
            files=files,
            xcoms=run.xcoms,
            now=time.time(),
        )
        return HTMLResponse(run_view.render(page))

    return app
