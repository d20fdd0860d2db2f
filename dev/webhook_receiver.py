"""A local HTTP receiver for the operator's notifications (tests): records each POST's path and
JSON body; can answer with given status codes in turn, or hang, to show a failing receiver never
blocks a rollout."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WebhookReceiver:
    """Listens on ``host`` (a free port); ``url`` uses ``advertise`` (the address Pods reach the
    host at, for the operator Pod) or ``host``. ``answers``: status codes to give in turn (then
    200); ``hang``: seconds to wait before answering. ``got``: ``{"path", "code", "body"}`` each."""

    def __init__(self, host: str = "127.0.0.1", advertise: str | None = None, answers=(), hang: float = 0.0):
        self.got: list[dict] = []
        self.answers, self.hang = list(answers), hang
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(outer.hang)
                with outer._lock:
                    code = outer.answers.pop(0) if outer.answers else 200
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = {"unparsed": raw.decode(errors="replace")}
                    outer.got.append({"path": self.path, "code": code, "body": body})
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{advertise or host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)
        self._thread.start()

    def messages(self, path: str | None = None) -> list[dict]:
        with self._lock:
            return [g["body"] for g in self.got if path is None or g["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "WebhookReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
