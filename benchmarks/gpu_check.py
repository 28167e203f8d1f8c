"""On a machine with an NVIDIA GPU: do the caps, the attribution and time-slicing really hold?

Starts two gpushare kernels with 10G and 20G slices (timeslice mode) on the real card, with
PyTorch (CUDA build) in the kernel environment, and reports:

1. allocating past the cap fails in the kernel with an out-of-memory error, and how much each
   kernel could allocate before it did (goal: within the slice);
2. NVML usage attributed by the monitor to the right kernel (goal: each kernel's ledger figure
   at least what its PyTorch reserved, and inside its slice: NVML counts the CUDA context too);
3. bf16 matmul throughput with the cap vs a plain kernel without gpushare (goal: <= 1% apart);
4. two kernels running matmuls at once, each against its solo figure (goal: >= 45%);
5. held memory and suspend/resume of 1, 4 and 16 GiB, and a resume onto another card
   (``gpu_memory_checks.py``: the ledger never offers memory a kernel holds; NVML shows a
   suspended kernel holding nothing; its tensors come back unchanged).

Prints one PASS/FAIL line per check and writes gpu_check.json into $OUT (or the current
directory) after every check, so a check that breaks or hangs loses nothing of the others; a
check that raises is recorded with its error and the next one runs. Needs torch with CUDA and
pynvml in the same environment, and a driver with the CUDA 12.8 checkpoint API (13.1 to restore
onto another card). Checks 1-4 took 69 s on an H200; all of it takes about five minutes.

    python benchmarks/gpu_check.py [--sizes 1,4,16] [--checks caps,speed,memory]
    python benchmarks/gpu_check.py --dry-run   # no GPU: check 5 on a simulated pool (tests)

The dry run exists so the script does not rot where no GPU is at hand: its figures are not
measurements. Figures from an H200 are in docs/benchmarks.md ("On a GPU").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import traceback
from functools import partial
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

FREE = "del chunks; torch.cuda.empty_cache()"

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
            if message["msg_type"] == "error":  # not the cell's own "error" key (an OOM)
                content = message["content"]
                lines.append(json.dumps({"kernel_error": f"{content['ename']}: {content['evalue']}"}))

        await client.execute_interactive(code, output_hook=collect, timeout=timeout)
    finally:
        client.stop_channels()
    text = "".join(lines).strip().splitlines()
    result = json.loads(text[-1]) if text else {}
    if "kernel_error" in result:  # the cell raised: the check that ran it is recorded as broken
        raise RuntimeError(f"in the kernel: {result['kernel_error']}")
    return result


def install(prefix: Path) -> None:
    from jupyter_gpushare.config.kernelspecs import install_kernelspecs

    install_kernelspecs(["4G", "10G", "20G"], prefix=str(prefix))


class Report(dict[str, Any]):
    """The checks' results, written to ``path`` after every step: a check that breaks (a driver
    error, a kernel that dies) is recorded as its error and the next check still runs, so one
    short run on a borrowed GPU brings back everything that did work."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.started = time.monotonic()

    async def step(self, key: str, check: Any) -> Any:
        print(f"[{time.monotonic() - self.started:6.1f} s] {key} ...", file=sys.stderr, flush=True)
        try:
            self[key] = await check
        except Exception as error:  # recorded, shown as FAIL, and the run goes on
            traceback.print_exc()
            self[key] = {"error": f"{type(error).__name__}: {error}"}
        self.save()
        return self[key]

    def save(self) -> None:
        self["seconds"] = time.monotonic() - self.started
        self.path.write_text(json.dumps(self, indent=2))


async def allocation_past_the_cap(kernel: Any, cap: int) -> dict[str, Any]:
    result = await run(kernel, ALLOCATE_PAST_CAP)
    result["cap"] = cap
    result["within_cap"] = result.get("allocated", 0) <= cap
    result["failed_with_oom"] = "out of memory" in (result.get("error") or "").lower()
    return result


async def attribution(ledger: Any, kernel_id: str, reserved: int) -> dict[str, Any]:
    await asyncio.sleep(2.0)  # a few monitor rounds
    record = ledger.get(kernel_id)
    used = record.memory_used if record else None
    return {
        "ledger_memory_used": used,
        "usage_source": record.usage_source if record else None,
        "torch_reserved": reserved,
        "attributed": used is not None and used >= reserved,
        # NVML counts the CUDA context too: a kernel that fills its framework's cap stays inside
        # its slice (no over-limit warning) only if the cap leaves room for the context.
        "slice": record.memory if record else None,
        "within_slice": used is not None and record is not None and used <= record.memory,
    }


async def matmul_capped_vs_plain(kernels: Any, small: str, plain: str) -> dict[str, Any]:
    capped = await run(kernels.get_kernel(small), MATMUL.format(seconds=10))
    uncapped = await run(kernels.get_kernel(plain), MATMUL.format(seconds=10))
    return {
        "capped_tflops": capped.get("tflops"),
        "plain_tflops": uncapped.get("tflops"),
        "difference": abs(capped["tflops"] - uncapped["tflops"]) / uncapped["tflops"]
        if capped.get("tflops") and uncapped.get("tflops")
        else None,
        "errors": [result["error"] for result in (capped, uncapped) if "error" in result] or None,
    }


async def time_sliced_pair(kernels: Any, small: str, large: str, solo_small: float) -> dict[str, Any]:
    solo_large = await run(kernels.get_kernel(large), MATMUL.format(seconds=10))
    together = await asyncio.gather(
        run(kernels.get_kernel(small), MATMUL.format(seconds=15)),
        run(kernels.get_kernel(large), MATMUL.format(seconds=15)),
    )
    return {
        "solo_tflops": [solo_small, solo_large.get("tflops")],
        "together_tflops": [together[0].get("tflops"), together[1].get("tflops")],
        "share_of_solo": [
            together[0]["tflops"] / solo_small,
            together[1]["tflops"] / solo_large["tflops"],
        ],
    }


CHECKS = ("caps", "speed", "memory")  # 1-2, 3-4, 5


async def main(
    report: Report,
    dry_run: bool = False,
    sizes: tuple[int, ...] = (1, 4, 16),
    checks: tuple[str, ...] = CHECKS,
) -> Report:
    root = Path(tempfile.mkdtemp(prefix="gpushare-gpu-check-"))
    os.environ["JUPYTER_PATH"] = str(root / "share" / "jupyter")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    (root / "runtime").mkdir(mode=0o700)  # the kernels' connection files go there
    os.environ["JUPYTER_GPUSHARE_LEDGER_PATH"] = str(root / "ledger.sqlite")
    os.environ.pop("JUPYTER_GPUSHARE_SIMULATE", None)
    if dry_run:
        os.environ["JUPYTER_GPUSHARE_SIMULATE"] = "2xA100-80GB"
    install(root)
    from jupyter_gpushare.backends.local.ledger import Ledger

    kernels = AsyncMultiKernelManager(
        config=Config({"GPUShare": {"sample_interval": 0.5}}),
        connection_dir=str(root / "runtime"),  # not the current directory
    )
    if dry_run:
        await kernels.start_kernel(kernel_name="python3-gpu-4g")  # the ledger knows the pool now
        await kernels.shutdown_all(now=True)
    ledger = Ledger(root / "ledger.sqlite")
    try:
        if not dry_run and {"caps", "speed"} & set(checks):
            small = await kernels.start_kernel(kernel_name="python3-gpu-10g")
            large = await kernels.start_kernel(kernel_name="python3-gpu-20g")
            report["pool"] = [
                {"uuid": device.uuid, "name": device.name, "memory_total": device.memory_total}
                for device in ledger.devices()
            ]
            if "caps" in checks:
                # 1. allocation past the cap, both kernels holding their memory at once
                for name, kernel_id, cap in (("10G", small, 10 * GiB), ("20G", large, 20 * GiB)):
                    await report.step(
                        f"cap_{name}", allocation_past_the_cap(kernels.get_kernel(kernel_id), cap)
                    )
                # 2. attribution: the ledger's NVML figure per kernel vs what PyTorch reserved there
                for name, kernel_id in (("10G", small), ("20G", large)):
                    reserved = report[f"cap_{name}"].get("reserved", 0)
                    await report.step(f"attribution_{name}", attribution(ledger, kernel_id, reserved))
                for name, kernel_id in (("10G", small), ("20G", large)):
                    await report.step(f"freed_{name}", run(kernels.get_kernel(kernel_id), FREE))
            if "speed" in checks:
                plain = await kernels.start_kernel(kernel_name="python3")
                # 3. matmul with the cap vs without gpushare, one at a time
                matmul = await report.step("matmul", matmul_capped_vs_plain(kernels, small, plain))
                # 4. two kernels time-sliced at once
                if matmul.get("capped_tflops"):
                    await report.step(
                        "timeslice", time_sliced_pair(kernels, small, large, matmul["capped_tflops"])
                    )
                else:
                    report["timeslice"] = {"error": "no solo figure: the capped matmul did not run"}
            await kernels.shutdown_all(now=True)
        if "memory" not in checks:
            return report
        # 5. held memory, suspend/resume and a resume onto another card
        report["memory"] = {}
        memory_checks = gpu_memory_checks.MemoryChecks(kernels, ledger, dry_run)
        report["memory"]["held"] = await report.step("held", memory_checks.held())
        report["memory"]["suspend_resume"] = [
            await report.step(f"suspend_resume_{gib}", memory_checks.suspend_resume(gib)) for gib in sizes
        ]
        report["memory"]["resume_elsewhere"] = await report.step(
            "resume_elsewhere", memory_checks.resume_elsewhere()
        )
        for key in ["held", "resume_elsewhere", *(f"suspend_resume_{gib}" for gib in sizes)]:
            report.pop(key)  # kept under "memory" only
    finally:
        await kernels.shutdown_all(now=True)
    return report


def cap_line(name: str, cap: dict[str, Any]) -> str:
    ok = cap["within_cap"] and cap["failed_with_oom"]
    stopped = "OOM" if cap["failed_with_oom"] else "no OOM"
    why = cap.get("error") or cap.get("kernel_error")
    verdict = "PASS" if ok else "FAIL"
    return f"cap {name}: allocated {cap['allocated'] / GiB:.2f} GiB before {stopped}: {verdict} ({why})"


def attribution_line(name: str, attribution: dict[str, Any]) -> str:
    ok = attribution["attributed"] and attribution.get("within_slice")
    inside = "inside" if attribution.get("within_slice") else "OVER"
    return (
        f"attribution {name}: ledger {attribution['ledger_memory_used']} bytes "
        f"[{attribution['usage_source']}] vs torch reserved {attribution['torch_reserved']}, "
        f"{inside} its slice of {attribution.get('slice')}: {'PASS' if ok else 'FAIL'}"
    )


def matmul_line(matmul: dict[str, Any]) -> str:
    return (
        f"matmul capped {matmul['capped_tflops']:.1f} vs plain {matmul['plain_tflops']:.1f} TFLOP/s, "
        f"difference {100 * matmul['difference']:.2f}%: {'PASS' if matmul['difference'] <= 0.01 else 'FAIL'}"
    )


def timeslice_line(timeslice: dict[str, Any]) -> str:
    shares = timeslice["share_of_solo"]
    return (
        f"time-sliced pair: {100 * shares[0]:.0f}% and {100 * shares[1]:.0f}% of solo: "
        f"{'PASS' if min(shares) >= 0.45 else 'FAIL'}"
    )


def verdicts(report: dict[str, Any]) -> list[str]:
    checks = report.get("checks") or CHECKS
    lines = []
    if not report.get("dry_run"):  # a dry run has check 5 only
        if "caps" in checks:
            for name in ("10G", "20G"):
                cap, attribution = report.get(f"cap_{name}"), report.get(f"attribution_{name}")
                lines.append(gpu_memory_checks.verdict(f"cap {name}", cap, partial(cap_line, name)))
                lines.append(
                    gpu_memory_checks.verdict(
                        f"attribution {name}", attribution, partial(attribution_line, name)
                    )
                )
        if "speed" in checks:
            lines.append(gpu_memory_checks.verdict("matmul", report.get("matmul"), matmul_line))
            lines.append(
                gpu_memory_checks.verdict("time-sliced pair", report.get("timeslice"), timeslice_line)
            )
    if "memory" not in checks:
        return lines
    memory = report.get("memory")
    if not isinstance(memory, dict):
        return [*lines, "held memory: FAIL (not run)"]
    return lines + gpu_memory_checks.verdicts(memory)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="no GPU: check 5 on a simulated pool")
    parser.add_argument("--sizes", default="1,4,16", help="GiB of tensors to suspend and resume")
    parser.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help="which to run: caps (1-2), speed (3-4), memory (5); default all",
    )
    return parser.parse_args()


if __name__ == "__main__":
    options = arguments()
    sizes = tuple(int(size) for size in options.sizes.split(","))
    output = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    result = Report(output)
    result["dry_run"] = options.dry_run
    checks = tuple(options.checks.split(","))
    unknown = set(checks) - set(CHECKS)
    if unknown:
        sys.exit(
            f"gpu_check.py: unknown check(s) {', '.join(sorted(unknown))}; choose from {', '.join(CHECKS)}"
        )
    result["checks"] = list(checks)
    asyncio.run(main(result, options.dry_run, sizes, checks))
    result.save()
    print("\n".join(verdicts(result)))
    print(f"details: {output}", file=sys.stderr)
