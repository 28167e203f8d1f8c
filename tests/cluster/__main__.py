"""``make cluster``: the test cluster in the foreground, until Ctrl-C or SIGTERM.

Kubernetes' own control plane and four simulated 80 GiB GPU nodes advertising the NVIDIA device
plugin's ``nvidia.com/gpu`` and publishing NVIDIA's DRA driver's ResourceSlices; the
administrator's kubeconfig in ``build/cluster/kubeconfig``. Kernel pods on the simulated nodes
run as local processes of this one (with this Python), so a Jupyter server of this checkout can
start them. Beside them, one real node (``real-node``: Kubernetes' kubelet on containerd and
runc, real_node.py; root, Linux and Debian's containerd, runc, CNI plugins and umoci), whose
pods run in containers; ``--no-real-node`` leaves it out, ``--real-node-label KEY=VALUE`` labels it.
``--kueue`` adds Kueue (kueue.py, built first when missing) with a ResourceFlavor, a ClusterQueue
``gpu`` holding the nodes' ``nvidia.com/gpu`` as quota, and a LocalQueue ``gpu`` in ``default``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from .build import REPOSITORY, find
from .controlplane import ControlPlane
from .dra_devices import hami_driver, nvidia_driver
from .kueue import QUEUE_LABEL, Kueue, gpu_queues
from .kueue import build as build_kueue
from .node_side import NodeSide
from .nodes import aliyun_nodes, device_plugin_nodes, dra_nodes, hami_nodes, kai_nodes, volcano_nodes
from .real_node import DEVICE_PLUGINS, NODE_IP, RealNode

NODE_KINDS = {
    "nvidia": device_plugin_nodes,
    "hami": hami_nodes,
    "volcano": volcano_nodes,
    "kai": kai_nodes,
    "aliyun": aliyun_nodes,
    "dra-only": dra_nodes,
}
DRIVERS = {"nvidia": nvidia_driver, "hami": hami_driver, "none": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--directory", type=Path, default=REPOSITORY / "build" / "cluster")
    parser.add_argument(
        "--nodes", choices=sorted(NODE_KINDS), default="nvidia", help="what the nodes advertise"
    )
    parser.add_argument("--count", type=int, default=4, help="how many nodes (default 4)")
    parser.add_argument("--dra", choices=sorted(DRIVERS), default="nvidia", help="the DRA driver's slices")
    parser.add_argument("--port", type=int, default=0, help="the API server's port (default: a free one)")
    parser.add_argument("--kubernetes", choices=["oldest", "newest"], default="oldest")
    parser.add_argument(
        "--real-node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one real node (kubelet, containerd, runc) beside the simulated ones (default: yes)",
    )
    parser.add_argument(
        "--real-node-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the real node's own (repeatable), e.g. one a device plugin's GFD would set",
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="Kueue with a ClusterQueue and a LocalQueue 'gpu' (in default) holding the nodes' GPUs",
    )
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    labels = dict(label.split("=", 1) for label in args.real_node_label if "=" in label)
    if len(labels) != len(args.real_node_label):
        parser.error("--real-node-label takes KEY=VALUE")

    kueue_binary = build_kueue() if args.kueue else None  # before the cluster: a cold build takes minutes
    started = time.monotonic()
    state = args.directory / "state"
    shutil.rmtree(state, ignore_errors=True)  # a fresh cluster each time
    kubeconfig = args.directory / "kubeconfig"
    plane = ControlPlane(state, find(args.kubernetes), port=args.port, progress=print)
    make_driver = DRIVERS[args.dra]
    driver = make_driver(args.count) if make_driver else None  # type: ignore[operator]
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    nodes = NODE_KINDS[args.nodes](args.count)
    with contextlib.ExitStack() as stack:
        stack.enter_context(plane)
        queued = ""
        if kueue_binary is not None:
            # Before the nodes: pods the node side makes go through Kueue's webhook from the start.
            stack.enter_context(
                Kueue(plane, args.directory / "kueue", binary=kueue_binary, progress=print, visibility=True)
            )
            for manifest in gpu_queues("default", gpus=args.count):
                plane.admin.apply(manifest)
            queued = (
                f"  Kueue: LocalQueue gpu in default, ClusterQueue gpu holding {args.count} nvidia.com/gpu;"
                f" label a pod {QUEUE_LABEL}=gpu\n"
            )
        stack.enter_context(NodeSide(plane, nodes, args.directory / "nodes", driver=driver))
        real = ""
        if args.real_node:
            workdir = args.directory / "real-node"  # beside state: a killed run's is cleared up by the next
            node = stack.enter_context(RealNode(plane, workdir, labels=labels, progress=print))
            real = (
                f"  The real node {node.name} ({NODE_IP}; device plugins register in {DEVICE_PLUGINS};"
                f" images: {node.busybox.ref}, or import an OCI archive with\n"
                f"    ctr --address {node.socket} -n k8s.io images import --base-name NAME ARCHIVE.tar)\n"
            )
        shutil.copyfile(plane.admin_kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        print(
            f"\nThe cluster is up after {time.monotonic() - started:.0f} s: Kubernetes {plane.version},"
            f" {args.count} simulated GPU nodes ({args.nodes} device plugin"
            f"{'' if driver is None else f', {args.dra} DRA driver'})"
            f"{', one real node' if args.real_node else ''}{', Kueue' if queued else ''}.\n"
            f"  export KUBECONFIG={kubeconfig}\n"
            f"  kubectl of the same version: {plane.binary} kubectl get nodes\n"
            "  Point a Jupyter server at it (kernel pods run as processes of this command):\n"
            f"    KUBECONFIG={kubeconfig} .venv/bin/jupyter lab --GPUShare.backend=kubernetes \\\n"
            "      --GPUShare.namespace=default --GPUShare.resource_preset=nvidia-dra\n"
            f"{real}{queued}"
            "  Ctrl-C stops everything.",
            flush=True,
        )
        stop.wait()
        print("stopping the cluster…", flush=True)
    kubeconfig.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
