"""The broker's authority over the cluster: the Kubernetes backend as each user's server may use it."""

from __future__ import annotations

from jupyter_gpushare.backends.broker_base.identity import Caller
from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend
from jupyter_gpushare.backends.kubernetes.broker.orphans import collect_orphans
from jupyter_gpushare.backends.kubernetes.broker.pods import PodStarts


class KubernetesAuthority:
    """The cluster, for users' servers anywhere in it."""

    def __init__(self, backend: KubernetesBackend, pods: PodStarts) -> None:
        self.backend = backend
        self.cluster = backend
        self.pods = pods

    def as_seen_by(self, caller: Caller) -> KubernetesBackend:
        accounts = self.backend.accounts
        if caller.groups and accounts is not None:
            accounts.note_groups(caller.user, caller.groups)  # GET usage?by=group
        return self.cluster.scoped(caller.user, caller.server_id, caller.viewer)

    def owner_of(self, kernel_id: str) -> str | None:
        return self.pods.owner_of(kernel_id)

    def kernel_of(self, caller: Caller) -> str | None:
        return None  # HTTP callers: a server (kernel pods talk to their server, not the broker)

    def housekeeping(self) -> None:
        collect_orphans(self.pods)
        self.pods.account()


__all__ = ["KubernetesAuthority"]
