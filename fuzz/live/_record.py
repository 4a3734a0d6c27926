"""Findings on live servers: confirmed, minimised against the server, deduplicated, saved.

:meth:`LiveRecorder.consider` takes a request the oracle called a finding and:

1. skips it when its cause is known (a crash, hang or 5xx of the same kind), or, for an
   under-count, when a request with the same unusual fields was examined already;
2. confirms a measured crossing (latency or memory over the budget) and a 5xx by sending it
   again: other load on the machine is not a finding; with concurrent workers, a crash or hang too
   (every request in flight when the server died failed: the finding is the one that kills
   it again alone);
3. minimises it with :func:`fuzz.minimize.shrink_json` against the live server (bounded in
   tests and time), the predicate being "the same finding again": the same cause, or for an
   under-count an excess of at least half the original (so the minimised request keeps the
   text that is not counted, not just the template's fixed overhead). A request that kills
   the server is minimised only when the server can be brought back (``recover``) after each
   test;
4. names an under-count by the shape of the minimised request: its fields that a plain chat or
   completion does not have (``messages[].content[type=refusal].refusal``), the template's
   own overhead when there are none; that name is its cause;
5. saves it as a payload file: attacks under ``<root>/found/<target>/`` (:func:`payloads.save_found`);
   a false positive, a benign request the guard refuses, under ``<root>/benign/`` with
   ``expect: {status: 200}``, so that a corpus that adopts it tests that the guard lets it
   through.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fuzz.findings import Finding, FindingSet, cause_of, safe_target_name
from fuzz.live._oracle import LiveOracle, Measured
from fuzz.live._request import LiveRequest
from fuzz.live._shapes import CHAT
from fuzz.minimize import MinimiseStats, ddmin, shrink_json
from fuzz.targets._base import Cost

__all__ = [
    "BASELINE",
    "OVERHEAD",
    "LiveRecorder",
    "baseline_body",
    "payload_class",
    "remove_paths",
    "shape_paths",
    "shape_signature",
]

# The name of an under-count that needs no field beyond a plain chat's: the template's own text.
OVERHEAD = "template-overhead"

# The fields of a plain chat (content a string or text parts) and a plain completion: an
# under-count needing none but these is the chat template's own overhead.
BASELINE: frozenset[str] = frozenset(
    {
        "model",
        "messages",
        "messages[]",
        "messages[].role",
        "messages[].content",
        "messages[].content[type=text]",
        "messages[].content[type=text].text",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "temperature",
        "seed",
    }
)
_MEASURED = frozenset({"budget"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# Tokens an under-count must keep above what its plain-chat core shows, when minimised.
_MARGIN = 16
_GUIDED = frozenset(
    {
        "grammar",
        "guided_grammar",
        "guided_regex",
        "guided_json",
        "guided_choice",
        "structured_outputs",
        "response_format",
        "regex",
    }
)
_MEDIA = frozenset({"image_url", "video_url", "audio_url", "input_audio", "image", "file", "uuid"})
_FAN_OUT = frozenset(
    {"n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs", "logit_bias", "stop"}
)


class _Abort(Exception):
    """The server cannot be brought back: stop minimising."""


def _item_path(prefix: str, item: Any) -> str:
    """A list item's path: ``[]``, or ``[type=...]`` for a content part with a string type
    (what a template renders depends on a part's type, not on a tool's)."""
    kind = item.get("type") if isinstance(item, dict) else None
    if isinstance(kind, str) and prefix.endswith("content"):
        return f"{prefix}[type={kind}]"
    return f"{prefix}[]"


def shape_paths(doc: Any, prefix: str = "") -> set[str]:
    """Every field path of ``doc``: list items as ``[]``, content parts as ``[type=...]``
    (``messages[].content[type=refusal].refusal``), ``type`` keys left out."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "type" and isinstance(v, str):
                continue
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= shape_paths(v, path)
    elif isinstance(doc, list):
        for item in doc[:64]:
            path = _item_path(prefix, item)
            out.add(path)
            out |= shape_paths(item, path)
    return out


def _leaves(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(q != p and q.startswith(p) for q in paths))


def shape_signature(doc: Any) -> str:
    """The fields of ``doc`` beyond :data:`BASELINE`, as a cause name."""
    novel = shape_paths(doc) - BASELINE
    leaves = _leaves(novel)
    return "+".join(leaves)[:200] if leaves else OVERHEAD


def remove_paths(doc: Any, paths: set[str], prefix: str = "") -> Any:
    """A copy of ``doc`` without the fields whose :func:`shape_paths` name is in ``paths``."""
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if path not in paths:
                out[k] = remove_paths(v, paths, path)
        return out
    if isinstance(doc, list):
        items = []
        for item in doc:
            path = _item_path(prefix, item)
            if path not in paths:
                items.append(remove_paths(item, paths, path))
        return items
    return doc


def _plain_text(content: Any) -> str:
    """A message content as the plain text a chat of text parts carries."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [
        p["text"]
        for p in content
        if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
    ]
    return "".join(texts)


def baseline_body(doc: Any) -> dict[str, Any] | None:
    """``doc`` reduced to the fields of :data:`BASELINE`: every message a role and its text
    (text parts joined), or None when it is not an object."""
    if not isinstance(doc, dict):
        return None
    top = {p for p in BASELINE if "." not in p and "[" not in p}
    out = {k: v for k, v in doc.items() if k in top and k not in ("messages", "prompt")}
    if isinstance(doc.get("prompt"), str):
        out["prompt"] = doc["prompt"]
    if isinstance(doc.get("messages"), list):
        out["messages"] = [
            {"role": m.get("role"), "content": _plain_text(m.get("content"))}
            for m in doc["messages"]
            if isinstance(m, dict)
        ]
    return out


def _keys(doc: Any, out: set[str], depth: int = 0) -> int:
    """Collect every key; return the nesting depth."""
    deepest = depth
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(str(k))
            deepest = max(deepest, _keys(v, out, depth + 1))
    elif isinstance(doc, list):
        for v in doc[:256]:
            deepest = max(deepest, _keys(v, out, depth + 1))
    return deepest


def payload_class(req: LiveRequest, cause: str) -> str:
    """The THREATS.md class a finding on a live server is filed under."""
    if cause.startswith("undercount:"):
        return "volume"
    keys: set[str] = set()
    depth = _keys(req.body, keys) if req.body is not None else 0
    if keys & _GUIDED:
        return "guided_decoding"
    if keys & _MEDIA:
        return "multimodal_fan_out"
    if "chat_template" in keys:
        return "request_chat_template"
    if "chat_template_kwargs" in keys:
        return "template_kwargs"
    if keys & _FAN_OUT:
        return "fan_out"
    if depth > 32 or req.body is None:
        return "json_body_bomb"
    return "volume"


def _payload_cost(cost: Cost, size: int) -> dict[str, float]:
    from payloads.loader import COST_METRICS

    d = cost.to_dict()
    d["size_bytes"] = float(size)
    d["cost_per_byte"] = round(cost.per_byte(size), 6)
    return {k: v for k, v in d.items() if k in COST_METRICS}


class LiveRecorder:
    """Records the findings of one live campaign (thread-safe; the campaign calls it with the
    other workers paused, so the server sees only the minimiser's requests)."""

    def __init__(
        self,
        oracle: LiveOracle,
        findings: FindingSet,
        *,
        target: str,
        engine: str,
        recover: Callable[[], bool],
        save_root: Path | None = None,
        seed: int | None = None,
        minimise: bool = True,
        minimise_s: float = 20.0,
        max_tests: int = 200,
        confirm_faults: bool = False,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.oracle = oracle
        self.findings = findings
        self.target = target
        self.engine = engine
        self.recover = recover
        self.save_root = save_root
        self.seed = seed
        self.minimise = minimise
        self.minimise_s = minimise_s
        self.max_tests = max_tests
        self.confirm_faults = confirm_faults
        self.note = note or (lambda _text: None)
        self.duplicates: Counter[str] = Counter()
        self.unconfirmed = 0
        self.examined: set[frozenset[str]] = set()
        self.minimise_tests = 0
        self.requests: dict[str, LiveRequest] = {}
        self.busy_s = 0.0  # spent confirming, classifying and minimising
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ public

    def consider(
        self, req: LiveRequest, measured: Measured, found_after_s: float
    ) -> Finding | None:
        with self._lock:
            start = time.monotonic()
            try:
                return self._consider(req, measured, found_after_s)
            finally:
                self.busy_s += time.monotonic() - start

    def _consider(self, req: LiveRequest, measured: Measured, at: float) -> Finding | None:
        outcome = measured.outcome
        verdict = outcome.verdict
        if verdict != "undercount" and self.findings.has(cause_of(outcome)):
            self.duplicates[cause_of(outcome)] += 1
            return None
        if not self._confirmed(req, measured):
            self.unconfirmed += 1
            return None
        if verdict == "undercount":
            novel = frozenset(shape_paths(req.body) - BASELINE)
            if novel in self.examined:
                self.duplicates["undercount:(examined shape)"] += 1
                return None
            self.examined.add(novel)
            # Nothing beyond a plain chat: any excess is the template's overhead. Otherwise at
            # least half the excess, so that the unusual fields stay in the minimised request.
            need = max(1, (measured.excess + 1) // 2) if novel else 1
            core = self._core_excess(req) if novel else None
            known = self._known_explains(req, measured, novel, need)
            if known is not None:
                self.duplicates[known] += 1
                return None
            if core is not None:
                overhead = f"undercount:{outcome.where}:{OVERHEAD}"
                if core >= need and self.findings.has(overhead):
                    # The plain-chat core alone shows it: the template's overhead, known.
                    self.duplicates[overhead] += 1
                    return None
                # Keep what the core does not explain, with a margin: the minimised request
                # keeps the text the guard misses, not just as much of it as possible.
                need = min(need, max(core, 0) + _MARGIN)
        else:
            need = 0
        small, final, stats_tests, minimised = req, measured, 0, False
        if self.minimise:
            try:
                small, final, stats_tests = self._minimise(req, measured, need)
            except _Abort:
                self.note("the server could not be brought back while minimising")
            minimised = small.to_input() != req.to_input()
        self.minimise_tests += stats_tests
        out = final.outcome
        if out.verdict == "undercount":
            out = dataclasses.replace(out, where=f"{out.where}:{shape_signature(small.body)}")
        cause = cause_of(out)
        if not self.findings.claim(cause):
            self.duplicates[cause] += 1
            return None
        finding = Finding(
            target=self.target,
            engine=self.engine,
            cause=cause,
            outcome=out,
            original=req.to_input(),
            data=small.to_input(),
            cost_before=outcome.cost,
            cost_after=out.cost,
            found_after_s=at,
            minimised=minimised,
            minimise_tests=stats_tests,
            seed=self.seed,
        )
        if self.save_root is not None:
            try:
                self._save(finding, small, final)
            except Exception as exc:  # the finding stands; report why it has no file
                finding.save_error = f"{type(exc).__name__}: {exc}"
        self.findings.add(finding)
        self.requests[cause] = small
        return finding

    def _confirmed(self, req: LiveRequest, measured: Measured) -> bool:
        """Send a measured crossing (latency, memory) again: other load on the machine is not
        a finding; a 5xx too (one request: a gateway's 502 on a connection to a server that
        was just restarted is not the request's). With concurrent workers
        (``confirm_faults``), a crash or a hang too: every
        request in flight when the server died failed, only the one that kills it again alone
        is the finding (the server is brought back first; when it cannot be, the request is
        taken as it is)."""
        out = measured.outcome
        faults = out.verdict in ("crash", "timeout") and self.confirm_faults
        if out.verdict not in _MEASURED and out.verdict != "server_error" and not faults:
            return True
        if faults and not self.oracle.alive() and not self.recover():
            return True
        again = self.oracle.run(req)
        return cause_of(again.outcome) == cause_of(out)

    def _known_explains(
        self, req: LiveRequest, measured: Measured, novel: frozenset[str], need: int
    ) -> str | None:
        """The known under-count whose fields the request has and without which its excess
        falls below ``need`` (one test per such class), or None."""
        prefix = f"undercount:{measured.outcome.where}:"
        for cause, small in list(self.requests.items()):
            if not cause.startswith(prefix) or cause.endswith(OVERHEAD):
                continue
            fields = set(_leaves(shape_paths(small.body) - BASELINE))
            if not fields or not fields <= novel:
                continue
            without = remove_paths(req.body, fields)
            m = self.oracle.run(req.with_body(without))
            self.minimise_tests += 1
            if m.outcome.verdict not in ("ok", "undercount") or m.excess < need:
                return cause
        return None

    def _core_excess(self, req: LiveRequest) -> int | None:
        """The excess of the request's plain-chat core (:func:`baseline_body`: its unusual
        fields removed), or None when the core is not served."""
        core = baseline_body(req.body)
        if core is None:
            return None
        m = self.oracle.run(req.with_body(core))
        self.minimise_tests += 1
        if m.outcome.verdict not in ("ok", "undercount"):
            return None
        return m.excess

    # ------------------------------------------------------------------------ minimisation

    def _predicate(self, original: Measured, need: int) -> Callable[[LiveRequest], Measured | None]:
        """Run a candidate; its measurement when it is the same finding (an under-count: with
        an excess of at least ``need``), else None."""
        out = original.outcome
        cause = cause_of(out)

        def run(candidate: LiveRequest) -> Measured | None:
            m = self.oracle.run(candidate)
            o = m.outcome
            if o.verdict in ("crash", "timeout") and not self.oracle.alive() and not self.recover():
                raise _Abort
            if out.verdict == "undercount":
                same = o.verdict == "undercount" and o.where == out.where and m.excess >= need
            elif out.verdict == "false_positive":
                same = o.verdict == "false_positive" and o.error_code == out.error_code
            else:
                same = cause_of(o) == cause
            return m if same else None

        return run

    def _minimise(
        self, req: LiveRequest, measured: Measured, need: int
    ) -> tuple[LiveRequest, Measured, int]:
        dead = measured.outcome.verdict in ("crash", "timeout") and not self.oracle.alive()
        if dead and not self.recover():
            raise _Abort
        run = self._predicate(measured, max(1, need))
        last: dict[str, Measured] = {}
        if isinstance(req.body, dict):
            stats = MinimiseStats()

            def still(doc: Any) -> bool:
                cand = req.with_body(doc)
                m = run(cand)
                if m is not None:
                    last[cand.to_input().hex()] = m
                return m is not None

            keep = frozenset({"model"})
            body = shrink_json(
                req.body,
                still,
                max_tests=self.max_tests,
                deadline_s=self.minimise_s,
                stats=stats,
                keep=keep,
            )
            small = req.with_body(body)
            tests = stats.tests
        elif req.raw is not None:
            bstats = MinimiseStats()

            def still_raw(data: bytes) -> bool:
                cand = dataclasses.replace(req, raw=data, _bytes=[])
                m = run(cand)
                if m is not None:
                    last[cand.to_input().hex()] = m
                return m is not None

            raw = ddmin(
                req.raw,
                still_raw,
                max_tests=self.max_tests,
                deadline_s=self.minimise_s,
                stats=bstats,
            )
            small = dataclasses.replace(req, raw=raw, _bytes=[])
            tests = bstats.tests
        else:
            return req, measured, 0
        final = last.get(small.to_input().hex())
        if final is None or small.to_input() == req.to_input():
            return req, measured, tests
        return small, final, tests

    # ------------------------------------------------------------------------------ saving

    def _save(self, finding: Finding, req: LiveRequest, measured: Measured) -> None:
        assert self.save_root is not None
        existing = self.findings.known.get(finding.cause)
        if existing is not None:
            finding.path, finding.known = existing, True
            return
        out = finding.outcome
        kind = "a differential" if self.engine == "differential" else "a black-box"
        description = (
            f"Found by {kind} campaign against the live server {self.target}: {out.verdict}"
            f" ({finding.cause}); {len(finding.original)} bytes minimised to"
            f" {finding.size_bytes}."
        )
        if out.error_message:
            description += f" {out.error_message[:300]}"
        before = _payload_cost(finding.cost_before, len(finding.original))
        after = _payload_cost(finding.cost_after, finding.size_bytes)
        field = "+".join(_leaves(shape_paths(req.body) - BASELINE))[:200] or "body"
        if out.verdict == "false_positive":
            path = self._save_benign(finding, req, description, field, before, after)
        else:
            from payloads import save_found

            payload = save_found(
                target=safe_target_name(self.target),
                class_=payload_class(req, finding.cause),
                body=req.to_bytes(),
                endpoint=req.path,
                target_field=field,
                description=description,
                engine=self.engine,
                cause=finding.cause,
                cost_before=before,
                cost_after=after,
                seed=self.seed,
                minimised=finding.minimised,
                root=self.save_root,
            )
            path = payload.path
        finding.path = str(path)
        self.findings.known[finding.cause] = finding.path

    def _save_benign(
        self,
        finding: Finding,
        req: LiveRequest,
        description: str,
        field: str,
        before: dict[str, float],
        after: dict[str, float],
    ) -> Path:
        """A false positive as a benign payload: the guard should let it through."""
        from payloads import load_payload, parse_payload

        assert self.save_root is not None
        body = req.to_bytes()
        target = safe_target_name(self.target)
        pid = f"found-{target}-fp-{hashlib.sha256(body).hexdigest()[:12]}"
        directory = Path(self.save_root) / "benign"
        path = directory / f"{pid}.yaml"
        if path.exists():
            return path
        try:
            text = body.decode("utf-8")
            body_field: dict[str, Any] = {"body_text": text}
            if yaml.safe_load(yaml.safe_dump(body_field, allow_unicode=True)) != body_field:
                raise ValueError
        except (UnicodeDecodeError, ValueError):
            body_field = {"body_b64": base64.b64encode(body).decode("ascii")}
        record: dict[str, Any] = {
            "id": pid,
            "class": "benign",
            "source": "fuzz",
            "description": description,
            "target_field": field,
            "endpoint": req.path if req.path else CHAT,
            **body_field,
            "expect": {"status": 200},
            "found": {
                "target": target,
                "engine": self.engine,
                "cause": finding.cause,
                "seed": self.seed,
                "found_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "minimised": finding.minimised,
            },
            "cost": {"before": before, "after": after},
        }
        parse_payload(record, path)
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(
            yaml.safe_dump(record, sort_keys=False, allow_unicode=True, width=100), "utf-8"
        )
        load_payload(path)
        return path
