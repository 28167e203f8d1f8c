"""The doctor's last check: a real gpushare kernel started with a small slice, asked what it sees.

The failure users fear most is a notebook that silently falls back to the CPU after moving to a
shared GPU. The kernel starts as any other would — through the broker with ``broker_url``, on
the node ledger (its remembered pool too), or as a pod — so a green line means kernels start.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jupyter_gpushare.core.accounting.tally import TEST_KERNEL_NAME
from jupyter_gpushare.core.findings import Check

# Which devices the kernel was given: CUDA_VISIBLE_DEVICES on a node we place on; in a kernel
# pod, the device plugin (or a DRA driver's CDI edits) names them in NVIDIA_VISIBLE_DEVICES for
# the container runtime, and nothing sets CUDA_VISIBLE_DEVICES.
VISIBLE_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
TEST_KERNEL_CODE = f"""
import json, os
named = [name for name in {VISIBLE_DEVICE_VARIABLES!r} if os.environ.get(name)]
seen = {{"visible": os.environ.get(named[0]) if named else None,
        "visible_from": named[0] if named else None,
        "memory": os.environ.get("JUPYTER_GPUSHARE_MEMORY_BYTES")}}
try:
    import torch
    seen["torch_cuda"] = torch.cuda.is_available()
    seen["device"] = torch.cuda.get_device_name(0) if seen["torch_cuda"] else None
except ImportError:
    seen["torch_cuda"] = None
print(json.dumps(seen))
"""


def check_test_kernel(
    has_devices: bool, simulated: bool, size: str = "512M", printed: Sequence[Check] = ()
) -> Check:
    """Start a real gpushare kernel with a small slice and ask what it sees (``has_devices``:
    whether the pool the kernel would be placed in has any; ``simulated``: whether it is a
    simulated one, where no framework can use a GPU). ``printed``: the checks above it, the
    only ones its fix may refer to."""
    if not has_devices:
        failed = next((check.name for check in printed if check.status == "FAIL"), None)
        if failed is None:
            return Check("test kernel", "FAIL", "not started: no GPU in the pool", "see the checks above")
        why = "no GPU in the pool" if failed == "GPUs" else f"the {failed} check failed"
        return Check("test kernel", "FAIL", f"not started: {why}", f"fix the {failed} check first")
    try:
        seen = asyncio.run(_run_test_kernel(size))
    except Exception as error:
        return Check(
            "test kernel",
            "FAIL",
            f"could not start a gpushare kernel: {error}",
            "check the ledger and kernelspec lines above, and the server log",
        )
    return kernel_verdict(seen, simulated)


def kernel_verdict(seen: dict[str, Any], simulated: bool) -> Check:
    """The test kernel's line from what it saw (TEST_KERNEL_CODE's answer)."""
    if not seen.get("visible") or not seen.get("memory"):
        return Check("test kernel", "FAIL", f"the kernel got no slice ({seen})", "report this as a bug")
    variable = seen.get("visible_from") or VISIBLE_DEVICE_VARIABLES[0]
    where = f"{variable}={seen['visible']}, slice {int(seen['memory']) // 2**20} MiB"
    if simulated:
        # The GPUs line already warns that the pool is simulated: kernels start, which is all
        # a simulated pool can show.
        return Check("test kernel", "OK", f"{where} (simulated pool: no framework check)")
    if seen.get("torch_cuda") is False:
        return Check(
            "test kernel",
            "FAIL",
            f"{where}, but PyTorch sees no CUDA device: notebooks would silently run on the CPU",
            "install a CUDA build of PyTorch and check the driver "
            "(and libvgpu.so / the MPS daemon for those modes)",
        )
    if seen.get("torch_cuda") is None:
        return Check("test kernel", "OK", f"{where} (PyTorch not installed: framework check skipped)")
    return Check("test kernel", "OK", f"{where}; PyTorch sees {seen.get('device')}")


async def _run_test_kernel(size: str) -> dict[str, Any]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_gpushare.config.kernelspecs import build_kernelspec

    with tempfile.TemporaryDirectory() as directory:
        # Its kernelspec's name is the mark the accounting knows it by: the slice is held and
        # accounted like any other, but kept out of the user's figures (tally.TEST_KERNEL_NAME).
        spec_dir = Path(directory) / "kernels" / TEST_KERNEL_NAME
        spec_dir.mkdir(parents=True)
        (spec_dir / "kernel.json").write_text(json.dumps(build_kernelspec(size)))
        manager = AsyncKernelManager(
            kernel_name=TEST_KERNEL_NAME,
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(Path(directory) / "kernels")]),
        )
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        lines: list[str] = []
        try:
            await client.wait_for_ready(timeout=60)

            def collect(message: dict[str, Any]) -> None:
                if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
                    lines.append(message["content"]["text"])

            await client.execute_interactive(TEST_KERNEL_CODE, output_hook=collect, timeout=120)
        finally:
            client.stop_channels()
            await manager.shutdown_kernel(now=True)
    output = "".join(lines).strip().splitlines()
    return json.loads(output[-1]) if output else {}
