"""Dynamic Resource Allocation in the simulated cluster: the DRA part of the scheduler, the
resourceclaim controller and the claim garbage collector, acting on the ``resource.k8s.io/v1``
kinds an API server made with ``dra=True`` serves (api.py).

* :class:`DraSimulation` publishes a driver's ResourceSlices and DeviceClasses (dra_devices.py
  builds them) when the node starts. When the scheduler (scheduler.py) considers a pod, the pod
  waits until every claim it names exists; then, node by node, each claim's request
  (``exactly``, or the first ``firstAvailable`` subrequest that can be met) is matched against the
  node's devices: the DeviceClass's and the request's CEL selectors (the subset of cel.py),
  availability (a device without ``allowMultipleAllocations`` holds one claim; one with it holds
  claims while their consumed capacity fits: the requested amount, else the capacity's
  request-policy default, else all of it), and the count. A pod whose claims can be met on a node
  gets ``status.allocation`` (results, consumed capacity, the claim's opaque config, a node
  selector) and ``reservedFor`` written on each claim and is bound there; otherwise it stays
  pending with the scheduler's words, "0/N nodes are available: N cannot allocate all claims.".
  Allocation happens one pod at a time, as the scheduler's does, so capacity is never handed out
  twice.
* Claims are made from the ResourceClaimTemplates pods name (the resourceclaim controller); a
  claim owned by a pod that is gone is deleted (the garbage collector); a pod that ended or went
  leaves ``reservedFor``, and a claim nobody reserves any more is deallocated.

Verified against the emulator only: no real kube-scheduler, DRA driver or kubelet plugin runs,
so device preparation (CDI, MPS daemons, HAMi-core) is not exercised.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...cluster.dra_devices import consumed_per_device
from .api import ApiServer
from .cel import Quantity, compile_selector, device_view
from .nodes import SimNode
from .resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES

# ---- allocation -------------------------------------------------------------------------------


@dataclass
class _Device:
    driver: str
    pool: str
    raw: dict[str, Any]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.raw["name"]

    @property
    def shared(self) -> bool:
        return bool(self.raw.get("allowMultipleAllocations"))

    def capacity(self) -> dict[str, dict[str, Any]]:
        return dict(self.raw.get("capacity") or {})


@dataclass
class _Use:
    """What the allocated claims hold of one device."""

    holders: int = 0
    consumed: dict[str, int] = field(default_factory=dict)
    exclusive: bool = False


def _claim_results(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


DeviceKey = tuple[str, str, str]  # driver, pool, device


def usage_of(
    claims: Iterable[Mapping[str, Any]], devices: Mapping[DeviceKey, _Device]
) -> dict[DeviceKey, _Use]:
    uses: dict[tuple[str, str, str], _Use] = {}
    for claim in claims:
        for result in _claim_results(claim):
            key = (result["driver"], result["pool"], result["device"])
            use = uses.setdefault(key, _Use())
            use.holders += 1
            consumed = result.get("consumedCapacity")
            device = devices.get(key)
            if consumed is None or device is None or not device.shared:
                use.exclusive = True
                continue
            for name, amount in consumed.items():
                use.consumed[name] = use.consumed.get(name, 0) + Quantity.parse(str(amount)).value
    return uses


def _consumption(device: _Device, requested: Mapping[str, str]) -> dict[str, int] | None:
    """What a claim would consume of a shared device, or None when it asks for a capacity the
    device lacks or an amount outside the request policy's range."""
    capacity = device.capacity()
    if any(name not in capacity for name in requested):
        return None
    consumed: dict[str, int] = {}
    for name, value in capacity.items():
        policy = value.get("requestPolicy") or {}
        if name in requested:
            amount = Quantity.parse(str(requested[name])).value
            valid = policy.get("validRange") or {}
            if "min" in valid and amount < Quantity.parse(str(valid["min"])).value:
                return None
            if "max" in valid and amount > Quantity.parse(str(valid["max"])).value:
                return None
        elif "default" in policy:
            amount = Quantity.parse(str(policy["default"])).value
        else:
            amount = Quantity.parse(str(value["value"])).value
        consumed[name] = amount
    return consumed


def _fits(device: _Device, use: _Use | None, requested: Mapping[str, str]) -> dict[str, int] | None:
    """The consumption a claim would have on ``device`` if it fits there now ({} exclusive)."""
    if use is not None and use.exclusive:
        return None
    if not device.shared:
        if use is not None and use.holders:
            return None
        capacity = device.capacity()
        for name, amount in requested.items():
            if name not in capacity:
                return None
            if Quantity.parse(str(amount)).value > Quantity.parse(str(capacity[name]["value"])).value:
                return None
        return {}
    consumed = _consumption(device, requested)
    if consumed is None:
        return None
    for name, amount in consumed.items():
        total = Quantity.parse(str(device.capacity()[name]["value"])).value
        if (use.consumed.get(name, 0) if use else 0) + amount > total:
            return None
    return consumed


def _quantity_text(amount: int) -> str:
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20)):
        if amount and amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)


class Unsupported(Exception):
    """A claim outside what the simulation allocates: the test must say so, not pass by chance."""


@dataclass
class DraSimulation:
    """A DRA driver's published devices and the scheduler's allocation of claims."""

    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    allocations: int = 0  # claims allocated so far
    _share_ids: Any = field(default_factory=lambda: itertools.count(1))

    async def publish(self, api: ApiServer) -> None:
        async with api._lock:
            for item in [*self.classes, *self.slices]:
                await api.add(DEVICE_CLASSES if item["kind"] == "DeviceClass" else RESOURCE_SLICES, item)

    @staticmethod
    def claim_names(pod: Mapping[str, Any]) -> list[str | None]:
        """The claims a pod names: its own, or those made from its templates (None: not made yet)."""
        made = {
            item["name"]: item.get("resourceClaimName")
            for item in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        names: list[str | None] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            if "resourceClaimName" in entry:
                names.append(entry["resourceClaimName"])
            elif "resourceClaimTemplateName" in entry:
                names.append(made.get(entry["name"]))
            else:
                raise Unsupported(f"pod claim entry {entry}")
        return names

    async def claims_ready(self, api: ApiServer, pod: Mapping[str, Any]) -> bool:
        """Whether every claim the pod names exists (the scheduler waits for them)."""
        namespace = pod["metadata"]["namespace"]
        async with api._lock:
            names = self.claim_names(pod)
            return all(name and api.get(RESOURCE_CLAIMS, namespace, name) is not None for name in names)

    async def make_claims_from_templates(self, api: ApiServer, pod: Mapping[str, Any]) -> None:
        """The resourceclaim controller: a claim per template entry of the pod, owned by it, named
        ``<pod>-<entry>-<random>`` and recorded in the pod's ``resourceClaimStatuses``."""
        metadata = pod["metadata"]
        entries = [
            entry for entry in pod["spec"].get("resourceClaims") or [] if "resourceClaimTemplateName" in entry
        ]
        made = {item["name"] for item in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        for entry in entries:
            if entry["name"] in made:
                continue
            async with api._lock:
                template = api.get(
                    RESOURCE_CLAIM_TEMPLATES, metadata["namespace"], entry["resourceClaimTemplateName"]
                )
                if template is None:
                    continue  # the pod waits for its template
                name = f"{metadata['name']}-{entry['name']}-{uuid.uuid4().hex[:5]}"
                claim_metadata = copy.deepcopy(template["spec"].get("metadata") or {})
                claim_metadata.update(
                    {
                        "name": name,
                        "namespace": metadata["namespace"],
                        "annotations": {
                            **claim_metadata.get("annotations", {}),
                            "resource.kubernetes.io/pod-claim-name": entry["name"],
                        },
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": metadata["name"],
                                "uid": metadata["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    }
                )
                await api.add(
                    RESOURCE_CLAIMS,
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": claim_metadata,
                        "spec": copy.deepcopy(template["spec"]["spec"]),
                    },
                )
                current = api.get(PODS, metadata["namespace"], metadata["name"])
                if current is None:
                    return
                statuses = current["status"].setdefault("resourceClaimStatuses", [])
                statuses.append({"name": entry["name"], "resourceClaimName": name})
                await api.store(PODS, current)

    def _devices(self, slices: Sequence[Mapping[str, Any]], node: str | None = None) -> list[_Device]:
        devices = []
        for resource_slice in slices:
            spec = resource_slice["spec"]
            if node is not None and spec.get("nodeName") != node:
                continue
            for device in spec.get("devices") or []:
                devices.append(_Device(spec["driver"], spec["pool"]["name"], device))
        return sorted(devices, key=lambda device: device.key)

    async def _plan(
        self, api: ApiServer, pod: Mapping[str, Any], node: str
    ) -> tuple[dict[str, list[dict[str, Any]]], int] | None:
        """The results each of the pod's unallocated claims would get on ``node``, and how far
        down their firstAvailable lists they had to go (None: they cannot all be met there)."""
        namespace = pod["metadata"]["namespace"]
        async with api._lock:
            claims = [api.get(RESOURCE_CLAIMS, namespace, name or "") for name in self.claim_names(pod)]
            every_claim = api.items(RESOURCE_CLAIMS)
            slices = api.items(RESOURCE_SLICES)
            classes = {item["metadata"]["name"]: item for item in api.items(DEVICE_CLASSES)}
        all_devices = {device.key: device for device in self._devices(slices)}
        uses = usage_of(every_claim, all_devices)
        here = self._devices(slices, node)
        planned: dict[str, list[dict[str, Any]]] = {}
        rank = 0
        for claim in claims:
            if claim is None:
                return None
            if _claim_results(claim):  # allocated before (a shared claim): it must be on this node
                selector = claim["status"]["allocation"].get("nodeSelector") or {}
                if node not in str(selector):
                    return None
                continue
            allocated = self._allocate_claim(claim, here, classes, uses)
            if allocated is None:
                return None
            planned[claim["metadata"]["name"]], position = allocated
            rank += position
        return planned, rank

    async def rank_nodes(
        self, api: ApiServer, pod: Mapping[str, Any], nodes: Sequence[SimNode]
    ) -> list[SimNode]:
        """Nodes in the order the scheduler prefers them for the pod: those where its claims get
        earlier firstAvailable entries first (KEP-4816's scoring), then in their own order."""
        ranks: dict[str, float] = {}
        for node in nodes:
            planned = await self._plan(api, pod, node.name)
            ranks[node.name] = float("inf") if planned is None else planned[1]
        return sorted(nodes, key=lambda node: ranks[node.name])

    async def allocate(self, api: ApiServer, pod: dict[str, Any], node: str) -> bool:
        """Allocate the pod's claims on ``node`` (written to the API) and say whether it could."""
        namespace = pod["metadata"]["namespace"]
        names = [name for name in self.claim_names(pod) if name is not None]
        if not names:
            return True
        plan = await self._plan(api, pod, node)
        if plan is None:
            return False
        planned, _ = plan
        on_node = {"key": "metadata.name", "operator": "In", "values": [node]}
        consumer = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        async with api._lock:
            for name in names:
                current = api.get(RESOURCE_CLAIMS, namespace, name)
                if current is None:
                    return False
                status = current.setdefault("status", {})
                if name in planned:
                    config = [
                        {"source": "FromClaim", **item}
                        for item in (current["spec"].get("devices") or {}).get("config") or []
                    ]
                    status["allocation"] = {
                        "devices": {"results": planned[name], **({"config": config} if config else {})},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [on_node]}]},
                    }
                    self.allocations += 1
                reserved = status.setdefault("reservedFor", [])
                if all(item["uid"] != consumer["uid"] for item in reserved):
                    reserved.append(consumer)
                await api.store(RESOURCE_CLAIMS, current)
        return True

    def _allocate_claim(
        self,
        claim: Mapping[str, Any],
        devices: Sequence[_Device],
        classes: Mapping[str, Mapping[str, Any]],
        uses: dict[tuple[str, str, str], _Use],
    ) -> tuple[list[dict[str, Any]], int] | None:
        """The claim's results, and the sum of the positions of the options taken."""
        results: list[dict[str, Any]] = []
        rank = 0
        for request in (claim["spec"].get("devices") or {}).get("requests") or []:
            if (claim["spec"].get("devices") or {}).get("constraints"):
                raise Unsupported("claim constraints")
            if "exactly" in request:
                options = [(request["name"], request["exactly"])]
            else:
                subrequests = request.get("firstAvailable") or []
                options = [(f"{request['name']}/{sub['name']}", sub) for sub in subrequests]
            for position, (name, body) in enumerate(options):
                picked = self._pick(body, devices, classes, uses)
                if picked is not None:
                    rank += position
                    for device, consumed in picked:
                        result: dict[str, Any] = {
                            "request": name,
                            "driver": device.driver,
                            "pool": device.pool,
                            "device": device.raw["name"],
                        }
                        use = uses.setdefault(device.key, _Use())
                        use.holders += 1
                        if device.shared:
                            result["consumedCapacity"] = {k: _quantity_text(v) for k, v in consumed.items()}
                            result["shareID"] = f"{next(self._share_ids):08d}-0000-4000-8000-000000000000"
                            for key, amount in consumed.items():
                                use.consumed[key] = use.consumed.get(key, 0) + amount
                        else:
                            use.exclusive = True
                        results.append(result)
                    break
            else:
                return None
        return results, rank

    def _pick(
        self,
        body: Mapping[str, Any],
        devices: Sequence[_Device],
        classes: Mapping[str, Mapping[str, Any]],
        uses: Mapping[tuple[str, str, str], _Use],
    ) -> list[tuple[_Device, dict[str, int]]] | None:
        if body.get("allocationMode", "ExactCount") != "ExactCount":
            raise Unsupported(f"allocationMode {body.get('allocationMode')}")
        device_class = classes.get(body["deviceClassName"])
        if device_class is None:
            return None  # the scheduler: device class not found
        expressions = [
            selector["cel"]["expression"]
            for selector in [
                *((device_class.get("spec") or {}).get("selectors") or []),
                *(body.get("selectors") or []),
            ]
        ]
        selectors = [compile_selector(expression) for expression in expressions]
        requested = (body.get("capacity") or {}).get("requests") or {}
        picked: list[tuple[_Device, dict[str, int]]] = []
        for device in devices:
            view = device_view(device.driver, device.raw)
            if not all(selector(view) for selector in selectors):
                continue
            consumed = _fits(device, uses.get(device.key), requested)
            if consumed is not None:
                picked.append((device, consumed))
            if len(picked) == int(body.get("count", 1)):
                return picked
        return None

    async def collect(self, api: ApiServer, pods: Sequence[Mapping[str, Any]]) -> None:
        """The resourceclaim controller and the garbage collector: claims are made from the
        templates pods name; claims whose owner pod is gone are deleted; pods gone or ended leave
        ``reservedFor``; a claim nobody reserves is deallocated."""
        live = {
            pod["metadata"]["uid"]
            for pod in pods
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
        present = {pod["metadata"]["uid"] for pod in pods}
        for pod in pods:
            if pod["metadata"]["uid"] in live and not pod["metadata"].get("deletionTimestamp"):
                await self.make_claims_from_templates(api, pod)
        async with api._lock:
            for claim in api.items(RESOURCE_CLAIMS):
                metadata = claim["metadata"]
                references = metadata.get("ownerReferences") or []
                owners = [ref["uid"] for ref in references if ref.get("kind") == "Pod"]
                if owners and not any(uid in present for uid in owners):
                    await api.remove(RESOURCE_CLAIMS, metadata["namespace"], metadata["name"])
                    continue
                status = claim.get("status") or {}
                reserved = status.get("reservedFor") or []
                kept = [item for item in reserved if item["uid"] in live]
                if kept == reserved:
                    continue
                updated = copy.deepcopy(claim)
                updated["status"]["reservedFor"] = kept
                if not kept:
                    updated["status"].pop("allocation", None)
                await api.store(RESOURCE_CLAIMS, updated)


__all__ = ["DraSimulation", "consumed_per_device"]
