"""What a kernel pod asks for under Dynamic Resource Allocation (``resource.k8s.io/v1``). Pure.

The second dialect of the docs/how-it-works/modes.md modes, beside the device plugins' extended resources of
:mod:`.requests`: each kernel pod gets a ResourceClaim of its own, created with the pod and owned
by it, and the pod's container refers to it. Per mode the claim's one request (``gpu``) asks:

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

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.backends.kubernetes.objects.manifests import CLAIM_REQUEST
from jupyter_gpushare.backends.kubernetes.objects.presets import DraNames
from jupyter_gpushare.backends.kubernetes.objects.requests import (
    ClusterFacts,
    PodRequest,
    bytes_for,
    smallest_mig_profile,
    soft_caps,
)
from jupyter_gpushare.core.errors import (
    ConfigurationError,
    GPUShareError,
    InvalidRequestError,
    ModeUnavailableError,
)
from jupyter_gpushare.core.sizes import GiB, MiB, Size, format_bytes

API_VERSION = "resource.k8s.io/v1"
REQUEST = CLAIM_REQUEST  # the claim's one request, and the pod's name for the claim
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a kernel's claim: the request itself, or one ``firstAvailable`` entry."""

    mode: str
    device_class: str
    selectors: tuple[str, ...] = ()  # CEL expressions, all must hold
    capacity: Mapping[str, str] = field(default_factory=dict)  # capacity.requests
    parameters: Mapping[str, Any] | None = None  # the driver's opaque configuration
    memory: int | None = None  # bytes the slice stands for, where known before allocation
    env: Mapping[str, str] = field(default_factory=dict)

    def device_request(self) -> dict[str, Any]:
        """The ``exactly`` (or subrequest) body of this alternative."""
        body: dict[str, Any] = {
            "deviceClassName": self.device_class,
            "allocationMode": "ExactCount",
            "count": 1,
        }
        if self.selectors:
            body["selectors"] = [{"cel": {"expression": expression}} for expression in self.selectors]
        if self.capacity:
            body["capacity"] = {"requests": dict(self.capacity)}
        return body


# ---- quantities and CEL -----------------------------------------------------------------------


def quantity(size_bytes: int) -> str:
    """A Kubernetes quantity for a byte count: ``6Gi``, ``1536Mi``, or plain bytes."""
    if size_bytes % GiB == 0:
        return f"{size_bytes // GiB}Gi"
    if size_bytes % MiB == 0:
        return f"{size_bytes // MiB}Mi"
    return str(size_bytes)


def _member(name: str) -> str:
    return f".{name}" if _IDENTIFIER.match(name) else f"[{json.dumps(name)}]"


def memory_at_least(names: DraNames, size_bytes: int) -> str:
    """CEL: the device has at least ``size_bytes`` of memory."""
    capacity = f"device.capacity[{json.dumps(names.driver)}]{_member(names.memory_capacity)}"
    return f'{capacity}.compareTo(quantity("{quantity(size_bytes)}")) >= 0'


def product_is(names: DraNames, gpu_type: str) -> str:
    """CEL: the device's product name contains ``gpu_type`` (any case), as HAMi's
    ``use-gputype`` matches "A100" in "NVIDIA A100-SXM4-80GB"."""
    attribute = f"device.attributes[{json.dumps(names.driver)}]{_member(names.product_attribute)}"
    return f"{attribute}.lowerAscii().contains({json.dumps(gpu_type.lower())})"


def profile_is(names: DraNames, profile: str) -> str:
    """CEL: the MIG device has this profile."""
    attribute = f"device.attributes[{json.dumps(names.driver)}]{_member(names.mig_profile_attribute)}"
    return f"{attribute} == {json.dumps(profile)}"


# ---- one alternative per mode ------------------------------------------------------------------


def _names(cluster: ClusterFacts) -> DraNames:
    names = cluster.preset.dra
    if names is None:
        raise ConfigurationError(f"resource preset {cluster.preset.name!r} is not a DRA preset")
    missing = [
        trait
        for trait, value in (("dra_driver", names.driver), ("dra_device_class", names.device_class))
        if not value
    ]
    if missing:
        raise ConfigurationError(
            f"resource preset {cluster.preset.name!r} needs the DRA driver's names: set "
            f"{' and '.join(f'c.GPUShare.{trait}' for trait in missing)} (e.g. 'gpu.nvidia.com')"
        )
    return names


def _card_selectors(names: DraNames, cluster: ClusterFacts, at_least: int | None) -> tuple[str, ...]:
    selectors = [memory_at_least(names, at_least)] if at_least else []
    if cluster.gpu_type:
        selectors.append(product_is(names, cluster.gpu_type))
    return tuple(selectors)


def exclusive_alternative(
    size: Size, cores: int | None, cluster: ClusterFacts, at_least: int | None = None
) -> Alternative:
    """A whole card with at least ``at_least`` bytes (or the size asked, when it is an amount).
    On a driver with consumable capacity a claim without capacity requests consumes the request
    policy's default: the whole card for HAMi-DRA and NVIDIA's ``memory`` shares."""
    names = _names(cluster)
    if at_least is None and size.kind == "bytes":
        at_least = size.resolve(0)
    return Alternative(
        "exclusive", names.device_class, _card_selectors(names, cluster, at_least), memory=cluster.gpu_memory
    )


def _shared(
    mode: str,
    size: Size,
    cluster: ClusterFacts,
    parameters: Mapping[str, Any] | None,
    extra_capacity: Mapping[str, str] | None = None,
    extra_env: Callable[[int], Mapping[str, str]] | None = None,
) -> Alternative:
    """A slice of a shared card: consumable memory where the driver offers it, else the card."""
    names = _names(cluster)
    if size.is_whole:
        return exclusive_alternative(size, None, cluster)
    memory = bytes_for(size, cluster.gpu_memory, percent_resource=False)
    assert memory is not None
    capacity: dict[str, str] = {}
    if names.consumable_capacity:
        capacity[names.memory_capacity] = quantity(memory)
    capacity.update(extra_capacity or {})
    env = {**soft_caps(memory, cluster.gpu_memory), **(extra_env(memory) if extra_env else {})}
    return Alternative(
        mode,
        names.device_class,
        _card_selectors(names, cluster, memory),
        capacity,
        parameters,
        memory=memory,
        env=env,
    )


def _gpu_config(names: DraNames, sharing: dict[str, Any]) -> dict[str, Any] | None:
    if not names.nvidia_sharing:
        return None
    return {"apiVersion": names.config_api_version, "kind": "GpuConfig", "sharing": sharing}


def timeslice_alternative(size: Size, cores: int | None, cluster: ClusterFacts) -> Alternative:
    names = _names(cluster)
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
    return _shared("timeslice", size, cluster, _gpu_config(names, sharing))


def mps_alternative(size: Size, cores: int | None, cluster: ClusterFacts) -> Alternative:
    """NVIDIA's driver runs the MPS daemon and enforces the pinned limit from the claim's
    configuration; other drivers get MPS's client variables, as device-plugin pods do."""
    names = _names(cluster)
    if size.is_whole:
        return exclusive_alternative(size, None, cluster)
    memory = bytes_for(size, cluster.gpu_memory, percent_resource=False)
    assert memory is not None
    mps_config: dict[str, Any] = {"defaultPinnedDeviceMemoryLimit": quantity(memory)}
    if cores is not None:
        mps_config["defaultActiveThreadPercentage"] = cores
    parameters = _gpu_config(names, {"strategy": "MPS", "mpsConfig": mps_config})

    def mps_env(memory: int) -> dict[str, str]:
        if parameters is not None:
            return {}
        env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory // MiB}M"}
        if cores is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
        return env

    return _shared("mps", size, cluster, parameters, extra_env=mps_env)


def vgpu_alternative(size: Size, cores: int | None, cluster: ClusterFacts) -> Alternative:
    """Memory and cores as consumable capacity, enforced by the driver (HAMi-core)."""
    names = _names(cluster)
    if names.nvidia_sharing:
        raise ModeUnavailableError(
            f"resource preset {cluster.preset.name!r} (NVIDIA's DRA driver) has no vgpu: it does not "
            "enforce memory slices by interception. Use mode 'mps' (a pinned memory limit per "
            "kernel) or resource preset 'hami-dra'"
        )
    if not names.consumable_capacity:
        raise ModeUnavailableError(
            "mode 'vgpu' needs a DRA driver whose GPUs take several claims, each consuming part of "
            "their memory (consumable capacity): resource preset 'hami-dra', or set "
            "c.GPUShare.dra_consumable_capacity = True where the driver offers it"
        )
    extra: dict[str, str] = {}
    if cores is not None:
        if not names.cores_capacity:
            raise ModeUnavailableError(
                f"resource preset {cluster.preset.name!r} cannot limit GPU cores: set "
                "c.GPUShare.dra_cores_capacity to the driver's capacity of SM percent"
            )
        extra[names.cores_capacity] = str(cores)
    return _shared("vgpu", size, cluster, None, extra_capacity=extra)


def mig_alternative(size: Size, cores: int | None, cluster: ClusterFacts) -> Alternative:
    names = _names(cluster)
    if not names.mig_device_class:
        raise ModeUnavailableError(
            f"resource preset {cluster.preset.name!r} has no MIG device class: set "
            "c.GPUShare.dra_mig_device_class (e.g. 'mig.nvidia.com')"
        )
    if not cluster.mig_profiles and not size.is_whole:
        raise ModeUnavailableError(
            f"mode 'mig' needs MIG devices: no ResourceSlice of {names.driver} offers one "
            "(or set c.GPUShare.mig_profiles)"
        )
    profile, memory = smallest_mig_profile(size, cluster)
    return Alternative("mig", names.mig_device_class, (profile_is(names, profile),), memory=memory)


# What a kernel's claim asks for, by mode: the DRA dialect of the same modes as POD_REQUESTS.
ALTERNATIVES: dict[str, Callable[[Size, int | None, ClusterFacts], Alternative]] = {
    "exclusive": exclusive_alternative,
    "timeslice": timeslice_alternative,
    "mps": mps_alternative,
    "vgpu": vgpu_alternative,
    "mig": mig_alternative,
}


# ---- the claim ---------------------------------------------------------------------------------


def claim_request(
    mode: str, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
) -> PodRequest:
    """The pod request of a kernel in ``mode``: no extended resources, a ResourceClaim spec.

    With fallbacks (``cluster.fallbacks``) listing ``mode``, the request is a ``firstAvailable``
    list: this mode first, then the others in their order; a mode that cannot hold this size is
    left out (all of them failing raises the first one's reason)."""
    if mode not in ALTERNATIVES:
        raise InvalidRequestError(f"no claim for mode {mode!r}; modes: {', '.join(ALTERNATIVES)}")
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
            if name == "exclusive":
                alternative = exclusive_alternative(size, mode_cores, cluster, card_at_least)
            else:
                alternative = ALTERNATIVES[name](size, mode_cores, cluster)
        except GPUShareError as refusal:
            refusals.append(refusal)
            continue
        # A whole card in a sharing mode is the exclusive alternative: ask for it once.
        if all(other.mode != alternative.mode for other in alternatives):
            alternatives.append(alternative)
    if not alternatives:
        raise refusals[0]
    names = _names(cluster)
    spec = claim_spec(alternatives, names)
    if len(alternatives) == 1:
        chosen = alternatives[0]
        return PodRequest({}, env=dict(chosen.env), memory=chosen.memory, claim=spec)
    # Whichever alternative the scheduler picks holds at least the size asked: the kernel's caps
    # are the size's (a MIG device may be larger; MPS is pinned to the size). The variables of
    # each alternative apply only where it was chosen (MPS's are read by MPS clients alone).
    asked = size.resolve(0) if size.kind == "bytes" else alternatives[0].memory
    env: dict[str, str] = {}
    for item in reversed(alternatives):
        env.update(item.env)
    if asked is not None and size.kind != "whole":
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


SHARING_MODES = ("timeslice", "mps", "vgpu")


def whole_card_warning(spec: Mapping[str, Any], mode: str) -> str | None:
    """Why a claim for a sharing mode will hold a whole card, or None: an alternative in a
    sharing mode that asks for a device without capacity requests consumes all of it (the
    driver's devices do not take several claims), so each such kernel holds a card of its own."""
    for request in (spec.get("devices") or {}).get("requests") or []:
        alternatives = request.get("firstAvailable") or [{"name": mode, **(request.get("exactly") or {})}]
        for item in alternatives:
            name = str(item.get("name") or mode)
            if name in SHARING_MODES and not (item.get("capacity") or {}).get("requests"):
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
