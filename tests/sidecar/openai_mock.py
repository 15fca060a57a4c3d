"""A small OpenAI-compatible server on loopback for the real-AIPerf tests: `/v1/chat/completions`
(non-streaming) answers `max_tokens` words of a fixed text, with `usage`; any GET lists one model."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORDS = ["the", "bridge", "records", "every", "scrape", "and", "the", "report", "brackets", "the", "window"]


class OpenAIMock:
    def __init__(self, delay_s: float = 0.004) -> None:
        self.requests = 0
        self.delay_s = delay_s
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send({"object": "list", "data": [{"id": "mock-model", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length) or b"{}")
                tokens = int(request.get("max_completion_tokens") or request.get("max_tokens") or 16)
                time.sleep(mock.delay_s)
                mock.requests += 1
                text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
                self._send({"id": f"c{mock.requests}", "object": "chat.completion", "created": int(time.time()),
                            "model": request.get("model"),
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": text}}],
                            "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="openai mock")

    def __enter__(self) -> OpenAIMock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
