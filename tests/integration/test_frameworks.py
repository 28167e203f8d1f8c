"""PyTorch (CPU 2.13) and JAX (CPU) import cleanly in a gpushare kernel: no failure, no warning.

The caps are applied by the import hook; on a CPU build there is no CUDA device, so PyTorch is
left alone and says so in ``%gpu``; JAX is held by the environment the provisioner set.
"""

from __future__ import annotations

import pytest

from ..support.kernels import kernel_manager, run_cell
from ..support.nodes import Node

pytestmark = pytest.mark.integration

IMPORT_BOTH = """
import warnings, logging, io
log_output = io.StringIO()
logging.getLogger().addHandler(logging.StreamHandler(log_output))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import jax, jax.numpy as jnp
    total = float(jnp.ones(4).sum()) + float(torch.ones(4).sum())
print("total", total)
print("warnings", [str(w.message) for w in caught])
print("logged", repr(log_output.getvalue()))
import os
print("jax preallocate", os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"])
"""


async def test_torch_and_jax_import_without_failing_or_warning(node: Node) -> None:
    kernels = kernel_manager()
    try:
        kernel_id = await kernels.start_kernel(kernel_name="python3-gpu-4g")
        kernel = kernels.get_kernel(kernel_id)
        cell = await run_cell(kernel, IMPORT_BOTH, timeout=180)
        assert cell.error is None, cell
        assert cell.stderr == "", cell.stderr
        lines = dict(line.split(" ", 1) for line in cell.stdout.strip().splitlines())
        assert lines["total"] == "8.0"
        assert lines["warnings"] == "[]"
        assert lines["logged"] == "''"
        assert lines["jax"] == "preallocate false"

        status = await run_cell(kernel, "%gpu")
        assert "Cap: torch: no CUDA device (CPU build or no GPU): nothing to cap" in status.result
        assert "Cap: jax: XLA_PYTHON_CLIENT_MEM_FRACTION=0.0406" in status.result
    finally:
        await kernels.shutdown_all(now=True)
