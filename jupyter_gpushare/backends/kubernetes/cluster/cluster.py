"""The cluster I/O edge: the few Kubernetes API calls the backend makes, over the official client.

Everything here blocks (the client is synchronous); async callers run it with
``asyncio.to_thread``. Objects come and go as plain dicts shaped as the API sends them
(camelCase), the same shape the pure builders in :mod:`..objects.manifests` produce, so nothing in the
backend depends on the client's generated model classes.

Configuration: an injected ``ApiClient`` or ``Configuration`` (tests point it at an emulator),
else the in-cluster service account, else the kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from jupyter_gpushare.backends.kubernetes.objects import kueue
from jupyter_gpushare.core.errors import BackendUnavailableError

IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# (connect, read) seconds a request waits: an API server that accepts but never answers (frozen,
# behind a dead proxy) fails a call in time instead of holding a kernel start forever.
REQUEST_TIMEOUT = (10.0, 60.0)
# Connections a process's API client keeps open for reuse, at least. The client's default is
# 5 per CPU (10 on 2 cores), fewer than the threads that call the API at once in a busy broker:
# 200 creating kernel pods, up to 5 watches, request threads deleting pods, and housekeeping. A
# call beyond the pool opened a connection (TCP + TLS) and threw it away afterwards ("Connection
# pool is full, discarding connection"). More creating threads only pay once the broker's own
# per-start work is small: 128 of them with a pool of 160 made a burst of 200 starts slower while
# every start read every pod; 96 made it faster once it did not, 200 faster still (one wave for a
# burst of 200; docs/benchmarks.md).
API_CONNECTIONS = 216


class ClusterError(BackendUnavailableError):
    """The Kubernetes API refused or could not be reached; the message says which and why."""

    status = 503

    def __init__(self, message: str, api_status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.api_status = api_status  # HTTP status the API answered, None when unreachable
        self.reason = reason  # the Status object's reason (NotFound, AlreadyExists, Forbidden…)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.api_status, self.reason))


@dataclass(frozen=True)
class ClusterConfig:
    """Where the API is and which namespace the process is in, as discovered."""

    configuration: k8s_client.Configuration
    source: str  # "in-cluster", "kubeconfig" or "injected"
    namespace: str | None  # the service account's or the kubeconfig context's namespace


def load_configuration() -> ClusterConfig:
    """In-cluster config when running in a pod, else the kubeconfig; a clear error when neither."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        pass
    else:
        return ClusterConfig(configuration, "in-cluster", _read(IN_CLUSTER_NAMESPACE_FILE))
    # $KUBECONFIG as it is now: the client reads it once, when first imported.
    config_file = os.environ.get("KUBECONFIG") or None
    try:
        k8s_config.load_kube_config(config_file=config_file, client_configuration=configuration)  # type: ignore[no-untyped-call]
        _, active = k8s_config.list_kube_config_contexts(config_file=config_file)  # type: ignore[no-untyped-call]
    except (k8s_config.ConfigException, OSError, TypeError) as error:
        raise ClusterError(
            "no Kubernetes configuration: this process runs in no cluster and has no kubeconfig "
            f"($KUBECONFIG or ~/.kube/config) ({error})"
        ) from None
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return ClusterConfig(configuration, "kubeconfig", namespace)


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip() or None
    except OSError:
        return None


RESOURCE_GROUP = "resource.k8s.io"  # Dynamic Resource Allocation


class Cluster:
    """Pods, Secrets, events and nodes in one namespace; ResourceClaims, ResourceSlices and
    DeviceClasses of Dynamic Resource Allocation (``resource.k8s.io/v1``)."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        api_client: k8s_client.ApiClient | None = None,
        configuration: k8s_client.Configuration | None = None,
    ) -> None:
        discovered_namespace: str | None = None
        if api_client is None:
            if configuration is None:
                found = load_configuration()
                configuration, discovered_namespace = found.configuration, found.namespace
            configuration.connection_pool_maxsize = max(
                configuration.connection_pool_maxsize or 0, API_CONNECTIONS
            )
            api_client = TimelyApiClient(configuration)
        self.api_client = api_client
        self.core = k8s_client.CoreV1Api(api_client)
        self.resource = k8s_client.ResourceV1Api(api_client)
        self.namespace = namespace or discovered_namespace or "default"
        self.host = str(api_client.configuration.host)

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]

    # ---- Secrets and pods -------------------------------------------------------------------

    def create_secret(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            f"create Secret {body['metadata']['name']}",
            lambda: self.core.create_namespaced_secret(self.namespace, body, _preload_content=False),  # type: ignore[arg-type]
        )

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            f"create pod {body['metadata']['name']}",
            lambda: self.core.create_namespaced_pod(self.namespace, body, _preload_content=False),  # type: ignore[arg-type]
        )

    def read_pod(self, name: str) -> dict[str, Any] | None:
        """The pod, or None when there is none of that name."""
        return self._call_or_none(
            f"read pod {name}",
            lambda: self.core.read_namespaced_pod(name, self.namespace, _preload_content=False),
        )

    def delete_pod(self, name: str, grace_period_seconds: int | None = None) -> bool:
        """Delete a pod; False when it was already gone. Grace 0 deletes at once (SIGKILL)."""
        options: dict[str, Any] = {}
        if grace_period_seconds is not None:
            options["grace_period_seconds"] = grace_period_seconds
        found = self._call_or_none(
            f"delete pod {name}",
            lambda: self.core.delete_namespaced_pod(name, self.namespace, _preload_content=False, **options),
        )
        return found is not None

    def delete_secret(self, name: str) -> bool:
        """Delete a Secret; False when it was already gone."""
        found = self._call_or_none(
            f"delete Secret {name}",
            lambda: self.core.delete_namespaced_secret(name, self.namespace, _preload_content=False),
        )
        return found is not None

    def pod_log(self, name: str, container: str = "kernel", tail_lines: int = 20) -> str:
        """The last lines a container wrote; empty when there are none (yet, or any more)."""
        try:
            response = self.core.read_namespaced_pod_log(
                name, self.namespace, container=container, tail_lines=tail_lines, _preload_content=False
            )
        except ApiException as error:
            if error.status in (400, 404):  # not started, or gone
                return ""
            raise self._error(f"read the log of pod {name}", error) from None
        except (HTTPError, OSError) as error:
            raise ClusterError(
                f"cannot reach the Kubernetes API at {self.host}: {unreachable(error)}."
            ) from None
        data = getattr(response, "data", b"")  # typed str, but unread (_preload_content=False)
        return bytes(data or b"").decode(errors="replace")

    def list_pods(self, label_selector: str) -> list[dict[str, Any]]:
        listed = self._call(
            "list pods",
            lambda: self.core.list_namespaced_pod(
                self.namespace, label_selector=label_selector, _preload_content=False
            ),
        )
        return list(listed.get("items") or [])

    def list_secrets(self, label_selector: str) -> list[dict[str, Any]]:
        listed = self._call(
            "list Secrets",
            lambda: self.core.list_namespaced_secret(
                self.namespace, label_selector=label_selector, _preload_content=False
            ),
        )
        return list(listed.get("items") or [])

    def pod_events(self, pod: str) -> list[dict[str, Any]]:
        """Events about one pod (scheduler, kubelet), oldest first."""
        listed = self._call(
            "list events",
            lambda: self.core.list_namespaced_event(
                self.namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
                _preload_content=False,
            ),
        )
        return sorted(listed.get("items") or [], key=event_time)

    def list_workloads(self, label_selector: str, version: str) -> list[dict[str, Any]]:
        """Kueue's Workloads (``kueue.x-k8s.io/<version>``) in the namespace that match."""
        custom = k8s_client.CustomObjectsApi(self.api_client)
        listed = self._call(
            "list Kueue Workloads",
            lambda: custom.list_namespaced_custom_object(
                kueue.GROUP,
                version,
                self.namespace,
                kueue.WORKLOADS,
                label_selector=label_selector,
                _preload_content=False,
            ),
        )
        return list(listed.get("items") or [])

    def local_queue(self, name: str, version: str) -> dict[str, Any]:
        """Kueue's LocalQueue ``name`` in the namespace (``kueue.x-k8s.io/<version>``)."""
        custom = k8s_client.CustomObjectsApi(self.api_client)
        return self._call(
            f"read Kueue LocalQueue {name}",
            lambda: custom.get_namespaced_custom_object(
                kueue.GROUP, version, self.namespace, kueue.LOCAL_QUEUES, name, _preload_content=False
            ),
        )

    def cluster_queue(self, name: str, version: str) -> dict[str, Any]:
        """Kueue's ClusterQueue ``name`` (cluster-scoped; ``kueue.x-k8s.io/<version>``)."""
        custom = k8s_client.CustomObjectsApi(self.api_client)
        return self._call(
            f"read Kueue ClusterQueue {name}",
            lambda: custom.get_cluster_custom_object(
                kueue.GROUP, version, kueue.CLUSTER_QUEUES, name, _preload_content=False
            ),
        )

    def pending_workloads(self, local_queue: str, version: str) -> list[dict[str, Any]]:
        """The Workloads waiting in LocalQueue ``local_queue``, in order, from Kueue's visibility
        API (``visibility.kueue.x-k8s.io/<version>``; served where Kueue's VisibilityOnDemand is
        on): each with its positions in the LocalQueue and its ClusterQueue."""
        path = (
            f"/apis/{kueue.VISIBILITY_GROUP}/{version}/namespaces/{{namespace}}/localqueues/{{name}}"
            "/pendingworkloads"
        )
        client = self.api_client

        def read() -> Any:
            request = client.param_serialize(  # the generated client has no call for a subresource here
                "GET",
                path,
                path_params={"namespace": self.namespace, "name": local_queue},
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = client.call_api(*request)
            response.read()  # type: ignore[no-untyped-call]
            if not 200 <= response.status <= 299:
                body = (response.data or b"").decode("utf-8", errors="replace")
                raise ApiException.from_response(http_resp=response, body=body, data=None)
            return response

        listed = self._call(f"read LocalQueue {local_queue}'s pending workloads", read)
        return list(listed.get("items") or [])

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node (needs a ClusterRole: nodes are cluster-scoped)."""
        listed = self._call("list nodes", lambda: self.core.list_node(_preload_content=False))
        return list(listed.get("items") or [])

    # ---- Dynamic Resource Allocation ----------------------------------------------------------

    def create_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            f"create ResourceClaim {body['metadata']['name']}",
            lambda: self.resource.create_namespaced_resource_claim(
                self.namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
            ),
        )

    def read_claim(self, name: str) -> dict[str, Any] | None:
        """The ResourceClaim, or None when there is none of that name."""
        return self._call_or_none(
            f"read ResourceClaim {name}",
            lambda: self.resource.read_namespaced_resource_claim(
                name, self.namespace, _preload_content=False
            ),
        )

    def delete_claim(self, name: str) -> bool:
        """Delete a ResourceClaim; False when it was already gone."""
        found = self._call_or_none(
            f"delete ResourceClaim {name}",
            lambda: self.resource.delete_namespaced_resource_claim(
                name, self.namespace, _preload_content=False
            ),
        )
        return found is not None

    def list_claims(self, label_selector: str) -> list[dict[str, Any]]:
        listed = self._call(
            "list ResourceClaims",
            lambda: self.resource.list_namespaced_resource_claim(
                self.namespace, label_selector=label_selector, _preload_content=False
            ),
        )
        return list(listed.get("items") or [])

    def list_all_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim of every namespace (needs a ClusterRole)."""
        listed = self._call(
            "list ResourceClaims in all namespaces",
            lambda: self.resource.list_resource_claim_for_all_namespaces(_preload_content=False),
        )
        return list(listed.get("items") or [])

    def list_resource_slices(self) -> list[dict[str, Any]]:
        """Every ResourceSlice: the devices DRA drivers publish, per node (cluster-scoped)."""
        listed = self._call(
            "list ResourceSlices", lambda: self.resource.list_resource_slice(_preload_content=False)
        )
        return list(listed.get("items") or [])

    def list_device_classes(self) -> list[dict[str, Any]]:
        listed = self._call(
            "list DeviceClasses", lambda: self.resource.list_device_class(_preload_content=False)
        )
        return list(listed.get("items") or [])

    def resource_api_versions(self) -> list[str]:
        """The versions of ``resource.k8s.io`` the API serves, preferred first (empty: none)."""
        groups = self._call(
            "list API groups",
            lambda: k8s_client.ApisApi(self.api_client).get_api_versions(_preload_content=False),
        )
        for group in groups.get("groups") or []:
            if group.get("name") == RESOURCE_GROUP:
                preferred = (group.get("preferredVersion") or {}).get("version")
                versions = [str(item.get("version")) for item in group.get("versions") or []]
                return sorted(versions, key=lambda version: version != preferred)
        return []

    def allowed(self, verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        """Whether this client may ``verb`` ``resource`` (its ``subresource``) in the namespace
        (a SelfSubjectAccessReview); False where the API cannot say."""
        attributes = {"namespace": self.namespace, "verb": verb, "resource": resource, "group": group}
        if subresource:
            attributes["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        authorization = k8s_client.AuthorizationV1Api(self.api_client)
        try:
            answer = self._call(
                f"review whether it may {verb} {resource}",
                lambda: authorization.create_self_subject_access_review(review, _preload_content=False),  # type: ignore[arg-type]
            )
        except ClusterError:
            return False
        return bool((answer.get("status") or {}).get("allowed"))

    # ---- plumbing -----------------------------------------------------------------------------

    def _call(self, what: str, call: Callable[[], Any]) -> dict[str, Any]:
        try:
            response = call()
            return dict(json.loads(response.data or b"{}"))
        except ApiException as error:
            raise self._error(what, error) from None
        except (HTTPError, OSError) as error:
            raise ClusterError(
                f"cannot reach the Kubernetes API at {self.host} to {what}: {unreachable(error)}."
            ) from None

    def _call_or_none(self, what: str, call: Callable[[], Any]) -> dict[str, Any] | None:
        try:
            return self._call(what, call)
        except ClusterError as error:
            if error.api_status == 404:
                return None
            raise

    def _error(self, what: str, error: ApiException) -> ClusterError:
        reason, message = str(error.reason or ""), ""
        try:
            status = json.loads(error.body or "{}")
            reason = str(status.get("reason") or reason)
            message = str(status.get("message") or "")
        except (TypeError, ValueError):
            message = str(error.body or "")[:200]
        hint = ""
        if error.status in (401, 403):
            hint = (
                f" (the server's service account needs the Role in examples/kubernetes for "
                f"namespace {self.namespace})"
            )
        return ClusterError(
            f"the Kubernetes API refused to {what} in namespace {self.namespace}: "
            f"{message or reason or error.status}{hint}",
            api_status=error.status,
            reason=reason,
        )


def unreachable(error: BaseException) -> str:
    """Why a request got no answer, in a few words ("connection refused", "no answer in time"),
    from the error urllib3 raised after its retries: the OS's reason where there is one, not the
    connection pool's repr."""
    seen: set[int] = set()
    timed_out = False
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[:1].lower() + cause.strerror[1:]
        timed_out = timed_out or isinstance(cause, (Urllib3Timeout, TimeoutError))
        reason = getattr(cause, "reason", None)  # urllib3's MaxRetryError: the last error
        cause = reason if isinstance(reason, BaseException) else cause.__cause__ or cause.__context__
    return "no answer in time" if timed_out else str(error)


class TimelyApiClient(k8s_client.ApiClient):
    """The client's ApiClient with :data:`REQUEST_TIMEOUT` where a call names no timeout (the
    watch names its own)."""

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        # Every generated API method passes _request_timeout by name (None when not given).
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or REQUEST_TIMEOUT
        return super().call_api(*args, **kwargs)  # type: ignore[no-untyped-call]


def event_time(event: dict[str, Any]) -> datetime.datetime:
    """When an event last happened, to the second: a sort key under which events of one second
    keep the API's order. The old and new event APIs differ in where they say it and in precision
    — kubelet's events to the second (``…:05Z``), the scheduler's (events.k8s.io) to the
    microsecond (``…:05.250000Z``) — so neither their text nor their exact times sort a
    scheduler's event among kubelet's of the same second; the API lists events by name, which
    both write as ``<pod>.<hex nanoseconds>``, in the order they happened."""
    text = str(
        event.get("lastTimestamp")
        or (event.get("series") or {}).get("lastObservedTime")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return NO_TIME
    # The API writes UTC with a Z; a time without a zone is taken as UTC, comparable with it.
    return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).replace(microsecond=0)


NO_TIME = datetime.datetime.min.replace(tzinfo=datetime.UTC)  # an event that says no time: first
