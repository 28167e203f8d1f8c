"""``jupyter gpushare``: status of the node's pool, and kernelspec installation (docs/reference/cli.md)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jupyter_gpushare import __version__
from jupyter_gpushare.backends import backend_for
from jupyter_gpushare.backends.kubernetes.objects.presets import DRA_PRESETS, PRESETS, PresetError
from jupyter_gpushare.broker.settings import BROKER_CONFIG_DIR
from jupyter_gpushare.config import GPUShare, load_settings, unreported_warnings
from jupyter_gpushare.config.kernelspecs import (
    hidden_by,
    install_kernelspecs,
    kernels_directory,
    kernelspec_name,
)
from jupyter_gpushare.config.kinds import kind_names
from jupyter_gpushare.core.accounting.usage_report import ReportError, as_csv, as_table, check_by, parse_since
from jupyter_gpushare.core.errors import BackendUnavailableError, GPUShareError, SimulationSpecError
from jupyter_gpushare.core.modes import MODES
from jupyter_gpushare.core.payloads import KernelPayload, PoolPayload, StatusPayload
from jupyter_gpushare.core.sizes import SizeError, format_bytes, parse_size
from jupyter_gpushare.core.terminal import printable


class CommandError(Exception):
    """A user error: printed as one line, exit code 2, nothing changed."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter gpushare",
        description="Fractional GPUs for Jupyter kernels.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    status = commands.add_parser(
        "status", help="pool, slices and queue from the node ledger (releases dead kernels' slices first)"
    )
    status.add_argument("--json", action="store_true", help='print {"pool": ..., "kernels": [...]}')

    usage = commands.add_parser(
        "report",
        help="what kernels reserved and used (GiB·hours), their busy, idle and suspended hours and "
        "queue waits: yours, or every user's for a broker's admin (the doctor's test kernels apart)",
    )
    usage.add_argument("--since", default="7d", help="how far back: 7d (default), 24h, 90m, 2w")
    usage.add_argument(
        "--by",
        default="user",
        help="user (default), group (JupyterHub groups) or kernel (each kernel: its short id, owner, "
        "start and notebook)",
    )
    usage.add_argument("--format", default="table", help="table (default), csv or json")

    render = commands.add_parser(
        "render-pod",
        help="print the kernel pod manifest (YAML) the Kubernetes backend would create, and its "
        "ResourceClaim under a DRA preset",
    )
    render.add_argument("--memory", help="slice size, e.g. 4G (default: GPUShare.default_memory)")
    render.add_argument("--mode", choices=list(MODES), help="sharing mode (default: GPUShare.default_mode)")
    render.add_argument("--cores", help="percent of the GPU's SMs, where the mode can limit it")
    render.add_argument("--kernelspec", metavar="NAME", help="take argv and the request from this kernelspec")
    render.add_argument(
        "--preset", choices=list(PRESETS), help="resource preset (default: GPUShare.resource_preset)"
    )
    render.add_argument("--kernel-id", default="00000000-0000-4000-8000-000000000000", help=argparse.SUPPRESS)

    profiles = commands.add_parser(
        "profiles",
        help="print a KubeSpawner profile_list (YAML for Zero to JupyterHub's singleuser.profileList)",
    )
    profiles.add_argument("--sizes", help="comma-separated sizes (default: GPUShare.sizes)")
    profiles.add_argument("--mode", choices=list(MODES), default="vgpu", help="sharing mode (default: vgpu)")
    profiles.add_argument(
        "--preset", choices=list(PRESETS), default="hami", help="resource preset (default: hami)"
    )
    profiles.add_argument(
        "--mig-profiles", help="comma-separated MIG profiles for --mode mig, e.g. 1g.10gb,3g.40gb"
    )
    profiles.add_argument(
        "--kueue-queue",
        help="the Kueue LocalQueue GPU servers wait in (their pods are labelled for it; "
        "docs/admins/kueue.md)",
    )
    profiles.add_argument(
        "--claim-templates",
        action="store_true",
        help="with a DRA preset: print the ResourceClaimTemplates the profiles refer to, for "
        "kubectl apply -n <users' namespace> -f -",
    )

    doctor = commands.add_parser(
        "doctor",
        help="check driver, MIG, MPS, libvgpu.so, ledger, cluster and a test kernel; a fix per problem",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--no-kernel", action="store_true", help="skip starting a test kernel")

    broker = commands.add_parser(
        "broker",
        help="run the GPU broker: the one process that holds the ledger or the cluster for many users",
    )
    broker.add_argument("--socket", metavar="PATH", help="serve on this Unix socket (a team box)")
    broker.add_argument("--ip", metavar="IP", help="serve HTTP on this address (a JupyterHub service)")
    broker.add_argument(
        "--port", metavar="N", type=int, help="HTTP port (default: GPUShareBroker.port, 8765)"
    )
    broker.add_argument("--backend", choices=kind_names(), help="what it holds (default: GPUShare.backend)")
    broker.add_argument(
        "--config-dir",
        metavar="DIR",
        default=BROKER_CONFIG_DIR,
        help="its own configuration: jupyter_server_config.py (or .json) with the GPUShare limits and "
        f"GPUShareBroker settings, read before the Jupyter config path (default: {BROKER_CONFIG_DIR})",
    )

    kernelspec = commands.add_parser("kernelspec", help="manage gpushare kernelspecs")
    kernelspec_commands = kernelspec.add_subparsers(dest="kernelspec_command", metavar="ACTION")
    kernelspec_commands.required = True
    install = kernelspec_commands.add_parser(
        "install",
        help='install "Python 3 (GPU)" (its size is picked at each start), and one kernelspec per '
        "size given with --sizes (for nbclient, papermill, jupyter console)",
    )
    install.add_argument("--sizes", help="comma-separated fixed sizes, e.g. 2G,4G,whole")
    install.add_argument("--mode", choices=list(MODES), help="sharing mode (default: GPUShare.default_mode)")
    install.add_argument(
        "--picker",
        action="store_true",
        help='with --sizes, install "Python 3 (GPU)" (python3-gpu) even where it would hide one '
        "installed elsewhere, such as the administrator's (without --sizes it is always installed)",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (a venv/conda env)")
    where.add_argument("--prefix", metavar="P", help="install under prefix P")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Faults reach the user once, as the sentence below, not also through the library's log.
    logging.getLogger("jupyter_gpushare").addHandler(logging.NullHandler())
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "status":
            return _status(arguments.json)
        if arguments.command == "report":
            return _report(arguments.since, arguments.by, arguments.format)
        if arguments.command == "kernelspec":
            return _install(arguments)
        if arguments.command == "render-pod":
            return _render_pod(arguments)
        if arguments.command == "profiles":
            return _profiles(arguments)
        if arguments.command == "broker":
            return _broker(arguments)
        if arguments.command == "doctor":
            from jupyter_gpushare.doctor import report, run_checks

            checks = run_checks(_settings(), kernel=not arguments.no_kernel)
            print(printable(report(checks, arguments.json)))
            return 1 if any(check.status == "FAIL" for check in checks) else 0
    except BackendUnavailableError as error:
        # The pool (the node's ledger, the cluster), not the command, is at fault: the sentence
        # names what and the fix.
        print(f"jupyter gpushare: error: {printable(str(error))}", file=sys.stderr)
        return 1
    except (CommandError, GPUShareError, SizeError, SimulationSpecError, PresetError) as error:
        print(f"jupyter gpushare: error: {printable(str(error))}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {arguments.command!r}")
    return 2  # pragma: no cover - parser.error exits


def _settings() -> GPUShare:
    """The settings every command uses; a user's setting an administrator's file overrules is
    said on stderr, not applied silently."""
    settings = load_settings()
    bypassed = settings.settled.broker_bypassed() if settings.settled else None
    for sentence in [*unreported_warnings(settings), *([bypassed] if bypassed else [])]:
        print(f"jupyter gpushare: warning: {printable(sentence)}", file=sys.stderr)
    return settings


def _broker(arguments: argparse.Namespace) -> int:
    from jupyter_gpushare.broker.app import run
    from jupyter_gpushare.broker.settings import load_broker_configuration

    flags = {"socket": arguments.socket, "ip": arguments.ip, "port": arguments.port}
    run(load_broker_configuration(arguments.config_dir, flags, arguments.backend))
    return 0


def _status(as_json: bool) -> int:
    # The local backend reconciles the ledger as it opens it (a broker's client asks the broker
    # to); the Kubernetes one lists the cluster.
    backend = backend_for(_settings())
    backend.check_access()  # a pool that cannot be read at all: one sentence, exit status 1
    status: StatusPayload = {"pool": backend.pool(), "kernels": backend.all_kernels()}
    if as_json:
        print(json.dumps(status, indent=2))
        return 0
    # Every cell came from someone: ids, paths and names from users, messages from the pool.
    print(printable(_format_status(status["pool"], status["kernels"], backend.location())))
    return 0


def _report(since: str, by: str, form: str) -> int:
    # Every flag is checked before the pool is opened: a bad one is one sentence, exit status 2.
    try:
        seconds, by = parse_since(since), check_by(by)
    except ReportError as error:
        raise CommandError(f"--{error}") from None
    if form not in REPORT_FORMATS:
        raise CommandError(f"--format takes one of {', '.join(REPORT_FORMATS)}, not {form!r}")
    payload = backend_for(_settings()).usage(seconds, by)
    if form == "json":
        print(json.dumps(payload, indent=2))
    else:
        print(as_csv(payload) if form == "csv" else as_table(payload))
    return 0


REPORT_FORMATS = ("table", "csv", "json")


def _format_status(pool: PoolPayload, kernels: list[KernelPayload], location: str) -> str:
    lines = [
        f"Pool: {len(pool['devices'])} device(s){' (simulated)' if pool['simulated'] else ''}, "
        f"backend {pool['backend']}, overcommit {pool['overcommit']:g}",
        location[:1].upper() + location[1:],
    ]
    if pool.get("problem"):
        lines.append(f"Problem: {pool['problem']}")
    for device in pool["devices"]:
        label = "" if device.get("node") else f"GPU{device['id']}  "
        lines.append(
            f"{label}{device['name']}  reserved {format_bytes(device['memory_reserved'])}"
            f" of {format_bytes(device['memory_total'])}  modes: {', '.join(device['modes']) or '-'}"
        )
        for kernel in kernels:
            if kernel["state"] == "running" and kernel["device"] == device["id"]:
                lines.append(
                    f"  {kernel['kernel_id'] or '(hidden)'}  {kernel['owner']}  "
                    f"{format_bytes(kernel['memory_request'] or 0)} {kernel['mode']}  "
                    f"{kernel.get('pod') or kernel['path']}".rstrip()
                )
    queued = [kernel for kernel in kernels if kernel["state"] == "queued"]
    lines.append(f"Queue: {len(queued)} waiting")
    for kernel in queued:
        lines.append(
            f"  {kernel['queue_position']}. {kernel['kernel_id'] or '(hidden)'}  {kernel['owner']}  "
            f"{kernel['size']} {kernel['mode']}" + (f"  {kernel['detail']}" if kernel.get("detail") else "")
        )
    return "\n".join(lines)


def _render_pod(arguments: argparse.Namespace) -> int:
    import yaml
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    from jupyter_gpushare.backends.kubernetes.objects.build import (
        DEFAULT_ARGV,
        cluster_facts,
        kernel_claim,
        kernel_pod,
    )
    from jupyter_gpushare.backends.kubernetes.objects.claims import whole_card_warning
    from jupyter_gpushare.core.slice_request import make_slice_request

    settings = _settings()
    if arguments.preset:
        settings.resource_preset = arguments.preset
    argv: tuple[str, ...] = DEFAULT_ARGV
    kernel_env: dict[str, str] = {}
    memory, mode, cores = arguments.memory, arguments.mode, arguments.cores
    if arguments.kernelspec:
        try:
            spec = KernelSpecManager().get_kernel_spec(arguments.kernelspec)
        except NoSuchKernel:
            raise CommandError(f"no kernelspec named {arguments.kernelspec!r}") from None
        argv = tuple(spec.argv)
        kernel_env = dict(spec.env or {})
        config = ((spec.metadata or {}).get("kernel_provisioner") or {}).get("config") or {}
        memory = memory or config.get("gpu_memory")
        mode = mode or config.get("gpu_mode")
        cores = cores or config.get("gpu_cores")
    request = make_slice_request(memory, mode, cores, settings.default_memory, settings.default_mode)
    owner = settings.effective_owner()
    server_id = f"{owner}@render-pod"
    pod, pod_request = kernel_pod(
        settings,
        kernel_id=arguments.kernel_id,
        server_id=server_id,
        owner=owner,
        request=request,
        cluster=cluster_facts(settings),
        argv=argv,
        kernel_env=kernel_env,
    )
    claim = kernel_claim(
        pod_request,
        kernel_id=arguments.kernel_id,
        server_id=server_id,
        owner=owner,
        namespace=pod["metadata"]["namespace"],
        size=request.size.text,
        queue=settings.kueue_queue or None,
    )
    print("# The connection file and token are mounted from a Secret of the same name + -conn.")
    if claim is not None:
        print("# The ResourceClaim below is created with the pod and owned by it (its uid then).")
        whole = None if request.size.is_whole else whole_card_warning(claim["spec"], request.mode.name)
        if whole:
            print(f"jupyter gpushare: warning: {whole}", file=sys.stderr)
            print(f"# Warning: {whole}")
    print(yaml.safe_dump(pod, sort_keys=False), end="")
    if claim is not None:
        print("---")
        print(yaml.safe_dump(claim, sort_keys=False), end="")
    return 0


def _profiles(arguments: argparse.Namespace) -> int:
    import yaml

    from jupyter_gpushare.hub import claim_templates, static_profiles

    settings = _settings()
    sizes = _sizes(arguments.sizes, settings.sizes)
    mig = [profile.strip() for profile in arguments.mig_profiles.split(",")] if arguments.mig_profiles else []
    options: dict[str, Any] = {"preset": arguments.preset, "mig_profiles": mig}
    dra = arguments.preset in DRA_PRESETS
    if arguments.kueue_queue:
        from jupyter_gpushare.config.traits import local_queue_problem

        problem = local_queue_problem(arguments.kueue_queue)
        if problem is not None:
            raise CommandError(f"--kueue-queue: {problem}")
        if not arguments.claim_templates:  # a claim is not queued: its pod is
            options["kueue_queue"] = arguments.kueue_queue
    if dra:
        options["dra_names"] = settings.dra_names()  # the generic preset's names come from config
    if arguments.claim_templates:
        if not dra:
            raise CommandError(f"--claim-templates needs a DRA preset ({', '.join(DRA_PRESETS)})")
        templates = claim_templates(sizes, arguments.mode, **options)
        print("# ResourceClaimTemplates of the GPU profiles: kubectl apply -n <users' namespace> -f -")
        print(yaml.safe_dump_all(templates, sort_keys=False), end="")
        return 0
    profile_list = static_profiles(sizes, arguments.mode, **options)
    print("# singleuser.profileList for Zero to JupyterHub, made by `jupyter gpushare profiles`")
    if dra:
        print(
            f"# Each choice refers to a ResourceClaimTemplate: create them with `jupyter gpushare "
            f"profiles --preset {arguments.preset} --mode {arguments.mode} --claim-templates`."
        )
    print(yaml.safe_dump(profile_list, sort_keys=False), end="")
    return 0


def _sizes(text: str | None, default: list[str]) -> list[str]:
    sizes = [size.strip() for size in text.split(",")] if text else list(default)
    if not sizes or not all(sizes):
        raise CommandError("--sizes needs a comma-separated list such as 2G,4G,whole")
    for size in sizes:
        parse_size(size)  # every size checked before anything is done
    return sizes


def _install(arguments: argparse.Namespace) -> int:
    settings = _settings()
    sizes = _sizes(arguments.sizes, []) if arguments.sizes is not None else []
    prefix = sys.prefix if arguments.sys_prefix else arguments.prefix
    mode = arguments.mode or settings.default_mode
    directory = kernels_directory(arguments.user, prefix)
    picker = kernelspec_name(None, mode)
    # "Python 3 (GPU)" comes with the sizes unless a copy here would hide one installed where
    # Jupyter looks later (a user's over the administrator's: then the administrator's updates
    # and settings never reach that user); asked for alone, or with --picker, it is installed.
    hidden = hidden_by(picker, directory)
    asking = not sizes or arguments.picker or not hidden
    installed = install_kernelspecs(sizes, mode, user=arguments.user, prefix=prefix, asking=asking)
    for name, place in installed:
        hides = hidden_by(name, Path(place).parent)
        also = f", hiding {_listed(hides)}" if hides else ""
        print(f"Installed kernelspec {name} in {place}{also}")
    if not asking:
        mine = directory / picker
        if (mine / "kernel.json").is_file():
            print(
                f"Not installed: {picker}: the one already in {mine} hides {_listed(hidden)}; "
                f"`jupyter kernelspec remove {picker}` removes it (--picker installs it anew)"
            )
        else:
            in_use = f"{_listed(hidden)} is in use"
            print(f"Not installed: {picker}: {in_use} (--picker installs one here, hiding it)")
    return 0


def _listed(paths: Sequence[Path]) -> str:
    return " and ".join(f"the one in {path}" for path in paths)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
