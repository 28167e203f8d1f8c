"""JupyterHub: GPU sizes as KubeSpawner profile options, and a GPU budget for any spawner.

``gpu_profiles()`` builds a KubeSpawner ``profile_list`` (docs/admins/jupyterhub.md). Its choices
carry the pod resources of the chosen mode (the same builders as kernel pods), and the single-user
server is told its GPU budget through ``JUPYTER_GPUSHARE_*`` variables, so its own kernels are held
to it. The custom size is validated by a regex and converted to the resource's unit by a callable
override — KubeSpawner calls callables with the spawner instead of formatting them, so each spawn
reads its own value and no earlier value can stick.

Under a DRA preset (``nvidia-dra``, ``hami-dra``, ``dra``) a choice attaches a ResourceClaim to the
server instead of extended resources: KubeSpawner's ``modify_pod_hook`` refers the pod to it and
``after_pod_created_hook`` creates it, owned by the pod
(:mod:`jupyter_gpushare.backends.kubernetes.cluster.spawner_claims`). YAML cannot hold hooks:
``static_profiles()`` refers each choice to a ResourceClaimTemplate (``claim_templates()`` prints
them, ``jupyter gpushare profiles --claim-templates``), from which Kubernetes makes a claim with
each server pod.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.spawner_claims import ServerClaim, configured_hook
from jupyter_gpushare.backends.kubernetes.cluster.spawner_kueue import told_while_queued
from jupyter_gpushare.backends.kubernetes.objects.claims import make_claim_template, pod_claim_reference
from jupyter_gpushare.backends.kubernetes.objects.dialects import kernel_request
from jupyter_gpushare.backends.kubernetes.objects.kueue import queue_labels
from jupyter_gpushare.backends.kubernetes.objects.manifests import CLAIM_REQUEST
from jupyter_gpushare.backends.kubernetes.objects.presets import resolve_preset
from jupyter_gpushare.config.traits import local_queue_problem
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.modes import get_mode
from jupyter_gpushare.core.pods.cluster import ClusterFacts
from jupyter_gpushare.core.pods.presets import ResourcePreset
from jupyter_gpushare.core.pods.requests import TYPED_VALUE, PodRequest
from jupyter_gpushare.core.sizes import format_bytes, parse_size

OPTION = "gpu"
# docs/users/sizes.md amounts: 6G, 6g, 6GB, 6GiB, 0.5G, 512M, 512MB, 512MiB, or a bare integer (MiB).
CUSTOM_SIZE_REGEX = r"^\s*(\d+(\.\d+)?|\.\d+)\s*([gGmM]([iI]?[bB])?)?\s*$"
CUSTOM_SIZE_MESSAGE = "A GPU memory size such as 6G, 512M or 4096 (MiB)."


def _choice_slug(size: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", size.lower()).strip("-") or "size"


def _label(size: str) -> str:
    parsed = parse_size(size)
    if parsed.is_whole:
        return "A whole GPU"
    if parsed.form == "percent":
        return f"{parsed.text} of a GPU"
    return f"{format_bytes(parsed.resolve(0))} of GPU memory"


def spawner_overrides(request: PodRequest, size: str, mode: str, queue: str | None = None) -> dict[str, Any]:
    """KubeSpawner trait overrides for one GPU choice (a DRA claim's hooks: :func:`claim_hooks`);
    with ``queue``, the server pod waits in that Kueue LocalQueue."""
    environment = {
        env_names.DEFAULT_MODE: mode,
        env_names.GPU_SIZE: size,
    }
    if request.memory is not None:
        # The server's kernels share this slice among themselves, each capped by gpushare.
        environment[env_names.MAX_MEMORY_PER_USER] = str(request.memory // (1024 * 1024))
    overrides: dict[str, Any] = {
        "extra_resource_limits": dict(request.resources),
        "environment": {**request.env, **environment},
    }
    if request.annotations:
        overrides["extra_annotations"] = dict(request.annotations)
    labels = {**request.labels, **queue_labels(queue)}
    if labels:
        overrides["extra_labels"] = labels
    if request.scheduler_name:
        overrides["scheduler_name"] = request.scheduler_name
    return overrides


def checked_queue(queue: str | None) -> str | None:
    """``queue`` if it can name a Kueue LocalQueue (GPUShare.kueue_queue's rule), else ValueError."""
    problem = local_queue_problem(queue) if queue else None
    if problem is not None:
        raise ValueError(f"kueue_queue: {problem}")
    return queue or None


def claim_hooks(claim: ServerClaim) -> dict[str, Any]:
    """The KubeSpawner overrides that give a server its own ResourceClaim."""
    return {
        "modify_pod_hook": claim.modify_pod_hook,
        "after_pod_created_hook": claim.after_pod_created_hook,
    }


def queue_hooks(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The KubeSpawner override that tells a queued server's spawn progress what Kueue says of
    its pod while it waits (after the choice's own ``after_pod_created_hook``, a claim's)."""
    return {"after_pod_created_hook": told_while_queued(overrides.get("after_pod_created_hook"))}


def cluster_of(
    preset: str,
    resource_names: Mapping[str, str] | None = None,
    mig_profiles: Sequence[str] = (),
    gpu_memory: str | None = None,
    dra_names: Mapping[str, object] | None = None,
) -> ClusterFacts:
    return ClusterFacts(
        preset=resolve_preset(preset, resource_names, dra_names),
        mig_profiles=tuple(mig_profiles),
        gpu_memory=parse_size(gpu_memory).resolve(0) if gpu_memory else None,
    )


def gpu_profiles(
    sizes: Sequence[str] = ("2G", "4G", "8G", "16G", "whole"),
    mode: str = "vgpu",
    *,
    preset: str = "hami",
    resource_names: Mapping[str, str] | None = None,
    dra_names: Mapping[str, object] | None = None,
    mig_profiles: Sequence[str] = (),
    gpu_memory: str | None = None,
    cores: int | None = None,
    default: str | None = None,
    custom: bool = True,
    display_name: str = "GPU notebook",
    description: str = "A Jupyter server with a GPU slice",
    slug: str = "gpu",
    kubespawner_override: Mapping[str, Any] | None = None,
    cpu_profile: bool = True,
    kueue_queue: str | None = None,
) -> list[dict[str, Any]]:
    """A KubeSpawner ``profile_list`` offering ``sizes`` of GPU in ``mode``.

    Every size is checked now, so a typo in ``jupyterhub_config.py`` fails at hub start.
    ``gpu_memory`` (the cards' memory, e.g. "80G") lets shares such as "25%" be offered.
    Under a DRA preset each server gets a ResourceClaim of its own (``dra_names``: the DRA
    names of the generic preset, as the ``dra_*`` traits give them: field -> value).
    With ``kueue_queue`` (a LocalQueue in the servers' namespace), a GPU server's pod is labelled
    for it and waits for Kueue's quota (docs/admins/kueue.md); the CPU profile is not queued.
    """
    queue = checked_queue(kueue_queue)
    cluster = cluster_of(preset, resource_names, mig_profiles, gpu_memory, dra_names)
    choices: dict[str, Any] = {}
    for size in sizes:
        request = kernel_request(mode, parse_size(size), cores, cluster)
        overrides = spawner_overrides(request, size, mode, queue)
        if request.claim is not None:
            overrides.update(claim_hooks(ServerClaim.fixed(dict(request.claim), size)))
        if queue:
            overrides.update(queue_hooks(overrides))
        choices[_choice_slug(size)] = {
            "display_name": _label(size),
            "kubespawner_override": overrides,
        }
    if not choices:
        raise ValueError("gpu_profiles needs at least one size")
    default_slug = _choice_slug(default) if default else next(iter(choices))
    if default_slug not in choices:
        raise ValueError(f"default size {default!r} is not one of {list(sizes)}")
    choices[default_slug]["default"] = True

    option: dict[str, Any] = {"display_name": "GPU size", "choices": choices}
    if custom:
        option["unlisted_choice"] = {
            "enabled": True,
            "display_name": "Custom GPU size (e.g. 6G)",
            "display_name_in_choices": "Custom size…",
            "validation_regex": CUSTOM_SIZE_REGEX,
            "validation_message": CUSTOM_SIZE_MESSAGE,
            "kubespawner_override": _custom_overrides(mode, cores, cluster, queue),
        }
    gpu = {
        "display_name": display_name,
        "slug": slug,
        "description": description,
        "default": True,
        "profile_options": {OPTION: option},
        "kubespawner_override": dict(kubespawner_override or {}),
    }
    profiles = [gpu]
    if cpu_profile:
        cpu_overrides: dict[str, Any] = {}
        if cluster.preset.dra is not None or queue:
            # A spawner object outlives a spawn: a CPU server after a GPU one has the admin's
            # hooks again, not the claim's or the queue's.
            cpu_overrides = {
                name: lambda spawner, name=name: configured_hook(spawner, name)
                for name in ("modify_pod_hook", "after_pod_created_hook")
            }
        profiles.append(
            {
                "display_name": "CPU only",
                "slug": "cpu",
                "description": "No GPU",
                "kubespawner_override": cpu_overrides,
            }
        )
    return profiles


def _custom_overrides(
    mode: str, cores: int | None, cluster: ClusterFacts, queue: str | None
) -> dict[str, Any]:
    """Callables computing each override from this spawn's own custom value."""

    def request_of(spawner: Any) -> tuple[PodRequest, str]:
        value = str(spawner.user_options.get(f"{OPTION}--unlisted-choice", "")).strip()
        return kernel_request(mode, parse_size(value), cores, cluster), value

    def field(name: str) -> Callable[[Any], Any]:
        def compute(spawner: Any) -> Any:
            request, value = request_of(spawner)
            return spawner_overrides(request, value, mode, queue).get(name, {})

        return compute

    names = ["extra_resource_limits", "environment", "extra_annotations", "extra_labels"]
    overrides: dict[str, Any] = {name: field(name) for name in names}
    scheduler = get_mode(mode).scheduler_name(cluster.preset)
    if scheduler:
        overrides["scheduler_name"] = scheduler
    if cluster.preset.dra is not None:

        def spec_of(spawner: Any) -> dict[str, Any]:
            request, value = request_of(spawner)
            if request.claim is None:  # pragma: no cover - a DRA preset always makes a claim
                raise ValueError(f"no claim for {value}")
            return dict(request.claim)

        overrides.update(claim_hooks(ServerClaim(spec_of, lambda spawner: request_of(spawner)[1])))
    if queue:
        overrides.update(queue_hooks(overrides))
    return overrides


def static_profiles(
    sizes: Sequence[str] = ("2G", "4G", "8G", "16G", "whole"), mode: str = "vgpu", **options: Any
) -> list[dict[str, Any]]:
    """The same profile list with only plain values, for YAML (Zero to JupyterHub's
    ``singleuser.profileList``).

    YAML cannot hold the callables that convert a custom size, so the custom field there takes a
    whole number in the resource's own unit (MiB, or GiB for Aliyun) and passes it through
    KubeSpawner's ``{value}`` template; ``gpu_profiles()`` in ``hub.extraConfig`` accepts any size.
    Nor hooks: a server queued by Kueue waits as in ``gpu_profiles()``, but its spawn's progress
    does not say Kueue's words (that is a hook's task).
    """
    profiles = gpu_profiles(sizes, mode, **options)
    for profile in profiles:
        _drop_hooks(profile["kubespawner_override"])
        for choice in (profile.get("profile_options") or {}).get(OPTION, {}).get("choices", {}).values():
            _drop_hooks(choice["kubespawner_override"])
    option = profiles[0]["profile_options"][OPTION]
    preset = resolve_preset(
        options.get("preset", "hami"), options.get("resource_names"), options.get("dra_names")
    )
    if preset.dra is not None:
        return _static_claims(profiles, sizes, mode)
    custom = option.get("unlisted_choice")
    if custom is None:
        return profiles
    template = _templated_custom(mode, preset, options.get("cores"), options.get("kueue_queue"))
    if template is None:
        del option["unlisted_choice"]
        return profiles
    unit, overrides = template
    custom.update(
        {
            "display_name": f"Custom GPU size in {unit}",
            "validation_regex": r"^[1-9][0-9]{0,6}$",
            "validation_message": f"A whole number of {unit}.",
            "kubespawner_override": overrides,
        }
    )
    return profiles


def _drop_hooks(overrides: dict[str, Any]) -> None:
    for hook in ("modify_pod_hook", "after_pod_created_hook"):
        overrides.pop(hook, None)


def template_name(mode: str, size: str) -> str:
    """The ResourceClaimTemplate a static DRA profile choice refers to."""
    return f"gpushare-{mode}-{_choice_slug(size)}"


def _static_claims(profiles: list[dict[str, Any]], sizes: Sequence[str], mode: str) -> list[dict[str, Any]]:
    """DRA choices for YAML: the pod refers to a ResourceClaimTemplate (Kubernetes makes a claim
    from it with each server pod and deletes it with the pod), and the notebook container lists
    the claim. KubeSpawner replaces the container's ``resources`` with ``extra_container_config``'s,
    so CPU and memory guarantees go into the same block where they are needed (see docs/dra.md)."""
    option = profiles[0]["profile_options"][OPTION]
    option.pop("unlisted_choice", None)  # a template per typed-in value cannot exist beforehand
    for size in sizes:
        overrides = option["choices"][_choice_slug(size)]["kubespawner_override"]
        for hook in ("modify_pod_hook", "after_pod_created_hook"):
            overrides.pop(hook, None)
        overrides["extra_pod_config"] = {
            "resourceClaims": [pod_claim_reference(template_name(mode, size), template=True)]
        }
        overrides["extra_container_config"] = {"resources": {"claims": [{"name": CLAIM_REQUEST}]}}
    profiles[1:] = [{**profile, "kubespawner_override": {}} for profile in profiles[1:]]
    return profiles


def claim_templates(
    sizes: Sequence[str] = ("2G", "4G", "8G", "16G", "whole"),
    mode: str = "mps",
    *,
    preset: str = "nvidia-dra",
    resource_names: Mapping[str, str] | None = None,
    dra_names: Mapping[str, object] | None = None,
    mig_profiles: Sequence[str] = (),
    gpu_memory: str | None = None,
    cores: int | None = None,
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    """The ResourceClaimTemplates :func:`static_profiles` refers to, one per size."""
    cluster = cluster_of(preset, resource_names, mig_profiles, gpu_memory, dra_names)
    if cluster.preset.dra is None:
        raise ValueError(f"resource preset {preset!r} is not a DRA preset: its profiles need no claim")
    templates = []
    for size in sizes:
        request = kernel_request(mode, parse_size(size), cores, cluster)
        assert request.claim is not None
        labels = {
            "app.kubernetes.io/name": "jupyter-gpushare-server",
            "app.kubernetes.io/managed-by": "jupyter-gpushare",
        }
        templates.append(
            make_claim_template(template_name(mode, size), request.claim, labels=labels, namespace=namespace)
        )
    return templates


def _templated_custom(
    mode: str, preset: ResourcePreset, cores: int | None, queue: str | None
) -> tuple[str, dict[str, Any]] | None:
    """The overrides of a custom size typed as a whole number of the mode's unit (KubeSpawner's
    ``{value}``), or None where the mode takes no amount (a whole card, a MIG profile)."""
    templated = get_mode(mode).templated_request(preset, cores)
    if templated is None:
        return None
    request = templated.request
    budget = TYPED_VALUE if templated.unit == "MiB" else f"{TYPED_VALUE}G"
    overrides: dict[str, Any] = {
        "extra_resource_limits": dict(request.resources),
        "environment": {env_names.DEFAULT_MODE: mode, env_names.MAX_MEMORY_PER_USER: budget},
    }
    if request.annotations:
        overrides["extra_annotations"] = dict(request.annotations)
    labels = {**request.labels, **queue_labels(queue)}
    if labels:
        overrides["extra_labels"] = labels
    if request.scheduler_name:
        overrides["scheduler_name"] = request.scheduler_name
    return templated.unit, overrides


def budget_options_form(sizes: Iterable[str] = ("4G", "8G", "16G"), default: str | None = None) -> str:
    """An ``options_form`` for any spawner: the user picks a GPU budget for their server."""
    sizes = list(sizes)
    for size in sizes:
        parse_size(size)
    chosen = default or sizes[0]
    options = "".join(
        f'<option value="{html.escape(size)}"{" selected" if size == chosen else ""}>'
        f"{html.escape(_label(size))}</option>"
        for size in sizes
    )
    return (
        '<label for="gpu-budget">GPU memory for this server</label>'
        f'<select id="gpu-budget" name="gpu_budget" class="form-control">{options}</select>'
    )


def budget_from_form(formdata: Mapping[str, list[str]], allowed: Iterable[str]) -> dict[str, str]:
    """``options_from_form`` for :func:`budget_options_form`: only offered sizes are accepted."""
    allowed = list(allowed)
    value = (formdata.get("gpu_budget") or [""])[0]
    if value not in allowed:
        raise ValueError(f"GPU budget {value!r} is not one of {', '.join(allowed)}")
    return {"gpu_budget": value}


def budget_environment(user_options: Mapping[str, Any], ledger_path: str | None = None) -> dict[str, str]:
    """Environment for a local spawner so the user's server holds its kernels to the budget.

    Several users' servers on one node share the ledger at ``ledger_path``.
    """
    budget = user_options.get("gpu_budget")
    environment: dict[str, str] = {}
    if budget:
        parse_size(budget)
        environment[env_names.MAX_MEMORY_PER_USER] = str(budget)
    if ledger_path:
        environment[env_names.LEDGER_PATH] = ledger_path
    return environment


__all__ = [
    "CUSTOM_SIZE_REGEX",
    "budget_environment",
    "budget_from_form",
    "budget_options_form",
    "claim_templates",
    "gpu_profiles",
    "static_profiles",
]
