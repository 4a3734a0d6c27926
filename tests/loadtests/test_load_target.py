"""``schedguard load`` against any stack (issue 26, item 8): the model and the upstream's kind
read from the target, the benign look-alikes fitted to the kind, the corpus's bodies naming the
served model, and memory read from pids or Prometheus ``/metrics``.

A fake server plays vLLM (``owned_by: vllm``; 404 for another model, 400 for the reference's own
fields and for media, as vLLM serving a text-only model answers; a forced tool call answered
with the call) and exports
``process_resident_memory_bytes``; one short ``schedguard load --host`` run against it must see
no benign error and report the memory it was told where to read.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import loadtests
from guard.policy import load_policy
from loadtests import fit, target
from loadtests.monitor import Monitor, Watched, resident_bytes
from loadtests.replay import CORPUS_MODEL, load_attacks, load_lookalikes, with_model
from payloads.loader import BENIGN, load_corpus
from schedguard import _load_cli
from schedguard.cli import build_parser
from schedguard.servers import schedguard_argv

MODEL = "tiny-llama"
RSS = 123 * (1 << 20)
KEY = f"Bearer {target.BENIGN_KEY}"


class _FakeVllm(BaseHTTPRequestHandler):
    """vLLM's answers, as far as the load test meets them."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self.server.models_auth.append(self.headers.get("authorization"))
            models = [{"id": MODEL, "object": "model", "owned_by": self.server.owner}]
            self._send(200, json.dumps({"object": "list", "data": models}).encode())
        elif self.path == "/metrics":
            text = f"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {RSS}.0\n"
            self._send(200, text.encode(), "text/plain")
        elif self.path == "/health":
            self._send(200, b"")
        else:
            self._send(404, b'{"error":{"message":"not found"}}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        self.server.posted.append(body)
        if body.get("model") != MODEL:
            self._send(404, b'{"error":{"message":"model not found"}}')
            return
        if any(f in body for f in fit.REFERENCE_ONLY_FIELDS) or "image_url" in json.dumps(body):
            self._send(400, b'{"error":{"message":"bad request"}}')
            return
        if body.get("stream"):
            events = [{"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]} for i in range(3)]
            sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            self._send(200, sse + b"data: [DONE]\n\n", "text/event-stream")
            return
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        choice: dict[str, Any] = {"index": 0, "text": "ok", "finish_reason": "stop"}
        if "messages" in body:
            choice = {"index": 0, "message": _message(body), "finish_reason": "stop"}
        answer = {"choices": [choice], "usage": usage}
        self._send(200, json.dumps(answer).encode())


def _message(body: dict[str, Any]) -> dict[str, Any]:
    """A chat answer: the call a forced ``tool_choice`` asks for (vLLM answers ``required``
    and a named function with one; loadtests/tool_calls.py checks it), text otherwise."""
    forced = body.get("tool_choice")
    if not body.get("tools") or not (forced == "required" or isinstance(forced, dict)):
        return {"role": "assistant", "content": "ok"}
    name = (
        forced["function"]["name"]
        if isinstance(forced, dict)
        else body["tools"][0]["function"]["name"]
    )
    call = {"id": "call-0", "type": "function", "function": {"name": name, "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner = "vllm"

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FakeVllm)
        self.posted: list[dict[str, Any]] = []
        self.models_auth: list[str | None] = []


@pytest.fixture
def fake() -> Iterator[tuple[str, _Server]]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv
    finally:
        srv.shutdown()
        srv.server_close()


# ------------------------------------------------------------------------------ the target


@pytest.mark.parametrize(
    ("owners", "kind"),
    [
        (["schedguard"], "reference"),
        (["vllm"], "vllm"),
        (["me"], "llama_cpp"),
        (["openai"], "other"),
        (["vllm", "me"], "other"),  # not one server's
        ([], "other"),
    ],
)
def test_kind_from_owned_by(owners: list[str], kind: str) -> None:
    doc = {"data": [{"id": f"m{i}", "owned_by": o} for i, o in enumerate(owners)]}
    assert target.kind_of(doc) == kind
    assert target.first_model(doc) == ("m0" if owners else None)


def test_discover_reads_the_targets_models(fake: tuple[str, _Server]) -> None:
    url, srv = fake
    assert target.discover(url) == target.Target(
        MODEL, "vllm", "/v1/models; kind from /v1/models owned_by"
    )
    assert srv.models_auth == [KEY]  # asked as the benign tenant: a guard with keys wants one
    assert target.discover(url, model="other-model").model == "other-model"
    assert target.discover(url, kind="llama_cpp").kind == "llama_cpp"
    srv.owner = "schedguard"
    assert target.discover(url).kind == "reference"
    asked = len(srv.models_auth)
    assert target.discover(url, model="m", kind="vllm").kind == "vllm"
    assert len(srv.models_auth) == asked  # both given: nothing to ask
    assert not target.is_guard(url)  # no /readyz naming an upstream kind


def test_discover_without_models(fake: tuple[str, _Server]) -> None:
    url, _ = fake
    with pytest.raises(target.TargetError, match="give --model"):
        target.discover(url + "/nothing-here")
    unknown = target.discover(url + "/nothing-here", model="m")
    assert (unknown.model, unknown.kind) == ("m", "other")


# ------------------------------------------------------------------------------ the mix


def _lookalikes() -> dict[str, Any]:
    return {
        p.id: p
        for p in load_corpus(None, classes=[BENIGN], kind="benign", include_found=False)
        if not p.routes
    }


@pytest.mark.parametrize(
    ("payload_id", "kinds_sent"),
    [
        ("bn-prompt-template", {"reference"}),  # the reference's own field
        ("bn-prompt-template-nested", {"reference"}),
        ("bn-embeddings", {"reference"}),  # not a generation request
        ("bn-model-id-org-slash", {"reference"}),
        ("bn-multimodal-image", {"reference"}),  # media: the model may be text-only
        ("bn-custom-tool-chat-grammar", {"reference", "other"}),  # vLLM, llama-cpp: 400/500
        ("bn-json-schema", {"reference", "vllm", "other"}),  # llama-cpp-python has no json_schema
        ("bn-prompt-list", {"reference", "vllm", "other"}),  # llama-cpp-python: one prompt
        ("bn-chat-simple", {"reference", "vllm", "llama_cpp", "other"}),
    ],
)
def test_lookalikes_fit_the_kind(payload_id: str, kinds_sent: set[str]) -> None:
    payload = _lookalikes()[payload_id]
    sent = {k for k in target.KINDS if fit.unfit_reason(payload, k) is None}
    assert sent == kinds_sent


def test_no_reference_field_goes_elsewhere() -> None:
    for kind in ("vllm", "llama_cpp", "other"):
        kept, left = fit.fit(list(_lookalikes().values()), kind)
        assert kept and left
        for p in kept:
            body = p.body_json()
            assert not set(fit.REFERENCE_ONLY_FIELDS) & set(body), (kind, p.id)
    ids = {r.id for r in load_lookalikes(None, kind="vllm")}
    assert "bn-chat-simple" in ids and "bn-prompt-template" not in ids


def test_bodies_name_the_served_model() -> None:
    assert with_model(b'{"model":"schedguard-ref","n":1}', "m/x") == b'{"model":"m/x","n":1}'
    assert with_model(b'{"model":"schedguard-ref"}', None) == b'{"model":"schedguard-ref"}'
    for replay in load_lookalikes(None, kind="vllm", model=MODEL)[:10]:
        assert CORPUS_MODEL not in replay.body()
    attacks = load_attacks(["fan_out"], model=MODEL)
    named = [a for a in attacks if CORPUS_MODEL in a.payload.body_bytes()]
    assert named and all(b'"tiny-llama"' in a.body() for a in named)


def test_attacks_the_guard_admits_in_front_of_a_kind_by_design() -> None:
    """vLLM reads JSON schemas itself: the guard refuses llama.cpp's grammar crashers only in
    front of other upstreams, so they are not sent to vLLM; nothing else changes per kind."""
    policy = load_policy(str(Path(loadtests.__file__).with_name("policy.yaml")))
    attacks = [r.payload for r in load_attacks()]
    to_vllm = fit.attacks_left_out(attacks, "vllm", policy, target.ATTACK_KEY)
    llamacpp = {a.id for a in attacks if a.id.startswith("gd-llamacpp-")}
    assert llamacpp and llamacpp <= set(to_vllm)
    assert all("guided_schema_grammar" in to_vllm[i] for i in llamacpp)
    framed = {a.id for a in attacks if a.transport is not None}
    assert framed and not framed & set(to_vllm)
    assert len(to_vllm) < len(attacks) // 10  # the exception, not the rule
    assert fit.attacks_left_out(attacks, "llama_cpp", policy, target.ATTACK_KEY) == {}
    for kind in ("reference", "other"):
        assert fit.attacks_left_out(attacks, kind, policy, target.ATTACK_KEY) == {}
    # A key the policy does not know is refused in front of every kind: nothing left out.
    assert fit.attacks_left_out(attacks, "vllm", policy, "sk-unknown") == {}


# ------------------------------------------------------------------------------ memory


def test_resident_bytes_from_prometheus_text() -> None:
    text = (
        "# TYPE process_resident_memory_bytes gauge\n"
        'process_resident_memory_bytes{pid="1"} 100.0\n'
        'process_resident_memory_bytes{pid="2"} 50.0\n'
        "# TYPE other_bytes gauge\nother_bytes 7.0\n"
    )
    assert resident_bytes(text) == 150
    assert resident_bytes("# TYPE other gauge\nother 1.0\n") is None


def test_memory_from_metrics_without_a_pid(fake: tuple[str, _Server]) -> None:
    url, _ = fake
    w = Watched("upstream", None, url + "/metrics")
    w.sample(0.0)
    w.sample(1.0)
    assert w.peak == w.current == RSS and len(w.series) == 2 and w.source == url + "/metrics"
    broken = Watched("guard", None, url + "/nothing")
    broken.sample(0.0)
    assert broken.peak is None and broken.metrics_error
    # A pid wins: its sampler sees the kernel's high-water mark, a scrape only a moment.
    assert Watched("guard", 1, url + "/metrics").metrics_url is None
    assert Watched("guard", None).peak is None
    mon = Monitor(upstream_metrics_url=url + "/metrics")
    mon.sample()
    assert mon.snapshot()["upstream"]["rss_mb"] == 123.0


def test_host_endpoints_carry_what_was_found(fake: tuple[str, _Server], tmp_path: Path) -> None:
    url, _ = fake
    args = build_parser().parse_args(
        [
            "load",
            "--host",
            url,
            "--upstream-pid",
            "4242",
            "--upstream-metrics",
            url + "/m",
            "--out",
            str(tmp_path),
        ]
    )
    ends = _load_cli._host_endpoints(args)
    assert ends.attacks_left_out == str(tmp_path / "attacks_left_out.json")
    left = json.loads(Path(ends.attacks_left_out).read_text())
    assert "gd-llamacpp-schema-maxlength-deep" in left
    assert (ends.model, ends.kind, ends.upstream_pid) == (MODEL, "vllm", 4242)
    assert ends.upstream_metrics_url is None  # the pid is the better source
    assert ends.guard_metrics_url is None  # the fake is no guard
    cmd = " ".join(_load_cli.locust_argv(args, ends, Path("out")))
    assert f"--model {MODEL}" in cmd and "--upstream-kind vllm" in cmd
    assert "--upstream-pid 4242" in cmd and f"--attacks-left-out-json {tmp_path}" in cmd


def test_pids_and_model_go_with_host(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["load", "--guard-pid", "12"])
    assert _load_cli.run(args) == 2
    assert "go with --host" in capsys.readouterr().err


# ------------------------------------------------------------------------------ one run


@pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="the load extra (locust) is not installed"
)
def test_load_a_vllm_like_server(fake: tuple[str, _Server], tmp_path: Path) -> None:
    """Benign users only, half of their requests look-alikes: none fails (each names the
    served model, none carries the reference's fields or media), and the upstream's memory is
    in the report, read from its /metrics."""
    url, srv = fake
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            *schedguard_argv("load"),
            "--host",
            url,
            "--upstream-metrics",
            url + "/metrics",
            "--duration",
            "6",
            "--users",
            "3",
            "--attack-share",
            "0",
            "--user-rps",
            "3",
            "--quiet",
            "--out",
            str(out),
            "--json",
            "--",
            "--lookalike-share",
            "0.6",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(proc.stdout)
    n = report["numbers"]
    assert n["benign_requests"] > 0 and n["lookalike_requests"] > 0, proc.stderr[-2000:]
    assert n["benign_errors"] == 0, n["benign_failure_samples"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert n["target"]["model"] == MODEL and n["target"]["upstream_kind"] == "vllm"
    assert n["upstream_peak_rss_mb"] == 123.0
    assert n["target"]["memory_from"] == {"guard": None, "upstream": url + "/metrics"}
    html = (out / "report.html").read_text()
    assert f"vllm upstream serving {MODEL}" in html and f"upstream from {url}/metrics" in html
    assert all(body["model"] == MODEL for body in srv.posted)
    assert "prompt_template" not in json.dumps(srv.posted)


def test_a_policy_that_does_not_load_stops_the_run(
    fake: tuple[str, _Server], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("limits: [not, a, mapping]\n")
    args = build_parser().parse_args(
        ["load", "--host", fake[0], "--policy", str(bad), "--out", str(tmp_path / "out")]
    )
    assert _load_cli.run(args) == 2
    assert "--policy" in capsys.readouterr().err
