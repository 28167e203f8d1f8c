"""What the local kind reads of live GPU use: NVML per device and per process, and which kernel
each process belongs to."""
