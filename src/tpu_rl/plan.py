"""``python -m tpu_rl.plan --conf FILE.json``: prints every Kubernetes object and GKE request a run with
those params would submit, as multi-document YAML, without contacting any cloud."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

import yaml

from tpu_rl import __version__, gke, manifests
from tpu_rl.config import ConfigError, RunConfig
from tpu_rl.hub_datasets import data_resolution
from tpu_rl.layout import GcsLayout
from tpu_rl.run import DAG_ID, RunIdentity
from tpu_rl.training_metrics import gate_resolution


def plan_documents(
    config: RunConfig, run: RunIdentity, now: datetime | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(comment, document) pairs in the order the DAG submits them; ``now`` (default: now) is when the
    cluster's upgrade exclusion starts."""
    now = now or datetime.now(UTC)
    layout = GcsLayout(config, run)
    docs: list[tuple[str, dict[str, Any]]] = []
    capacity = _capacity_comment(config)
    if config.creates_cluster:
        with_pools = f"; its TPU node pools' {capacity}" if config.tpu_pools_with_cluster else ""
        docs.append(
            (
                f"GKE: create the cluster (deleted at the end of the run){with_pools}",
                {
                    "gkeRequest": "CreateCluster",
                    "parent": gke.cluster_parent(config),
                    "cluster": gke.cluster_body(config, run, now),
                },
            )
        )
    if config.tpu_pools_per_run:
        for i in range(config.cluster_nodepool_count):
            docs.append(
                (
                    f"GKE: create TPU node pool {i} before training (deleted right after it); {capacity}",
                    {
                        "gkeRequest": "CreateNodePool",
                        "parent": gke.cluster_path(config),
                        "nodePool": gke.tpu_node_pool(config, run, i),
                    },
                )
            )
    docs.append(
        ("ServiceAccount of the workload pods (created when absent)", manifests.workload_service_account(config))
    )
    docs.append(
        (
            f"Secret: {manifests.HF_TOKEN_KEY} from Airflow connection '{config.hf_token_conn_id}' at run time "
            "(value never shown)",
            manifests.hf_token_secret(config, run),
        )
    )
    docs.append(
        (
            "HF -> MaxText conversion (skipped when its output is already complete)",
            manifests.hf_to_maxtext_jobset(config, run),
        )
    )
    docs.append(("RL training on Pathways", manifests.training_jobset(config, run)))
    docs.append(
        (
            f"MaxText -> HF export; the step is resolved from the final checkpoint at run time "
            f"(shown: the planned {config.train_steps})",
            manifests.maxtext_to_hf_jobset(config, run, config.train_steps, layout.export_attempt_prefix(1)),
        )
    )
    return docs


def _capacity_comment(config: RunConfig) -> str:
    """What the TPU pool requests shown (the first candidate's) set for their capacity."""
    first = config.candidates[0]
    capacity = f"capacity_type {first.capacity_type}: {gke.capacity_fields(config)}"
    if config.capacity_candidates:
        return f"candidate 0, {first.describe()}, {capacity}; the next candidates only when it fails"
    return capacity


def candidate_lines(config: RunConfig) -> list[str]:
    """Where the run's TPU pools may come from, in the order create_tpu_pools tries them, each with its price and
    wait and what its pool request sets; nothing for a run that creates no TPU pool."""
    if not config.tpu_pools_per_run and not config.tpu_pools_with_cluster:
        return []
    lines = ["Capacity candidates, tried in order (all the run's slices on one):"]
    for index, candidate in enumerate(config.candidates):
        price = candidate.price(config.tpu_price_per_chip_hour)
        lines.append(
            f"  {index}: {candidate.describe()}, ${price:.2f} per chip-hour, wait {candidate.wait_minutes} min: "
            f"{gke.capacity_fields(config, candidate)}"
        )
    if config.max_preemptions_per_candidate:
        lines.append(
            f"  after {config.max_preemptions_per_candidate} preemption(s) on a candidate, the resume moves to the next"
        )
    return lines


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated values out in full: anchors and aliases make a plan hard to review."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(config: RunConfig, run: RunIdentity, now: datetime | None = None) -> str:
    """The plan as YAML documents, each under its comment; ``now`` as in :func:`plan_documents`."""
    return "".join(
        f"---\n# {comment}\n{yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, width=1000)}"
        for comment, doc in plan_documents(config, run, now)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_rl.plan", description=__doc__)
    parser.add_argument("--conf", required=True, help="JSON file with the run's params (the trigger conf)")
    parser.add_argument("--run-id", default="plan", help="run id the names are derived from")
    parser.add_argument("--dag-id", default=DAG_ID)
    args = parser.parse_args(argv)
    with open(args.conf) as f:
        params = json.load(f)
    try:
        config = RunConfig.from_params(params)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"# tpu-rl {__version__}: what run {args.run_id!r} of {args.dag_id} would submit")
    if resolution := gate_resolution(config):
        print(f"# Quality gate: {resolution}")
    if resolution := data_resolution(config):
        print(f"# Training data: {resolution}")
    for line in candidate_lines(config):
        print(f"# {line}")
    sys.stdout.write(render(config, RunIdentity(args.dag_id, args.run_id)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
