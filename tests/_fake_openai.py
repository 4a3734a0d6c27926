"""A scripted OpenAI-compatible server and guard dry run, for the live campaigns' tests.

``python tests/_fake_openai.py PORT [PIDFILE]`` serves, on 127.0.0.1:PORT:

- ``GET /health``, ``GET /v1/models`` (model ``fake-model``), ``GET /metrics``
  (``process_resident_memory_bytes``);
- ``POST /v1/chat/completions`` and ``/v1/completions``: ``usage.prompt_tokens`` is 2 plus,
  per message, 3 plus a quarter of the characters of every string in it (content strings,
  parts of any type, any key but ``type``): what a template that renders everything counts. Scripted
  faults, by what the body holds:

  - a ``grammar`` with 1000 ``(`` or more in a row and the word ``KILL``: the process exits
    at once (a crash);
  - a ``grammar`` containing ``HANG``: never answers;
  - ``SEGV`` in a ``grammar`` or in a ``response_format`` schema's ``pattern``: the process
    dies by SIGSEGV in ``add_grammar`` (with ``PYTHONFAULTHANDLER=1`` its stack goes to stderr,
    as a C extension's segfault would);
  - ``bad_words``: 500 ``Internal Server Error``, after a ``KeyError`` traceback on stderr;
  - a string containing ``ONCE``: 500 ``cold cache`` the first time this process sees one,
    served after (a fault only a fresh server shows);
  - ``n`` above 100: 500 ``{"error": {"message": "engine failure at step 12"}}``;
  - ``n`` equal to 99: 500 ``validation error: n`` (what ``--ignore-5xx`` is for);
  - a string containing ``SLOW``: answers after 1.5 s;
  - ``max_tokens`` 777: holds 300 MB for a second before answering;
  - ``max_tokens`` above 4096: 400 ``context_length_exceeded``.

- ``POST /guard/v1/check?path=...``: a guard's dry run. It refuses ``n`` above 16
  (``n_exceeded``), grammars with 100 ``(`` in a row (``guided_grammar_too_deep``) and any
  string containing ``FALSEPOS`` (``looks_bad``); otherwise it admits, with
  ``costs.prompt_tokens`` counted like the server but only over ``content`` strings and ``text``
  parts: a ``refusal`` part (or any other key) is not counted, the under-count the
  differential campaign must find. It injects ``max_tokens: 3`` when there is none.

``PIDFILE``, when given, gets the server's pid (for restart commands in tests).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake-model"


def _strings(node: Any) -> list[str]:
    """Every string in ``node`` but the values of ``type`` keys."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() if k != "type" for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def _quarter(text: str) -> int:
    return math.ceil(len(text) / 4)


def upstream_tokens(body: dict[str, Any]) -> int:
    if isinstance(body.get("prompt"), str):
        return 2 + _quarter(body["prompt"])
    total = 2
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            total += 3 + sum(_quarter(s) for s in _strings(m))
    return total


def guard_tokens(body: dict[str, Any]) -> int:
    if isinstance(body.get("prompt"), str):
        return 2 + _quarter(body["prompt"])
    total = 2
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        total += 3 + _quarter(str(m.get("role", "")))
        content = m.get("content")
        if isinstance(content, str):
            total += _quarter(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    total += _quarter(str(part.get("text", "")))
    return total


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

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
        elif self.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": MODEL}]})
        elif self.path == "/metrics":
            data = b"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1.5e+08\n"
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._reply(404, {"error": {"message": "not found", "code": "not_found"}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
            _strings(body)
        except (ValueError, RecursionError):
            self._reply(400, {"error": {"message": "invalid json", "code": "invalid_json"}})
            return
        if not isinstance(body, dict):
            self._reply(400, {"error": {"message": "not an object", "code": "invalid_json"}})
            return
        path, _, query = self.path.partition("?")
        try:
            if path == "/guard/v1/check":
                self._check(body, urllib.parse.parse_qs(query))
            else:
                self._serve(body)
        except (TypeError, ValueError, AttributeError):  # a shape this fake does not model
            self._reply(400, {"error": {"message": "unsupported", "code": "invalid_request"}})

    def _check(self, body: dict[str, Any], query: dict[str, list[str]]) -> None:
        grammar = str(body.get("grammar", ""))
        code = None
        if isinstance(body.get("n"), int) and body["n"] > 16:
            code = "n_exceeded"
        elif "(" * 100 in grammar:
            code = "guided_grammar_too_deep"
        elif any("FALSEPOS" in s for s in _strings(body)):
            code = "looks_bad"
        if code is not None:
            self._reply(
                200,
                {"allowed": False, "status": 400, "code": code, "message": code, "costs": {}},
            )
            return
        mutations = []
        if "max_tokens" not in body:
            mutations.append({"path": ["max_tokens"], "value": 3, "reason": "default"})
        out = body.get("max_tokens", 3)
        costs = {
            "prompt_tokens": guard_tokens(body),
            "output_tokens": out,
            "sequences": 1,
            "output_tokens_reserved": out,
        }
        self._reply(
            200,
            {"allowed": True, "status": 200, "code": None, "costs": costs, "mutations": mutations},
        )

    def _serve(self, body: dict[str, Any]) -> None:
        grammar = str(body.get("grammar", ""))
        if "(" * 1000 in grammar and "KILL" in grammar:
            os._exit(1)
        schema = (body.get("response_format") or {}) if isinstance(body, dict) else {}
        pattern = (
            str((schema.get("schema") or {}).get("pattern", "")) if isinstance(schema, dict) else ""
        )
        if "SEGV" in grammar or "SEGV" in pattern:
            add_grammar()
        if "bad_words" in body:
            try:
                sampler_for(body)
            except KeyError:
                traceback.print_exc()
                sys.stderr.flush()
                self._reply(500, {"error": {"message": "Internal Server Error", "code": None}})
                return
        if any("ONCE" in s for s in _strings(body)) and not _WARM:
            _WARM.append(True)
            self._reply(500, {"error": {"message": "cold cache", "code": None}})
            return
        if "HANG" in grammar:
            time.sleep(3600)
        n = body.get("n")
        if isinstance(n, int) and n > 100:
            self._reply(500, {"error": {"message": "engine failure at step 12", "code": None}})
            return
        if n == 99:
            self._reply(500, {"error": {"message": "validation error: n", "code": None}})
            return
        if any("SLOW" in s for s in _strings(body)):
            time.sleep(1.5)
        max_tokens = body.get("max_tokens", 3)
        if max_tokens == 777:
            hold = bytearray(300 << 20)
            for i in range(0, len(hold), 4096):
                hold[i] = 1
            time.sleep(1.0)
            del hold
        if isinstance(max_tokens, int) and max_tokens > 4096:
            self._reply(400, {"error": {"message": "too long", "code": "context_length_exceeded"}})
            return
        prompt = upstream_tokens(body)
        completion = max(0, min(int(max_tokens) if isinstance(max_tokens, int) else 3, 3))
        self._reply(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            },
        )


_WARM: list[bool] = []


def add_grammar() -> None:
    """Where the scripted segfault happens (named like llama-cpp-python's frame): a real one,
    in the thread serving the request, as a C extension's NULL dereference."""
    ctypes.string_at(0)


def sampler_for(body: dict[str, Any]) -> None:
    _ = {}["bad_words_sampler"]


def main() -> None:
    port = int(sys.argv[1])
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            f.write(str(os.getpid()))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
