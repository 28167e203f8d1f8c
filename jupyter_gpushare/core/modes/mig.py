"""MIG: a hardware partition; the kernel gets the smallest free instance that fits."""

from __future__ import annotations

from jupyter_gpushare.core.modes.base import Grant, Mode, NodeFacts, framework_caps


class MIGMode(Mode):
    name = "mig"
    placement = "mig"
    enforcement = "hardware partition"

    def unavailable_reason(self, facts: NodeFacts) -> str | None:
        if facts.mig_instances:
            return None
        return (
            "mode 'mig' needs MIG instances: enable MIG (`nvidia-smi -i 0 -mig 1`) and create "
            "instances (`nvidia-smi mig -cgi 1g.10gb -C`)"
        )

    def mode_env(self, grant: Grant, facts: NodeFacts) -> dict[str, str]:
        return framework_caps(grant)
