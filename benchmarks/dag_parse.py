"""Prints how long each DAG file takes to parse, as the dag-processor does it, and which heavy modules
parsing pulls in. Goals: the pipeline file under 0.2 s, 20 programs under 1 s, 100 under 4 s, with no Google or
Kubernetes client imported at parse time.

Each measurement runs in a fresh interpreter that has already imported Airflow (the dag-processor has). The
programs file is parsed with the shipped example's two programs, then with generated ones: copies of the
example's daily program, each with its own cluster name and one of four capacity groups.

    python benchmarks/dag_parse.py [--programs 20 100] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PIPELINE = REPO / "dags" / "maxtext_rl_tpu.py"
PROGRAMS_DAG = REPO / "dags" / "maxtext_rl_tpu_programs.py"
EXAMPLE = REPO / "include" / "examples" / "programs.yaml"
HEAVY = (
    "google.cloud",
    "kubernetes",
    "kubernetes_asyncio",
    "airflow.providers.google",
    "airflow.providers.cncf",
    "tensorboard",
    "fastapi",
)

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
                  "dags": len(bag.dag_ids), "heavy": sorted(m for m in new if m.startswith({HEAVY!r}))}}))
"""


def generated_programs(count: int, folder: Path) -> Path:
    """``count`` copies of the example's daily program, each its own DAG, cluster and one of four groups."""
    daily = yaml.safe_load(EXAMPLE.read_text())["programs"]["maxtext_rl_tpu_daily"]
    programs = {}
    for index in range(count):
        program = {
            **daily,
            "capacity": {"group": f"v6e-64-group-{index % 4}", "slices": 1},
            "params": {**daily["params"], "cluster_name": f"tpu-rl-program-{index}"},
        }
        programs[f"maxtext_rl_tpu_program_{index}"] = program
    path = folder / f"programs-{count}.yaml"
    path.write_text(yaml.safe_dump({"programs": programs}))
    return path


def measure(label: str, dag_file: Path, programs: Path | None, runs: int, per_dag: int = 0) -> bool:
    results = []
    env = {**os.environ, "TPU_RL_PROGRAMS": str(programs or EXAMPLE)}
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", PROBE, str(dag_file)], capture_output=True, text=True, env=env)
        if out.returncode:
            print(out.stderr[-3000:])
            return False
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if results[0]["errors"]:
        print(f"{label}: import errors: {results[0]['errors']}")
        return False
    times = [r["seconds"] for r in results]
    median = statistics.median(times)
    per = f", {median / per_dag * 1000:.0f} ms per program" if per_dag else ""
    heavy = results[0]["heavy"]
    print(
        f"{label}: {results[0]['dags']} DAGs, median {median:.3f} s over {runs} fresh interpreters "
        f"(min {min(times):.3f}, max {max(times):.3f}){per}; heavy modules imported: {len(heavy)}"
        + (f" {heavy[:10]}" if heavy else "")
    )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, nargs="*", default=[20, 100], help="generated program counts")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    ok = measure(f"{PIPELINE.relative_to(REPO)}", PIPELINE, None, args.runs)
    ok &= measure(f"{PROGRAMS_DAG.relative_to(REPO)}, the example's programs", PROGRAMS_DAG, EXAMPLE, args.runs, 2)
    with tempfile.TemporaryDirectory() as folder:
        for count in args.programs:
            ok &= measure(
                f"{PROGRAMS_DAG.relative_to(REPO)}, {count} programs",
                PROGRAMS_DAG,
                generated_programs(count, Path(folder)),
                args.runs,
                count,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
