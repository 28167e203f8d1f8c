"""On a machine with an NVIDIA GPU: do the caps, the attribution and time-slicing really hold?

Starts two gpushare kernels with 10G and 20G slices (timeslice mode) on the real card, with
PyTorch (CUDA build) in the kernel environment, and reports:

1. allocating past the cap fails in the kernel with an out-of-memory error, and how much each
   kernel could allocate before it did (goal: within the slice);
2. NVML usage attributed by the monitor to the right kernel (goal: each kernel's ledger figure
   at least what its PyTorch reserved);
3. bf16 matmul throughput with the cap vs a plain kernel without gpushare (goal: <= 1% apart);
4. two kernels running matmuls at once, each against its solo figure (goal: >= 45%);
5. held memory and suspend/resume of 1, 4 and 16 GiB, and a resume onto another card
   (``gpu_memory_checks.py``: the ledger never offers memory a kernel holds; NVML shows a
   suspended kernel holding nothing; its tensors come back unchanged).

Prints a table and writes gpu_check.json into $OUT (or the current directory). Needs torch with
CUDA and pynvml in the same environment, and a driver with the CUDA 12.8 checkpoint API (13.1 to
restore onto another card). Takes about five minutes.

    python benchmarks/gpu_check.py [--sizes 1,4,16]
    python benchmarks/gpu_check.py --dry-run   # no GPU: check 5 on a simulated pool (tests)

The dry run exists so the script does not rot where no GPU is at hand: its figures are not
measurements. Nothing of check 5 has run on a GPU yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from traitlets.config import Config

sys.path.insert(0, str(Path(__file__).parent))
import gpu_memory_checks

GiB = 1024**3

ALLOCATE_PAST_CAP = """
import torch, json
chunks, allocated, error = [], 0, None
try:
    while allocated < 200 * 2**30:
        chunks.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
        allocated += 256 * 2**20
except torch.cuda.OutOfMemoryError as oom:
    error = str(oom).splitlines()[0]
print(json.dumps({"allocated": allocated, "error": error,
                  "reserved": torch.cuda.memory_reserved()}))
"""

HOLD_THEN_FREE = "import time; time.sleep({seconds}); del chunks; torch.cuda.empty_cache()"

MATMUL = """
import torch, time, json
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5): a @ b
torch.cuda.synchronize()
start = time.perf_counter(); n = 0
while time.perf_counter() - start < {seconds}:
    a @ b; n += 1
    if n % 20 == 0: torch.cuda.synchronize()
torch.cuda.synchronize()
elapsed = time.perf_counter() - start
print(json.dumps({{"tflops": 2 * 8192**3 * n / elapsed / 1e12}}))
"""


async def run(kernel: Any, code: str, timeout: float = 300) -> dict[str, Any]:
    client = kernel.client()
    client.start_channels()
    lines: list[str] = []
    try:
        await client.wait_for_ready(timeout=120)

        def collect(message: dict[str, Any]) -> None:
            if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
                lines.append(message["content"]["text"])
            if message["msg_type"] == "error":
                lines.append(json.dumps({"error": message["content"]["evalue"]}))

        await client.execute_interactive(code, output_hook=collect, timeout=timeout)
    finally:
        client.stop_channels()
    text = "".join(lines).strip().splitlines()
    return json.loads(text[-1]) if text else {}


def install(prefix: Path) -> None:
    from jupyter_gpushare.kernelspec import install_kernelspecs

    install_kernelspecs(["4G", "10G", "20G"], prefix=str(prefix))


async def main(dry_run: bool = False, sizes: tuple[int, ...] = (1, 4, 16)) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpushare-gpu-check-"))
    os.environ["JUPYTER_PATH"] = str(root / "share" / "jupyter")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    (root / "runtime").mkdir(mode=0o700)  # the kernels' connection files go there
    os.environ["JUPYTER_GPUSHARE_LEDGER_PATH"] = str(root / "ledger.sqlite")
    os.environ.pop("JUPYTER_GPUSHARE_SIMULATE", None)
    if dry_run:
        os.environ["JUPYTER_GPUSHARE_SIMULATE"] = "2xA100-80GB"
    install(root)
    from jupyter_gpushare.ledger import Ledger

    kernels = AsyncMultiKernelManager(
        config=Config({"GPUShare": {"sample_interval": 0.5}}),
        connection_dir=str(root / "runtime"),  # not the current directory
    )
    report: dict[str, Any] = {}
    if dry_run:
        await kernels.start_kernel(kernel_name="python3-gpu-4g")  # the ledger knows the pool now
        await kernels.shutdown_all(now=True)
    ledger = Ledger(root / "ledger.sqlite")
    try:
        if dry_run:
            report["memory"] = await gpu_memory_checks.run_all(kernels, ledger, True, list(sizes))
            return report
        small = await kernels.start_kernel(kernel_name="python3-gpu-10g")
        large = await kernels.start_kernel(kernel_name="python3-gpu-20g")
        plain = await kernels.start_kernel(kernel_name="python3")

        # 1. allocation past the cap, both kernels holding their memory at once
        for name, kernel_id, cap in (("10G", small, 10 * GiB), ("20G", large, 20 * GiB)):
            result = await run(kernels.get_kernel(kernel_id), ALLOCATE_PAST_CAP)
            result["cap"] = cap
            result["within_cap"] = result.get("allocated", 0) <= cap
            result["failed_with_oom"] = bool(result.get("error"))
            report[f"cap_{name}"] = result
        await asyncio.sleep(2.0)  # a few monitor rounds
        # 2. attribution: the ledger's NVML figure per kernel vs what PyTorch reserved there
        for name, kernel_id in (("10G", small), ("20G", large)):
            record = ledger.get(kernel_id)
            used = record.memory_used if record else None
            reserved = report[f"cap_{name}"].get("reserved", 0)
            report[f"attribution_{name}"] = {
                "ledger_memory_used": used,
                "usage_source": record.usage_source if record else None,
                "torch_reserved": reserved,
                "attributed": used is not None and used >= reserved,
            }
        for kernel_id in (small, large):
            await run(kernels.get_kernel(kernel_id), HOLD_THEN_FREE.format(seconds=0))

        # 3. matmul with the cap vs without gpushare, one at a time
        capped = await run(kernels.get_kernel(small), MATMUL.format(seconds=10))
        uncapped = await run(kernels.get_kernel(plain), MATMUL.format(seconds=10))
        report["matmul"] = {
            "capped_tflops": capped.get("tflops"),
            "plain_tflops": uncapped.get("tflops"),
            "difference": abs(capped["tflops"] - uncapped["tflops"]) / uncapped["tflops"]
            if capped.get("tflops") and uncapped.get("tflops")
            else None,
        }
        # 4. two kernels time-sliced at once
        solo_large = await run(kernels.get_kernel(large), MATMUL.format(seconds=10))
        together = await asyncio.gather(
            run(kernels.get_kernel(small), MATMUL.format(seconds=15)),
            run(kernels.get_kernel(large), MATMUL.format(seconds=15)),
        )
        report["timeslice"] = {
            "solo_tflops": [capped.get("tflops"), solo_large.get("tflops")],
            "together_tflops": [together[0].get("tflops"), together[1].get("tflops")],
            "share_of_solo": [
                together[0]["tflops"] / capped["tflops"],
                together[1]["tflops"] / solo_large["tflops"],
            ],
        }
        await kernels.shutdown_all(now=True)
        report["memory"] = await gpu_memory_checks.run_all(kernels, ledger, False, list(sizes))
    finally:
        await kernels.shutdown_all(now=True)
    return report


def verdicts(report: dict[str, Any]) -> list[str]:
    lines = []
    if "cap_10G" not in report:  # a dry run: check 5 only
        return gpu_memory_checks.verdicts(report["memory"])
    for name in ("10G", "20G"):
        cap = report[f"cap_{name}"]
        lines.append(
            f"cap {name}: allocated {cap['allocated'] / GiB:.2f} GiB before "
            f"{'OOM' if cap['failed_with_oom'] else 'no error'}: "
            f"{'PASS' if cap['within_cap'] and cap['failed_with_oom'] else 'FAIL'} ({cap.get('error')})"
        )
        attribution = report[f"attribution_{name}"]
        lines.append(
            f"attribution {name}: ledger {attribution['ledger_memory_used']} bytes "
            f"[{attribution['usage_source']}] vs torch reserved {attribution['torch_reserved']}: "
            f"{'PASS' if attribution['attributed'] else 'FAIL'}"
        )
    matmul = report["matmul"]
    lines.append(
        f"matmul capped {matmul['capped_tflops']:.1f} vs plain {matmul['plain_tflops']:.1f} TFLOP/s, "
        f"difference {100 * matmul['difference']:.2f}%: {'PASS' if matmul['difference'] <= 0.01 else 'FAIL'}"
    )
    shares = report["timeslice"]["share_of_solo"]
    lines.append(
        f"time-sliced pair: {100 * shares[0]:.0f}% and {100 * shares[1]:.0f}% of solo: "
        f"{'PASS' if min(shares) >= 0.45 else 'FAIL'}"
    )
    return lines + gpu_memory_checks.verdicts(report["memory"])


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="no GPU: check 5 on a simulated pool")
    parser.add_argument("--sizes", default="1,4,16", help="GiB of tensors to suspend and resume")
    return parser.parse_args()


if __name__ == "__main__":
    options = arguments()
    sizes = tuple(int(size) for size in options.sizes.split(","))
    started = time.monotonic()
    result = asyncio.run(main(options.dry_run, sizes))
    result["dry_run"] = options.dry_run
    result["seconds"] = time.monotonic() - started
    output = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    output.write_text(json.dumps(result, indent=2))
    print("\n".join(verdicts(result)))
    print(f"details: {output}", file=sys.stderr)
