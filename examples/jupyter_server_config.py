# An example jupyter_server_config.py for a team GPU box. Copy the lines you need into
# ~/.jupyter/jupyter_server_config.py (or a system-wide config directory). Kernels started
# outside a server (jupyter console, nbclient, papermill) read the same GPUShare section.
c = get_config()  # type: ignore[name-defined]  # noqa: F821

# A simulated pool lets you try everything without a GPU; remove it on a GPU node.
c.GPUShare.simulate = "2xA100-80GB,1xT4-16GB"

c.GPUShare.default_memory = "4G"
c.GPUShare.default_mode = "timeslice"
c.GPUShare.sizes = ["2G", "4G", "8G", "16G", "whole"]

# Reserve at most 1.25 x physical memory: most notebooks use far less than they ask for.
c.GPUShare.overcommit = 1.25
c.GPUShare.max_memory_per_kernel = "40G"
c.GPUShare.max_memory_per_user = "48G"

# Wait in a FIFO queue for up to 10 minutes when the cards are full.
c.GPUShare.when_full = "queue"
c.GPUShare.queue_timeout = 600

# Every server on this node that points here shares one accounting of the cards: a ledger shared
# through a group (docs/admins/team-box.md, "With one shared ledger file"). With the GPU broker,
# set c.GPUShare.broker_url instead and put the limits above in the broker's configuration.
c.GPUShare.ledger_path = "/var/lib/gpushare-team/ledger.sqlite"

# Hard limits need the node's help: a running MPS daemon, or HAMi-core's library.
# c.GPUShare.mps_pipe_directory = "/tmp/nvidia-mps"
# c.GPUShare.libvgpu_path = "/usr/local/vgpu/libvgpu.so"
