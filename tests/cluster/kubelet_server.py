"""The simulated kubelets' HTTPS endpoint: what the API server fetches ``pods/log`` from.

A client reads a pod's log from the API server (``GET …/pods/NAME/log``); the API server asks
the kubelet of the pod's node, at the node's InternalIP and ``daemonEndpoints`` port, for
``/containerLogs/NAMESPACE/POD/CONTAINER``. One server here answers for every node of a node
side (they share 127.0.0.1), with a certificate from the cluster's CA, and only to a client
certificate from that CA (the API server's ``kube-apiserver-kubelet-client``).
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from .pki import KeyPair

LogLookup = Callable[[str, str], Path | None]  # (namespace, pod) -> its container's log, if any


class KubeletServer:
    """``/containerLogs`` on 127.0.0.1 (a free port), in a thread."""

    def __init__(self, lookup: LogLookup, serving: KeyPair, ca: Path, directory: Path) -> None:
        certificate, key = serving.write(directory, "kubelet")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certificate), str(key))
        context.load_verify_locations(str(ca))
        context.verify_mode = ssl.CERT_REQUIRED

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._answer(404, f"{url.path} is not served by the simulated kubelet")
                    return
                _, namespace, pod, container = parts
                path = lookup(namespace, pod)
                if path is None or not path.exists():
                    self._answer(400, f'container "{container}" in pod "{pod}" is waiting to start')
                    return
                query = parse_qs(url.query)
                lines = path.read_text(errors="replace").splitlines(keepends=True)
                if "tailLines" in query:
                    count = int(query["tailLines"][0])
                    lines = lines[-count:] if count else []
                body = "".join(lines).encode()
                if "limitBytes" in query:
                    body = body[: int(query["limitBytes"][0])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _answer(self, code: int, message: str) -> None:
                body = json.dumps(
                    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
                )
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: object) -> None:
                pass  # the API server's requests are not the test's output

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # The handshake in the handler's thread, not in the one that accepts connections.
        self._server.socket = context.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kubelet-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
