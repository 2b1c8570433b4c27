"""The HTTP server's runner: the served ASGI stack (http_app.served_asgi) on uvicorn, with the drain on
SIGTERM, the port file and the exit code. The app, its bodies and its middlewares live beside it
(http_app.py, http_models.py, http_middleware.py); this is the one HTTP module that starts a process.
"""

from __future__ import annotations

import socket
import threading

import uvicorn

from rmscore.core.config import ServeConfig
from rmscore.core.scoring import ScoringCore
from rmscore.frontends import reward_text
from rmscore.frontends.drain import Drain
from rmscore.frontends.http_app import served_asgi
from rmscore.frontends.http_protocol import with_header_deadline
from rmscore.frontends.memory import start_trimming
from rmscore.frontends.process import exit_code, write_port_file
from rmscore.runtimes.workers import RUNTIME


class _DrainingServer(uvicorn.Server):
    """On SIGTERM: report not ready and refuse new work, finish accepted work, then let uvicorn close
    (frontends/drain.py); a second signal is uvicorn's own forced exit."""

    def __init__(self, config, core: ScoringCore):
        super().__init__(config)
        self.core = core
        self.drain = Drain(core)

    def handle_exit(self, sig, frame) -> None:
        if not self.drain.signal():
            return super().handle_exit(sig, frame)
        self.core.begin_drain()  # /readyz reads the core's state: NOT_SERVING and refusing are one step

        def finish() -> None:
            # uvicorn gets only what is left of the reserve, so the exit comes within the grace.
            self.config.timeout_graceful_shutdown = self.drain.finish()
            self.drain.report()
            self.should_exit = True

        threading.Thread(target=finish, daemon=True).start()


def run(cfg: ServeConfig) -> int:
    chat_template = reward_text.chat_template(cfg)  # a bad --chat-template refuses the start before any loading
    core = ScoringCore(cfg, RUNTIME)
    asgi = served_asgi(core, chat_template)  # the app inside every middleware (http_middleware.wrap)
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets whose proto says TCP, and accepted sockets inherit it. With proto 0, uvicorn's two
    # writes per response (headers, body) met the client's delayed ACK: +40 ms on every request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    port = sock.getsockname()[1]
    tls = dict(ssl_certfile=str(cfg.tls_cert_file), ssl_keyfile=str(cfg.tls_key_file)) if cfg.tls else {}
    # h11, not uvicorn's "auto" (httptools wherever it is installed): the parser whose framing
    # tests/integration/test_transport_py.py checks, whatever else the venv holds; with request
    # headers due within body_timeout_seconds (frontends/http_protocol.py: uvicorn has no such timer).
    config = uvicorn.Config(asgi, log_level="warning", timeout_graceful_shutdown=int(cfg.drain_grace_seconds),
                            access_log=False, http=with_header_deadline(cfg.body_timeout_seconds), **tls)
    server = _DrainingServer(config, core)
    write_port_file(cfg.port_file, port, port)
    failed = []

    def on_state(state: str) -> None:
        if state == "failed":  # never ready: exit rather than answer 503 forever
            failed.append(state)
            server.should_exit = True

    core.start_loading(on_state)
    # freed request buffers go back to the system (frontends/memory.py)
    start_trimming(pin_threshold=cfg.backend == "onnxruntime")
    server.run(sockets=[sock])
    core.stop(join_timeout_s=0.0)  # a batch still in the model must not hold the exit past the grace
    return exit_code(core, 1 if failed else 0)
