"""Findings on live servers: confirmed, minimised against the server, deduplicated, saved.

The finding model is every campaign's (:mod:`fuzz.findings`); what only a live server needs is
here. :meth:`LiveRecorder.record` takes a request the oracle called a finding and:

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
4. names an under-count by the shape of the minimised request (:mod:`fuzz.live._fields`): its
   fields that a plain chat or completion does not have
   (``messages[].content[type=refusal].refusal``), the template's own overhead when there are
   none; that name is its cause;
5. saves it as a payload file (:func:`fuzz.findings.save_finding`): attacks under
   ``<root>/found/<target>/``, a false positive, a benign request the guard refuses, under
   ``<root>/benign/`` with ``expect: {status: 200}``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz.findings import (
    MEASURED_VERDICTS,
    Finding,
    FindingSet,
    cause_of,
    replay_command,
    save_finding,
)
from fuzz.live._component import component_of
from fuzz.live._fields import (
    BASELINE,
    OVERHEAD,
    baseline_body,
    leaves,
    payload_class,
    remove_paths,
    shape_paths,
    shape_signature,
)
from fuzz.live._oracle import LiveOracle, Measured
from fuzz.live._request import LiveRequest
from fuzz.minimize import MinimiseStats, ddmin, shrink_json

__all__ = ["LiveRecorder", "cause_with_evidence"]

# Tokens an under-count must keep above what its plain-chat core shows, when minimised.
_MARGIN = 16


def _signature(m: Measured) -> str | None:
    """The cause signature the server's log gives for this measurement, if any."""
    ev = m.extra.get("evidence")
    sig = ev.get("signature") if isinstance(ev, dict) else None
    return sig if isinstance(sig, str) else None


def cause_with_evidence(m: Measured) -> str:
    """The deduplication key of a live finding: its verdict's cause, refined by what the
    server's log names (``crash:ServerDied:server:died@SIGSEGV@llama_cpp/_internals.py:...``):
    two crashes with different stacks are two bugs."""
    cause = cause_of(m.outcome)
    sig = _signature(m)
    return cause if sig is None else f"{cause}@{sig}"


class _Abort(Exception):
    """The server cannot be brought back: stop minimising."""


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
        target_url: str | None = None,
        server_kind: str | None = None,
        can_restart: Callable[[], bool] | None = None,
        restart: Callable[[], bool] | None = None,
    ) -> None:
        self.oracle = oracle
        self.target_url = target_url
        self.server_kind = server_kind
        # Whether a server that is up can be restarted (a restart command is set and has not
        # failed), and doing it: a finding that does not reproduce on the server as it is, is
        # tried once more on a fresh one.
        self.can_restart = can_restart or (lambda: False)
        self.restart = restart or (lambda: False)
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

    def record(self, req: LiveRequest, measured: Measured, found_after_s: float) -> Finding | None:
        """Confirm, minimise, name and save the finding ``measured`` reports for ``req`` (seen
        ``found_after_s`` into the run); None when its cause is known or it did not reproduce."""
        with self._lock:
            start = time.monotonic()
            try:
                return self._record(req, measured, found_after_s)
            finally:
                self.busy_s += time.monotonic() - start

    def _record(self, req: LiveRequest, measured: Measured, at: float) -> Finding | None:
        outcome = measured.outcome
        verdict = outcome.verdict
        if verdict != "undercount" and self.findings.has(cause_with_evidence(measured)):
            self._again(cause_with_evidence(measured))
            return None
        fresh_only = False
        confirmed = self._confirmed(req, measured)
        if confirmed is None:
            confirmed = self._confirmed_fresh(req, measured)
            if confirmed is None:
                self.unconfirmed += 1
                return None
            fresh_only = True
        if confirmed is not measured:
            # The run that confirmed it was sent alone (the other workers paused): its log
            # excerpt is this request's. The first one's may be another worker's traceback
            # (a 500 named KeyError@check_tool_usage that was an allowed_token_ids request).
            measured = confirmed
            if verdict != "undercount" and self.findings.has(cause_with_evidence(measured)):
                self._again(cause_with_evidence(measured))
                return None
        if verdict == "undercount":
            novel = frozenset(shape_paths(req.body) - BASELINE)
            if novel in self.examined:
                self._again("undercount:(examined shape)")
                return None
            self.examined.add(novel)
            # Nothing beyond a plain chat: any excess is the template's overhead. Otherwise at
            # least half the excess, so that the unusual fields stay in the minimised request.
            need = max(1, (measured.excess + 1) // 2) if novel else 1
            core = self._core_excess(req) if novel else None
            known = self._known_explains(req, measured, novel, need)
            if known is not None:
                self._again(known)
                return None
            if core is not None:
                overhead = f"undercount:{outcome.where}:{OVERHEAD}"
                if core >= need and self.findings.has(overhead):
                    # The plain-chat core alone shows it: the template's overhead, known.
                    self._again(overhead)
                    return None
                # Keep what the core does not explain, with a margin: the minimised request
                # keeps the text the guard misses, not just as much of it as possible.
                need = min(need, max(core, 0) + _MARGIN)
        else:
            need = 0
        small, final, stats_tests, minimised = req, measured, 0, False
        if self.minimise:
            try:
                small, final, stats_tests = self._minimise(req, measured, need, fresh_only)
            except _Abort:
                self.note("the server could not be brought back while minimising")
            minimised = small.to_input() != req.to_input()
        self.minimise_tests += stats_tests
        out = final.outcome
        if out.verdict == "undercount":
            out = dataclasses.replace(out, where=f"{out.where}:{shape_signature(small.body)}")
            cause = cause_of(out)
        else:
            cause = cause_with_evidence(final)
        if not self.findings.claim(cause):
            self._again(cause)
            return None
        evidence = dict(final.extra.get("evidence") or measured.extra.get("evidence") or {})
        if final.reply is not None and final.reply.status is not None:
            evidence["status"] = final.reply.status
            evidence["error_code"] = final.reply.error_code()
        evidence.update(component_of(evidence, small.body, self.server_kind))
        evidence["request_shape"] = shape_signature(small.body)
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
            evidence=evidence,
            fresh_only=fresh_only,
        )
        if self.save_root is not None:
            try:
                self._save(finding, small)
            except Exception as exc:  # the finding stands; report why it has no file
                finding.save_error = f"{type(exc).__name__}: {exc}"
            finding.replay_command = replay_command(finding.path, self.target_url)
        self.findings.add(finding)
        self.requests[cause] = small
        return finding

    def _confirmed(self, req: LiveRequest, measured: Measured) -> Measured | None:
        """Send a measured crossing (latency, memory) again: other load on the machine is not
        a finding; a 5xx too (one request: a gateway's 502 on a connection to a server that
        was just restarted is not the request's). With concurrent workers
        (``confirm_faults``), a crash or a hang too: every
        request in flight when the server died failed, only the one that kills it again alone
        is the finding (the server is brought back first; when it cannot be, the request is
        taken as it is). The measurement that confirms it (``measured`` itself when it needs
        no confirmation), or None."""
        out = measured.outcome
        faults = out.verdict in ("crash", "timeout") and self.confirm_faults
        if out.verdict not in MEASURED_VERDICTS and out.verdict != "server_error" and not faults:
            return measured
        if faults and not self.oracle.alive() and not self.recover():
            return measured
        again = self.oracle.run(req)
        return again if cause_of(again.outcome) == cause_of(out) else None

    def _confirmed_fresh(self, req: LiveRequest, measured: Measured) -> Measured | None:
        """A finding the server as it is did not repeat, tried once on a freshly started
        server (when it can be restarted): True when it reproduces there (it needs a fresh
        server: the campaign marks it so, and minimises it restarting before every test); the
        measurement that reproduced it, or None."""
        out = measured.outcome
        # Not a measured crossing: one that does not repeat is most often the machine's load,
        # and restarting a server that takes a minute to start for each would be costly.
        if out.verdict not in ("server_error", "timeout"):
            return None
        if not self.can_restart() or not self.restart():
            return None
        again = self.oracle.run(req)
        return again if cause_of(again.outcome) == cause_of(out) else None

    def _again(self, cause: str) -> None:
        self.duplicates[cause] += 1
        self.findings.met_again(cause)

    def _known_explains(
        self, req: LiveRequest, measured: Measured, novel: frozenset[str], need: int
    ) -> str | None:
        """The known under-count whose fields the request has and without which its excess
        falls below ``need`` (one test per such class), or None."""
        prefix = f"undercount:{measured.outcome.where}:"
        for cause, small in list(self.requests.items()):
            if not cause.startswith(prefix) or cause.endswith(OVERHEAD):
                continue
            fields = set(leaves(shape_paths(small.body) - BASELINE))
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

    def _predicate(
        self, original: Measured, need: int, fresh: bool = False
    ) -> Callable[[LiveRequest], Measured | None]:
        """Run a candidate; its measurement when it is the same finding (an under-count: with
        an excess of at least ``need``; a crash or 5xx whose server log names a cause: the
        same signature when the candidate's log names one too), else None. ``fresh``: the
        server is restarted before each test."""
        out = original.outcome
        cause = cause_of(out)
        signature = _signature(original)

        def run(candidate: LiveRequest) -> Measured | None:
            if fresh and not self.restart():
                raise _Abort
            m = self.oracle.run(candidate)
            o = m.outcome
            if o.verdict in ("crash", "timeout") and not self.oracle.alive() and not self.recover():
                raise _Abort
            if out.verdict == "undercount":
                same = o.verdict == "undercount" and o.where == out.where and m.excess >= need
            elif out.verdict == "false_positive":
                same = o.verdict == "false_positive" and o.error_code == out.error_code
            else:
                theirs = _signature(m)
                same = cause_of(o) == cause and (
                    signature is None or theirs is None or theirs == signature
                )
            return m if same else None

        return run

    def _minimise(
        self, req: LiveRequest, measured: Measured, need: int, fresh: bool = False
    ) -> tuple[LiveRequest, Measured, int]:
        dead = measured.outcome.verdict in ("crash", "timeout") and not self.oracle.alive()
        if dead and not self.recover():
            raise _Abort
        run = self._predicate(measured, max(1, need), fresh)
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

    def _save(self, finding: Finding, req: LiveRequest) -> None:
        assert self.save_root is not None
        out = finding.outcome
        kind = "a differential" if self.engine == "differential" else "a black-box"
        description = (
            f"Found by {kind} campaign against the live server {self.target}: {out.verdict}"
            f" ({finding.cause}); {len(finding.original)} bytes minimised to"
            f" {finding.size_bytes}."
        )
        if out.error_message:
            description += f" {out.error_message[:300]}"
        save_finding(
            finding,
            self.findings,
            self.save_root,
            class_=payload_class(req, finding.cause),
            body=req.to_bytes(),
            endpoint=req.path,
            target_field="+".join(leaves(shape_paths(req.body) - BASELINE))[:200] or "body",
            description=description,
        )
