"""A jupyter server on the Kubernetes backend: the cluster as its pool, kernel pods as its slices.

A real ``jupyter server`` process talks to Kubernetes' own API server (list + watch, as the
shipped RBAC lets its ServiceAccount) and starts real kernels in pods the real kube-scheduler
binds and the simulated nodes run as local processes (tests/cluster/). What the tests read is what
the panel reads: ``GET pool``, ``GET kernels``, and what ``%gpu`` prints inside a pod kernel.

test_pool.py: the watch, the pool it gives, ``jupyter gpushare status``; test_pod_kernels.py:
kernel pods started, run, resized, refused and reconnected to through the server's REST API;
test_usage_reports.py: the kernel's own routes and HAMi's metrics as sources of use.
"""
