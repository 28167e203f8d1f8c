"""What the tests share, in one place: the tests' own tools, not tests.

- ``polling``: waiting for a state with a deadline (``wait_until``, ``async_wait_until``), the
  one way a test or benchmark waits (tests/unit/test_polling.py rejects a wait loop without one).
- ``json_http``: one JSON call over HTTP, status and body, never an exception for an error status.
- ``nodes``: a simulated node (isolated Jupyter directories, a simulated pool, its own ledger,
  kernelspecs) and the kernel images of the cluster tests.
- ``servers``: a real ``jupyter server`` process, its REST API and a cell run over its websocket.
- ``kernels``: real kernels through jupyter_client, hand-made kernelspecs, processes' ends, and
  the scripts a test starts as OS processes of their own (``starter.py``, ``many_starter.py``).
- ``teambox``: real OS users, a root-held broker and each user's servers as that user.
- ``nvml_sim``: NVML simulated at its C ABI, a ``libnvidia-ml.so.1`` built from C serving a state
  file written from Python, for the real ``pynvml`` and NVIDIA's device plugin.
- ``nvml_fake``, ``checkpoint_fake``: fakes at the edges we do not own (NVML where only a fake
  can answer, the CUDA driver's checkpoint calls).

The test cluster (Kubernetes' own control plane and a simulated node side) is a package of its
own, tests/cluster/; the browser tests' page helpers stay in tests/ui/lab.py.
"""
