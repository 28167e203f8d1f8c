"""What a backend can do with a kernel's slice: asked by callers instead of which backend it is.

Every backend answers the same kernel-facing calls (resize, give back, suspend, resume, declare
held memory); where one cannot do a call it raises the one :class:`~.errors.NotOfferedError`,
with its own sentence. A caller that decides before asking — the panel's buttons, the commands'
``isEnabled``, the idle timer choosing between suspend and release — reads these flags, which
reach the browser as each kernel's ``capabilities`` (``GET kernels``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU, GPUShareError, NotOfferedError
from jupyter_gpushare.core.payloads import CapabilitiesPayload

FLAGS = ("can_request", "can_release", "can_suspend", "can_force_shrink", "resize_restarts")


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers a running kernel; ``refusals`` says, per flag that is off, the
    sentence the refusal carries (a person reads it in %gpu, REST and the panel)."""

    can_request: bool = True
    can_release: bool = True
    can_suspend: bool = True
    can_force_shrink: bool = True
    resize_restarts: bool = False
    refusals: tuple[tuple[str, str], ...] = ()

    def payload(self) -> CapabilitiesPayload:
        return {
            "can_request": self.can_request,
            "can_release": self.can_release,
            "can_suspend": self.can_suspend,
            "can_force_shrink": self.can_force_shrink,
            "resize_restarts": self.resize_restarts,
        }

    def to_wire(self) -> dict[str, Any]:
        """The flags and the refusals' sentences, as a GPU broker tells its clients (``GET info``)."""
        return {**self.payload(), "refusals": dict(self.refusals)}

    @classmethod
    def from_wire(cls, answer: object) -> Capabilities:
        """What :meth:`to_wire` wrote; one sentence where the answer is not that."""
        if not isinstance(answer, dict):
            raise GPUShareError(f"the GPU broker's capabilities must be an object, not {answer!r}")
        flags = {flag: answer.get(flag) for flag in FLAGS}
        refusals = answer.get("refusals", {})
        if (
            not all(isinstance(value, bool) for value in flags.values())
            or not isinstance(refusals, dict)
            or not all(isinstance(sentence, str) for sentence in refusals.values())
        ):
            raise GPUShareError(
                f"the GPU broker's capabilities need true/false for {', '.join(FLAGS)} and "
                f"sentences for its refusals, not {answer!r}"
            )
        return cls(
            **{flag: bool(value) for flag, value in flags.items()},
            refusals=tuple((str(action), sentence) for action, sentence in refusals.items()),
        )

    def require(self, capability: str, action: str | None = None) -> None:
        """Nothing when ``capability`` (a flag's name) is offered, else :class:`NotOfferedError`
        with this backend's sentence for ``action`` (by default: for the flag)."""
        if not getattr(self, capability):
            raise NotOfferedError(self.refusal(action or capability, capability))

    def refusal(self, action: str, capability: str | None = None) -> str:
        """The sentence refusing ``action`` (or, without one of its own, ``capability``)."""
        sentences = dict(self.refusals)
        return (
            sentences.get(action)
            or sentences.get(capability or action)
            or f"{action.removeprefix('can_')} is not offered here: nothing was changed"
        )


# The node ledger, in the kernel's own process or the server's: everything.
NODE_LEDGER = Capabilities()

_THROUGH_A_BROKER = "is not available through a GPU broker yet: nothing was changed"

# What a broker's routes do not carry yet, whatever its backend offers: the sentences by action.
_NOT_THROUGH_A_BROKER = {
    "can_suspend": (
        ("can_suspend", f"suspend {_THROUGH_A_BROKER}"),
        ("resume", f"resume {_THROUGH_A_BROKER}"),
    ),
    "can_force_shrink": (("can_force_shrink", f"a forced shrink {_THROUGH_A_BROKER}"),),
}


def through_a_broker(offered: Capabilities) -> Capabilities:
    """What a GPU broker offers its clients of what its backend offers (``offered``): it places,
    resizes and releases, but does not checkpoint GPU state nor keep forced shrinks yet. A flag
    the backend already lacks keeps the backend's own sentence (a pod's, say)."""
    cut = [flag for flag in _NOT_THROUGH_A_BROKER if getattr(offered, flag)]
    if not cut:
        return offered
    sentences = dict(offered.refusals)
    for flag in cut:
        sentences.update(_NOT_THROUGH_A_BROKER[flag])
    return replace(offered, **{flag: False for flag in cut}, refusals=tuple(sentences.items()))


def offline(why: str) -> Capabilities:
    """Nothing offered, each refusal saying ``why`` (a broker that cannot be reached)."""
    return Capabilities(
        can_request=False,
        can_release=False,
        can_suspend=False,
        can_force_shrink=False,
        refusals=tuple((flag, why) for flag in FLAGS if flag != "resize_restarts"),
    )


# Local kernels whose slices a GPU broker holds.
LOCAL_BROKER = through_a_broker(NODE_LEDGER)


def pod_capabilities(held_for_life: str) -> Capabilities:
    """Kernel pods: Kubernetes holds a pod's resources for its life, so nothing is given back
    without a new pod, and a resize is a new pod (``held_for_life``: the sentence that says so)."""
    return Capabilities(
        can_request=False,
        can_release=False,
        can_suspend=False,
        can_force_shrink=False,
        resize_restarts=True,
        refusals=tuple(
            (flag, held_for_life)
            for flag in ("can_request", "can_release", "can_suspend", "can_force_shrink")
        ),
    )


KERNEL_PODS = pod_capabilities(POD_HOLDS_ITS_GPU)
