"""The CUDA driver's checkpoint calls: the one edge of suspend/resume that we do not own.

``cuCheckpointProcessLock / Checkpoint / Restore / Unlock / GetState`` act on *another*
process, named by its pid: NVIDIA describes them as calls for an external controller, so a kernel
is never checkpointed from inside itself but by a helper process (:mod:`.__main__`) started by
whoever asks (the kernel's own ``%gpu suspend``, its idle timer, or the server that started it).

Two ways in, the first that works: ``cuda.core.checkpoint`` (cuda-python), else ``libcuda.so.1``
through ctypes. Both check the driver's CUDA version first and say which one is needed:

* checkpoint and restore onto the same GPU: the CUDA 12.8 driver API (display driver r570+);
* restore onto another GPU of the same chip: the CUDA 13.1 driver API, the first whose restore
  arguments carry GPU pairs (older drivers restore onto the GPU the state came from only).

``CudaCoreDriver`` ran against a real driver once (an H200, driver 580.159, cuda-core 1.2:
checkpoint and restore on the same GPU, docs/benchmarks.md); ``CtypesDriver`` and the remap have
not. Tests substitute this module's drivers, as they substitute NVML.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Literal, Protocol

ProcessState = Literal["running", "locked", "checkpointed", "failed"]
STATES: tuple[ProcessState, ...] = ("running", "locked", "checkpointed", "failed")

CHECKPOINT_API = 12080  # cuDriverGetVersion() of the first driver with cuCheckpointProcess*
REMAP_API = 13010  # the first whose CUcheckpointRestoreArgs carry GPU pairs

# CUresult values the flows tell apart (cuda.h).
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_TIMEOUT = 909


class DriverError(Exception):
    """A checkpoint call failed; ``str()`` is the driver's word for it (``CUDA_ERROR_TIMEOUT``)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotSupported(DriverError):
    """No driver, or one without the checkpoint API (or without what a call needs)."""


def api_text(version: int) -> str:
    """``12080`` as people write it: ``12.8``."""
    return f"{version // 1000}.{version % 1000 // 10}"


class CheckpointDriver(Protocol):
    """The checkpoint calls, on a process named by its pid."""

    def version(self) -> int:
        """``cuDriverGetVersion()``: 12080 for CUDA 12.8."""

    def state(self, pid: int) -> ProcessState: ...

    def lock(self, pid: int, timeout_ms: int) -> None: ...

    def checkpoint(self, pid: int) -> None: ...

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        """Restore; ``gpu_pairs`` (checkpointed GPU UUID, GPU UUID to restore onto) remap it."""

    def unlock(self, pid: int) -> None: ...


def require(driver: CheckpointDriver, remap: bool = False) -> int:
    """The driver's CUDA version, or :class:`NotSupported` saying which one is needed."""
    version = driver.version()
    needed = REMAP_API if remap else CHECKPOINT_API
    if version < needed:
        what = "restoring GPU state onto another GPU" if remap else "CUDA checkpoint (suspend and resume)"
        raise NotSupported(
            f"{what} needs an NVIDIA driver with the CUDA {api_text(needed)} driver API"
            f"{' (display driver r570 or later)' if not remap else ''}; this driver offers CUDA "
            f"{api_text(version)}"
        )
    return version


# ---- libcuda through ctypes -------------------------------------------------------------------


class _LockArgs(ctypes.Structure):
    _fields_ = (
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    )


class _GpuPair(ctypes.Structure):
    _fields_ = (("oldUuid", ctypes.c_ubyte * 16), ("newUuid", ctypes.c_ubyte * 16))


class _RestoreArgs(ctypes.Structure):
    # 64 bytes in every layout that has GPU pairs (CUDA 13.1 on): the pairs first, the rest zero.
    _fields_ = (
        ("gpuPairs", ctypes.POINTER(_GpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * 52),
    )


def uuid_bytes(uuid: str) -> bytes:
    """``GPU-xxxxxxxx-xxxx-…`` (NVML's form) as the 16 bytes of a ``CUuuid``."""
    text = uuid.removeprefix("GPU-").replace("-", "")
    raw = bytes.fromhex(text)
    if len(raw) != 16:
        raise ValueError(f"not a GPU UUID: {uuid!r}")
    return raw


class CtypesDriver:
    """``libcuda.so.1`` directly: the checkpoint entry points of the installed driver."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._cuda: Any = ctypes.CDLL(library)
        except OSError as error:
            raise NotSupported(f"the NVIDIA driver library cannot be loaded ({error})") from None
        self._version = self._read_version()
        if self._version >= CHECKPOINT_API:
            self._call("cuInit", ctypes.c_uint(0))

    def _read_version(self) -> int:
        version = ctypes.c_int(0)
        self._call("cuDriverGetVersion", ctypes.byref(version))
        return int(version.value)

    def _call(self, name: str, *args: Any) -> None:
        function = getattr(self._cuda, name, None)
        if function is None:
            raise NotSupported(f"this NVIDIA driver has no {name}")
        result = int(function(*args))
        if result != 0:
            raise self._error(name, result)

    def _error(self, name: str, result: int) -> DriverError:
        text = ctypes.c_char_p()
        getter = getattr(self._cuda, "cuGetErrorName", None)
        if getter is not None and getter(result, ctypes.byref(text)) == 0 and text.value:
            words = text.value.decode()
        else:
            words = f"CUresult {result}"
        kind = NotSupported if result == CUDA_ERROR_NOT_SUPPORTED else DriverError
        return kind(f"{name}: {words}", result)

    def version(self) -> int:
        return self._version

    def state(self, pid: int) -> ProcessState:
        state = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", ctypes.c_int(pid), ctypes.byref(state))
        if not 0 <= state.value < len(STATES):
            raise DriverError(f"cuCheckpointProcessGetState: unknown state {state.value}")
        return STATES[state.value]

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", ctypes.c_int(pid), ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", ctypes.c_int(pid), None)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        if not gpu_pairs:
            self._call("cuCheckpointProcessRestore", ctypes.c_int(pid), None)
            return
        require(self, remap=True)
        pairs = (_GpuPair * len(gpu_pairs))()
        for pair, (old, new) in zip(pairs, gpu_pairs, strict=True):
            ctypes.memmove(pair.oldUuid, uuid_bytes(old), 16)
            ctypes.memmove(pair.newUuid, uuid_bytes(new), 16)
        args = _RestoreArgs(gpuPairs=pairs, gpuPairsCount=len(gpu_pairs))
        self._call("cuCheckpointProcessRestore", ctypes.c_int(pid), ctypes.byref(args))

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", ctypes.c_int(pid), None)


# ---- cuda-python's cuda.core.checkpoint -------------------------------------------------------


class CudaCoreDriver:
    """``cuda.core.checkpoint.Process`` (cuda-python), which checks the bindings and the driver."""

    def __init__(self) -> None:
        from cuda.bindings import driver as bindings  # ImportError: not installed
        from cuda.core import checkpoint  # AttributeError/ImportError: a cuda-core without it

        self._process = checkpoint.Process
        error, version = bindings.cuDriverGetVersion()
        if int(error) != 0:
            raise NotSupported(f"cuDriverGetVersion: {error}")
        self._version = int(version)
        if self._version >= CHECKPOINT_API:
            bindings.cuInit(0)

    def _do(self, action: str, pid: int, *args: Any, **kwargs: Any) -> Any:
        try:
            target = self._process(pid)
            value = getattr(target, action)
            return value(*args, **kwargs) if callable(value) else value
        except Exception as error:  # cuda.core raises RuntimeError or its CUDAError with the words
            text = str(error)
            kind = NotSupported if "not supported" in text.lower() else DriverError
            code = CUDA_ERROR_TIMEOUT if "CUDA_ERROR_TIMEOUT" in text else None
            raise kind(f"cuda.core checkpoint {action}: {text}", code) from None

    def version(self) -> int:
        return self._version

    def state(self, pid: int) -> ProcessState:
        state = str(self._do("state", pid))
        if state not in STATES:
            raise DriverError(f"cuda.core checkpoint state: unknown state {state!r}")
        return state  # type: ignore[return-value]

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._do("lock", pid, timeout_ms=timeout_ms)

    def checkpoint(self, pid: int) -> None:
        self._do("checkpoint", pid)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        if gpu_pairs:
            require(self, remap=True)
        mapping = {old.removeprefix("GPU-"): new.removeprefix("GPU-") for old, new in gpu_pairs}
        self._do("restore", pid, gpu_mapping=mapping or None)

    def unlock(self, pid: int) -> None:
        self._do("unlock", pid)


def load_driver() -> CheckpointDriver:
    """The installed driver's checkpoint calls: cuda.core where it has them, else libcuda."""
    try:
        return CudaCoreDriver()
    except (ImportError, AttributeError):
        pass
    return CtypesDriver()
