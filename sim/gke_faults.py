"""Capacity faults of the GKE emulator (sim/gke_emulator.py): rules in $SIM/gke/faults.json, read on each request.

A rule is a JSON object under its name:
  "kind"          "stockout": a matching node pool create is accepted and stays RUNNING while GKE retries
                  (TPU_RL_SIM_GKE_STOCKOUT_SECONDS: GKE's ~35 minutes, time-scaled), nothing said in the pool
                  meanwhile; then its operation ends DONE with error RESOURCE_EXHAUSTED and GKE's [GCE_STOCKOUT] text,
                  the pool in ERROR with no nodes, or, with "nodes" N > 0, in RUNNING_WITH_ERROR with N of its nodes
                  (a partial create); a pool of a cluster's own create request (CreateCluster's node_pools) is
                  matched too, and fails the cluster's create: its operation ends the same way, the cluster in ERROR
                  until it is deleted (sim/gke_project.py, Project._cluster_stockout);
                  "quota": a matching node pool create is refused at once with 403 PERMISSION_DENIED,
                  "Insufficient regional quota to satisfy request" for the TPU family's quota;
                  "reservation-missing": a matching node pool create is refused at once with NOT_FOUND
                  'Google Compute Engine: reservation "R" not found for node pool "P" at zone "Z".'
                  "capacity-held": a matching pool's capacity comes only "seconds" after its create: the create
                  operation stays RUNNING, the pool PROVISIONING with no condition (no source shows GKE filling
                  one during a create), then its nodes appear; a flex-start pool's create is done at once and
                  its nodes (the slice the autoscaler would add) appear after "seconds"
                  "slow-create": a matching node pool create takes "seconds" and the pool shows ERROR in the middle
                  third of it, while its operation still runs, then RUNNING with all its nodes, the operation DONE
                  without error: a slow create GKE recovers (NVIDIA/aicr 2065: a pool create of about 35 minutes
                  that "briefly reported ERROR; GKE recovered it", past Terraform's 30-minute create timeout)
                  "slow-reply": a matching node pool create is applied (the pool PROVISIONING, its operation
                  RUNNING) and its reply sent only "seconds" later: the caller may die before it has it, as a
                  worker lost in the middle of the request (its retry must find the pool and wait on the
                  operation, not create it again)
                  "cluster-error": a matching cluster's create ends DONE with error 13 (INTERNAL) "Failed to create
                  cluster", the cluster left in ERROR without a control plane, as GKE leaves one whose create failed:
                  GKE does not repair it, it must be deleted (terraform-provider-google #2816; magic-modules #8978,
                  which taints such a cluster so that the next apply deletes and re-creates it)
                  "throttle": a matching request that changes a cluster or a pool (create, delete) is refused at once
                  with 429 RESOURCE_EXHAUSTED for the project's API requests a minute (GKE "Quotas and limits": 3000);
                  it clears by waiting (GKE's other 429, a cluster's concurrent operations beyond 5, the emulator
                  answers by itself)
                  "upgrade": GKE starts its own patch upgrade of a matching cluster's control plane (operation
                  UPGRADE_MASTER, the cluster RECONCILING, "seconds" long) just before a matching request that changes
                  the cluster or a pool, which GKE then refuses with FAILED_PRECONDITION "Operation ... is currently
                  upgrading cluster C" (terraform-provider-google 3650), as every such request until it is done
                  "unavailable": a matching request (a create or delete of a cluster or a pool, a read of a cluster,
                  a pool or an operation) is answered UNAVAILABLE (503), as a front end that lost its backend is;
                  the same request made again may pass
                  "kube-unavailable": a new connection to a matching cluster's DNS-based endpoint (sim/gke_dns.py) is
                  answered 503 ServiceUnavailable by the front end before the control plane, as Google's front end
                  answers when its backend is away (a control-plane replica restarting in an upgrade or a repair)
                  "kube-reset": a new connection to a matching cluster's DNS-based endpoint is closed after its first
                  request without an answer (a reset connection); client-go makes both requests again
                  (k8s.io/client-go rest/with_retry.go), as the package's hooks do
  "seconds"       for capacity-held: how long the capacity is held back; for slow-create: how long the create takes;
                  for slow-reply: how late the reply is; for upgrade: how long the upgrade runs
  "nodes"         for stockout: how many of the pool's nodes GKE created before it ran out (default 0)
  "pool_prefix"   the node pool's name starts with it (absent: any pool)
  "machine_type"  the pool's machine type equals it (absent: any)
  "cluster"       the pool's cluster (for cluster-error, kube-unavailable, kube-reset: the cluster) is named so
                  (absent: any)
  "zone"          the pool's zone (its first location, else the cluster's) is this one (absent: any): a stockout
                  of one zone while another has capacity
  "capacity_type" the pool's capacity type is this one (absent: any): on_demand, spot, flex_start or reservation,
                  read from the request as sim/gke_rules.py capacity_type_of does: a zone stocked out on demand
                  while its Spot capacity is there, quota missing for Spot only
  "region"        the pool's cluster is in this region (absent: any): Compute Engine's TPU quota is regional
                  (GKE answers "Insufficient regional quota ... available in region R"), so a quota rule of one
                  region leaves another region's creates alone
  "times"         how many matching creates it applies to (absent: no limit); "applied" counts them

CLI:
  gke_faults.py set NAME --kind KIND (one of the kinds above)
                [--pool-prefix P] [--machine-type M] [--cluster C] [--times N] [--seconds S] [--nodes N]
                [--zone Z] [--capacity-type T] [--region R]
  gke_faults.py list
  gke_faults.py clear [NAME]
"""

import argparse
import json
import os
from pathlib import Path

from .fault_rules import clear_rules, list_rules, put_rule, take_first

SIM = Path(os.environ.get("SIM") or os.environ.get("TPU_RL_SIM_DIR") or Path(__file__).resolve().parent.parent / ".sim")
KINDS = (
    "stockout",
    "reservation-missing",
    "capacity-held",
    "slow-create",
    "quota",
    "slow-reply",
    "cluster-error",
    "throttle",
    "upgrade",
    "unavailable",
    "kube-unavailable",
    "kube-reset",
)
#: The capacity types a rule may match (sim/gke_rules.py capacity_type_of).
CAPACITY_TYPES = ("on_demand", "spot", "flex_start", "reservation")
#: The kinds that last "seconds".
TIMED_KINDS = ("capacity-held", "slow-create", "slow-reply", "upgrade")


def path() -> Path:
    return SIM / "gke" / "faults.json"


def set_fault(
    name,
    kind,
    pool_prefix=None,
    machine_type=None,
    times=None,
    seconds=None,
    nodes=None,
    cluster=None,
    zone=None,
    capacity_type=None,
    region=None,
):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    if (kind in TIMED_KINDS) != (seconds is not None):
        raise ValueError(f"seconds is required by {', '.join(TIMED_KINDS)}, and only by them")
    if nodes is not None and kind != "stockout":
        raise ValueError("nodes is for stockout only")
    return put_rule(
        path(),
        name,
        kind,
        pool_prefix=pool_prefix,
        machine_type=machine_type,
        times=times,
        seconds=seconds,
        nodes=nodes,
        cluster=cluster,
        zone=zone,
        capacity_type=capacity_type,
        region=region,
    )


def list_faults():
    return list_rules(path())


def clear_faults(name=None):
    clear_rules(path(), name)


def take(kind, pool_name, machine_type, cluster="", zone="", capacity_type="", region=""):
    """The name of the first rule of `kind` matching the pool that has uses left; counts the use. None if none."""

    def matches(rule):
        return (
            rule.get("kind") == kind
            and (not rule.get("pool_prefix") or pool_name.startswith(rule["pool_prefix"]))
            and (not rule.get("machine_type") or rule["machine_type"] == machine_type)
            and (not rule.get("cluster") or rule["cluster"] == cluster)
            and (not rule.get("zone") or rule["zone"] == zone)
            and (not rule.get("capacity_type") or rule["capacity_type"] == capacity_type)
            and (not rule.get("region") or rule["region"] == region)
        )

    taken = take_first(path(), matches)
    return taken[0] if taken else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("set")
    s.add_argument("name")
    s.add_argument("--kind", required=True, choices=KINDS)
    s.add_argument("--pool-prefix")
    s.add_argument("--machine-type")
    s.add_argument("--times", type=int)
    s.add_argument("--seconds", type=float)
    s.add_argument("--nodes", type=int)
    s.add_argument("--cluster")
    s.add_argument("--zone")
    s.add_argument("--capacity-type", choices=CAPACITY_TYPES)
    s.add_argument("--region")
    sub.add_parser("list")
    c = sub.add_parser("clear")
    c.add_argument("name", nargs="?")
    args = parser.parse_args()
    if args.cmd == "set":
        print(
            json.dumps(
                {
                    args.name: set_fault(
                        args.name,
                        args.kind,
                        args.pool_prefix,
                        args.machine_type,
                        args.times,
                        args.seconds,
                        args.nodes,
                        args.cluster,
                        args.zone,
                        args.capacity_type,
                        args.region,
                    )
                }
            )
        )
    elif args.cmd == "list":
        print(json.dumps(list_faults(), indent=1, sort_keys=True))
    else:
        clear_faults(args.name)


if __name__ == "__main__":
    main()
