"""check_triggerer's trigger imports every module the package's triggers need when they run, off the event loop, and
reports the triggerer's version beside the one of the worker that deferred, driven here with asyncio alone."""

from __future__ import annotations

import ast
import asyncio
import sys
import threading
from pathlib import Path

import pytest

import tpu_rl
from tpu_rl.triggers import triggerer
from tpu_rl.triggers.triggerer import RUN_TIME_IMPORTS, TriggererCheckTrigger, trigger_modules

pytestmark = pytest.mark.core

SOURCES = Path(tpu_rl.__file__).parent.parent


def _source(module: str) -> Path | None:
    for path in (SOURCES / f"{module.replace('.', '/')}.py", SOURCES / module.replace(".", "/") / "__init__.py"):
        if path.exists():
            return path
    return None


def _imports(tree: ast.AST, in_function: bool = False) -> list[tuple[str, bool]]:
    """(module, inside a function) of each absolute import, ``if TYPE_CHECKING:`` blocks aside; a name imported
    ``from`` a package of tpu_rl that is one of its modules counts as that module; ``importlib.import_module("x")``
    counts as an import of x."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, in_function) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, in_function))
            own = node.module.split(".")[0] == "tpu_rl"  # another package's modules are not in SOURCES when it is src/
            found += [
                (f"{node.module}.{a.name}", in_function)
                for a in node.names
                if own and _source(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
            if isinstance(node.args[0], ast.Constant):
                found.append((node.args[0].value, True))
        found += _imports(node, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))
    return found


def _imports_at_run_time() -> set[str]:
    """Every import inside a function of the package's modules that the trigger modules load (following the
    package's own imports, at module level and inside functions), the standard library's aside."""
    todo, seen, lazy = [m for m in trigger_modules() if m.startswith("tpu_rl.")], set(), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name, in_function in _imports(ast.parse(_source(module).read_text())):
            if name.split(".")[0] == "tpu_rl":
                todo += [name] if _source(name) else []
            elif in_function and name.split(".")[0] not in sys.stdlib_module_names:
                lazy.add(name)
    return lazy


def test_the_list_of_run_time_imports_is_every_import_inside_a_function_of_what_the_triggers_load():
    """A new import inside a hook or a trigger function (the Google provider, a client) must be added to the list,
    or the check would not prove that the triggerer has it."""
    assert set(RUN_TIME_IMPORTS) == _imports_at_run_time()
    assert {"aiohttp", "airflow.providers.google.cloud.hooks.gcs", "kubernetes_asyncio.client"} <= set(RUN_TIME_IMPORTS)


def test_every_module_of_the_triggers_package_is_imported():
    modules = trigger_modules()
    assert {"tpu_rl.triggers.checkpoints", "tpu_rl.triggers.gke", "tpu_rl.triggers.jobset"} <= set(modules)
    own = {p.stem for p in (SOURCES / "tpu_rl" / "triggers").glob("*.py")} - {"__init__"}
    assert {m.removeprefix("tpu_rl.triggers.") for m in modules if m.startswith("tpu_rl.")} == own


def _first_event(trigger: TriggererCheckTrigger) -> dict:
    async def first():
        return (await anext(trigger.run())).payload

    return asyncio.run(first())


def test_the_trigger_imports_them_all_in_a_thread_and_reports_both_versions(monkeypatch):
    """The Google provider takes seconds to import: on the triggerer's event loop every trigger would wait."""
    threads = []
    real = triggerer.import_all

    def recorded(modules):
        threads.append(threading.get_ident())
        return real(modules)

    monkeypatch.setattr(triggerer, "import_all", recorded)
    event = _first_event(TriggererCheckTrigger(sent_by="2.4.0", hold_seconds=0))
    assert threads and threads[0] != threading.get_ident()  # asyncio.run's loop runs in this thread
    assert event["version"] == tpu_rl.__version__ and event["deferred_by"] == "2.4.0"
    assert event["imported"] == trigger_modules() and event["failed"] == []


def test_a_module_that_does_not_import_is_reported_with_its_error(monkeypatch):
    monkeypatch.setattr(triggerer, "RUN_TIME_IMPORTS", ("aiohttp", "tpu_rl_no_such_module"))
    event = _first_event(TriggererCheckTrigger(sent_by=tpu_rl.__version__, hold_seconds=0))
    assert event["failed"] == [
        {"module": "tpu_rl_no_such_module", "error": "ModuleNotFoundError: No module named 'tpu_rl_no_such_module'"}
    ]
    assert "aiohttp" in event["imported"]


def test_a_trigger_serialised_by_2_4_0_still_runs():
    """2.4.0 serialised ``sent_by`` and ``hold_seconds`` only: a triggerer of this version still builds and runs it."""
    event = _first_event(TriggererCheckTrigger(**{"sent_by": "2.4.0", "hold_seconds": 0.0}))
    assert event["deferred_by"] == "2.4.0"
