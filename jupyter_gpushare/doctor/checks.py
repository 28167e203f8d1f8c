"""One line of ``jupyter gpushare doctor``: a check's name, OK / WARN / FAIL, what it found, the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.detail}"
        return f"{text}\n      fix: {self.fix}" if self.fix and self.status != "OK" else text


@dataclass(frozen=True)
class Findings:
    """A backend kind's checks (its ``doctor_checks``), and what the test kernel's check needs."""

    checks: list[Check]
    ready: bool  # whether the pool can give a kernel a slice, so the test kernel should start
    simulated: bool  # a simulated pool (the test kernel's GPU is then declared, not real)


__all__ = ["Check", "Findings", "Status"]
