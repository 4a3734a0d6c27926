"""A stand-in OpenAI-ish server for testing the demo's machinery without scheduler_ref.

``python tests/_fake_server.py MODE PORT``. Benign requests get 200; a request whose
``prompt_template`` starts with ``{{{{`` (the seed) is handled by MODE:
``hog`` allocates until the memory cap (MemoryError -> exit 137, like schedguard's middleware),
``hang`` never answers, ``reject`` answers 400 template_depth_exceeded, ``crash`` exits 3.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

MODE = sys.argv[1]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {"status": "ok"})
        else:
            self._reply(200, {"object": "list", "data": [{"id": "fake"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if not str(body.get("prompt_template", "")).startswith("{{{{"):
            self._reply(200, {"choices": [{"text": "hi"}], "model": body.get("model")})
            return
        if MODE == "hog":
            hoard = []
            try:
                while True:
                    hoard.append(bytearray(8 << 20))
            except MemoryError:
                os._exit(137)
        elif MODE == "hang":
            time.sleep(3600)
        elif MODE == "crash":
            os._exit(3)
        err = {"message": "too deep", "type": "invalid_request_error", "param": None}
        self._reply(400, {"error": {**err, "code": "template_depth_exceeded"}})


if __name__ == "__main__":
    HTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
