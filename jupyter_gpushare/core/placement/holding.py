"""What a kernel still holds on its GPU, in the words every front end shows (pure).

The ledger never offers memory a live process holds: a shrink below what a kernel holds is
refused (or, forced, the held memory stays reserved), and a release keeps what is still held
reserved until it is freed. These sentences carry the numbers and how to free memory; the
ledger, the backend, ``%gpu``, REST and the panel all show the same ones.
"""

from __future__ import annotations

from jupyter_gpushare.core.sizes import format_bytes

FREE_IT = "del the tensors, then torch.cuda.empty_cache() (PyTorch) or free_all_blocks() (CuPy)"

_SOURCES = {
    "nvml": "measured by NVML",
    "simulated": "declared on this simulated pool",
    "kernel": "as the kernel reported it",
}


def source_words(source: str | None) -> str:
    """How a held figure was known, for a sentence: ``measured by NVML``."""
    return _SOURCES.get(source or "", "as last measured")


def shrink_refusal(size: str, memory: int, held: int, source: str | None, device: str) -> str:
    """Why ``size`` (``memory`` bytes) is refused for a kernel holding ``held`` bytes."""
    shown = size if format_bytes(memory) == size else f"{size} ({format_bytes(memory)})"
    return (
        f"{shown} is less than the {format_bytes(held)} this kernel holds on {device} "
        f"({source_words(source)}): nothing was changed. Free memory first ({FREE_IT}) and retry, "
        f"or shrink anyway with %gpu resize {size} --force: the {format_bytes(held)} then stays "
        "reserved as held memory until it is freed"
    )


def forced_note(memory: int, held: int, device: str) -> str:
    """What a forced shrink below the held memory leaves reserved."""
    return (
        f"The slice is {format_bytes(memory)}, but this kernel still holds {format_bytes(held)} on "
        f"{device}: the ledger keeps {format_bytes(held)} reserved until it is freed ({FREE_IT})."
    )


def released_note(memory: int, held: int, source: str | None, device: str) -> str:
    """What a release says: what was given back, and what stays reserved as held."""
    if held <= 0:
        return f"Released {format_bytes(memory)}."
    return (
        f"Released the {format_bytes(memory)} slice, but this kernel still holds "
        f"{format_bytes(held)} on {device} ({source_words(source)}; a CUDA context alone takes a "
        "few hundred MiB): it stays reserved as held memory until it is freed. Free it with "
        f"{FREE_IT}, give it all back with %gpu suspend, or restart the kernel."
    )
