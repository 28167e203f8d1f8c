"""``POST kernels`` waits once: on the start and on its provisioner's reports, not in a loop.

The server's context starts kernels through a kernel manager that stands in for jupyter_server's
(the edge we do not own: its ``start_kernel`` reserves through the real local backend, reports
as a gpushare provisioner does, and its kernel "process" comes up when the test says so). The
backend counts how often it is asked whether a start waits: once after the first second, and
again only on a report — never every few milliseconds while a placed kernel's process comes up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.records import NewRequest, Placed
from jupyter_gpushare.core.slice_request import SliceRequest
from jupyter_gpushare.server import context as server_context
from jupyter_gpushare.server.context import GPUShareContext
from tests.support.polling import async_wait_until

SPEC = "python3-gpu-test"


class CountingBackend(LocalBackend):
    """The local backend, counting the questions ``POST kernels`` asks it while it waits."""

    asked_waiting = 0

    def is_waiting(self, kernel_id: str) -> bool:
        self.asked_waiting += 1
        return super().is_waiting(kernel_id)


class SlowProcesses:
    """jupyter_server's kernel manager as far as a start goes: the slice through the backend
    (queue positions and the placement reported as the gpushare provisioners report them), then a
    kernel process that is up once ``up`` is set."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.up = asyncio.Event()
        self.started: list[str] = []

    async def start_kernel(
        self,
        kernel_id: str,
        gpushare_on_state: Callable[[str], None],
        gpushare_checked: SliceRequest,
        **_: Any,
    ) -> str:
        record = await self.backend.acquire(
            kernel_id,
            gpushare_checked,
            on_wait=lambda position, reason: gpushare_on_state(f"waiting: position {position}"),
        )
        gpushare_on_state(f"holds {record.size}")
        await self.up.wait()
        self.started.append(kernel_id)
        return kernel_id

    def list_kernel_ids(self) -> list[str]:
        return list(self.started)

    def get_kernel(self, kernel_id: str) -> Any:
        raise KeyError(kernel_id)


@pytest.fixture
def backend(tmp_path: Path) -> CountingBackend:
    settings = GPUShare(
        simulate="1xA100-80GB",
        ledger_path=str(tmp_path / "ledger.sqlite"),
        owner="alice",
        queue_poll_interval=0.05,
    )
    return CountingBackend(settings)


@pytest.fixture
def specs(tmp_path: Path) -> KernelSpecManager:
    spec_dir = tmp_path / "kernels" / SPEC
    spec_dir.mkdir(parents=True)
    provisioner = {"provisioner_name": "gpushare-provisioner", "config": {"gpu_memory": "8G"}}
    spec = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": SPEC}
    (spec_dir / "kernel.json").write_text(
        json.dumps({**spec, "metadata": {"kernel_provisioner": provisioner}})
    )
    return KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])


def context_of(backend: LocalBackend, specs: KernelSpecManager) -> tuple[GPUShareContext, SlowProcesses]:
    processes = SlowProcesses(backend)
    return GPUShareContext(backend=backend, kernel_manager=processes, kernel_spec_manager=specs), processes


def fill_the_card(backend: LocalBackend) -> None:
    request = NewRequest(
        "k-full", "bob", backend.server_id, "timeslice", "shared", "80G", None, backend.holder
    )
    assert isinstance(backend.ledger.request(request, backend.policy), Placed)


@pytest.fixture(autouse=True)
def answer_within(monkeypatch: pytest.MonkeyPatch) -> None:
    # Room for a placement on a loaded machine before the first answer is due.
    monkeypatch.setattr(server_context, "START_ANSWER_WITHIN", 2.0)


async def test_a_placed_kernel_whose_process_is_slow_is_waited_for_without_asking_again(
    backend: CountingBackend, specs: KernelSpecManager
) -> None:
    context, processes = context_of(backend, specs)
    start = asyncio.ensure_future(context.start_kernel(SPEC, "", {}))
    # Placed at once; its process is slow to come up, past the time the first answer is due.
    await async_wait_until(lambda: backend.asked_waiting >= 1, timeout=60, message="the first question")
    asked = backend.asked_waiting
    loop = asyncio.get_running_loop()
    loop.call_later(1.0, processes.up.set)
    view, running = await asyncio.wait_for(start, 60)
    assert running and view["state"] == "running", view
    # The 50 ms loop this replaced asked some 20 times in that second; the one wait, not again.
    assert backend.asked_waiting == asked <= 2, backend.asked_waiting


async def test_a_queued_start_is_answered_queued_and_starts_when_there_is_room(
    backend: CountingBackend, specs: KernelSpecManager
) -> None:
    fill_the_card(backend)
    context, processes = context_of(backend, specs)
    processes.up.set()
    view, running = await asyncio.wait_for(context.start_kernel(SPEC, "", {}), 60)
    assert not running and view["state"] == "queued", view
    assert "position 1" in (view.get("detail") or ""), view
    kernel_id = view["kernel_id"]

    backend.free("k-full")
    await async_wait_until(
        lambda: kernel_id in processes.started, timeout=60, message="the queued start placed and started"
    )
    assert backend.ledger.get(kernel_id) is not None
