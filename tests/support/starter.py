"""Started as its own OS process by the crash tests: starts one gpushare kernel and waits.

Prints ``<kernel_id> <kernel_pid>`` once the kernel is up, then sleeps until killed.
"""

from __future__ import annotations

import asyncio
import sys

from jupyter_client.manager import AsyncKernelManager


async def main(kernel_name: str) -> None:
    manager = AsyncKernelManager(kernel_name=kernel_name)
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    print(manager.kernel_id, manager.provisioner.pid, flush=True)  # type: ignore[union-attr]
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
