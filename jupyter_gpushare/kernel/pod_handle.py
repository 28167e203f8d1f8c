"""A kernel pod's handle on its slice, reaching it through the server that started the pod (one of
the two :class:`~.slice_handle.SliceHandle` implementations; the other is a local kernel's,
:mod:`.node_handle`).

A pod kernel has no node ledger: Kubernetes placed it and holds its slice for the pod's life.
It talks to the server that started it over HTTP, at ``JUPYTER_GPUSHARE_REPORT_URL`` (set by the
provisioner), proving who it is with the token mounted from its Secret — the same token the
server's provisioner keeps. A reporter thread sends the kernel's GPU use every
``sample_interval``; ``%gpu status``/``pool`` read the server's view; ``%gpu resize SIZE
--restart`` asks the server for a new pod of that size.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from jupyter_gpushare.backends.broker_client.transport import BrokerClient, UnreachableError
from jupyter_gpushare.core import env_names
from jupyter_gpushare.core.errors import POD_HOLDS_ITS_GPU, GPUShareError, NeedsRestartError, NotOfferedError
from jupyter_gpushare.core.modes import UnknownModeError, get_mode
from jupyter_gpushare.core.sizes import parse_size
from jupyter_gpushare.kernel import caps
from jupyter_gpushare.kernel.display import PodSliceStatus, PoolStatus
from jupyter_gpushare.kernel.pod_nvml import WholeCards

log = logging.getLogger("jupyter_gpushare")

REQUEST_TIMEOUT = 5.0


class PodSliceHandle:
    """The handle of this kernel, running in a pod the Kubernetes backend made: it also reports
    the kernel's GPU use to the server."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.kernel_id = env.get(env_names.KERNEL_ID, "")
        self.mode = env.get(env_names.MODE, "")
        memory = env.get(env_names.MEMORY_BYTES, "")
        self.memory = int(memory) if memory.isdigit() else None
        report_url = env.get(env_names.REPORT_URL, "")
        self.report_url = report_url or None
        self.kernel_url = report_url.removesuffix("/usage") if report_url else None
        self.interval = max(float(env.get(env_names.SAMPLE_INTERVAL) or 1.0), 0.2)
        self._token = read_token_file(env.get(env_names.TOKEN_FILE))
        self.declared: tuple[int, int | None] | None = None
        self._problem: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: BrokerClient | None = None  # the server's kernel routes, built on first use
        self._whole_cards = WholeCards() if holds_whole_cards(self.mode) else None

    # ---- talking to the server -----------------------------------------------------------

    def call(self, method: str, suffix: str, body: dict[str, Any] | None = None) -> Any:
        """One request to this kernel's own routes on the server (the broker's transport, with
        the kernel's token); its JSON answer, or the server's refusal as a domain error."""
        if not self.kernel_url:
            raise UnreachableError(
                "this kernel pod was started without a server to report to (no "
                f"{env_names.REPORT_URL}); the GPU panel and %gpu need a jupyter server with the "
                "Kubernetes backend"
            )
        if self._client is None:
            self._client = BrokerClient(
                self.kernel_url,
                hub_token="",
                timeout=REQUEST_TIMEOUT,
                prefix="",
                unreachable="cannot reach the server at {url}: {why}",
            )
        return self._client.call(method, suffix, body, token=self._token or "")

    def view(self) -> dict[str, Any]:
        """``{"kernel": <GET kernels entry>, "pool": <GET pool>}`` as the server sees them."""
        answer: dict[str, Any] = self.call("GET", "/self")
        return answer

    # ---- SliceHandle -----------------------------------------------------------------------

    def status(self, notes: list[str] | None = None) -> PodSliceStatus:
        try:
            view, problem = self.view().get("kernel"), None
        except GPUShareError as error:
            view, problem = None, str(error)
        return PodSliceStatus(self.mode, self.memory, view, problem, caps.descriptions(), list(notes or []))

    def pool(self) -> PoolStatus:
        return PoolStatus(self.view()["pool"])

    def request(self, memory: object, mode: object = None, cores: object = None, on_wait: Any = None) -> Any:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    def release(self) -> Any:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    def suspend(self) -> Any:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    def resume(self, on_wait: Any = None) -> Any:
        raise NotOfferedError(POD_HOLDS_ITS_GPU)

    def resize(self, memory: object, restart: bool = False, force: bool = False) -> PodSliceStatus:
        parse_size(memory)  # a bad size is refused before anything else
        if not restart:
            raise NeedsRestartError(
                "a kernel pod's GPU slice is fixed for the pod's life: nothing was changed. Run "
                f"%gpu resize {memory} --restart to restart this kernel in a new pod of that size"
            )
        answer = self.call("POST", "/resize", {"gpu_memory": memory})
        message = str((answer or {}).get("message") or "restarting in a new pod")
        return PodSliceStatus(self.mode, self.memory, None, None, caps.descriptions(), [message])

    def declare_usage(self, memory: object, utilization: int | None = None) -> None:
        self.declare(memory, utilization)

    def watch(self, **kwargs: Any) -> Any:
        raise NotOfferedError(
            "%gpu watch reads the node ledger, which a kernel pod does not have; the JupyterLab GPU "
            "panel shows this kernel live, and %gpu status shows its latest use"
        )

    def start(self, shell: Any) -> None:
        """Report this kernel's GPU use and its cells to its server, which shows the use in the
        panel and passes the cells on to the accounting (busy and idle hours); where the admin
        opted in (``GPUShare.idle_pod_restart``), ask for a new pod once idle."""
        self.start_reporting()
        if not self.kernel_url:
            return
        idle_after = float(os.environ.get(env_names.IDLE_RELEASE_AFTER) or 0)
        restarts = os.environ.get(env_names.IDLE_POD_RESTART, "").lower() == "true"
        from jupyter_gpushare.kernel.activity import ActivityWatch

        ActivityWatch(self, idle_after if restarts else 0.0).register(shell)

    def note_cell(self, busy: bool, at: float, idle_after: float) -> None:
        """Tell the server a cell started (``busy``) or ended at ``at`` (off the cell's thread;
        the idle action of a pod is a new one, which gives its GPU back)."""
        body = {"busy": busy, "at": at, "idle_after": idle_after, "idle_action": "release"}
        self.call("POST", "/activity", body)

    def on_idle(self, idle_for: float) -> str | None:
        """Idle too long: ask the server for a new pod (the only way a pod gives memory back)."""
        answer = self.call("POST", "/idle", {"idle_for": round(idle_for, 1)})
        return str((answer or {}).get("message") or "restarting in a new pod")

    def before_cell(self, source: str) -> None:
        """Nothing to resume: a pod never suspends."""

    def warnings(self) -> tuple[str, ...]:
        """None after each cell: the server shows a pod's warnings (the panel, %gpu status)."""
        return ()

    # ---- usage ---------------------------------------------------------------------------

    def declare(self, memory: object, utilization: int | None = None) -> None:
        """Declare this kernel's use (demos and tests; labelled simulated), sent at once."""
        used = parse_size(memory).resolve(0) if memory not in (0, "0") else 0
        if utilization is not None and not (isinstance(utilization, int) and 0 <= utilization <= 100):
            raise GPUShareError(f"utilization must be a whole percentage 0-100, not {utilization!r}")
        self.declared = (used, utilization)
        self.report_once(raise_errors=True)

    def measure(self) -> tuple[int, int | None, str] | None:
        """``(bytes, utilization, source)``: declared use; else, where the pod holds its cards
        whole, what NVML says they use (the CUDA context and every library's memory included);
        else PyTorch's own accounting of the memory it holds; None when nothing can be measured
        from inside the pod. NVML is not read on a shared card (time-slicing, MPS, vGPU, MIG):
        its figure there includes the neighbours' use, and inside a container NVML names
        processes by the host's PIDs, so the kernel's own share cannot be picked out."""
        if self.declared is not None:
            return (*self.declared, "simulated")
        if self._whole_cards is not None:
            read = self._whole_cards.read()
            if read is not None:
                return (*read, "kernel")  # the kernel's own report, as the server accepts it
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                held = sum(torch.cuda.memory_reserved(index) for index in range(torch.cuda.device_count()))
                return int(held), None, "kernel"
        except Exception:  # a broken CUDA setup must not break the kernel
            return None
        return None

    def report_once(self, raise_errors: bool = False) -> None:
        measured = self.measure()
        if measured is None or not self.kernel_url:
            return
        used, utilization, source = measured
        try:
            self.call("POST", "/usage", {"memory_used": used, "utilization": utilization, "source": source})
        except GPUShareError as error:
            if raise_errors:
                raise
            if str(error) != self._problem:  # say it once, not every second
                log.warning("GPU usage report failed: %s", error)
            self._problem = str(error)
        else:
            self._problem = None

    def start_reporting(self) -> None:
        if self._thread is None and self.kernel_url:
            self._thread = threading.Thread(target=self._report_forever, name="gpushare-report", daemon=True)
            self._thread.start()

    def _report_forever(self) -> None:
        while not self._stop.wait(self.interval):
            self.report_once()


def holds_whole_cards(mode: str) -> bool:
    """Whether a pod of ``mode`` holds its cards whole (the mode's placement, so that another
    package's whole-card mode counts too); an unknown or broken mode holds nothing."""
    try:
        return get_mode(mode).placement == "exclusive"
    except (UnknownModeError, GPUShareError):
        return False


def read_token_file(path: str | None) -> str | None:
    """A kernel pod's token: mounted from its Secret (never in its environment)."""
    if not path:
        return None
    try:
        with open(path) as file:
            return file.read().strip() or None
    except OSError:
        return None
