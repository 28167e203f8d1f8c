"""Session traces for ``replay.py``: the format, a generator of realistic days, and a reader of
the ``openb_pod_list`` CSV form of cluster traces.

The trace format (JSON, ``"format": "gpushare-trace/1"``)
----------------------------------------------------------
::

    {"format": "gpushare-trace/1",
     "name": "generated week, seed 1",
     "sessions": [
       {"id": "u03-17", "user": "u03", "start": 33120.0, "end": 38410.5, "memory": "8G",
        "cells": [[33150.0, 12.5], [33260.2, 301.0], ...]},
       ...]}

* ``start``, ``end``: seconds from the start of the trace when the kernel starts and is shut
  down; the kernel asks for its slice at ``start``.
* ``memory``: the slice it asks for, a size as ``%gpu`` takes it (``8G``, ``512M``, ``whole``).
* ``cells``: ``[start, duration]`` of each cell it runs, seconds, in order, within the session;
  ``null`` for a trace without cells (a cluster's pods), whose sessions hold their slice throughout
  and are never idle.
* ``user``: who started it (the queue's fair share and the per-user figures).

The generator
-------------
Seeded (Python's ``random`` only, so a seed gives the same trace on any platform). About
``users`` people work on weekdays (fewer at weekends) with a day profile (ramp-up at 8-10,
lunch dip, tail-off after 17). Each starts kernels as a thinned Poisson process, sizes from the
package's usual mix (``packing.SIZE_MIX``). Sessions are heavy-tailed: lognormal (median 45 min,
sigma 1.2), and one in twelve is left on after its work — until the evening, overnight, or for
days (Pareto, alpha 1.3, from 2 h, at most 3 days). Within the working part, cells alternate
with think time so that cells run about a third of the time: cells lognormal (median 20 s, a
heavy tail of long training cells), gaps lognormal (median 40 s) with the odd long break
(a meeting, lunch: 15-90 min). Other shapes (``SHAPES``: heavier tails, bursts of starts, few
users) change these figures.

``openb_pod_list`` CSV
----------------------
The Alibaba GPU-sharing cluster trace (``openb_pod_list_*.csv``: ``name, cpu_milli, memory_mib,
num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time``):
each pod asking for one GPU or a share of one (``num_gpu`` 1, ``gpu_milli`` per mille of the
card) becomes a session of ``gpu_milli`` / 1000 of the card's memory from ``creation_time`` to
``deletion_time`` (or the end of the trace), without cells. Pods without a GPU are left out;
pods of several whole GPUs are left out and counted (a notebook kernel takes one card). A list
without creation and deletion times (openb's ``multigpu`` lists) is refused: it says nothing of
when pods ran.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packing import DAY_PROFILE, SIZE_MIX

from jupyter_gpushare.core.sizes import GiB, MiB, parse_size

FORMAT = "gpushare-trace/1"
DAY = 86400.0
WORK_START_H = 8.0


@dataclass(frozen=True)
class Session:
    id: str
    user: str
    start: float
    end: float
    memory: str  # a size, as a kernel asks for it
    cells: tuple[tuple[float, float], ...] | None  # (start, duration); None: no cells known

    def busy(self) -> float:
        return sum(duration for _, duration in self.cells or ())


@dataclass(frozen=True)
class Trace:
    name: str
    sessions: tuple[Session, ...]
    skipped: int = 0  # pods left out (several GPUs)

    @property
    def length(self) -> float:
        return max((session.end for session in self.sessions), default=0.0)


# ---- the file format ------------------------------------------------------------------------------


def dump(trace: Trace, path: Path) -> None:
    sessions = [
        {
            "id": s.id,
            "user": s.user,
            "start": round(s.start, 3),
            "end": round(s.end, 3),
            "memory": s.memory,
            "cells": None if s.cells is None else [[round(a, 3), round(d, 3)] for a, d in s.cells],
        }
        for s in trace.sessions
    ]
    path.write_text(json.dumps({"format": FORMAT, "name": trace.name, "sessions": sessions}))


def load(path: Path) -> Trace:
    """A trace file (the format above); a ``.csv`` is read as ``openb_pod_list``."""
    if path.suffix == ".csv":
        return read_openb(path)
    document: Any = json.loads(path.read_text())
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{path} is not a trace of format {FORMAT!r}")
    sessions = []
    for number, item in enumerate(document.get("sessions") or []):
        try:
            cells = item.get("cells")
            session = Session(
                str(item["id"]),
                str(item["user"]),
                float(item["start"]),
                float(item["end"]),
                parse_size(item["memory"]).canonical,
                None if cells is None else tuple((float(a), float(d)) for a, d in cells),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: session {number} is not valid: {error}") from None
        if session.end < session.start:
            raise ValueError(f"{path}: session {session.id} ends before it starts")
        sessions.append(session)
    return Trace(str(document.get("name") or path.stem), tuple(sessions))


def read_openb(path: Path, card_memory: int = 80 * GiB) -> Trace:
    """Pods of an ``openb_pod_list`` CSV as sessions without cells (see the module's text)."""
    sessions: list[Session] = []
    skipped = 0
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        missing = {"name", "num_gpu", "creation_time", "deletion_time"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"{path} has no {', '.join(sorted(missing))} column: not a list of when pods ran "
                "(the openb multigpu lists, for one, have no times)"
            )
        rows = list(reader)
    ends = [float(row["deletion_time"]) for row in rows if (row.get("deletion_time") or "").strip()]
    horizon = max(ends, default=0.0)
    for row in rows:
        gpus = int(float(row.get("num_gpu") or 0))
        if gpus == 0:
            continue
        if gpus > 1:
            skipped += 1
            continue
        milli = float(row.get("gpu_milli") or 1000)
        start = float(row["creation_time"])
        deleted = (row.get("deletion_time") or "").strip()
        end = float(deleted) if deleted else horizon
        memory = "whole" if milli >= 1000 else f"{max(256, math.ceil(card_memory * milli / 1000 / MiB))}M"
        sessions.append(Session(row["name"], row.get("qos") or "pods", start, max(start, end), memory, None))
    first = min((s.start for s in sessions), default=0.0)
    shifted = tuple(
        Session(s.id, s.user, s.start - first, s.end - first, s.memory, None)
        for s in sorted(sessions, key=lambda s: s.start)
    )
    return Trace(path.stem, shifted, skipped)


# ---- the generator ----------------------------------------------------------------------------------


def _size(rng: random.Random) -> str:
    total = sum(weight for _, weight in SIZE_MIX)
    pick = rng.random() * total
    for size, weight in SIZE_MIX:
        pick -= weight
        if pick <= 0:
            return f"{size}G"
    return f"{SIZE_MIX[-1][0]}G"


def _cells(rng: random.Random, start: float, work_end: float) -> list[tuple[float, float]]:
    """Cells from ``start`` to ``work_end``: runs about a third of the time."""
    cells: list[tuple[float, float]] = []
    at = start + rng.lognormvariate(math.log(30), 1.0)  # the first cell: opening, imports
    while at < work_end:
        duration = min(rng.lognormvariate(math.log(20), 1.6), 4 * 3600)  # a long training cell now and then
        duration = min(duration, max(1.0, work_end - at))
        cells.append((at, duration))
        gap = rng.lognormvariate(math.log(40), 1.2)
        if rng.random() < 0.03:
            gap += rng.uniform(15 * 60, 90 * 60)  # a meeting, lunch
        at += duration + gap
    return cells


@dataclass(frozen=True)
class Shape:
    """How a generated trace's people work (the default: the module's text)."""

    users: int = 60
    kernels_per_user: float = 4.0
    work_sigma: float = 1.2  # lognormal sigma of a session's working part (median 45 min)
    left_on: float = 1 / 12  # share of sessions left on after their work
    left_on_alpha: float = 1.3  # Pareto alpha of how long (from 2 h)
    bursts: int = 0  # per weekday: a class or a deadline, a third of the users start within 2 min


SHAPES = {
    "default": Shape(),
    # Sessions with much heavier tails: a third left on, for far longer.
    "heavy-tail": Shape(work_sigma=1.8, left_on=1 / 3, left_on_alpha=1.05),
    # Three times a weekday a third of the users start a kernel at once.
    "bursts": Shape(bursts=3),
    # Eight people who each start many kernels.
    "few-users": Shape(users=8, kernels_per_user=20.0),
}


def generate(
    seed: int = 1, days: int = 7, users: int | None = None, shape: Shape = SHAPES["default"]
) -> Trace:
    """A seeded trace of ``days`` days (the first a Monday) of ``users`` people's notebooks
    (``shape.users`` unless given)."""
    rng = random.Random(seed)
    users = shape.users if users is None else users
    hours = len(DAY_PROFILE)
    peak, mean = max(DAY_PROFILE), sum(DAY_PROFILE) / hours
    activity = [rng.gammavariate(2.0, 0.5) for _ in range(users)]
    sessions: list[Session] = []

    def add(user: int, start: float) -> None:
        work = min(rng.lognormvariate(math.log(45 * 60), shape.work_sigma), 10 * 3600)
        work_end = start + max(120.0, work)
        end = work_end + rng.lognormvariate(math.log(60), 1.0)  # closing the notebook
        if rng.random() < shape.left_on:  # left on after the work is done
            end = work_end + min(2 * 3600 * rng.paretovariate(shape.left_on_alpha), 3 * DAY)
        number, size = len(sessions), _size(rng)  # drawn before the cells: seeds keep their traces
        cells = tuple(_cells(rng, start, work_end))
        sessions.append(Session(f"u{user:02d}-{number}", f"u{user:02d}", start, end, size, cells))

    for day in range(days):
        weekend = day % 7 >= 5
        for user in range(users):
            rate = (
                shape.kernels_per_user
                * activity[user]
                * (0.15 if weekend else 1.0)
                / (hours * 3600 * mean)
                * peak
            )
            t = 0.0
            while True:
                t += rng.expovariate(rate) if rate > 0 else math.inf
                if t >= hours * 3600:
                    break
                if rng.random() * peak > DAY_PROFILE[int(t // 3600)]:
                    continue
                add(user, day * DAY + WORK_START_H * 3600 + t)
        for _ in range(0 if weekend else shape.bursts):
            at = day * DAY + WORK_START_H * 3600 + rng.uniform(1, 8) * 3600
            for user in rng.sample(range(users), max(1, users // 3)):
                add(user, at + rng.uniform(0, 120))
    sessions.sort(key=lambda session: session.start)
    named = next((name for name, known in SHAPES.items() if known == shape), "custom")
    kind = "" if named == "default" else f", {named}"
    return Trace(f"generated {days}-day trace{kind}, {users} users, seed {seed}", tuple(sessions))


def busy_share(sessions: Iterable[Session]) -> float:
    """Cells' time over the sessions' working time (start to the last cell's end)."""
    busy = worked = 0.0
    for session in sessions:
        if session.cells:
            busy += session.busy()
            last = session.cells[-1]
            worked += last[0] + last[1] - session.start
    return busy / worked if worked else 0.0


__all__ = [
    "FORMAT",
    "SHAPES",
    "Session",
    "Shape",
    "Trace",
    "busy_share",
    "dump",
    "generate",
    "load",
    "read_openb",
]
