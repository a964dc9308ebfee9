"""A small client of a running Airflow's REST API (v2): what the demo and the end-to-end tests do as a user
would from the UI: unpause, trigger with conf, watch the run, read task logs, clear a task."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

TERMINAL = {"success", "failed"}


class AirflowApiError(RuntimeError):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:2000]}")
        self.status, self.body = status, body


class LocalAirflow:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._token: str | None = None

    def request(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        try:
            text = self._send(method, path, body)
        except AirflowApiError as error:
            if error.status != 401:
                raise
            # Airflow 3.1's simple auth manager asks a token even when everyone is admin (3.3 lets the API in
            # without one): it gives one without credentials in that mode.
            self._token = json.loads(self._send("GET", "/auth/token"))["access_token"]
            text = self._send(method, path, body)
        return text if raw else (json.loads(text) if text else None)

    def _send(self, method: str, path: str, body: Any = None) -> str:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.read().decode()
        except urllib.error.HTTPError as error:
            raise AirflowApiError(error.code, error.read().decode()) from None

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        """Until the dag-processor has parsed the DAG file."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", f"/api/v2/dags/{dag_id}")
                return
            except AirflowApiError as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(2)

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any], run_id: str | None = None) -> str:
        body: dict[str, Any] = {"conf": conf, "logical_date": None}
        if run_id:
            body["dag_run_id"] = run_id
        return self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float, on_poll=None) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.run(dag_id, run_id)["state"]
            if on_poll:
                on_poll(state)
            if state in TERMINAL:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {state} after {timeout:.0f} s")
            time.sleep(3)

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        body = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")
        return {ti["task_id"]: ti for ti in body["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        body = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        )
        content = body.get("content", body) if isinstance(body, dict) else body
        if isinstance(content, list):
            return "\n".join(_log_line(line) for line in content)
        return str(content)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}?deserialize=true"
        return self.request("GET", path)["value"]

    def upstream(self, dag_id: str) -> dict[str, list[str]]:
        """Each task's direct upstream tasks."""
        upstream: dict[str, list[str]] = {}
        for task in self.request("GET", f"/api/v2/dags/{dag_id}/tasks")["tasks"]:
            upstream.setdefault(task["task_id"], [])
            for child in task["downstream_task_ids"]:
                upstream.setdefault(child, []).append(task["task_id"])
        return upstream

    def clear(self, dag_id: str, run_id: str, task_ids: list[str]) -> list[str]:
        """Clears the tasks and their downstream, as the UI's Clear does; returns the task ids cleared."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": task_ids,
            "include_downstream": True,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        cleared = self.request("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", body)
        return sorted(ti["task_id"] for ti in cleared["task_instances"])


def _log_line(line: Any) -> str:
    """A structured log record as text, with the exception it carries."""
    if not isinstance(line, dict):
        return str(line)
    text = str(line.get("event", ""))
    for error in line.get("error_detail") or []:
        text += f"\n{error.get('exc_type')}: {error.get('exc_value')}"
    return text


def stage_table(instances: dict[str, dict[str, Any]], upstream: dict[str, list[str]] | None = None) -> str:
    """The run's stages in execution order: state, duration and hand-off (the time from the end of the
    upstream stage it waited for, the last to end, to its own start: scheduling and worker latency)."""
    rows = sorted(instances.values(), key=lambda ti: (ti.get("start_date") or "9", ti["task_id"]))
    lines = [f"{'stage':<24} {'state':<16} {'duration':>9} {'hand-off':>9}  after", "-" * 80]
    for ti in rows:
        duration = f"{ti['duration']:.1f} s" if ti.get("duration") is not None else "-"
        handoff, after = "-", ""
        ends = [
            (instances[u]["end_date"], u)
            for u in (upstream or {}).get(ti["task_id"], [])
            if u in instances and instances[u].get("end_date")
        ]
        if ends and ti.get("start_date"):
            end, after = max(ends)
            handoff = f"{(_time(ti['start_date']) - _time(end)).total_seconds():.1f} s"
        lines.append(f"{ti['task_id']:<24} {str(ti['state']):<16} {duration:>9} {handoff:>9}  {after}")
    return "\n".join(lines)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
