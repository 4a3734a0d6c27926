"""Upstream bug reports from a campaign's record: ``schedguard fuzz report DIR --format issue``.

One markdown file per triage group (:mod:`fuzz.triage`) of ``DIR/report.json``, ready to file
with the upstream: a title naming the signature and the component, the versions the campaign
recorded (:mod:`fuzz.live._environment`), a ``curl`` reproduction with the minimised body, what
was observed (status or no answer, the server's log excerpt, its memory and CPU before and
after, times met), what was expected, the impact, and what schedguard's guard does about such a
request: its verdict on the minimised body, computed here with the policy given (the default
otherwise) by the guard's own pipeline (:func:`guard.pipeline.evaluate_body`).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

from fuzz.live import LiveRequest
from fuzz.upstream_versions import key_packages

__all__ = ["guard_verdict", "render_issue", "write_issues"]

_EXPECTED = {
    "crash": "The server refuses a request it cannot serve (a 4xx naming the field) and keeps "
    "serving the others.",
    "timeout": "An answer, or a 4xx, within a bounded time.",
    "server_error": "A 4xx naming the invalid field (or a 200): a 5xx says the server failed, "
    "not the request.",
    "budget": "Work in proportion to what the request asks for (its prompt and output tokens).",
    "undercount": "The guard's accounting bounds what the upstream counts.",
    "false_positive": "The guard admits a benign request the upstream serves cheaply.",
}
_IMPACT = {
    "crash": "Denial of service: any client that can send one request takes the whole server "
    "down (every request in flight fails) until it is restarted.",
    "timeout": "Denial of service: the request holds a worker (or the engine) with no answer; a "
    "few of them starve every other client.",
    "server_error": "A request fails with a server error; when the failure leaves state behind "
    "(threads, memory, a compile still running), repeating it degrades or kills the server.",
    "budget": "Resource amplification: one small request costs the server far more time or "
    "memory than its size and its token counts suggest.",
    "undercount": "A client is billed or rate-limited for less than the upstream spends.",
    "false_positive": "Legitimate traffic is refused.",
}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "finding"


@functools.cache
def _policy(path: Path | None) -> Any:
    """The policy, loaded once per file (loading it loads its tokenizer)."""
    from guard.policy import load_policy

    return load_policy(str(path) if path is not None else None)


def guard_verdict(
    body: bytes, path: str, policy_path: Path | None = None, kind: str | None = None
) -> dict[str, Any]:
    """The guard's verdict on a request (``allowed``, ``status``, ``code``, ``message``) in
    front of an upstream of ``kind`` (``vllm``, ``llama_cpp``; None or ``other``: not known),
    as the guard judges once it has read the upstream's kind."""
    from guard.pipeline import evaluate_body

    policy = _policy(policy_path)
    if kind in ("vllm", "llama_cpp"):
        policy = policy.with_upstream_kind(kind)
    v = evaluate_body(body, path, [], policy)
    if v.rejection is None:
        return {"allowed": True, "status": 200, "code": None, "message": None}
    r = v.rejection
    return {"allowed": False, "status": r.status, "code": r.code, "message": r.message}


def _request(finding: dict[str, Any]) -> LiveRequest | None:
    text = finding.get("input")
    if text is None and finding.get("path"):
        from payloads import load_payload

        p = load_payload(Path(finding["path"]))
        return LiveRequest(p.endpoint, json.loads(p.body_bytes()))
    return None if text is None else LiveRequest.from_input(text.encode("utf-8"))


def _curl(url: str, req: LiveRequest) -> str:
    body = req.to_bytes().decode("utf-8", "replace")
    return (
        f"curl -sS -w '\\nHTTP %{{http_code}}\\n' -X POST {shlex.quote(url + req.path)} \\\n"
        f"  -H 'content-type: application/json' --data-binary @- <<'JSON'\n{body}\nJSON"
    )


def _mib(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value / (1 << 20):.0f} MiB"


def _server_line(name: str, usage: Any) -> str:
    if not isinstance(usage, dict):
        return f"- {name}: not running (or not watched: `--pid`)"
    return f"- {name}: RSS {_mib(usage.get('rss_bytes'))}, CPU {usage.get('cpu_s')} s"


def render_issue(
    record: dict[str, Any], group: dict[str, Any], *, policy_path: Path | None = None
) -> tuple[str, str]:
    """The file name and the markdown of one group's report."""
    env = record.get("environment") or {}
    f = group["representative"]
    ev = f.get("evidence") or {}
    verdict = f.get("verdict") or "-"
    component = group.get("component") or ev.get("component") or "(unknown component)"
    server = _server_name(env)
    what = {
        "crash": "server dies",
        "timeout": "no answer",
        "server_error": f"HTTP {ev.get('status', '5xx')}",
        "budget": "over budget",
    }.get(verdict, verdict)
    shape = ev.get("request_shape") or "-"
    title = f"{server}: {what} ({group['signature']}) on a request with `{shape}`"
    url = record.get("target_url") or "http://127.0.0.1:PORT"
    req = _request(f)
    lines = [f"# {title}", "", "## Versions", ""]
    lines += _versions(env)
    lines += ["", "## Reproduction", ""]
    if req is None:
        lines.append(f"The minimised request is too large to inline: see `{f.get('path')}`.")
    else:
        lines += ["```sh", _curl(url, req), "```", ""]
        if f.get("fresh_only"):
            lines.append("Send it to a freshly started server: a server that served other "
                         "requests first does not show it.")  # fmt: skip
        else:
            lines.append("Any server started as above shows it; the first request suffices.")
    if f.get("replay_command"):
        lines += ["", f"With schedguard: `{f['replay_command']}`"]
    lines += ["", "## Observed", ""]
    lines += _observed(f, ev, group)
    lines += ["", "## Expected", "", _EXPECTED.get(verdict, "-")]
    lines += ["", "## Impact", "", _IMPACT.get(verdict, "-")]
    lines += ["", "## What schedguard's guard does about it", ""]
    tool = env.get("tool") or {}
    policy = f"policy {tool.get('policy', '(default)')}, sha256 {tool.get('policy_sha256')}"
    # The minimised body may lack what any valid request has (messages): the guard's verdict
    # on the request as the campaign found it says whether its specific check stops it.
    found = f.get("original_input")
    for label, r in (
        ("the minimised request", req),
        ("the request as found", None if found is None else LiveRequest.from_input(found.encode())),
    ):
        if r is None:
            continue
        g = guard_verdict(r.to_bytes(), r.path, policy_path, env.get("kind"))
        if g["allowed"]:
            lines.append(f"- {label}: admitted: the guard does not protect the server from it.")
        else:
            lines.append(f"- {label}: refused before the server sees it, {g['status']} "
                         f"`{g['code']}`: {g['message']}")  # fmt: skip
    lines.append(f"\n(The guard's own pipeline, {policy}.)")
    lines += ["", f"Found by schedguard's fuzzer (`{record.get('engine')}` campaign, seed "
              f"{record.get('seed')}), minimised from {f.get('original_size_bytes')} to "
              f"{f.get('size_bytes')} bytes in {f.get('minimise_tests')} tests."]  # fmt: skip
    function = ev.get("function") or ""
    name = f"{_slug(f'{verdict}-{component}-{function}')}.md"
    return name, "\n".join(lines) + "\n"


def _server_name(env: dict[str, Any]) -> str:
    packages = key_packages(env)
    version = env.get("server_version")
    kind = env.get("kind")
    if kind == "vllm":
        v = version.get("version") if isinstance(version, dict) else None
        dist = next((f"{k} {v2}" for k, v2 in packages.items() if k.startswith("vllm")), None)
        return dist or f"vLLM {v or '(version not captured)'}"
    if kind == "llama_cpp":
        dist = next((f"{k} {v2}" for k, v2 in packages.items() if "llama" in k.lower()), None)
        return dist or "llama-cpp-python (version not captured)"
    return "the upstream server"


def _versions(env: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if isinstance(env.get("server_version"), dict):
        out.append(f"- server `/version`: `{json.dumps(env['server_version'])}`")
    for k, v in key_packages(env).items():
        out.append(f"- {k} {v}")
    proc = env.get("process") or {}
    info = proc.get("llama_cpp_system_info")
    if info:
        out.append(f"- llama.cpp system info: `{str(info).strip()[:400]}`")
    for m in env.get("models") or []:
        out.append(f"- model: `{json.dumps(m)}`")
    if proc.get("cmdline"):
        out.append(f"- command line: `{shlex.join(proc['cmdline'])}`")
    tool = env.get("tool") or {}
    if tool:
        out.append(f"- found with schedguard {tool.get('schedguard')} (guard policy sha256 "
                   f"{tool.get('policy_sha256')})")  # fmt: skip
    return out or ["- (not captured: the campaign had no `--pid` and no `/version`)"]


def _observed(f: dict[str, Any], ev: dict[str, Any], group: dict[str, Any]) -> list[str]:
    out: list[str] = []
    status = ev.get("status")
    if f.get("verdict") == "crash":
        out.append(f"- no answer: the server died ({ev.get('signal') or 'no signal in its log'})")
    elif status is not None:
        out.append(f"- HTTP {status}: {(f.get('error_message') or '')[:300]}")
    else:
        out.append(f"- {f.get('error_message') or f.get('verdict')}")
    out.append(
        f"- after {f.get('wall_s', 0):.4g} s (wall); judged: {f.get('judged', {}).get('basis')}"
    )
    out.append(_server_line("server before", ev.get("server_before")))
    out.append(_server_line("server after", ev.get("server_after")))
    out.append(f"- met {group.get('count')} time(s) in the campaign ({len(group.get('causes', []))} "
               "distinct causes in this group)")  # fmt: skip
    if ev.get("kernel"):
        out += ["- kernel:", "", "```", *ev["kernel"], "```"]
    if ev.get("log_excerpt"):
        out += ["", f"Server log (`{ev.get('log', '-')}`):", "", "```", ev["log_excerpt"], "```"]
    return out


def write_issues(
    report_dir: Path, out_dir: Path | None = None, *, policy_path: Path | None = None
) -> list[Path]:
    """Write one markdown file per group of ``report_dir/report.json`` into ``out_dir``
    (default ``report_dir/issues``); the paths written."""
    record = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    target = out_dir or report_dir / "issues"
    target.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for i, group in enumerate(record.get("groups") or [], start=1):
        name, text = render_issue(record, group, policy_path=policy_path)
        path = target / f"{i:02d}-{name}"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
