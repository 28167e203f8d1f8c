"""The checkpoint helper: ``python -m jupyter_gpushare.backends.local.checkpoint
suspend|resume|version --pid N``.

The driver's checkpoint calls are made by a process other than the kernel they act on, so the
backend runs this small program (:class:`~.runner.HelperRunner`) whether a kernel suspends itself
or its server suspends it. It prints one JSON object — :class:`~.flows.Result` (``version``:
``{"version": N}``) — and exits 0; a non-zero exit is a crash, reported as such by the caller.
"""

from __future__ import annotations

import argparse
import json
import sys

from jupyter_gpushare.backends.local.checkpoint.driver import CheckpointDriver, DriverError, load_driver
from jupyter_gpushare.backends.local.checkpoint.flows import Result, resume_process, suspend_process


def _driver(simulated: str | None) -> CheckpointDriver:
    if simulated:
        from jupyter_gpushare.backends.local.checkpoint.simulated import SimulatedDriver

        return SimulatedDriver(simulated)
    return load_driver()


def _pair(text: str) -> tuple[str, str]:
    old, separator, new = text.partition("=")
    if not separator or not old or not new:
        raise argparse.ArgumentTypeError(f"a GPU pair is OLD_UUID=NEW_UUID, not {text!r}")
    return old, new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpushare.backends.local.checkpoint")
    parser.add_argument("action", choices=("suspend", "resume", "version"))
    parser.add_argument("--pid", type=int, default=0)
    parser.add_argument("--lock-timeout-ms", type=int, default=10_000)
    parser.add_argument("--pair", type=_pair, action="append", default=[], help="OLD_UUID=NEW_UUID")
    parser.add_argument("--simulated", metavar="STATE_DIR", help="a simulated pool's driver")
    arguments = parser.parse_args(argv)
    answer: dict[str, object]
    try:
        driver = _driver(arguments.simulated)
    except DriverError as error:
        answer = Result(False, reason=str(error), unsupported=True).as_json()
    else:
        if arguments.action == "version":
            answer = {"version": driver.version()}
        elif arguments.pid <= 0:
            parser.error("--pid must name the process")
        elif arguments.action == "suspend":
            answer = suspend_process(driver, arguments.pid, arguments.lock_timeout_ms).as_json()
        else:
            answer = resume_process(driver, arguments.pid, arguments.pair).as_json()
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
