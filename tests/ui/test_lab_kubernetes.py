"""The GPU panel of a ``jupyter lab`` on the Kubernetes backend, in Chromium.

The server talks to the test cluster (tests/cluster/: Kubernetes' own API server, scheduler and
controllers, as the Jupyter server's ServiceAccount under the shipped RBAC) and its simulated
nodes, which run kernel pods as local processes: three GPU nodes whose 80 GiB cards have half
their vGPU memory promised elsewhere, so a 60G kernel pod waits with kube-scheduler's reason
while a 6G one runs.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.core.sizes import GiB
from tests.cluster import ControlPlane, KubeCluster, hami_nodes

from .conftest import VIEWPORT
from .lab import (
    Lab,
    fit_note,
    free_port,
    gpu_card,
    kernel_name,
    make_environment,
    open_lab,
    open_panel,
    picker_dialog,
    run_cell,
    start_notebook,
    wait_for,
)

ROW = ".jp-gpushare-kernel"
IMAGE = "jupyter-gpushare-kernel:test"
# kube-scheduler's own sentence: why no node fits, then (1.34: "… no new claims to deallocate,")
# why preemption would not help.
REASON = re.compile(
    r"^pending: 0/3 nodes are available: 3 Insufficient nvidia\.com/gpumem\. .*"
    r"preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling\.$"
)


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.fixture(scope="module")
def simulated(control_plane: ControlPlane, kube_namespace: str) -> Iterator[tuple[Path, KubeCluster]]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-ui-k8s-"))
    nodes = hami_nodes(3, gpumem_mib=40960)
    with KubeCluster(control_plane, kube_namespace, root / "cluster", nodes) as cluster:
        yield root, cluster
    assert cluster.violations == []


@pytest.fixture(scope="module")
def cluster_lab(simulated: tuple[Path, KubeCluster]) -> Iterator[Lab]:
    root, cluster = simulated
    gpushare = {"backend": "kubernetes", "resource_preset": "hami", "kernel_image": IMAGE}
    env = make_environment(root, {**gpushare, "owner": "alice"})
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    config = Path(env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    settings = json.loads(config.read_text())
    settings["KubernetesProvisioner"] = {"poll_interval": 0.1, "unschedulable_grace": 120}
    config.write_text(json.dumps(settings))
    lab = Lab(root=root, env=env, port=free_port(), token="ui-test-token").start()
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def cluster_page(browser: Any, cluster_lab: Lab) -> Iterator[Any]:
    """JupyterLab on the cluster in a new browser context; its sessions and kernels end after."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    page = context.new_page()
    open_lab(page, cluster_lab)
    yield page
    context.close()
    cluster_lab.reset()  # sessions, kernels and notebooks gone
    wait_for(lambda: cluster_lab.request("GET", "api/gpushare/kernels")[1] == [], what="no kernel pods")


def test_the_panel_shows_gpu_nodes_and_kernel_pods_with_the_schedulers_words(
    cluster_page: Any, cluster_lab: Lab
) -> None:
    page, lab = cluster_page, cluster_lab
    panel = open_panel(page)
    devices = panel.locator(".jp-gpushare-device")
    expect(devices).to_have_count(3)
    expect(devices.nth(0)).to_contain_text("NVIDIA A100 SXM4 80GB on gpu-node-1")
    expect(devices.nth(0)).not_to_contain_text("GPU0")
    expect(panel.locator(".jp-gpushare-simulated-badge")).to_be_hidden()

    status, waiting = lab.request(
        "POST", "api/gpushare/kernels", {"name": "python3-gpu-4g-vgpu", "gpu_memory": "60G"}
    )
    assert status == 202 and waiting["state"] == "queued", waiting
    pending = panel.locator(f'{ROW}[data-kernel-id="{waiting["kernel_id"]}"]')
    expect(pending).to_contain_text("queued #1 · 60G")
    expect(pending.locator(".jp-gpushare-detail")).to_have_text(REASON, timeout=60_000)

    status, started = lab.request("POST", "api/gpushare/kernels", {"name": "python3-gpu-4g-vgpu"})
    assert status in (201, 202), started
    running = panel.locator(f'{ROW}[data-kernel-id="{started["kernel_id"]}"]')
    expect(running).to_contain_text(re.compile(r"4G on gpu-node-\d · vgpu"), timeout=30_000)
    expect(running.locator(".jp-gpushare-detail")).to_be_hidden()
    release = running.locator(".jp-gpushare-release")
    expect(release).to_be_disabled()
    expect(release).to_have_attribute("title", re.compile("keeps its GPU until it ends"))

    # Withdrawing the waiting start and shutting the running kernel down empty the panel.
    assert lab.request("DELETE", f"api/gpushare/kernels/{waiting['kernel_id']}/gpu")[0] == 204
    assert lab.request("DELETE", f"api/kernels/{started['kernel_id']}")[0] == 204
    expect(panel.locator(ROW)).to_have_count(0, timeout=30_000)
    wait_for(
        lambda: lab.request("GET", "api/gpushare/pool")[1]["queue"] == [],
        timeout=30,
        what="the cluster's queue to be empty",
    )


def test_picking_8g_on_a_4g_kernelspec_creates_one_pod_of_8g(
    cluster_page: Any, cluster_lab: Lab, simulated: tuple[Path, KubeCluster]
) -> None:
    """The picker answers from the watched nodes, and the notebook's kernel starts in one pod of
    the picked size: no pod of the kernelspec's size first, no second pod after."""
    page, lab = cluster_page, cluster_lab
    _, cluster = simulated
    before = len(cluster.created_pods())
    panel = open_panel(page)
    start_notebook(page, gpu_card("4G", "vgpu"))
    dialog = picker_dialog(page)
    expect(dialog.locator('input[value="4G"]')).to_be_checked()
    expect(fit_note(dialog, "8G")).to_have_text("fits now on gpu-node-1, 40G free")
    expect(fit_note(dialog, "whole")).to_have_text("queue position 1")  # a whole 80G card: none free
    dialog.locator('input[value="8G"]').check()
    assert len(cluster.created_pods()) == before  # nothing started while the dialog is open
    dialog.get_by_role("button", name="Start").click()
    row = panel.locator(ROW)
    expect(row).to_have_count(1)
    # Deadlines for a busy 2-core machine: a pod starts, then the notebook connects to it.
    expect(row).to_contain_text(re.compile(r"8G on gpu-node-\d · vgpu"), timeout=120_000)
    kernel_id = row.get_attribute("data-kernel-id")
    # The notebook takes the kernel once the server lists it among its kernels, and runs a cell
    # once it is connected to it.
    expect(kernel_name(page)).to_have_text(gpu_card("4G", "vgpu"), timeout=120_000)
    expect(page.get_by_text(f"{gpu_card('4G', 'vgpu')} | Idle")).to_be_visible(timeout=120_000)
    run_cell(page, "print(6 * 7)")
    output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").first
    expect(output).to_have_text("42", timeout=120_000)
    created = cluster.created_pods()[before:]
    assert len(created) == 1, [pod["metadata"]["name"] for pod in created]
    limits = created[0]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpumem"] == str(8 * 1024), limits
    view = lab.request("GET", f"api/gpushare/kernels/{kernel_id}")[1]
    assert view["memory_request"] == 8 * GiB and view["pod"] == created[0]["metadata"]["name"], view
