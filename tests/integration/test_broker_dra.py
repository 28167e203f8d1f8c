"""The GPU broker under a DRA preset, on Kubernetes' own control plane (issue 16, through the
broker).

The hub and broker of test_broker_kubernetes.py, on NVIDIA's DRA driver's ResourceSlices as the
simulated nodes publish them (four nodes, an 80 GiB A100 each, the fourth split into MIG
devices), with ``dra_fallbacks`` MIG then MPS; the real kube-scheduler allocates the claims and
the real garbage collector deletes them with their pods. Alice's server holds nothing of the
cluster: the broker builds each kernel pod's ResourceClaim with the embedded provisioner's
builder, creates it with the pod (owned by it), admits by the DRA pool and passes the
scheduler's words about a claim it cannot allocate on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.backends.kubernetes.objects.manifests import claim_name

from ..cluster import RESOURCE_CLAIMS, ControlPlane, dra_nodes, nvidia_driver
from ..support.polling import wait_until
from ..support.servers import execute
from .conftest import module_kube
from .test_broker_kubernetes import (
    Setup,
    call,
    hub_and_broker,
    server_of,
    single_user_processes,
    user_token,
)
from .test_kubernetes_dra import cordon

pytestmark = pytest.mark.integration

GENEROUS = 120  # seconds: what a busy 2-core machine may take for a pod, a claim or a deletion
KERNELSPECS = {
    "gpu-20g-mig": {"gpu_memory": "20G", "gpu_mode": "mig"},
    "gpu-200g-exclusive": {"gpu_memory": "200G", "gpu_mode": "exclusive"},
}


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, kube_namespace: str
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("broker-dra")
    driver = nvidia_driver()
    broker_settings = {"dra_fallbacks": ["mig", "mps"]}
    with (
        module_kube(control_plane, kube_namespace, root / "cluster", dra_nodes(), driver=driver) as cluster,
        hub_and_broker(root, cluster, KERNELSPECS, "nvidia-dra", broker_settings) as made,
    ):
        yield made


def claims(setup: Setup) -> list[dict[str, Any]]:
    return setup.cluster.objects(RESOURCE_CLAIMS)


def settled(setup: Setup, kernel_id: str, words: str) -> dict[str, Any]:
    """Alice's kernel once it runs and its view says ``words`` (the claim's allocation reaches
    the view after the pod runs: the scheduler's word comes first)."""
    answer = wait_until(
        lambda: call(setup, "alice", "GET", f"kernels/{kernel_id}"),
        GENEROUS,
        message=f"kernel {kernel_id} running, its view ending in {words!r}",
        until=lambda got: got[0] == 200 and got[1]["state"] == "running" and got[1]["detail"].endswith(words),
    )
    return dict(answer[1])


def nothing_left(setup: Setup) -> bool:
    cluster = setup.cluster
    return cluster.pods() == [] and cluster.secrets() == [] and claims(setup) == []


def test_a_kernel_starts_through_the_brokers_claim_resizes_into_a_new_one_and_leaves_none(
    setup: Setup,
) -> None:
    # kube-scheduler 1.34 does not prefer the node where the first firstAvailable entry fits
    # (docs/dra.md, "Fallbacks"): with the full GPUs' nodes open, the claim may get an MPS share
    # while the MIG device sits free. The MIG node alone takes the first kernel.
    full_gpus = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    cordon(setup.cluster, full_gpus)
    try:
        answer = call(setup, "alice", "POST", "kernels", {"name": "gpu-20g-mig"})
        assert answer[0] in (201, 202), (answer, setup.log()[-3000:])
        kernel_id = answer[1]["kernel_id"]
        view = settled(setup, kernel_id, "the claim got mig")
    finally:
        cordon(setup.cluster, full_gpus, unschedulable=False)
    # The broker made the claim with the pod, owned by it, and the scheduler allocated it.
    [pod] = setup.cluster.pods()
    [claim] = claims(setup)
    assert claim["metadata"]["name"] == claim_name(kernel_id, 0)
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim_name(kernel_id, 0)}]
    assert [(ref["kind"], ref["uid"]) for ref in claim["metadata"]["ownerReferences"]] == [
        ("Pod", pod["metadata"]["uid"])
    ]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/mig" and result["pool"] == pod["spec"]["nodeName"] == "gpu-node-4"
    assert view["mode"] == "mig", view
    # The server holds no cluster credentials.
    [process] = single_user_processes(setup, "alice")
    environ = process.environ()
    assert not [name for name in environ if name.startswith("KUBE")], environ
    assert not (Path(environ["HOME"]) / ".kube").exists()
    out, _ = asyncio.run(execute(server_of(setup, "alice"), kernel_id, "print(6 * 7)"))
    assert out.strip() == "42"

    # The only 3g.40gb MIG device is taken: a second such kernel falls back to an MPS share, and
    # is told so, as in the embedded case.
    second_start = call(setup, "alice", "POST", "kernels", {"name": "gpu-20g-mig"})
    assert second_start[0] in (201, 202), second_start
    other = second_start[1]["kernel_id"]
    fallen_back = settled(setup, other, "the claim got mps")
    assert fallen_back["mode"] == "mps", fallen_back
    token = user_token(setup, "alice")
    assert setup.hub.call("DELETE", f"/user/alice/api/kernels/{other}", token=token)[0] == 204
    wait_until(lambda: len(claims(setup)) == 1, timeout=GENEROUS)

    # Resize by restart through the broker: a new pod with a claim of its own name.
    resized = call(setup, "alice", "PATCH", f"kernels/{kernel_id}", {"gpu_memory": "12G", "restart": True})
    assert resized[0] == 200, resized
    # The first claim went with its pod (the broker deleted it with the pod).
    [second] = wait_until(lambda: claims(setup) if len(claims(setup)) == 1 else None, timeout=GENEROUS)
    assert second["metadata"]["name"] == claim_name(kernel_id, 1)
    assert second["metadata"]["uid"] != claim["metadata"]["uid"]
    code = "import os; print(os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])"
    out, _ = asyncio.run(execute(server_of(setup, "alice"), kernel_id, code))
    assert out.strip() == str(12 * 1024**3)

    # Shutdown leaves no pod, Secret or claim.
    deleted = setup.hub.call("DELETE", f"/user/alice/api/kernels/{kernel_id}", token=token)
    assert deleted[0] == 204, deleted
    wait_until(lambda: nothing_left(setup), timeout=GENEROUS)


def test_an_unsatisfiable_claim_fails_the_start_with_the_schedulers_reason(setup: Setup) -> None:
    answer = call(setup, "alice", "POST", "kernels", {"name": "gpu-200g-exclusive"})
    if answer[0] in (201, 202):  # admitted (no byte size to judge): the scheduler has the word
        kernel_id = answer[1]["kernel_id"]
        answer = wait_until(
            lambda: (lambda got: got if got[0] != 200 else None)(
                call(setup, "alice", "GET", f"kernels/{kernel_id}")
            ),
            timeout=GENEROUS,
        )
    status, body = answer
    assert status == 409, answer
    message = body["message"]
    assert "0/4 nodes are available: 4 cannot allocate all claims." in message, message
    assert 'quantity("200Gi")' in message, message  # what the claim asked for
    wait_until(lambda: nothing_left(setup), timeout=GENEROUS)
