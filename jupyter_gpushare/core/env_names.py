"""The environment variables jupyter-gpushare reads and writes, named once. Pure.

Three families: what describes one kernel's slice (set by a provisioner for the kernel it
starts), where a kernel pod reaches its server, and ``JUPYTER_GPUSHARE_<TRAIT>`` — any
``c.GPUShare`` trait, which is how a spawner, a test or a provisioner hands settings to a process
that reads no config file.
"""

from __future__ import annotations

PREFIX = "JUPYTER_GPUSHARE_"


def trait_variable(trait: str) -> str:
    """``JUPYTER_GPUSHARE_<TRAIT>``: a ``c.GPUShare`` trait given through the environment."""
    return PREFIX + trait.upper()


# ---- one kernel's slice (docs/admins/configuration.md) -------------------------------------------
KERNEL_ID = "JUPYTER_GPUSHARE_KERNEL_ID"
MODE = "JUPYTER_GPUSHARE_MODE"
DEVICE = "JUPYTER_GPUSHARE_DEVICE"
MEMORY_BYTES = "JUPYTER_GPUSHARE_MEMORY_BYTES"
CORES = "JUPYTER_GPUSHARE_CORES"
TOKEN = "JUPYTER_GPUSHARE_TOKEN"  # a local kernel's own-slice secret
TOKEN_FILE = "JUPYTER_GPUSHARE_TOKEN_FILE"  # where a kernel pod's token is mounted (never in env)
REPORT_URL = "JUPYTER_GPUSHARE_REPORT_URL"  # where a kernel pod reports its GPU use

# ---- settings some processes read directly (traits; see config.py) -------------------------------
SIMULATE = trait_variable("simulate")
LEDGER_PATH = trait_variable("ledger_path")
OWNER = trait_variable("owner")
BACKEND = trait_variable("backend")
DEFAULT_MODE = trait_variable("default_mode")
SAMPLE_INTERVAL = trait_variable("sample_interval")
IDLE_RELEASE_AFTER = trait_variable("idle_release_after")
IDLE_ACTION = trait_variable("idle_action")
IDLE_POD_RESTART = trait_variable("idle_pod_restart")
MAX_MEMORY_PER_USER = trait_variable("max_memory_per_user")
BROKER_URL = trait_variable("broker_url")
GPU_SIZE = "JUPYTER_GPUSHARE_GPU_SIZE"  # the size a JupyterHub profile picked for a user's server

# Variables that describe one kernel's slice. A server started inside a gpushare kernel inherits
# them; they are dropped before a new kernel gets its own, so no slice leaks into another.
SLICE_VARIABLES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        KERNEL_ID,
        MODE,
        DEVICE,
        MEMORY_BYTES,
        CORES,
        TOKEN,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "CUPY_GPU_MEMORY_LIMIT",
        "TF_FORCE_GPU_ALLOW_GROWTH",
    }
)
