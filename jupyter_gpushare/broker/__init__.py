"""``jupyter gpushare broker``: the one process that holds authority when several people share GPUs.

It alone opens the node ledger (local backend; the file is its user's, mode 0600) or holds the
cluster credentials (Kubernetes backend: it alone creates and deletes kernel pods and Secrets, and
runs the one list+watch). Users' servers, consoles, ``status`` and ``%gpu`` reach it through
:class:`~jupyter_gpushare.backends.broker_client.backend.RemoteBackend`; it identifies each caller —
the peer's OS user on its Unix socket (:mod:`jupyter_gpushare.backends.broker_base.identity`), the
JupyterHub user of the presented token over HTTP — and answers the same service API as the backends,
scoped to that caller. It is only a front door: the decisions are the backends'
(:mod:`jupyter_gpushare.backends`), made once for everyone.

Modules: :mod:`.settings` (where it reads its settings), :mod:`.routes` (the routes every
kind serves), :mod:`.usage_routes` (the accounting), :mod:`.door` (connection limits),
:mod:`.app` (listening and running). What it builds on — who calls, the authority, the routes'
base, a kind's side — is :mod:`jupyter_gpushare.backends.broker_base`; a kind's own routes and
authority are in the kind's package (``backends/local/broker/``,
``backends/kubernetes/broker/``), found through the registry.
"""
