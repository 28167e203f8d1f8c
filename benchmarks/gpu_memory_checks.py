"""The held-memory and suspend/resume checks of ``gpu_check.py`` (docs/how-it-works/ledger.md).

On an NVIDIA GPU (PyTorch with CUDA in the kernels' environment):

1. held memory: a kernel holding tensors is refused a shrink below them, releases with what it
   holds kept reserved, and a second kernel given everything the ledger then offers allocates
   all of it without running out of memory;
2. suspend/resume of 1, 4 and 16 GiB of tensors: the time each way (as the kernel reports it),
   what NVML says the kernel's process holds after the suspend (goal: nothing), and a checksum of
   the tensors after the resume (goal: unchanged);
3. resume onto another card: the suspended kernel's card is taken by another kernel, so the
   resume lands on another GPU of the same chip (needs two GPUs; skipped with one).

``--dry-run`` runs the same steps on a simulated pool (two simulated A100s, the simulated
checkpoint driver, declared usage instead of tensors, a CPU buffer for the checksum), so the
test suite keeps the script from rotting on machines without a GPU. Its figures say nothing
about a GPU.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GiB = 1024**3

# What a kernel cell does to hold N bytes and checksum them: tensors on the GPU, or (dry run)
# a declared usage and a CPU buffer standing for them.
HOLD_GPU = """
import torch, json
x = torch.randint(0, 255, ({n},), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(json.dumps({{"checksum": int(x.view(torch.int64).sum())}}))
"""
HOLD_DRY = """
import json, os, zlib
from jupyter_gpushare import kernel as gpu
gpu.simulate_usage(str({n} // 2**20) + "M")
x = os.urandom(min({n}, 2**20))
print(json.dumps({{"checksum": zlib.crc32(x)}}))
"""
CHECKSUM_GPU = 'print(json.dumps({"checksum": int(x.view(torch.int64).sum())}))'
CHECKSUM_DRY = 'print(json.dumps({"checksum": zlib.crc32(x)}))'
FILL_GPU = """
import torch, json
error = None
try:
    y = torch.empty({n}, dtype=torch.uint8, device="cuda"); y.fill_(1); torch.cuda.synchronize()
except torch.cuda.OutOfMemoryError as oom:
    error = str(oom).splitlines()[0]
print(json.dumps({{"error": error}}))
"""
FILL_DRY = """
import json
from jupyter_gpushare import kernel as gpu
gpu.simulate_usage(str({n} // 2**20) + "M")
print(json.dumps({{"error": None}}))
"""
FREE = "del x; import gc; gc.collect()"


@dataclass
class Cell:
    stdout: str = ""
    stderr: str = ""
    result: str = ""
    error: str | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)


async def cell(kernel: Any, code: str, timeout: float = 600) -> Cell:
    """Run ``code``; its outputs, with every JSON line of stdout parsed."""
    first_line = next((line for line in code.strip().splitlines() if line.strip()), "")
    print(f"    cell: {first_line[:70]}", file=sys.stderr, flush=True)  # where a hang happened
    client = kernel.client()
    client.start_channels()
    out = Cell()
    try:
        await client.wait_for_ready(timeout=120)

        def collect(message: dict[str, Any]) -> None:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif kind in ("execute_result", "display_data"):
                out.result += content["data"].get("text/plain", "")
            elif kind == "error":
                out.error = f"{content['ename']}: {content['evalue']}"

        await client.execute_interactive(code, output_hook=collect, timeout=timeout)
    finally:
        client.stop_channels()
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            out.lines.append(json.loads(line))
    return out


def seconds_in(text: str, pattern: str) -> float | None:
    """The ``(2.1 s)`` / ``in 2.1 s`` figure after ``pattern`` in a kernel's words."""
    found = re.search(pattern + r"[^\n]*?(\d+(?:\.\d+)?) s", text)
    return float(found.group(1)) if found else None


class MemoryChecks:
    """The three checks, on kernels started by ``kernels`` (kernelspecs python3-gpu-20g and -4g)."""

    def __init__(self, kernels: Any, ledger: Any, dry_run: bool) -> None:
        self.kernels = kernels
        self.ledger = ledger
        self.dry_run = dry_run
        self.hold = HOLD_DRY if dry_run else HOLD_GPU
        self.checksum = CHECKSUM_DRY if dry_run else CHECKSUM_GPU
        self.fill = FILL_DRY if dry_run else FILL_GPU

    async def start(self, size: str) -> tuple[str, Any]:
        kernel_id = await self.kernels.start_kernel(kernel_name=f"python3-gpu-{size}")
        return kernel_id, self.kernels.get_kernel(kernel_id)

    def free_on(self, device_uuid: str | None) -> int:
        pool = self.ledger.devices()
        total = next(device.memory_total for device in pool if device.uuid == device_uuid)
        taken = sum(
            max(record.memory, record.memory_used or 0)
            for record in self.ledger.records()
            if record.device_uuid == device_uuid
        )
        held = sum(left.held for left in self.ledger.released_all() if left.device_uuid == device_uuid)
        return int(total - taken - held)

    async def held(self) -> dict[str, Any]:
        kernel_id, kernel = await self.start("20g")
        await cell(kernel, self.hold.format(n=16 * GiB))
        record = self.ledger.get(kernel_id)
        device = record.device_uuid if record else None
        shrink = await cell(kernel, "%gpu resize 4G")
        released = await cell(kernel, "%gpu release")
        left = self.ledger.released(kernel_id)
        offered = self.free_on(device)
        other_id, other = await self.start("4g")
        grown = await cell(other, f"%gpu resize {offered // 2**20}M")
        other_record = self.ledger.get(other_id)
        # All of it but 1 GiB: the new kernel's CUDA context and allocator take some of its slice.
        filled = await cell(other, self.fill.format(n=offered - GiB))
        report = {
            "shrink_refused": "is less than" in shrink.stderr,
            "held_after_release": left.held if left else 0,
            "release_says_held": "still holds" in released.result,
            "offered_to_the_next_kernel": offered,
            "next_kernel_on_same_card": bool(other_record and other_record.device_uuid == device),
            # The resize asks for whole MiB: all of the offer but what rounding down leaves.
            "next_kernel_grew": bool(other_record and other_record.memory == offered // 2**20 * 2**20),
            "next_kernel_error": (filled.lines or [{}])[-1].get("error")
            or filled.error
            or grown.stderr
            or None,
        }
        await self.kernels.shutdown_kernel(other_id, now=True)
        await self.kernels.shutdown_kernel(kernel_id, now=True)
        return report

    async def suspend_resume(self, gib: int) -> dict[str, Any]:
        kernel_id, kernel = await self.start("20g")
        held = await cell(kernel, self.hold.format(n=gib * GiB))
        before = (held.lines or [{}])[-1].get("checksum")
        suspended = await cell(kernel, "%gpu suspend")
        left = self.ledger.released(kernel_id)
        was_suspended = bool(left and left.suspended and self.ledger.get(kernel_id) is None)
        # Read here, not in the kernel: its next cell resumes it first.
        nvml_used = None if self.dry_run else nvml_process_memory(kernel.provisioner.pid)
        after = await cell(kernel, self.checksum)
        report = {
            "gib": gib,
            "suspended": was_suspended,
            "suspend_seconds": seconds_in(suspended.stdout, "moved to host memory in"),
            "resume_seconds": seconds_in(after.stdout, "Resuming your"),
            "nvml_used_after_suspend": nvml_used,
            "checksum_before": before,
            "checksum_after": (after.lines or [{}])[-1].get("checksum"),
            "error": suspended.stderr.strip() or after.error,
        }
        report["checksum_same"] = before is not None and before == report["checksum_after"]
        await self.kernels.shutdown_kernel(kernel_id, now=True)
        return report

    async def resume_elsewhere(self) -> dict[str, Any]:
        devices = [device for device in self.ledger.devices() if not device.mig_enabled]
        if len(devices) < 2:
            return {"skipped": "one GPU: a resume onto another card needs two"}
        kernel_id, kernel = await self.start("4g")
        held = await cell(kernel, self.hold.format(n=GiB))
        before = (held.lines or [{}])[-1].get("checksum")
        first = self.ledger.get(kernel_id)
        # Another kernel on that card (placement packs) takes nearly all of it once the first
        # is suspended: the resume must go elsewhere.
        other_id, other = await self.start("4g")
        await cell(kernel, "%gpu suspend")
        other_record = self.ledger.get(other_id)
        if not (other_record and first and other_record.device_uuid == first.device_uuid):
            await self.kernels.shutdown_kernel(other_id, now=True)
            await self.kernels.shutdown_kernel(kernel_id, now=True)
            return {"skipped": "the other kernel was placed on another card than the suspended one"}
        # The other kernel grows to leave 1 GiB of that card: the 4G state must go elsewhere.
        await cell(other, f"%gpu resize {self.free_on(first.device_uuid) // 2**20 + 3 * 1024}M")
        after = await cell(kernel, self.checksum)
        again = self.ledger.get(kernel_id)
        report = {
            "from": first.device_uuid if first else None,
            "onto": again.device_uuid if again else None,
            "resume_seconds": seconds_in(after.stdout, "Resuming your"),
            "checksum_same": before is not None and before == (after.lines or [{}])[-1].get("checksum"),
            "error": after.error or after.stderr.strip() or None,
        }
        report["moved"] = bool(report["from"] and report["onto"] and report["from"] != report["onto"])
        await self.kernels.shutdown_kernel(other_id, now=True)
        await self.kernels.shutdown_kernel(kernel_id, now=True)
        return report


def nvml_process_memory(pid: int) -> int:
    """What NVML says process ``pid`` holds, over every GPU."""
    import pynvml

    pynvml.nvmlInit()
    try:
        used = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == pid:
                    used += process.usedGpuMemory or 0
        return used
    finally:
        pynvml.nvmlShutdown()


def verdict(label: str, entry: Any, line: Callable[[dict[str, Any]], str]) -> str:
    """``line(entry)``, or a FAIL that names what broke when the check recorded an error."""
    if not isinstance(entry, dict):
        return f"{label}: FAIL (not run)"
    if "error" in entry and len(entry) == 1:
        return f"{label}: FAIL ({entry['error']})"
    try:
        return line(entry)
    except (KeyError, TypeError, ZeroDivisionError) as error:
        return f"{label}: FAIL (incomplete: {type(error).__name__} {error}; see the JSON)"


def held_line(held: dict[str, Any]) -> str:
    ok = (
        held["shrink_refused"]
        and held["held_after_release"] >= 16 * GiB
        and held["next_kernel_grew"]
        and not held["next_kernel_error"]
    )
    error = "with an error" if held["next_kernel_error"] else "without an error"
    return (
        f"held memory: shrink refused {held['shrink_refused']}, {held['held_after_release'] / GiB:.1f} "
        f"GiB kept reserved after release, the next kernel offered "
        f"{held['offered_to_the_next_kernel'] / GiB:.1f} GiB allocated it {error}: {'PASS' if ok else 'FAIL'}"
    )


def suspend_resume_line(run: dict[str, Any]) -> str:
    nvml = run["nvml_used_after_suspend"]
    ok = run["suspended"] and run["checksum_same"] and not nvml
    return (
        f"suspend/resume {run['gib']} GiB: suspend {run['suspend_seconds']} s, resume "
        f"{run['resume_seconds']} s, NVML after suspend {nvml if nvml is not None else 'n/a'} bytes, "
        f"checksum {'same' if run['checksum_same'] else 'DIFFERENT'}: {'PASS' if ok else 'FAIL'}"
        + (f" ({run['error']})" if run["error"] else "")
    )


def elsewhere_line(elsewhere: dict[str, Any]) -> str:
    if "skipped" in elsewhere:
        return f"resume onto another card: skipped ({elsewhere['skipped']})"
    ok = elsewhere["moved"] and elsewhere["checksum_same"]
    same = "same" if elsewhere["checksum_same"] else "DIFFERENT"
    return (
        f"resume onto another card: {elsewhere['from']} -> {elsewhere['onto']} in "
        f"{elsewhere['resume_seconds']} s, checksum {same}: {'PASS' if ok else 'FAIL'}"
    )


def verdicts(report: dict[str, Any]) -> list[str]:
    """One PASS/FAIL line per check; a check that broke is a FAIL naming its error."""
    lines = [verdict("held memory", report.get("held"), held_line)]
    for index, run in enumerate(report.get("suspend_resume") or []):
        label = f"suspend/resume {run.get('gib', f'#{index + 1}')} GiB"
        lines.append(verdict(label, run, suspend_resume_line))
    lines.append(verdict("resume onto another card", report.get("resume_elsewhere"), elsewhere_line))
    return lines
