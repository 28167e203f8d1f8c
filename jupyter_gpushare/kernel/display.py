"""What ``%gpu`` shows: plain text in a terminal, a small HTML card in a notebook."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.core.placement.holding import source_words
from jupyter_gpushare.core.records import ReleasedSlice, SliceRecord
from jupyter_gpushare.core.sizes import format_bytes


def _percent(part: int | None, whole: int) -> str:
    return "" if part is None or whole <= 0 else f" ({100 * part / whole:.0f}%)"


def free_on(device: dict[str, Any], overcommit: float) -> int:
    """What no kernel has reserved on a ``GET pool`` device, under the overcommit: "free" as
    placement counts it (a kernel's own slice is taken too; the panel says it the same way)."""
    return max(0, int(device["memory_total"] * overcommit) - int(device["memory_reserved"]))


def _bar(used: int, reserved: int, total: int) -> str:
    """An HTML bar: used, the rest of the reservation, free."""
    if total <= 0:
        return ""
    used_pct = min(100.0, 100 * used / total)
    reserved_pct = max(0.0, min(100.0, 100 * reserved / total) - used_pct)
    return (
        '<div style="display:flex;height:10px;width:240px;background:#e0e0e0;border-radius:3px;'
        'overflow:hidden">'
        f'<div title="used" style="width:{used_pct:.1f}%;background:#e65100"></div>'
        f'<div title="reserved" style="width:{reserved_pct:.1f}%;background:#90caf9"></div></div>'
    )


class TextView:
    """Plain text in a terminal (and in ``repr``), from ``lines()``; subclasses add HTML."""

    def lines(self) -> list[str]:
        raise NotImplementedError

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


@dataclass(repr=False)
class SliceStatus(TextView):
    """``%gpu status``."""

    kernel_id: str
    record: SliceRecord | None
    device: str = ""
    device_short: str = ""  # "GPU2", where free memory is named
    free_on_device: int | None = None  # what no kernel has reserved there, this one included
    simulated: bool = False
    caps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    released: ReleasedSlice | None = None  # what it left when it released (held, suspended)
    # What a change did, said before the state it left ("Released 8G."), and the size to ask
    # for again once the kernel holds none.
    outcome: list[str] = field(default_factory=list)
    ask_again: str = "4G"

    def lines(self) -> list[str]:
        if self.record is None:
            return [*self.outcome, *self._without_slice(), *self.notes]
        record = self.record
        lines = [
            *self.outcome,
            f"GPU slice: {format_bytes(record.memory)} ({record.mode}) on {self.device}"
            + (" — simulated pool" if self.simulated else ""),
        ]
        if record.memory_used is None:
            lines.append("Used: not measured yet")
        else:
            lines.append(
                f"Used: {format_bytes(record.memory_used)} of {format_bytes(record.memory)}"
                f"{_percent(record.memory_used, record.memory)}"
                + (f", utilization {record.utilization}%" if record.utilization is not None else "")
                + (f" [{record.usage_source}]" if record.usage_source else "")
            )
        if record.held_beyond:
            lines.append(
                f"Held: {format_bytes(record.held_beyond)} on the GPU, more than the slice: the ledger "
                "keeps it reserved until it is freed"
            )
        if self.free_on_device is not None:
            lines.append(
                f"Free on {self.device_short or 'the device'}: {format_bytes(self.free_on_device)}"
                " (reserved by no kernel)"
            )
        if record.cores is not None:
            lines.append(f"Compute share: {record.cores}% of the SMs")
        lines.extend(f"Cap: {cap}" for cap in self.caps)
        lines.extend(f"Warning: {warning}" for warning in record.warnings)
        lines.extend(self.notes)
        return lines

    def _without_slice(self) -> list[str]:
        left = self.released
        state = left.suspended if left is not None else None
        if state is not None:
            moved = (
                f"{format_bytes(state.state_bytes)} of GPU state in host memory"
                if state.checkpointed
                else "no GPU state to keep"
            )
            return [
                f"This kernel is suspended: {moved}, its {format_bytes(state.memory)} slice back in "
                "the pool.",
                f"The next cell (or %gpu resume) waits for {state.size} on a {state.device_name} and "
                "restores it.",
            ]
        lines = [f"This kernel holds no GPU slice. Take one with %gpu request {self.ask_again}."]
        if left is not None and left.held:
            lines.append(
                f"Held: its processes still hold {format_bytes(left.held)} on {self.device} "
                f"({source_words(left.held_source)}): it stays reserved until freed."
            )
        return lines

    def _repr_html_(self) -> str:
        lines = self.lines()
        body = "".join(
            f'<div style="color:#b71c1c">&#9888; {html.escape(line[len("Warning: ") :])}</div>'
            if line.startswith("Warning: ")
            else f"<div>{html.escape(line)}</div>"
            for line in lines[1:]
        )
        bar = ""
        if self.record is not None and self.record.memory_used is not None:
            # What the kernel uses of its slice; nothing to draw before it is measured.
            used = self.record.memory_used
            bar = _bar(used, used, self.record.memory)
        return (
            '<div class="jp-gpushare-status" style="font-family:var(--jp-ui-font-family,sans-serif);'
            'font-size:12px;line-height:1.5">'
            f"<b>{html.escape(lines[0])}</b>{bar}{body}</div>"
        )


@dataclass(repr=False)
class PodSliceStatus(TextView):
    """``%gpu status`` in a kernel pod: the slice from the pod, its use from the server's view."""

    mode: str
    memory: int | None
    view: dict[str, Any] | None  # this kernel's GET kernels entry, None when unreachable
    problem: str | None = None
    caps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        view = self.view or {}
        memory = view.get("memory_request") or self.memory
        size = format_bytes(memory) if memory else "a"
        where = f" in pod {view['pod']}" if view.get("pod") else " in a kernel pod"
        if view.get("node"):
            where += f" on node {view['node']}"
        # Under DRA with fallbacks the claim may have got another mode than the kernel asked for;
        # the server reads which from the claim's allocation.
        mode = str(view.get("mode") or self.mode or "?")
        if self.mode and mode != self.mode:
            mode = f"{mode}, a fallback of the {self.mode} asked for"
        lines = [f"GPU slice: {size} ({mode}){where}"]
        if self.problem:
            lines.append(f"Usage unknown: {self.problem}")
        elif view.get("usage_source") and memory:
            used = int(view.get("memory_used") or 0)
            lines.append(
                f"Used: {format_bytes(used)} of {format_bytes(memory)}{_percent(used, memory)}"
                f" [{view['usage_source']}]"
            )
        else:
            lines.append("Used: not reported yet")
        lines.extend(f"Cap: {cap}" for cap in self.caps)
        lines.extend(f"Warning: {warning}" for warning in view.get("warnings") or [])
        lines.append("The slice is fixed for the pod's life: %gpu resize SIZE --restart makes a new pod.")
        lines.extend(self.notes)
        return lines


@dataclass(repr=False)
class PoolStatus(TextView):
    """``%gpu pool``."""

    pool: dict[str, Any]

    def lines(self) -> list[str]:
        pool = self.pool
        devices = pool["devices"]
        kind = "GPU node(s)" if devices and all(device.get("node") for device in devices) else "GPU(s)"
        lines = [
            f"{len(pool['devices'])} {kind}{' (simulated)' if pool['simulated'] else ''}, "
            f"overcommit {pool['overcommit']:g}, {len(pool['queue'])} waiting"
        ]
        if pool.get("problem"):
            lines.append(f"Warning: {pool['problem']}")
        for device in pool["devices"]:
            free = free_on(device, pool["overcommit"])
            lines.append(
                f"GPU{device['id']} {device['name']}: reserved {format_bytes(device['memory_reserved'])}"
                f" of {format_bytes(device['memory_total'])}, free {format_bytes(free)}, used "
                f"{format_bytes(device['memory_used'])}"
                + (f", {device['utilization']}% busy" if device["utilization"] is not None else "")
                + f"; modes: {', '.join(device['modes'])}"
            )
        return lines

    def _repr_html_(self) -> str:
        pool = self.pool
        rows = "".join(
            f"<tr><td>GPU{device['id']}</td><td>{html.escape(device['name'])}</td>"
            f"<td>{_bar(device['memory_used'], device['memory_reserved'], device['memory_total'])}</td>"
            f"<td>{format_bytes(device['memory_reserved'])} / {format_bytes(device['memory_total'])}</td>"
            f"<td>{'' if device['utilization'] is None else str(device['utilization']) + '%'}</td></tr>"
            for device in pool["devices"]
        )
        return (
            f'<div class="jp-gpushare-pool"><div>{html.escape(self.lines()[0])}</div>'
            "<table><tr><th>GPU</th><th>name</th><th>memory</th><th>reserved</th><th>busy</th></tr>"
            f"{rows}</table></div>"
        )
