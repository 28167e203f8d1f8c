"""One alternative of a kernel's ResourceClaim (``resource.k8s.io/v1``), and the pieces the modes
build theirs from: quantities, CEL selectors, a whole card, a slice of a shared card. Pure.

A claim's one request asks ``exactly`` one alternative, or ``firstAvailable`` of several, one per
mode (the Kubernetes kind's ``objects/claims.py`` puts them together). Where the driver's
devices take several claims (consumable capacity, KEP-5075) a slice of a shared card asks
``capacity.requests.memory`` = the slice, so one card holds many kernels; without it each claim
holds its card alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpushare.core.errors import ConfigurationError
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.pods.presets import DraNames
from jupyter_gpushare.core.pods.requests import bytes_for, soft_caps
from jupyter_gpushare.core.sizes import GiB, MiB, Size

WHOLE_CARD_MODE = "exclusive"  # the alternative a whole card is, whichever mode asked for it
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


# ---- what the modes' alternatives are made of --------------------------------------------------


def dra_names(cluster: ClusterFacts) -> DraNames:
    """The preset's DRA names, or the one sentence that says which setting is missing."""
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


def card_selectors(names: DraNames, cluster: ClusterFacts, at_least: int | None) -> tuple[str, ...]:
    """A card with at least ``at_least`` bytes, of the product ``gpu_type`` names where set."""
    selectors = [memory_at_least(names, at_least)] if at_least else []
    if cluster.gpu_type:
        selectors.append(product_is(names, cluster.gpu_type))
    return tuple(selectors)


def whole_card_alternative(size: Size, cluster: ClusterFacts, at_least: int | None = None) -> Alternative:
    """A whole card with at least ``at_least`` bytes (or the size asked, when it is an amount).
    On a driver with consumable capacity a claim without capacity requests consumes the request
    policy's default: the whole card for HAMi-DRA and NVIDIA's ``memory`` shares."""
    names = dra_names(cluster)
    if at_least is None and size.form == "bytes":
        at_least = size.resolve(0)
    return Alternative(
        WHOLE_CARD_MODE,
        names.device_class,
        card_selectors(names, cluster, at_least),
        memory=cluster.gpu_memory,
    )


def shared_alternative(
    mode: str,
    size: Size,
    cluster: ClusterFacts,
    parameters: Mapping[str, Any] | None,
    extra_capacity: Mapping[str, str] | None = None,
    extra_env: Callable[[int], Mapping[str, str]] | None = None,
) -> Alternative:
    """A slice of a shared card: consumable memory where the driver offers it, else the card
    (a whole size is the whole card)."""
    names = dra_names(cluster)
    if size.is_whole:
        return whole_card_alternative(size, cluster)
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
        card_selectors(names, cluster, memory),
        capacity,
        parameters,
        memory=memory,
        env=env,
    )


def gpu_config(names: DraNames, sharing: dict[str, Any]) -> dict[str, Any] | None:
    """NVIDIA's ``GpuConfig`` opaque parameters for a sharing strategy (None for other drivers)."""
    if not names.nvidia_sharing:
        return None
    return {"apiVersion": names.config_api_version, "kind": "GpuConfig", "sharing": sharing}


__all__ = [
    "WHOLE_CARD_MODE",
    "Alternative",
    "card_selectors",
    "dra_names",
    "gpu_config",
    "memory_at_least",
    "product_is",
    "profile_is",
    "quantity",
    "shared_alternative",
    "whole_card_alternative",
]
