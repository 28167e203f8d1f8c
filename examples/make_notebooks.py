"""Writes the example notebooks (run: python examples/make_notebooks.py). Kept as code so the
notebooks stay small, reviewable and identical to what the tests execute."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

# "Python 3 (GPU)": the kernelspec `make demo` and Binder install (`jupyter gpushare kernelspec
# install`); JupyterLab asks for its size when the notebook opens.
KERNEL = {"name": "python3-gpu", "display_name": "Python 3 (GPU)", "language": "python"}

# PyTorch is large (the CUDA build is gigabytes): `make demo` leaves it out, and the PyTorch
# notebook installs it into its kernel's environment the first time it runs, if it is missing,
# from the index pip is set up to use. Where it cannot be had, the notebook says so in one line
# and skips its training loop instead of failing on `import torch`.
TORCH_IF_MISSING = """# PyTorch is not part of `make demo` (it is large): installed here, once, if it is missing,
# from the package index pip uses (PyPI unless pip is configured otherwise).
import importlib
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("torch") is None:
    print("Installing PyTorch into this kernel's environment (once; it is large)...", flush=True)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-color", "torch"],
        capture_output=True,
        text=True,
    )
    importlib.invalidate_caches()
have_torch = importlib.util.find_spec("torch") is not None
if not have_torch:
    why = (pip.stderr.strip().splitlines() or [f"pip exited with status {pip.returncode}"])[-1]
    print(f"PyTorch could not be installed ({why.removeprefix('ERROR: ')}): the training loop below is skipped.")"""

TRAINING_LOOP = """if have_torch:
    import torch

    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    torch.manual_seed(0)
    x = torch.randn(512, 8, device=device)
    true_w = torch.arange(8, dtype=torch.float32, device=device)
    y = x @ true_w + 0.01 * torch.randn(512, device=device)
    model = torch.nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(200):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
        loss.backward()
        optimizer.step()
    print(f'device={device} final loss={loss.item():.4f}')
    assert loss.item() < 0.01"""

NOTEBOOKS = {
    "01-choose-a-size.ipynb": [
        new_markdown_cell(
            "# Choosing a GPU size\n\nThis notebook runs on the **Python 3 (GPU)** kernel. When it "
            "opened, JupyterLab asked for the size of its GPU slice (2G, 4G, 8G, 16G, a whole card or "
            "a size of your own), showing which sizes fit now and where; run under nbclient or "
            "papermill, it gets `GPUShare.default_memory` (4G). Change the size from here with "
            "`%gpu resize` — no restart needed unless JAX or TensorFlow are imported — or pick "
            "another one at the next start (*Kernel › Change Kernel…*).\n\n"
            "The documentation: [docs/index.md](../../docs/index.md) in this repository (the site: `make docs`)."
        ),
        new_code_cell("%gpu"),
        new_markdown_cell(
            "The whole pool: reserved and used memory on every card. Other users' slices "
            "show only as reserved memory."
        ),
        new_code_cell("%gpu pool"),
        new_code_cell(
            "import os\n"
            "print('visible device:', os.environ['CUDA_VISIBLE_DEVICES'])\n"
            "print('slice bytes:', os.environ['JUPYTER_GPUSHARE_MEMORY_BYTES'])"
        ),
    ],
    "02-magics-and-resize.ipynb": [
        new_markdown_cell(
            "# Growing, shrinking and releasing the slice\n\nEvery change goes through the "
            "node ledger, so it is refused with the reason when the card is full."
        ),
        new_code_cell("%gpu resize 8G"),
        new_code_cell("%gpu resize 2G"),
        new_markdown_cell("A size the card cannot hold is refused and nothing changes:"),
        new_code_cell("%gpu resize 1000G"),
        new_markdown_cell("Give the GPU back while you read results; the kernel keeps running."),
        new_code_cell("%gpu release"),
        new_code_cell("%gpu request 4G"),
        new_code_cell("from jupyter_gpushare import kernel as gpu\nstatus = gpu.status()\nstatus"),
    ],
    "03-pytorch-under-a-cap.ipynb": [
        new_markdown_cell(
            "# A PyTorch training loop under the cap\n\nWhen `torch` is imported in a gpushare kernel, it is "
            "capped to the slice (`torch.cuda.set_per_process_memory_fraction`). On a machine without a "
            "GPU (or on a simulated pool) the same loop runs on the CPU.\n\n"
            "`make demo` does not install PyTorch; the first cell installs it into this kernel's "
            "environment from your package index if it is missing (once), and where it cannot be "
            "had says so and the training loop is skipped."
        ),
        new_code_cell(TORCH_IF_MISSING),
        new_code_cell(TRAINING_LOOP),
        new_markdown_cell("`%gpu` lists the cap applied to PyTorch (or why none was needed):"),
        new_code_cell("%gpu"),
    ],
    "04-over-limit-warning.ipynb": [
        new_markdown_cell(
            "# When a kernel outgrows its slice\n\nOn a simulated pool a kernel can declare its use, which "
            "drives the same warnings real NVML measurements do. Above 90% of the slice you get a warning; "
            "above 100% the server's `over_limit_action` (warn, interrupt or kill) applies. The cells "
            "below assume a 4G slice: pick 4G when JupyterLab asks."
        ),
        new_code_cell(
            "from jupyter_gpushare import kernel as gpu\n"
            "import time\n"
            "gpu.simulate_usage('5G', utilization=60)  # on a 4G slice\n"
            "time.sleep(3)  # a few sampling rounds"
        ),
        new_code_cell("%gpu"),
        new_code_cell("gpu.simulate_usage('1G')  # back within the slice"),
    ],
}


def write(directory: Path) -> list[Path]:
    written = []
    for name, cells in NOTEBOOKS.items():
        for index, cell in enumerate(cells):
            cell.id = f"{name.split('-')[0]}-{index}"  # stable: a rewrite changes only what changed
        notebook = new_notebook(cells=cells, metadata={"kernelspec": KERNEL})
        path = directory / name
        nbformat.write(notebook, path)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(__file__).parent / "notebooks"):
        print(path)
