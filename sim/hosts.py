"""Lose and restore simulated hosts; what follows is done by the real controllers.

hosts.py lose NODE      delete the Node (the VM is gone). kube-controller-manager's pod GC then
                        marks each pod bound to it Failed with condition DisruptionTarget
                        (reason DeletionByPodGC) and deletes it: about 40-60 s later (its
                        orphan quarantine is 40 s, fixed). The Job counts a failure; a JobSet
                        restarts (failurePolicy) or fails. Replacement pods stay Pending
                        until the node is back.
hosts.py evict NODE     add the NoExecute taint sim.tpu-rl.dev/host-lost (a host going into
                        maintenance / unreachable): the taint-eviction controller deletes its pods
                        at once with DisruptionTarget (reason DeletionByTaintManager).
hosts.py restore        recreate the missing standard nodes (sim/nodes.py) and remove the
                        host-lost taint everywhere.
"""

import argparse
import os
from pathlib import Path

from . import nodes

LOST_TAINT = {"key": "sim.tpu-rl.dev/host-lost", "value": "true", "effect": "NoExecute"}


def core(kubeconfig):
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(kubeconfig))


def lose(api, name):
    api.delete_node(name)


def evict(api, name):
    taints = [t.to_dict() for t in (api.read_node(name).spec.taints or [])]
    taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
    if LOST_TAINT not in taints:
        api.patch_node(name, {"spec": {"taints": taints + [LOST_TAINT]}})


def restore(api, kubeconfig):
    nodes.ensure_nodes(kubeconfig)
    for node in api.list_node().items:
        taints = [{k: v for k, v in t.to_dict().items() if v is not None} for t in (node.spec.taints or [])]
        if LOST_TAINT in taints:
            api.patch_node(node.metadata.name, {"spec": {"taints": [t for t in taints if t != LOST_TAINT]}})


def main():
    sim = os.environ.get("SIM", str(Path(__file__).resolve().parent.parent / ".sim"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=os.path.join(sim, "kubeconfig"))
    parser.add_argument("action", choices=["lose", "evict", "restore"])
    parser.add_argument("node", nargs="?")
    args = parser.parse_args()
    api = core(args.kubeconfig)
    if args.action == "restore":
        restore(api, args.kubeconfig)
    elif not args.node:
        parser.error(f"{args.action} needs a NODE")
    else:
        {"lose": lose, "evict": evict}[args.action](api, args.node)
        print(f"{args.action}: {args.node}")


if __name__ == "__main__":
    main()
