"""Prints how long each DAG file takes to parse, as the dag-processor does it, and which heavy modules
parsing pulls in. Goal: well under 1 s, with no Google or Kubernetes client imported at parse time.

Each measurement runs in a fresh interpreter that has already imported Airflow (the dag-processor has). The
programs file is parsed with the shipped example's two programs (TPU_RL_PROGRAMS).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAG_FILES = [REPO / "dags" / name for name in ("maxtext_rl_tpu.py", "maxtext_rl_tpu_programs.py")]
PROGRAMS = REPO / "include" / "examples" / "programs.yaml"
HEAVY = ("google.cloud", "kubernetes", "kubernetes_asyncio", "airflow.providers.google", "airflow.providers.cncf",
         "tensorboard")
RUNS = 5

PROBE = f"""
import json, sys, time
import airflow.sdk, airflow.providers.standard.operators.empty
from airflow.dag_processing.dagbag import DagBag
before = set(sys.modules)
start = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
elapsed = time.perf_counter() - start
new = set(sys.modules) - before
print(json.dumps({{"seconds": elapsed, "errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                  "dags": list(bag.dag_ids), "heavy": sorted(m for m in new if m.startswith({HEAVY!r}))}}))
"""


def measure(dag_file: Path) -> int:
    results = []
    env = {**os.environ, "TPU_RL_PROGRAMS": str(PROGRAMS)}
    for _ in range(RUNS):
        out = subprocess.run([sys.executable, "-c", PROBE, str(dag_file)], capture_output=True, text=True, env=env)
        if out.returncode:
            print(out.stderr[-3000:])
            return 1
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if results[0]["errors"]:
        print("import errors:", results[0]["errors"])
        return 1
    times = [r["seconds"] for r in results]
    print(f"DAG file: {dag_file.relative_to(REPO)} -> dags {results[0]['dags']}")
    print(f"  parse time over {RUNS} fresh interpreters: median {statistics.median(times):.3f} s, "
          f"min {min(times):.3f} s, max {max(times):.3f} s (goal < 1 s)")
    heavy = results[0]["heavy"]
    print(f"  heavy modules imported while parsing: {len(heavy)}" + (f" {heavy[:10]}" if heavy else ""))
    return 0


def main() -> int:
    return max(measure(dag_file) for dag_file in DAG_FILES)


if __name__ == "__main__":
    sys.exit(main())
