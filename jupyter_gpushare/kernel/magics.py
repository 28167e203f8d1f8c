"""``%gpu``: show, grow, shrink, release, suspend and resume this kernel's slice without leaving
the notebook."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class

USAGE = """%gpu [status]                         this kernel's slice, use and warnings
%gpu pool                             every device: reserved, used, free
%gpu request SIZE [--mode M] [--cores N]   take a slice (e.g. 8G)
%gpu resize SIZE [--restart] [--force]   grow or shrink the slice in place (--force: below
                                      what the kernel holds, which then stays reserved)
%gpu release                          give the slice back; the kernel keeps running
%gpu suspend                          move the GPU state to host memory, free the slice
%gpu resume                           wait for a slice and restore the GPU state
%gpu watch                            a live view of the slice"""


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never exit the kernel on a typo
        raise _ArgumentError(message)


def _cores(text: str) -> int:
    """A whole number in the digits 0-9 (``int()`` alone reads other scripts' digits too)."""
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"a whole number in the digits 0-9, not {text!r}")
    return int(text)


COMMANDS = ("status", "pool", "request", "resize", "release", "suspend", "resume", "watch", "help")


def mistake(words: list[str], error: str) -> str:
    """One line for a %gpu line the parser refused: what is wrong, and where the usage is."""
    if words and words[0] not in COMMANDS:
        return f"%gpu: there is no command {words[0]!r}; the commands: {', '.join(COMMANDS)} (%gpu help)"
    where = f"%gpu {words[0]}" if words else "%gpu"
    if _spaced_size(words):
        # "%gpu resize 4 G": the parser sees a stray "G"; the person meant a size.
        size = f"{words[1]} {words[2]}"
        error = f"GPU size {size!r} has a space inside; write {words[1]}{words[2]}"
    return f"{where}: {error} (%gpu help shows the usage)"


def _parser() -> _Parser:
    # The installed modes are read at the first %gpu, not when every kernel loads this module.
    from jupyter_gpushare.core.modes import mode_names

    parser = _Parser(prog="%gpu", add_help=False)
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)
    commands.add_parser("status")
    commands.add_parser("pool")
    request = commands.add_parser("request")
    request.add_argument("size")
    request.add_argument("--mode", choices=mode_names())
    request.add_argument("--cores", type=_cores)
    resize = commands.add_parser("resize")
    resize.add_argument("size")
    resize.add_argument("--restart", action="store_true")
    resize.add_argument("--force", action="store_true")
    commands.add_parser("release")
    commands.add_parser("suspend")
    commands.add_parser("resume")
    commands.add_parser("watch")
    commands.add_parser("help")
    return parser


def _spaced_size(words: list[str]) -> bool:
    """Whether a size was written with a space before its unit (``4 G``, ``0.5 GiB``, ``25 %``)."""
    return (
        len(words) >= 3
        and words[0] in ("request", "resize")
        and re.fullmatch(r"[0-9]*\.?[0-9]+", words[1]) is not None
        and re.fullmatch(r"(?i:g|gb|gib|m|mb|mib)|%", words[2]) is not None
    )


def _sizes_last(words: list[str]) -> list[str]:
    """Let ``%gpu resize -1G`` reach the size check instead of reading as an unknown option."""
    if len(words) >= 2 and words[0] in ("request", "resize") and re.match(r"^-[\d.]", words[1]):
        return [words[0], *words[2:], "--", words[1]]
    return words


@magics_class
class GPUMagics(Magics):  # type: ignore[misc]
    @line_magic  # type: ignore[untyped-decorator]
    def gpu(self, line: str) -> Any:
        """Manage this kernel's GPU slice. Run ``%gpu help`` for the commands."""
        try:
            words = shlex.split(line)
        except ValueError as error:  # an unclosed quote
            print(f"%gpu: {error} (%gpu help shows the usage)", file=sys.stderr)
            return None
        try:
            arguments = _parser().parse_args(_sizes_last(words))
        except (_ArgumentError, ValueError) as error:
            print(mistake(words, str(error)), file=sys.stderr)
            return None
        command = arguments.command or "status"
        from jupyter_gpushare.core.errors import GPUShareError
        from jupyter_gpushare.core.sizes import SizeError
        from jupyter_gpushare.kernel import api

        try:
            if command == "status":
                return api.status()
            if command == "pool":
                return api.pool()
            if command == "request":
                return api.request(arguments.size, arguments.mode, arguments.cores)
            if command == "resize":
                return api.resize(arguments.size, restart=arguments.restart, force=arguments.force)
            if command == "release":
                return api.release()
            if command == "suspend":
                return api.suspend()
            if command == "resume":
                return api.resume()
            if command == "watch":
                return api.watch()
            print(USAGE)
            return None
        except (GPUShareError, SizeError) as error:
            # A clear sentence, no traceback: nothing was changed.
            print(f"%gpu {command}: {error}", file=sys.stderr)
            return None
