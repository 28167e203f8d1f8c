"""Holding PyTorch, TensorFlow, JAX and CuPy to the kernel's slice, applied when first imported.

JAX, CuPy and TensorFlow read the environment the provisioner set; PyTorch has no such variable,
and TensorFlow's growth setting does not limit, so an import hook calls their own APIs right
after the module finishes importing — before any user code can allocate. A framework without a
usable CUDA device (a CPU build, a machine without a GPU) is left alone, silently.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.framework_budget import framework_budget

log = logging.getLogger("jupyter_gpushare.kernel")


@dataclass(frozen=True)
class CapResult:
    """What applying a cap did, in words for ``%gpu status``."""

    framework: str
    applied: bool
    detail: str


def slice_bytes() -> int | None:
    value = os.environ.get(env_names.MEMORY_BYTES)
    return int(value) if value and value.isdigit() else None


# ---- one applier per framework -------------------------------------------------------------


def cap_torch(torch: Any, memory: int) -> CapResult:
    cuda = torch.cuda
    if not cuda.is_available():
        return CapResult("torch", False, "no CUDA device (CPU build or no GPU): nothing to cap")
    total = int(cuda.get_device_properties(0).total_memory)
    fraction = min(1.0, framework_budget(memory) / total)
    cuda.set_per_process_memory_fraction(fraction, 0)
    return CapResult("torch", True, f"per-process memory fraction {fraction:.4f} of device 0")


def cap_cupy(cupy: Any, memory: int) -> CapResult:
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return CapResult("cupy", False, "no CUDA device: nothing to cap")
    except Exception as error:  # CuPy raises its own CUDARuntimeError without a driver
        return CapResult("cupy", False, f"no CUDA device ({type(error).__name__}): nothing to cap")
    budget = framework_budget(memory)
    cupy.get_default_memory_pool().set_limit(size=budget)
    return CapResult("cupy", True, f"default memory pool limited to {budget} bytes")


def cap_tensorflow(tf: Any, memory: int) -> CapResult:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return CapResult("tensorflow", False, "no GPU visible to TensorFlow: nothing to cap")
    limit_mib = memory // (1024 * 1024)
    try:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)]
        )
    except RuntimeError as error:  # the GPU was initialised before the hook ran
        return CapResult("tensorflow", False, f"could not cap ({error}); restart the kernel")
    return CapResult("tensorflow", True, f"logical device memory_limit {limit_mib} MiB")


def cap_jax(jax: Any, memory: int) -> CapResult:
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if fraction is None:
        return CapResult("jax", False, "XLA_PYTHON_CLIENT_MEM_FRACTION is not set")
    return CapResult("jax", True, f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} (read at backend start)")


Applier = Callable[[Any, int], CapResult]

APPLIERS: dict[str, Applier] = {
    "torch": cap_torch,
    "cupy": cap_cupy,
    "tensorflow": cap_tensorflow,
    "jax": cap_jax,
}

# Frameworks whose cap follows a resize in a running kernel; the others need a restart.
LIVE_RESIZABLE = frozenset({"torch", "cupy"})

_results: dict[str, CapResult] = {}


def results() -> dict[str, CapResult]:
    """What was applied to each framework imported so far."""
    return dict(_results)


def apply(name: str, module: ModuleType | Any) -> CapResult | None:
    """Cap ``module`` to the slice; never raises, so an import can never fail because of us."""
    memory = slice_bytes()
    if memory is None:
        return None
    try:
        result = APPLIERS[name](module, memory)
    except Exception as error:  # a framework's own failure must not break the user's import
        result = CapResult(name, False, f"could not apply the cap: {type(error).__name__}: {error}")
        log.debug("GPU cap for %s failed", name, exc_info=True)
    _results[name] = result
    if name == "torch" and result.applied:
        _explain_out_of_memory(module, memory)
    return result


def _explain_out_of_memory(torch: Any, memory: int) -> None:
    """After PyTorch's out-of-memory traceback, say that the slice is the limit and how to grow it."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    error_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if shell is None or error_type is None:
        return

    def explain(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        gib = memory / 1024**3
        print(
            f"GPU slice: PyTorch in this kernel is capped to its {gib:.1f} GiB slice; "
            "free tensors or grow the slice with %gpu resize.",
            file=sys.stderr,
        )

    shell.set_custom_exc((error_type,), explain)


def reapply_imported() -> list[CapResult]:
    """After a resize: apply again to the imported frameworks that allow it."""
    applied = []
    for name in sorted(LIVE_RESIZABLE):
        module = sys.modules.get(name)
        if module is not None:
            result = apply(name, module)
            if result is not None:
                applied.append(result)
    return applied


def free_caches() -> list[str]:
    """Give back what imported frameworks cache but no tensor uses (PyTorch's caching allocator,
    CuPy's memory pools), before a shrink, release or suspend measures what the kernel holds.

    Called by the kernel's own slice; never raises: a framework that cannot free says why.
    """
    freed: list[str] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                freed.append("torch: emptied the CUDA caching allocator")
        except Exception as error:  # a broken CUDA setup must not break the magic
            freed.append(f"torch: could not empty its cache ({type(error).__name__}: {error})")
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
            freed.append("cupy: freed its memory pools' unused blocks")
        except Exception as error:
            freed.append(f"cupy: could not free its pools ({type(error).__name__}: {error})")
    return freed


def imported_needing_restart() -> list[str]:
    """Imported frameworks whose cap cannot change without restarting the kernel."""
    return sorted(name for name in APPLIERS if name not in LIVE_RESIZABLE and name in sys.modules)


# ---- the import hook -----------------------------------------------------------------------


class _CappingLoader(importlib.abc.Loader):
    """Wraps a framework's loader: imports it as usual, then applies the cap."""

    def __init__(self, name: str, loader: Any) -> None:
        self._name = name
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        apply(self._name, module)

    def __getattr__(self, attribute: str) -> Any:
        # Resource readers, get_code, is_package…: whatever else the real loader offers.
        return getattr(self._loader, attribute)


class CapOnImport(importlib.abc.MetaPathFinder):
    """A meta path finder that only wraps the loaders of the frameworks we cap."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in APPLIERS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CappingLoader(fullname, spec.loader)
                return spec
        return None


def install_import_hook() -> None:
    """Cap frameworks imported from now on, and those already imported."""
    if not any(isinstance(finder, CapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, CapOnImport())
    for name, module in list(sys.modules.items()):
        if name in APPLIERS and name not in _results:
            apply(name, module)


def descriptions() -> list[str]:
    """What was applied to each framework imported so far, as ``%gpu`` lists it."""
    return [f"{result.framework}: {result.detail}" for result in results().values()]
