"""The package's structure as docs/explanation/architecture.md states it: a pure core that loads without Airflow or a
cloud client (what the plan command and the DAG file's parse rely on), no import circle, short functions; the page's
list of the core and its place for every module are read from the page, so the page cannot drift from the code."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tpu_rl

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

PACKAGE = Path(tpu_rl.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "architecture.md"


def core_on_the_page() -> tuple[str, ...]:
    """The modules the page's "pure core" row names (params in, typed values and plain dicts out)."""
    row = next(line for line in ARCHITECTURE.read_text().splitlines() if line.startswith("| pure core |"))
    top_level = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    return tuple(sorted(set(re.findall(r"`([a-z_]+)`", row)) & top_level))


CORE = core_on_the_page()


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("tpu_rl", *path.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every package module a module imports: at the top, inside functions and for type checking alike."""
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            named |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
    return named & known


def test_the_core_loads_without_airflow_or_a_cloud_client():
    # An isolated interpreter, given the folder of the package these tests import (the installed wheel, or src/).
    probe = (
        f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); before = set(sys.modules); "
        + "; ".join(f"import tpu_rl.{name}" for name in CORE)
        + "; print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    assert "tpu_rl" in loaded
    assert loaded.isdisjoint({"airflow", "google", "kubernetes", "kubernetes_asyncio", "fastapi", "aiohttp"})


def test_no_module_of_the_package_imports_itself_back_through_others():
    found = modules()
    graph = {name: imports_of(path, set(found)) - {name, "tpu_rl"} for name, path in found.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start] - seen:
            seen.add(nxt)
            if nxt == goal or reaches(nxt, goal, seen):
                return True
        return False

    circles = sorted(name for name in graph if reaches(name, name, set()))
    assert circles == []


def test_the_core_imports_only_the_core():
    """A module the core imports is core too: else the plan command and the DAG file's parse load what the core
    row of the page does not promise."""
    found = modules()
    core = {f"tpu_rl.{name}" for name in CORE}
    outside = {
        f"{name} imports {imported}"
        for name in sorted(core)
        for imported in imports_of(found[name], set(found)) - {"tpu_rl"}
        if imported not in core
    }
    assert outside == set(), "name it in the pure core row of docs/explanation/architecture.md, or move the import"


def test_every_module_has_its_place_on_the_architecture_page():
    """Where new code goes is the page's job: a module it does not name has no layer."""
    page = ARCHITECTURE.read_text()
    unplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py":
            continue
        spelled = {relative.with_suffix("").as_posix(), relative.as_posix(), path.stem, path.name}
        if not any(f"`{name}`" in page for name in spelled):
            unplaced.append(relative.as_posix())
    assert unplaced == []


#: The checkout's Python beside the package, held to the same rules: the simulation, the tools, the benchmarks.
CHECKOUT = Path(__file__).resolve().parents[2]
BESIDE = ("sim", "scripts", "benchmarks")


def python_files() -> list[Path]:
    """The package's modules and the Python of the simulation, the tools and the benchmarks."""
    return [*modules().values(), *(p for folder in BESIDE for p in sorted((CHECKOUT / folder).rglob("*.py")))]


def test_no_function_is_longer_than_60_lines():
    long = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in python_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60
    ]
    assert long == []


def test_the_simulation_tools_and_benchmarks_are_packages_that_edit_no_import_path():
    """``sim``, ``scripts`` and ``benchmarks`` import each other as packages (``python -m sim.NAME``): a module
    put on ``sys.path`` by hand is imported twice under two names (``gke_faults`` and ``sim.gke_faults``), each
    with its own state. A module of the simulation stays under 700 lines: one job each."""
    assert all((CHECKOUT / folder / "__init__.py").is_file() for folder in BESIDE)
    edits = [
        f"{path.relative_to(CHECKOUT)}:{node.lineno}"
        for path in python_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys"
    ]
    assert edits == []
    big = [
        f"{p.name} ({n} lines)" for p in (CHECKOUT / "sim").glob("*.py") if (n := len(p.read_text().splitlines())) > 700
    ]
    assert big == []


def test_operators_sensors_and_triggers_reach_clouds_only_through_the_package_hooks():
    """Hooks call, operators decide: no operator, sensor or trigger module builds an API client or a provider's
    hook (a new call to GKE, Kubernetes or Cloud Storage becomes a hook method, with a public seam for tests)."""
    deciders = [
        p
        for name, p in modules().items()
        if name.startswith(("tpu_rl.operators.", "tpu_rl.sensors.", "tpu_rl.triggers."))
    ]
    built = []
    for path in deciders:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
                if name.endswith(("Client", "Api")) or (name.endswith("Hook") and not name.startswith(PACKAGE_HOOKS)):
                    built.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert deciders and built == []


def test_the_cluster_operators_and_the_gke_operations_base_know_no_capacity_candidate():
    """One module one job: bringing the TPU pools to a capacity candidate and moving them on is
    ``operators/tpu_pools.py``'s (``TpuPoolPass``). The cluster's operators and the base that awaits GKE's
    operations for both import neither the candidates, the failover rule nor the pools' module."""
    found = modules()
    pools = {"tpu_rl.candidates", "tpu_rl.failover", "tpu_rl.operators.tpu_pools"}
    knowing = {
        name: sorted(imports_of(found[name], set(found)) & pools)
        for name in ("tpu_rl.operators.cluster", "tpu_rl.operators.gke_operations")
    }
    assert knowing == {"tpu_rl.operators.cluster": [], "tpu_rl.operators.gke_operations": []}


def test_sync_work_leaves_the_event_loop_only_through_in_thread():
    """A sync call off a trigger's loop may ask the triggerer's supervisor (a connection, a task's state): sent from
    a plain thread, or cancelled once sent, it ends Airflow 3.1's trigger runner with every trigger of the triggerer
    (``tpu_rl.hooks.in_thread`` says how). So the package leaves the loop through that module alone."""
    leaving = ("to_thread", "run_in_executor", "sync_to_async")
    found = []
    for name, path in modules().items():
        if name == "tpu_rl.hooks.in_thread":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
                if called in leaving:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {called}")
    assert found == []


#: The hooks of the package (hooks/): what operators, sensors and triggers call.
PACKAGE_HOOKS = (
    "GkeApiHook",
    "AsyncGkeApiHook",
    "KubernetesApiHook",
    "AsyncKubernetesApiHook",
    "GcsBucketHook",
    "GcsReadHook",
)


def test_the_triggers_modules_import_no_cloud_client():
    """The triggerer imports a trigger's module on its event loop: a cloud client imported there stalls every
    trigger of that triggerer (the Google provider's GKE triggers took about 2 s). The package's triggers load
    their clients in a thread when they first need them."""
    probe = (
        "import sys; import airflow.triggers.base; before = set(sys.modules); "
        "import tpu_rl.triggers.gke, tpu_rl.triggers.jobset, tpu_rl.triggers.checkpoints, tpu_rl.triggers.triggerer; "
        "heavy = ('airflow.providers.google.cloud', 'google.cloud.container', 'google.cloud.storage', "
        "'kubernetes_asyncio', 'kubernetes.client', 'grpc'); "
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(heavy)))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_one_reader_of_the_services_times():
    """Kubernetes, GKE and Cloud Storage write RFC 3339 (``Z`` or an offset, up to nanoseconds); the package reads
    them in one place (``tpu_rl.timestamps``), not with a parser of its own per module."""
    from datetime import UTC, datetime, timedelta, timezone

    from tpu_rl.timestamps import parse_optional_time, parse_time, posix_time

    assert parse_time("2026-12-04T18:46:31.951334123Z") == datetime(2026, 12, 4, 18, 46, 31, 951334, tzinfo=UTC)
    assert parse_time("2026-12-04T20:46:31+02:00") == datetime(2026, 12, 4, 18, 46, 31, tzinfo=UTC)
    assert parse_time("2026-12-04T18:46:31.5").tzinfo == UTC  # no zone: UTC
    assert parse_time("2026-12-04T18:46:31+02:00").utcoffset() == timezone(timedelta(hours=2)).utcoffset(None)
    assert parse_optional_time("") is None and posix_time(None) is None
    assert posix_time("1970-01-01T00:01:00Z") == 60.0
    parsers = [
        path.relative_to(PACKAGE).as_posix()
        for path in modules().values()
        if "fromisoformat(" in path.read_text() and path.name != "timestamps.py"
    ]
    assert parsers == ["training_metrics.py"], parsers  # which reads back its own isoformat() strings
