"""The guided compile budget phase (issue 23): one tenant warming its benign structured-output
schemas then repeating them, another sending a schema it never sent before ~20 times a second.

Plain Python (no locust): the locustfile's ``--scenario guided-compile`` users send what this
module builds and tally the answers here; :func:`summarize` turns the tally and the benign
tenant's latencies into the per-tenant figures (``guided.json``).

- The **app** tenant's schemas are the benign structured requests of ``payloads/public/``
  (``structured/`` first) and ``payloads/benign/`` whose constraints the guard charges compile
  time for under the default policy (:func:`guard.pipeline.evaluate_body`), at most
  ``limit`` (50) distinct ones: it sends each once (warm), then repeats them in a round robin.
  Its requests are named by phase: ``guided warm``, ``guided repeat before flood``, ``guided
  repeat during flood``.
- The **flood** tenant sends :func:`unique_body`: a person with a 100-character name and a
  property named after the request's number (~2.6 s estimated at 100k each), every one new.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.pipeline import evaluate_body
from guard.policy import policy_from_yaml
from loadtests.target import REFERENCE_MODEL
from payloads.loader import Payload, load_payload

__all__ = [
    "APP",
    "BEFORE",
    "DURING",
    "FLOOD",
    "MODEL",
    "PHASES",
    "WARM",
    "BenignSchema",
    "benign_schemas",
    "load",
    "phase_of",
    "render",
    "summarize",
    "tally_key",
    "unique_body",
    "write",
]

APP = "app"
FLOOD = "flood"
WARM = "guided warm"
BEFORE = "guided repeat before flood"
DURING = "guided repeat during flood"
PHASES = (WARM, BEFORE, DURING)
_ROOT = Path(__file__).resolve().parent.parent / "payloads"


@dataclass(frozen=True)
class BenignSchema:
    """One benign structured-output request, ready to send."""

    id: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    stream: bool
    compile_s: float  # the guard's estimate, at the default policy's vocabulary


def _candidates(root: Path) -> list[Path]:
    structured = sorted((root / "public" / "structured").glob("*.yaml"))
    public = sorted(p for p in (root / "public").rglob("*.yaml") if p.parent.name != "structured")
    return structured + public + sorted((root / "benign").glob("*.yaml"))


MODEL = REFERENCE_MODEL  # the phase runs against the reference scheduler
MAX_TOKENS = 16


def _for_upstream(body: dict[str, Any]) -> bytes:
    """The body as the reference scheduler serves it: its model, and at most ``MAX_TOKENS``
    out (the constraint is untouched; what is measured is the guard's admission, not the
    upstream's decoding)."""
    body["model"] = MODEL
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(field), int):
            body[field] = min(body[field], MAX_TOKENS)
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS
    return json.dumps(body, separators=(",", ":")).encode()


def benign_schemas(limit: int = 50, *, root: Path | None = None) -> list[BenignSchema]:
    """Up to ``limit`` benign requests with distinct constraints the guard charges compile
    time for (each constraint's kind and text seen once), ``structured/`` first, as
    :func:`_for_upstream` rewrites them."""
    policy = policy_from_yaml("")
    out: list[BenignSchema] = []
    seen: set[tuple[bytes, ...]] = set()
    for path in _candidates(root or _ROOT):
        if len(out) >= limit:
            break
        payload: Payload = load_payload(path)
        if payload.kind != "benign" or payload.expect.status != 200 or payload.routes:
            continue
        raw = payload.body_bytes()
        verdict = evaluate_body(raw, payload.endpoint, payload.header_items(), policy)
        if verdict.rejection is not None or not verdict.compiles:
            continue
        key = tuple(sorted(c.key for c in verdict.compiles))
        if key in seen:
            continue
        seen.add(key)
        parsed = json.loads(raw)
        stream = bool(parsed.get("stream"))
        raw = _for_upstream(parsed)
        cost = sum(c.compile_s for c in verdict.compiles)
        headers = tuple((k, v) for k, v in payload.header_items() if k.lower() != "authorization")
        out.append(BenignSchema(payload.id, payload.endpoint, raw, headers, stream, cost))
    return out


def unique_body(n: int, nonce: str) -> bytes:
    """A chat request whose JSON schema no earlier request had: a person with a 100-character
    name (the costly part, ~2.6 s at 100k) and a property of its own (``nonce`` and ``n``)."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 100},
            f"f_{nonce}_{n}": {"type": "integer"},
        },
        "required": ["name"],
    }
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Answer."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def phase_of(warmed: bool, flood_started: bool) -> str:
    """The name of an app request: warming, or a repeat before or during the flood."""
    if not warmed:
        return WARM
    return DURING if flood_started else BEFORE


def tally_key(tenant: str, status: int, code: str | None, error: str | None = None) -> str:
    """``guided TENANT STATUS CODE``: one answer (status 0 and the error when none came)."""
    if status == 0:
        return f"guided {tenant} 0 {(error or 'no response').split(':')[0].replace(' ', '_')}"
    return f"guided {tenant} {status} {code or '-'}"


def summarize(
    tally: Mapping[str, int],
    latency_ms: Mapping[str, tuple[int, float | None, float | None]],
    *,
    schemas: int,
    flood_after_s: float,
    flood_rps: float,
) -> dict[str, Any]:
    """Per tenant: requests, admitted (2xx), refused by ``STATUS code``, 5xx and no answers;
    the app's requests, p50 and p99 (ms) per phase (``latency_ms``: phase -> (requests, p50,
    p99))."""
    tenants: dict[str, dict[str, Any]] = {}
    for tenant in (APP, FLOOD):
        refused: collections.Counter[str] = collections.Counter()
        requests = admitted = server_errors = no_answer = 0
        for key, count in tally.items():
            parts = key.split(" ")
            if len(parts) != 4 or parts[0] != "guided" or parts[1] != tenant:
                continue
            status, code = int(parts[2]), parts[3]
            requests += count
            if 200 <= status < 300:
                admitted += count
            elif status == 0:
                no_answer += count
                refused[f"no answer {code}"] += count
            else:
                refused[f"{status} {code}"] += count
                server_errors += count if status >= 500 else 0
        tenants[tenant] = {
            "requests": requests,
            "admitted": admitted,
            "refused": dict(sorted(refused.items())),
            "server_errors": server_errors,
            "no_answer": no_answer,
        }
    tenants[APP]["latency_ms"] = {
        phase: {"requests": n, "p50": p50, "p99": p99}
        for phase, (n, p50, p99) in latency_ms.items()
    }
    return {
        "scenario": "guided-compile",
        "schemas": schemas,
        "flood_after_s": flood_after_s,
        "flood_rps": flood_rps,
        "tenants": tenants,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def render(summary: Mapping[str, Any]) -> str:
    """The summary as a Markdown table (the one bench/README.md shows)."""
    lines = [
        f"guided compile budget: {summary['schemas']} benign schemas (app), unique schemas at "
        f"{summary['flood_rps']:g}/s from {summary['flood_after_s']:g} s (flood)",
        "",
        "| tenant | requests | admitted | refused by code | 5xx |",
        "|---|---|---|---|---|",
    ]
    tenants = summary["tenants"]
    for name in (APP, FLOOD):
        t = tenants[name]
        refused = ", ".join(f"{code}: {n}" for code, n in t["refused"].items()) or "0"
        lines.append(
            f"| {name} | {t['requests']} | {t['admitted']} | {refused} | {t['server_errors']} |"
        )
    lines += ["", "| app phase | requests | p50 ms | p99 ms |", "|---|---|---|---|"]
    latency = tenants[APP]["latency_ms"]
    for phase in PHASES:
        row = latency.get(phase, {"requests": 0, "p50": None, "p99": None})
        lines.append(f"| {phase} | {row['requests']} | {_ms(row['p50'])} | {_ms(row['p99'])} |")
    return "\n".join(lines)


def write(path: str | Path, summary: Mapping[str, Any]) -> None:
    Path(path).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def load(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data
