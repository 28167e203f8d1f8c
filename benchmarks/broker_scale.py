"""The GPU broker at cluster scale, on Kubernetes' own control plane: 500 nodes, 2,000 kernel pods.

Method
------
The test cluster (``tests/cluster/``: kube-apiserver, kube-scheduler, kube-controller-manager
from Kubernetes' own code) is started by this script with an audit log of the Jupyter server's
ServiceAccount (the identity the broker acts as), counted as ``broker_cluster.py`` counts it.
Its nodes are of two kinds: a few simulated HAMi nodes whose kubelets run the pods the real
scheduler binds to them (enough vGPUs for the concurrent starts), and Node objects with the same
GPU resources and labels but no kubelet behind them, tainted so that nothing is placed there —
they are what the broker's list+watch of nodes carries, as a large cluster's are. Together: 500.

1. **Watches open.** Watch requests the API server saw from the broker from its start to the end.
2. **200 concurrent starts.** 200 kernel pod starts posted to the broker at the same instant (the
   pod runs ``sleep``): admission (``POST pods`` until the broker reports the pod created) p50 and
   p99; the time from the first start posted to the 200th pod running; non-watch API requests per
   start.
3. **2,000 kernel pods.** The broker's RSS with no kernel, then with 2,000 kernel pods in the
   namespace — the 200 started above and 1,800 more created for a scheduler the cluster does not
   run (they stay pending, as queued kernels do) — once its watch shows them all; and how long
   ``GET pool`` and ``GET kernels`` take then.

Run: ``.venv/bin/python benchmarks/broker_scale.py`` (needs the ``test`` extra and the control
plane binary: ``make controlplane``); ``--quick`` runs 50 nodes, 20 concurrent starts and 200
kernel pods (CI size, well under a minute of its own).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker_cluster import (
    NAMESPACE,
    add_pending_pods,
    audited_plane,
    broker_env,
    percentile,
    rss_mib,
    start_broker,
    start_pods,
)

from tests.cluster import KubeCluster, Namespace, hami_nodes
from tests.cluster.nodes import SimNode
from tests.cluster.rest import NODES

VGPUS_PER_NODE = 10  # what a simulated HAMi node advertises per card (one card each)
PHANTOM_TAINT = {"key": "gpushare.bench/no-kubelet", "value": "true", "effect": "NoSchedule"}


def phantom_nodes(count: int) -> list[dict[str, Any]]:
    """Node objects as HAMi nodes register, without a kubelet behind them, tainted so the
    scheduler places nothing there."""
    template = hami_nodes(1)[0]
    nodes = []
    for index in range(count):
        manifest = SimNode(f"idle-node-{index:04d}", template.allocatable, template.labels).manifest()
        manifest["spec"]["taints"] = [PHANTOM_TAINT]
        nodes.append(manifest)
    return nodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: 50 nodes, 20 starts, 200 pods")
    parser.add_argument("--nodes", type=int, help="nodes in all (default 500; quick: 50)")
    parser.add_argument("--starts", type=int, help="concurrent starts (default 200; quick: 20)")
    parser.add_argument("--kernels", type=int, help="kernel pods in all (default 2000; quick: 200)")
    arguments = parser.parse_args()
    total_nodes = arguments.nodes or (50 if arguments.quick else 500)
    starts = arguments.starts or (20 if arguments.quick else 200)
    kernels = max(arguments.kernels or (200 if arguments.quick else 2000), starts)
    running_nodes = math.ceil(starts / VGPUS_PER_NODE)
    began = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="gpushare-broker-scale-") as directory:
        root = Path(directory)
        plane, audit = audited_plane(root)
        with (
            plane,
            KubeCluster(
                plane, Namespace(plane, NAMESPACE).create().name, root / "cluster", hami_nodes(running_nodes)
            ) as cluster,
        ):
            for manifest in phantom_nodes(max(0, total_nodes - running_nodes)):
                cluster.admin.create(NODES, manifest)
            env = broker_env(root, cluster.kubeconfig)
            (root / "config").mkdir()
            # No server asks after these kernels (a server would, every few seconds): the broker
            # must not collect them as orphans while they are measured.
            limits = {"GPUShareBroker": {"max_connections_per_user": 4 * starts, "orphan_grace": 3600}}
            (root / "config" / "jupyter_server_config.json").write_text(json.dumps(limits))
            audit.clear()
            broker_began = audit.offset  # the audit log from here on is the broker's
            broker, client = start_broker(root, env)
            try:
                nodes_seen = len(client.call("GET", "pool")["devices"])
                base = rss_mib(broker.pid)
                print(
                    f"cluster: {total_nodes} nodes ({running_nodes} with a simulated kubelet), "
                    f"the broker's pool shows {nodes_seen}; broker RSS {base:.0f} MiB"
                )
                audit.clear()
                admitted, _, first_to_last = start_pods(client, starts, "scale", poll=0.05)
                counted = audit.counts()
                per_start = sum(n for (verb, _), n in counted.items() if verb != "watch") / starts
                print(f"{starts} concurrent starts through the broker:")
                print(
                    f"  admission (POST -> pod created): p50 {statistics.median(admitted) * 1000:.0f} ms, "
                    f"p99 {percentile(admitted, 0.99) * 1000:.0f} ms"
                )
                print(f"  first start posted -> {starts}th pod running: {first_to_last:.1f} s")
                breakdown = {f"{verb} {resource}": n for (verb, resource), n in sorted(counted.items())}
                print(f"  API requests per start: {per_start:.2f} {json.dumps(breakdown)}")
                listing, took = add_pending_pods(cluster, client, kernels - starts, kernels)
                after = rss_mib(broker.pid)
                print(
                    f"{len(listing)} kernel pods: broker RSS {after:.0f} MiB "
                    f"(+{after - base:.0f} MiB, ratio {after / base:.2f} of its own); "
                    f"GET pool + kernels {took * 1000:.0f} ms"
                )
                # Every watch the broker opened, from its start (relists included) to now.
                audit.offset = broker_began
                print(f"watches the broker opened in all (relists included): {audit.watches()}")
            finally:
                broker.terminate()
                broker.wait(timeout=30)
    print(f"took {time.monotonic() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
