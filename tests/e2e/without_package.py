"""Runs the Airflow CLI in an interpreter without the distribution tpu-rl: neither its module nor its
metadata (so no entry points), as Cloud Composer 3 runs its triggerer when the package was given to it only
in plugins/ (which that triggerer never gets). Usage: ``python tests/e2e/without_package.py triggerer``, in
the stack's environment. With ``--without MODULE`` first, the interpreter keeps the package and lacks only that
module (and its submodules), as a triggerer with the package and without one of its dependencies."""

from __future__ import annotations

import importlib.metadata
import sys
from importlib.abc import MetaPathFinder

import importlib_metadata


class _Absent(MetaPathFinder):
    def __init__(self, module: str) -> None:
        self.module = module

    def find_spec(self, name, path=None, target=None):
        if name == self.module or name.startswith(f"{self.module}."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _without_tpu_rl(distributions):
    def filtered(**kwargs):
        return (d for d in distributions(**kwargs) if d.metadata["Name"] != "tpu-rl")

    return filtered


if sys.argv[1:2] == ["--without"]:
    sys.meta_path.insert(0, _Absent(sys.argv[2]))
    del sys.argv[1:3]
else:
    sys.meta_path.insert(0, _Absent("tpu_rl"))
    for _module in (importlib.metadata, importlib_metadata):  # Airflow reads entry points through either
        _module.distributions = _without_tpu_rl(_module.distributions)
sys.path[:] = [entry for entry in sys.path if not entry.endswith("/tests/e2e")]  # the script's own folder

from airflow.__main__ import main  # noqa: E402

sys.exit(main())
