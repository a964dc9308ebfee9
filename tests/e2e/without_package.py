"""Runs the Airflow CLI in an interpreter that cannot import ``tpu_rl``: an Airflow component as Cloud
Composer 3 runs its triggerer when the package was given to it only in plugins/ (which that triggerer never
gets). Usage: ``python tests/e2e/without_package.py triggerer``, in the stack's environment."""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class _Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tpu_rl" or name.startswith("tpu_rl."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Absent())
sys.path[:] = [entry for entry in sys.path if not entry.endswith("/tests/e2e")]  # the script's own folder

from airflow.__main__ import main  # noqa: E402

sys.exit(main())
