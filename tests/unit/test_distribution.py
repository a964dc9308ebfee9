"""The package as it ships: the wheel every Airflow component installs. A trigger is imported by the
triggerer from its serialised classpath, in a process that has the installed distribution and nothing of
this repository (Cloud Composer 3 gives the triggerer no plugins folder)."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tpu_rl
from tpu_rl_testing import TRIGGER_IMPORT_PROBE, trigger_samples

REPO = Path(__file__).resolve().parents[2]


def _package_triggers() -> set[type]:
    from airflow.triggers.base import BaseTrigger

    found = set()
    for module in pkgutil.walk_packages(tpu_rl.__path__, "tpu_rl."):
        if module.name == "tpu_rl.run_view_app":  # the api-server's app; defines no trigger
            continue
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(cls, BaseTrigger) and cls.__module__.startswith("tpu_rl.") and not inspect.isabstract(cls):
                found.add(cls)
    return found


def test_every_trigger_and_output_check_of_the_package_has_a_sample_here():
    """A new trigger or output check must be added to the import check below."""
    from tpu_rl.output_checks import OutputCheck

    samples = trigger_samples()
    assert _package_triggers() == {type(trigger) for trigger in samples}
    assert set(OutputCheck.kinds.values()) == {type(t.check) for t in samples if hasattr(t, "check")}


def test_every_trigger_classpath_imports_in_a_fresh_interpreter_with_only_the_wheel(tmp_path):
    serialized = [trigger.serialize() for trigger in trigger_samples()]
    payload = json.dumps([[classpath, kwargs] for classpath, kwargs in serialized])

    out = subprocess.run(
        [sys.executable, "-I", "-c", TRIGGER_IMPORT_PROBE],
        input=payload,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )

    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen["files"]) == len(serialized)
    assert all("/site-packages/tpu_rl/" in file for file in seen["files"]), seen["files"]
    sources = [str(REPO / folder) for folder in ("src", "plugins", "dags", "tests", "")]
    assert not [entry for entry in seen["path"] if entry.rstrip("/") in sources], seen["path"]


def test_the_installed_package_is_the_wheel_of_this_checkout():
    """make venv installs dist/'s wheel; a source edit not rebuilt into it would test other code than ships."""
    from importlib.metadata import distribution

    installed = distribution("tpu-rl")
    assert installed.version == tpu_rl.__version__
    stale = []
    for record in installed.files:
        if record.parts[0] == "tpu_rl" and record.suffix in (".py", ".yaml", ".json"):
            source = REPO / "src" / Path(*record.parts)
            if not source.is_file() or source.read_bytes() != record.locate().read_bytes():
                stale.append(str(record))
    assert not stale, f"installed files differ from src/ (run make venv): {stale}"


def test_requirements_txt_pins_the_distributions_version():
    lines = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert lines == [f"tpu-rl=={tpu_rl.__version__}"]


@pytest.mark.parametrize(
    "entry_point, target",
    [
        ("airflow.plugins", "tpu_rl.run_view_plugin:TpuRlRunViewPlugin"),
        ("apache_airflow_provider", "tpu_rl.provider:get_provider_info"),
    ],
)
def test_the_wheel_registers_its_entry_points(entry_point, target):
    from importlib.metadata import entry_points

    assert target in [ep.value for ep in entry_points(group=entry_point) if ep.dist.name == "tpu-rl"]
