"""The cluster watch reads events as JSON: the Kubernetes package's watch builds no model of each
object for the list call it is given (it would for the generated call itself: about 1 ms a pod
event, against 0.04 ms to parse its JSON). The library's behaviour is the edge tested here."""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes import watch as k8s_watch

from jupyter_gpushare.backends.kubernetes.cluster.watch import raw_events


def test_the_watch_keeps_each_event_as_json() -> None:
    core = client.CoreV1Api(client.ApiClient())
    watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
    assert watch.get_return_type(core.list_namespaced_pod)  # the generated call names its model
    unnamed = raw_events(core.list_namespaced_pod)
    assert not watch.get_return_type(unnamed)
    assert watch.get_watch_argument_name(unnamed) == "watch"
    pod = {"metadata": {"name": "k", "resourceVersion": "7"}, "status": {"phase": "Running"}}
    event = watch.unmarshal_event(
        json.dumps({"type": "MODIFIED", "object": pod}), watch.get_return_type(unnamed)
    )
    assert event["object"] == pod and event["raw_object"] == pod  # no V1Pod made


def test_the_unnamed_call_passes_every_option_on() -> None:
    calls: list[dict[str, object]] = []
    unnamed = raw_events(lambda **options: calls.append(options))
    unnamed(namespace="n", watch=True, resource_version="7")
    assert calls == [{"namespace": "n", "watch": True, "resource_version": "7"}]
