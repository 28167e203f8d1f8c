"""The broker's side of the Kubernetes backend: it holds the cluster credentials and the one
list+watch, creates the kernel pods (:mod:`.pods`), serves their routes (:mod:`.pod_routes`) and
keeps their accounting (:mod:`.pod_accounting`)."""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpushare.backends.broker_base.side import Route
from jupyter_gpushare.backends.kubernetes.backend import KubernetesBackend
from jupyter_gpushare.backends.kubernetes.broker import pod_routes
from jupyter_gpushare.backends.kubernetes.broker.authority import KubernetesAuthority
from jupyter_gpushare.backends.kubernetes.broker.pod_accounting import PodAccounting
from jupyter_gpushare.backends.kubernetes.broker.pods import PodStarts
from jupyter_gpushare.backends.protocol import ServerHooks
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.config.broker import GPUShareBroker


class KubernetesSide:
    routes: Sequence[Route] = tuple(pod_routes.ROUTES)

    def prepare(self, settings: GPUShare) -> None:
        """Nothing to settle: the cluster is found through the kubeconfig or the service account."""

    def authority(self, settings: GPUShare, broker: GPUShareBroker) -> KubernetesAuthority:
        backend = KubernetesBackend(settings)
        backend.attach_server(ServerHooks())  # the one list+watch of the cluster, in the broker
        # Every scoped copy of the backend answers GET usage from it, as its caller may see.
        accounting = PodAccounting(broker.effective_accounting_path(), lambda: backend.settings)
        backend.accounts = accounting
        pods = PodStarts(backend, orphan_grace=broker.orphan_grace, accounting=accounting)
        backend.expected_starts = pods.expected_starts  # the kernel views of Kueue's waiting pods
        return KubernetesAuthority(backend, pods)


SIDE = KubernetesSide()

__all__ = ["SIDE", "KubernetesSide"]
