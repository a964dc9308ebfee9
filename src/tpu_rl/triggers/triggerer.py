"""The trigger a run defers on once, before it creates anything billable, to prove that the triggerer runs the
version of this package that deferred and can import every module the package's triggers need (on Cloud
Composer 3 it can only if the distribution is installed: plugins/ never reaches the triggerer)."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import socket
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from tpu_rl.hooks.in_thread import in_thread

#: Seconds the trigger waits before firing. Airflow fails a task whose trigger fired and whose resumption was
#: queued before the scheduler processed the executor's report of its deferral (seen here: the worker took
#: 5.4 s to report on a loaded machine); the task's retries cover what this wait does not.
HOLD_SECONDS = 10.0

#: What the package's triggers import only when they run (inside functions, or by name in a thread): the Google
#: provider's GCS and GKE hooks, the Kubernetes provider's, their clients, aiohttp. Importing the trigger modules
#: loads none of them, so a triggerer without one would fail a wait hours into a run. This is every import
#: inside a function of the package's modules that ``tpu_rl.triggers`` loads, the standard library aside
#: (tests/unit/test_triggerer_imports.py reads them from the sources and keeps this list equal).
RUN_TIME_IMPORTS = (
    "aiohttp",
    "airflow.configuration",
    "airflow.providers.cncf.kubernetes.hooks.kubernetes",
    "airflow.providers.google.cloud.hooks.gcs",
    "airflow.providers.google.cloud.hooks.kubernetes_engine",
    "airflow.sdk.execution_time.task_runner",
    "asgiref.sync",
    "google.api_core",
    "google.api_core.exceptions",
    "google.cloud.container_v1",
    "google.cloud.storage.retry",
    "google.rpc.code_pb2",
    "google_crc32c",
    "kubernetes",
    "kubernetes.client",
    "kubernetes.client.exceptions",
    "kubernetes.dynamic",
    "kubernetes_asyncio.client",
    "urllib3.util.retry",
    "yaml",
)


def trigger_modules() -> list[str]:
    """Every module of ``tpu_rl.triggers``, then what they import when they run (:data:`RUN_TIME_IMPORTS`)."""
    from tpu_rl import triggers

    own = sorted(module.name for module in pkgutil.iter_modules(triggers.__path__, "tpu_rl.triggers."))
    return own + list(RUN_TIME_IMPORTS)


def import_all(modules: list[str]) -> tuple[list[str], list[dict[str, str]]]:
    """Imports each module: the ones imported, and each failure as its module and the exception. Slow (the
    Google provider takes seconds): call it in a thread, never on a triggerer's event loop."""
    imported, failed = [], []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # any exception a module raises while it loads: the module cannot be used
            failed.append({"module": name, "error": f"{type(error).__name__}: {error}"})
        else:
            imported.append(name)
    return imported, failed


class TriggererCheckTrigger(BaseTrigger):
    """Imports every trigger module of the package and what they import when they run, in a thread, then fires
    (not before ``hold_seconds``) with the triggerer's version of ``tpu_rl``, the deferring worker's, its host,
    the modules it imported and the ones it could not.

    :param sent_by: the version of the worker that deferred: the one the triggerer's must be.
    """

    def __init__(self, *, sent_by: str, hold_seconds: float = HOLD_SECONDS) -> None:
        super().__init__()
        self.sent_by = sent_by
        self.hold_seconds = hold_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "sent_by": self.sent_by,
            "hold_seconds": self.hold_seconds,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from tpu_rl import __version__

        loop = asyncio.get_running_loop()
        began = loop.time()
        self.log.info("tpu-rl %s in the triggerer (the worker that deferred runs %s)", __version__, self.sent_by)
        imported, failed = await in_thread(import_all, trigger_modules())
        for failure in failed:
            self.log.error("cannot import %s: %s", failure["module"], failure["error"])
        self.log.info("imported %d modules of the package's triggers: %s", len(imported), ", ".join(imported))
        await asyncio.sleep(max(0.0, self.hold_seconds - (loop.time() - began)))
        yield TriggerEvent(
            {
                "version": __version__,
                "deferred_by": self.sent_by,
                "host": socket.gethostname(),
                "imported": imported,
                "failed": failed,
            }
        )
