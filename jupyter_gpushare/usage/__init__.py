"""Usage of GPU slices: reading NVML, attributing processes to kernels, the watchdog's verdicts.

The sampling loop of local kernels is the local backend's (``backends/monitor.py``).
"""
