"""Whole cards: the kernel is alone on its GPU, as the native device plugin would give it."""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpushare.core.modes.base import Mode, NodeFacts
from jupyter_gpushare.core.pods.cluster import ClusterFacts, DraDevice, NodeGPUs, counts_virtual_gpus
from jupyter_gpushare.core.pods.dra import Alternative, whole_card_alternative
from jupyter_gpushare.core.pods.presets import DraNames, ResourcePreset
from jupyter_gpushare.core.pods.requests import PodRequest, whole_card
from jupyter_gpushare.core.sizes import Size


class ExclusiveMode(Mode):
    name = "exclusive"
    placement = "exclusive"
    enforcement = "whole card"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        return None

    def pod_request(self, size: Size, cores: int | None, cluster: ClusterFacts) -> PodRequest:
        return whole_card(cluster)

    def dra_alternative(
        self, size: Size, cores: int | None, cluster: ClusterFacts, card_at_least: int | None = None
    ) -> Alternative:
        return whole_card_alternative(size, cluster, card_at_least)

    def offered_on_node(self, node: NodeGPUs, preset: ResourcePreset) -> bool:
        # A node whose cards are shared (replicas) or virtual (HAMi) has no whole card to give.
        advertised = node.allocatable
        return (
            preset.gpu in advertised and not node.shares_cards and not counts_virtual_gpus(preset, advertised)
        )

    def offered_by_devices(self, devices: Sequence[DraDevice], names: DraNames) -> bool:
        return any(not device.is_mig for device in devices)
