"""Started as its own OS process by the concurrency test: starts N kernels at once.

Each kernel is started concurrently (asyncio.gather), held briefly, then shut down, so the
queued requests of both processes get their turn. Exits non-zero if any start failed.
"""

from __future__ import annotations

import asyncio
import os
import sys

from jupyter_client.multikernelmanager import AsyncMultiKernelManager


async def start_hold_stop(kernels: AsyncMultiKernelManager, kernel_name: str) -> None:
    kernel_id = await kernels.start_kernel(kernel_name=kernel_name)
    await asyncio.sleep(0.3)
    await kernels.shutdown_kernel(kernel_id, now=True)


async def main(kernel_name: str, count: int) -> None:
    # Connection files in the test's runtime directory, not the current one (kernels.kernel_manager).
    kernels = AsyncMultiKernelManager(connection_dir=os.environ["JUPYTER_RUNTIME_DIR"])
    await asyncio.gather(*(start_hold_stop(kernels, kernel_name) for _ in range(count)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
