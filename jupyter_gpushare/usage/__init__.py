"""Usage of GPU slices: sampling (NVML or reports), attribution to kernels, the watchdog."""
