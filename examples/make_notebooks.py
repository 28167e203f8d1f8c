"""Writes the example notebooks (run: python examples/make_notebooks.py). Kept as code so the
notebooks stay small, reviewable and identical to what the tests execute."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

KERNEL = {"name": "python3-gpu-4g", "display_name": "Python 3 (GPU 4G)", "language": "python"}

NOTEBOOKS = {
    "01-choose-a-size.ipynb": [
        new_markdown_cell(
            "# Choosing a GPU size\n\nThis notebook runs on the **Python 3 (GPU 4G)** kernel: a 4 GiB "
            "slice of a shared card. Pick another size in the kernel menu (2G, 8G, 16G, whole card), or "
            "change it from here with `%gpu` — no restart needed unless JAX or TensorFlow are imported.\n\n"
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
            "GPU (or on a simulated pool) the same loop runs on the CPU."
        ),
        new_code_cell(
            "import torch\n"
            "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "torch.manual_seed(0)\n"
            "x = torch.randn(512, 8, device=device)\n"
            "true_w = torch.arange(8, dtype=torch.float32, device=device)\n"
            "y = x @ true_w + 0.01 * torch.randn(512, device=device)\n"
            "model = torch.nn.Linear(8, 1).to(device)\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for _ in range(200):\n"
            "    optimizer.zero_grad()\n"
            "    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "print(f'device={device} final loss={loss.item():.4f}')\n"
            "assert loss.item() < 0.01"
        ),
        new_markdown_cell("`%gpu` lists the cap applied to PyTorch (or why none was needed):"),
        new_code_cell("%gpu"),
    ],
    "04-over-limit-warning.ipynb": [
        new_markdown_cell(
            "# When a kernel outgrows its slice\n\nOn a simulated pool a kernel can declare its use, which "
            "drives the same warnings real NVML measurements do. Above 90% of the slice you get a warning; "
            "above 100% the server's `over_limit_action` (warn, interrupt or kill) applies."
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
        notebook = new_notebook(cells=cells, metadata={"kernelspec": KERNEL})
        path = directory / name
        nbformat.write(notebook, path)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(__file__).parent / "notebooks"):
        print(path)
