"""``jupyter gpushare broker``: the one process that holds authority when several people share GPUs.

It alone opens the node ledger (local backend; the file is its user's, mode 0600) or holds the
cluster credentials (Kubernetes backend: it alone creates and deletes kernel pods and Secrets,
and runs the one list+watch). Users' servers, consoles, ``status`` and ``%gpu`` reach it through
:class:`~jupyter_gpushare.backends.remote.RemoteBackend`; it identifies each caller — the peer's OS
user on its Unix socket (:mod:`.identity`), the JupyterHub user of the presented token over HTTP
— and answers the same service API as the backends, scoped to that caller. It is only a front
door: the decisions are the backends' (:mod:`jupyter_gpushare.backends`), made once for everyone.

Modules: :mod:`.settings` (its traits), :mod:`.identity` (who calls), :mod:`.authority` (the
backend as each caller may use it), :mod:`.handlers` (the service API's routes), :mod:`.slices`
(local kernels' slices), :mod:`.pods` and :mod:`.pod_routes` (kernel pods, one queue for all),
:mod:`.app` (listening and running).
"""
