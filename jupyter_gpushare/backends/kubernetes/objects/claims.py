"""What a kernel pod asks for under Dynamic Resource Allocation (``resource.k8s.io/v1``). Pure.

The second dialect of the docs/how-it-works/modes.md modes, beside the device plugins' extended
resources: each kernel pod gets a ResourceClaim of its own, created with the pod and owned by it,
and the pod's container refers to it. Each mode says what the claim's one request (``gpu``) asks
of it (``Mode.dra_alternative``, in the mode's own module of :mod:`jupyter_gpushare.core.modes`);
this package's modes ask:

* ``exclusive`` — one device of the GPU class; CEL selects a card with at least the memory asked
  (``device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0``) and, where
  ``gpu_type`` is set, its product name;
* ``mig`` — one device of the MIG class whose ``profile`` attribute is the smallest that fits;
* ``mps`` — a GPU with NVIDIA's ``GpuConfig`` opaque parameters (``sharing.strategy: MPS``, the
  pinned memory limit = the slice, the active thread percentage = ``gpu_cores``), or MPS's own
  variables for drivers without that configuration;
* ``timeslice`` — ``sharing.strategy: TimeSlicing``, and the soft caps in the environment;
* ``vgpu`` — memory (and cores) as consumable capacity, HAMi-DRA's way.

Where the driver's devices take several claims (consumable capacity, KEP-5075) the shared modes
also ask ``capacity.requests.memory`` = the slice, so one card holds many kernels; without it
each claim holds its card alone. ``c.GPUShare.dra_fallbacks`` turns the request into a
``firstAvailable`` list, one subrequest per mode named after it, so the allocation result says
which mode a kernel got (:func:`allocated_mode`).

Nothing here talks to a cluster: the server's provisioner, ``render-pod``, the JupyterHub
profiles and a broker build the same claims from the same calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.manifests import CLAIM_REQUEST
from jupyter_gpushare.core.errors import GPUShareError
from jupyter_gpushare.core.modes import MODES, get_mode
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.pods.dra import Alternative, dra_names
from jupyter_gpushare.core.pods.presets import DraNames
from jupyter_gpushare.core.pods.requests import PodRequest, soft_caps
from jupyter_gpushare.core.sizes import Size, format_bytes

API_VERSION = "resource.k8s.io/v1"
REQUEST = CLAIM_REQUEST  # the claim's one request, and the pod's name for the claim


# ---- the claim ---------------------------------------------------------------------------------


def claim_request(
    mode: str, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
) -> PodRequest:
    """The pod request of a kernel in ``mode``: no extended resources, a ResourceClaim spec.

    With fallbacks (``cluster.fallbacks``) listing ``mode``, the request is a ``firstAvailable``
    list: this mode first, then the others in their order; a mode that cannot hold this size is
    left out (all of them failing raises the first one's reason)."""
    get_mode(mode)  # an unknown mode is refused before its fallbacks are tried
    order = (
        [mode, *(other for other in cluster.fallbacks if other != mode)]
        if mode in cluster.fallbacks
        else [mode]
    )
    alternatives: list[Alternative] = []
    refusals: list[GPUShareError] = []
    for name in order:
        # Cores are the asked mode's; a whole card or a MIG device needs none.
        mode_cores = cores if name == mode else None
        try:
            alternative = get_mode(name).dra_alternative(size, mode_cores, cluster, card_at_least)
        except GPUShareError as refusal:
            refusals.append(refusal)
            continue
        # A whole card in a sharing mode is the exclusive alternative: ask for it once.
        if all(other.mode != alternative.mode for other in alternatives):
            alternatives.append(alternative)
    if not alternatives:
        raise refusals[0]
    spec = claim_spec(alternatives, dra_names(cluster))
    if len(alternatives) == 1:
        chosen = alternatives[0]
        return PodRequest({}, env=dict(chosen.env), memory=chosen.memory, claim=spec)
    # Whichever alternative the scheduler picks holds at least the size asked: the kernel's caps
    # are the size's (a MIG device may be larger; MPS is pinned to the size). The variables of
    # each alternative apply only where it was chosen (MPS's are read by MPS clients alone).
    asked = size.resolve(0) if size.form == "bytes" else alternatives[0].memory
    env: dict[str, str] = {}
    for item in reversed(alternatives):
        env.update(item.env)
    if asked is not None and size.form != "whole":
        env.update(soft_caps(asked, cluster.gpu_memory))
    return PodRequest({}, env=env, memory=asked, claim=spec)


def claim_spec(alternatives: Sequence[Alternative], names: DraNames) -> dict[str, Any]:
    """``ResourceClaimSpec`` with one request: ``exactly`` one alternative, or ``firstAvailable``."""
    request: dict[str, Any] = {"name": REQUEST}
    configs: list[dict[str, Any]] = []
    if len(alternatives) == 1:
        request["exactly"] = alternatives[0].device_request()
        if alternatives[0].parameters is not None:
            configs.append(_opaque([REQUEST], names, alternatives[0].parameters))
    else:
        request["firstAvailable"] = [{"name": item.mode, **item.device_request()} for item in alternatives]
        for item in alternatives:
            if item.parameters is not None:
                configs.append(_opaque([f"{REQUEST}/{item.mode}"], names, item.parameters))
    devices: dict[str, Any] = {"requests": [request]}
    if configs:
        devices["config"] = configs
    return {"devices": devices}


def _opaque(requests: list[str], names: DraNames, parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {"requests": requests, "opaque": {"driver": names.driver, "parameters": dict(parameters)}}


def make_claim(
    name: str,
    namespace: str,
    spec: Mapping[str, Any],
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    owner: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim; with ``owner`` (the pod's ``name`` and ``uid``) it goes with that pod."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "annotations": dict(annotations),
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner["name"],
                "uid": owner["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": metadata, "spec": dict(spec)}


def make_claim_template(
    name: str, spec: Mapping[str, Any], *, labels: Mapping[str, str], namespace: str | None = None
) -> dict[str, Any]:
    """A ResourceClaimTemplate: Kubernetes makes one claim from it per pod, owned by the pod."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": dict(spec)},
    }


def pod_claim_reference(claim: str, *, template: bool = False) -> dict[str, str]:
    """The pod's ``resourceClaims`` entry for its one GPU claim (a claim, or a template)."""
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    return {"name": REQUEST, key: claim}


# ---- reading a claim back ----------------------------------------------------------------------


def allocated_mode(claim: Mapping[str, Any]) -> str | None:
    """The mode a kernel's claim was allocated in: the subrequest the scheduler picked
    (``gpu/mig``), or the one request's mode (None while unallocated)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    if not results:
        return None
    request = str(results[0].get("request") or "")
    _, _, subrequest = request.partition("/")
    return subrequest or None


def describe_claim(spec: Mapping[str, Any]) -> str:
    """One line for logs and errors: what each alternative of the claim asks for."""
    parts = []
    for request in (spec.get("devices") or {}).get("requests") or []:
        alternatives = request.get("firstAvailable") or [request.get("exactly") or {}]
        described = []
        for item in alternatives:
            text = f"1 {item.get('deviceClassName')} device"
            asked = ((item.get("capacity") or {}).get("requests")) or {}
            if asked:
                text += " consuming " + ", ".join(f"{name}={value}" for name, value in sorted(asked.items()))
            selectors = [selector["cel"]["expression"] for selector in item.get("selectors") or []]
            if selectors:
                text += " where " + " && ".join(selectors)
            described.append(f"{item['name']}: {text}" if "name" in item else text)
        parts.append(" or else ".join(described))
    return "; ".join(parts)


def _shares_cards(mode: str) -> bool:
    return mode in MODES and MODES[mode].placement == "shared"


def whole_card_warning(spec: Mapping[str, Any], mode: str) -> str | None:
    """Why a claim for a sharing mode will hold a whole card, or None: an alternative in a
    sharing mode that asks for a device without capacity requests consumes all of it (the
    driver's devices do not take several claims), so each such kernel holds a card of its own."""
    for request in (spec.get("devices") or {}).get("requests") or []:
        alternatives = request.get("firstAvailable") or [{"name": mode, **(request.get("exactly") or {})}]
        for item in alternatives:
            name = str(item.get("name") or mode)
            if _shares_cards(name) and not (item.get("capacity") or {}).get("requests"):
                return (
                    f"this claim's {name} request asks for a whole {item.get('deviceClassName')} device "
                    "(no capacity requests): without consumable capacity each such kernel holds a card "
                    "of its own, its MPS limit or caps notwithstanding. Where the DRA driver and "
                    "Kubernetes offer it (KEP-5075), set c.GPUShare.dra_consumable_capacity = True "
                    "(docs/dra.md)"
                )
    return None


def summary(request: PodRequest) -> str:
    """``a ResourceClaim for 1 gpu.nvidia.com device…, slice 6 GiB`` (or "" without a claim)."""
    if request.claim is None:
        return ""
    memory = f", slice {format_bytes(request.memory)}" if request.memory else ""
    return f"a ResourceClaim for {describe_claim(request.claim)}{memory}"
