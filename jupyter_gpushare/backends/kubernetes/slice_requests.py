"""A kernel pod's slice request, as its kernelspec (or a start's arguments) and the server's
settings make it: checked, with the defaults filled in, within ``max_memory_per_kernel`` — before
anything is asked of the cluster or of a broker."""

from __future__ import annotations

from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import DoesNotFitError
from jupyter_gpushare.core.placement.allocator import kernel_limit_refusal
from jupyter_gpushare.core.sizes import bytes_or_none
from jupyter_gpushare.core.slice_request import SliceRequest, make_slice_request


def pod_slice_request(memory: object, mode: object, cores: object, settings: GPUShare) -> SliceRequest:
    request = make_slice_request(
        memory,
        mode,
        cores,
        settings.default_memory,
        settings.default_mode,
        settings.min_memory_bytes(),
    )
    if request.size.form == "bytes":
        refusal = kernel_limit_refusal(request.size.resolve(0), bytes_or_none(settings.max_memory_per_kernel))
        if refusal is not None:
            raise DoesNotFitError(refusal)
    return request


__all__ = ["pod_slice_request"]
