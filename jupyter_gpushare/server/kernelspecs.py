"""Which kernelspecs are gpushare's, and the slice each asks for (read from the spec manager)."""

from __future__ import annotations

from typing import Any

from jupyter_client.kernelspec import NoSuchKernel

from jupyter_gpushare.core.errors import InvalidRequestError

PROVISIONER_NAME = "gpushare-provisioner"


def provisioner_config(spec: Any) -> dict[str, Any] | None:
    """The slice fields of a gpushare kernelspec, or None for any other kernelspec."""
    stanza = (spec.metadata or {}).get("kernel_provisioner") or {}
    if stanza.get("provisioner_name") != PROVISIONER_NAME:
        return None
    return dict(stanza.get("config") or {})


def gpushare_kernelspecs(kernel_spec_manager: Any) -> list[str]:
    specs = kernel_spec_manager.get_all_specs()
    return sorted(
        name
        for name, entry in specs.items()
        if ((entry.get("spec") or {}).get("metadata") or {})
        .get("kernel_provisioner", {})
        .get("provisioner_name")
        == PROVISIONER_NAME
    )


def default_kernelspec(kernel_spec_manager: Any, kernel_manager: Any) -> str:
    """The server's default kernel if it is a gpushare one, else the first gpushare kernelspec."""
    names = gpushare_kernelspecs(kernel_spec_manager)
    default = getattr(kernel_manager, "default_kernel_name", "")
    if default in names:
        return str(default)
    if not names:
        raise InvalidRequestError(
            "no gpushare kernelspec is installed; run `jupyter gpushare kernelspec install`"
        )
    return names[0]


def request_defaults(kernel_spec_manager: Any, name: str) -> dict[str, Any]:
    """The slice kernelspec ``name`` asks for; a clear refusal for an unknown or foreign one."""
    try:
        spec = kernel_spec_manager.get_kernel_spec(name)
    except NoSuchKernel:
        raise InvalidRequestError(
            f"no kernelspec named {name!r}; gpushare kernelspecs: {gpushare_kernelspecs(kernel_spec_manager)}"
        ) from None
    defaults = provisioner_config(spec)
    if defaults is None:
        raise InvalidRequestError(
            f"kernelspec {name!r} does not use gpushare-provisioner; choose one of "
            f"{gpushare_kernelspecs(kernel_spec_manager)}"
        )
    return defaults
