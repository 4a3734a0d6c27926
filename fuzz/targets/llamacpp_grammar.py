"""``backend-llamacpp-grammar``: the guard's GBNF verdict against llama.cpp's own grammar code.

llama-cpp-python 0.3.36 passes a request's ``grammar`` to llama.cpp
(``llama_sampler_init_grammar``). A grammar llama.cpp refuses crashes the server (the NULL
sampler: docs/findings/llamacpp-rejected-grammar-segfault.yaml), one it accepts may still
crash, abort or exhaust memory while the sampler is built or used
(llamacpp-nullable-left-recursion-abort.yaml). The guard reads the ``grammar`` field as
llama.cpp does (:mod:`guard.guided.grammar._gbnf`, a port of its parser) and refuses what it
could not survive. This target tests that port against the real thing, on GBNF text mutated
structurally (:mod:`fuzz.targets._gbnf_mutate`) from the corpus' grammars and
llama-cpp-python's bundled ones:

1. the guard's verdict on ``{"prompt": "h", "grammar": <input>}`` at ``/v1/completions``
   (:func:`guard.pipeline.evaluate_body`, the default policy in front of a ``llama_cpp``
   upstream);
2. llama.cpp's build of the same bytes in a child forked from the worker, then a few decode
   steps of masks and accepts (:mod:`fuzz.targets._llamacpp_build`), unless the guard refused
   it on cost (``*_too_large``, ``*_too_deep``, ``*_unsafe``: nothing to compare);
3. :func:`judge`: a finding when the guard **admits** a grammar llama.cpp refuses (the server
   then crashes), or that kills, aborts or starves it (signal, ``std::bad_alloc``, the CPU or
   wall limit), or that costs more than :data:`BUILD_BUDGET_S` / :data:`MEM_BUDGET` /
   :data:`MASK_BUDGET_S`, or more than :data:`PER_BYTE_S` of build per input byte (a cost
   that grows faster than the grammar: at the guard's 32 KB limit it would be over budget);
   and when the guard refuses as unparsable (``guided_grammar_invalid``) a grammar llama.cpp
   builds and walks within budget: a false refusal of a working grammar. Everything else is
   the guard's refusal, the documented rejection.

A finding's type names its class and phase (``GuardAdmits_SIGSEGV_build``,
``GuardRefuses_accepted``), so a campaign keeps one per class; its message carries the
guard's verdict and llama.cpp's own words (its parse error, an abort's message).

Without llama-cpp-python set up (``scripts/upstreams/upstreams.py setup llamacpp``) the target
says so in one line and the worker exits.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz.targets._base import Budgets, Cost
from fuzz.targets._common import TargetBase
from fuzz.targets._gbnf_mutate import GBNF_DICTIONARY, gbnf_mutate
from fuzz.targets._llamacpp_build import (
    VERSION,
    BuildLimits,
    BuildOutcome,
    LlamaCppGrammar,
    build,
    load,
    locate,
)
from guard.errors import GuardError

__all__ = [
    "BUILD_BUDGET_S",
    "MASK_BUDGET_S",
    "MEM_BUDGET",
    "PER_BYTE_S",
    "BuildStarved",
    "GrammarFinding",
    "Judgement",
    "LlamaCppGrammarBackend",
    "finding_type",
    "grammar_of",
    "judge",
]

_MIB = 1 << 20
# The other backend targets' budgets (issue 16): 1 s of CPU to build, 256 MiB, 0.05 s a mask.
BUILD_BUDGET_S = 1.0
MEM_BUDGET = 256 * _MIB
MASK_BUDGET_S = 0.05
# Build CPU per input byte beyond which the cost outgrows the grammar: 1 s over the guard's
# 32,768-character limit. Below SUPERLINEAR_FLOOR_S nothing is judged (fork, page faults).
PER_BYTE_S = BUILD_BUDGET_S / 32768
SUPERLINEAR_FLOOR_S = 0.05
# Refusals that state llama.cpp cannot parse the grammar: those are compared with llama.cpp.
# The cost refusals (too large, too deep, unsafe) are the policy's budgets: not compared.
_PARSE_CODE = "guided_grammar_invalid"
# A refusal the guard makes knowingly: a <text> token needs the model's vocabulary.
_DELIBERATE = ("token given by its text",)
ENDPOINT = "/v1/completions"


class BuildStarved(Exception):
    """The child got too little CPU before its wall-clock limit (a loaded machine): no
    verdict, so not a finding."""

    code = "llamacpp_build_starved"


class GrammarFinding(Exception):
    """The guard and llama.cpp disagree, or a grammar the guard admits hurts llama.cpp."""


_TYPES: dict[str, type[GrammarFinding]] = {}


def finding_type(name: str) -> type[GrammarFinding]:
    """The exception type of one class of finding: its name is the campaign's dedup key."""
    if name not in _TYPES:
        _TYPES[name] = type(name, (GrammarFinding,), {"__module__": __name__})
    return _TYPES[name]


@dataclass(frozen=True)
class Judgement:
    """:func:`judge`'s answer: ``finding`` is the finding's type name (None: not a finding)."""

    finding: str | None
    message: str


def judge(refusal: GuardError | None, out: BuildOutcome, size: int) -> Judgement:
    """The guard's verdict (``refusal``, None when it admits) against llama.cpp's outcome for
    an input of ``size`` bytes."""
    said = (
        "the guard admits it"
        if refusal is None
        else f"the guard refuses it ({refusal.code}: {refusal.message})"
    )
    llama = _describe(out)
    if refusal is None:
        bad = _harm(out, size)
        if bad is not None:
            return Judgement(f"GuardAdmits_{bad}", f"{said}; llama.cpp {llama}")
        return Judgement(None, f"{said}; llama.cpp {llama}")
    deliberate = any(d in refusal.message for d in _DELIBERATE)
    if (
        refusal.code == _PARSE_CODE
        and not deliberate
        and out.status == "accepted"
        and _harm(out, size) is None
    ):
        return Judgement("GuardRefuses_accepted", f"{said}; llama.cpp {llama}")
    return Judgement(None, f"{said}; llama.cpp {llama}")


def _harm(out: BuildOutcome, size: int) -> str | None:
    """What a grammar did to llama.cpp, as a finding's name, or None when it is harmless."""
    if out.status == "rejected":
        return "rejected"  # llama-cpp-python then adds the NULL sampler: SIGSEGV
    if out.status == "signal":
        return f"{out.signal}_{out.phase}"
    if out.status in ("memory", "time"):
        return f"{out.status}_{out.phase}"
    if out.status == "error":
        raise RuntimeError(f"the build harness failed: {out.log[-500:]}")
    if out.build_cpu_s > BUILD_BUDGET_S:
        return "over_budget_build"
    if out.peak_bytes > MEM_BUDGET:
        return "memory_over_budget"
    if out.mask_cpu_s > MASK_BUDGET_S:
        return "over_budget_mask"
    if out.build_cpu_s > SUPERLINEAR_FLOOR_S and out.build_cpu_s > PER_BYTE_S * size:
        return "superlinear_build"
    return None


def _describe(out: BuildOutcome) -> str:
    reason = out.reason()
    if out.status == "accepted":
        return (
            f"builds it in {out.build_cpu_s:.4f} s CPU, {out.peak_bytes >> 10} KiB, "
            f"walked {out.walked} tokens (dearest mask {out.mask_cpu_s:.4f} s)"
        )
    if out.status == "rejected":
        return f"refuses it ({reason or 'no reason logged'})"
    what = {"signal": f"dies by {out.signal}", "memory": "runs out of memory", "time": "hangs"}
    return (
        f"{what.get(out.status, out.status)} in {out.phase} after {out.cpu_s:.2f} s CPU, "
        f"{out.peak_bytes >> 20} MiB ({reason or 'nothing logged'})"
    )


# ---- input, corpus ------------------------------------------------------------------------------


def grammar_of(body: Any) -> str | None:
    """The GBNF text of a request body's llama-cpp-python ``grammar`` field (None: no text)."""
    if not isinstance(body, dict):
        return None
    grammar = body.get("grammar")
    return grammar if isinstance(grammar, str) else None


def _corpus_grammars() -> list[str]:
    """GBNF grammars of the payload corpus: the ``grammar`` field, and GBNF given to vLLM."""
    from payloads import load_corpus

    out: list[str] = []
    for p in load_corpus(classes=["guided_decoding", "benign"], include_public=True):
        try:
            body = json.loads(p.body_bytes())
        except (ValueError, RecursionError):
            continue
        if not isinstance(body, dict):
            continue
        so = body.get("structured_outputs")
        for g in (
            grammar_of(body),
            body.get("guided_grammar"),
            so.get("grammar") if isinstance(so, dict) else None,
        ):
            if isinstance(g, str) and "::=" in g:
                out.append(g)
    return out


def _bundled_grammars(site: Path | None) -> list[str]:
    """llama-cpp-python's own example grammars (``llama_cpp/llama_grammar.py``'s ``*_GBNF``),
    read without importing it."""
    path = None if site is None else site / "llama_cpp" / "llama_grammar.py"
    if path is None or not path.is_file():
        return []
    out: list[str] = []
    for node in ast.parse(path.read_text("utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id.endswith("_GBNF") for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out.append(node.value.value)
    return out


# Near the edges of llama.cpp's parser and of the guard's reading of it.
_EDGES = (
    'root ::= "a" root | "b"',
    'root ::= item+\nitem ::= [a-z]{1,8} " "\n',
    'root ::= x\nx ::= "a"? x | "b"\n',
    'root ::= ( "a" | "" )* "b"',
    'root ::= ws "x"\nws ::= [ ]*\n',
    'root ::= "\\u00e9"{2,3} [^\\x00-\\x1F]+',
    'root ::= a\na ::= b b\nb ::= c c\nc ::= "x"\n',
    'root ::= <[1]> "a" !<[2]>',
    'root::="a"\r\nroot ::= "b"\n',
    'root ::= ("a" ("b" ("c")?)*)+ # comment\n',
)


@functools.cache
def _seed_grammars(max_size: int) -> tuple[str, ...]:
    site = locate().site_packages
    found = [*_corpus_grammars(), *_bundled_grammars(site), *_EDGES]
    seen: dict[str, None] = {}
    for g in found:
        if len(g.encode("utf-8", "surrogatepass")) <= max_size:
            seen.setdefault(g, None)
    return tuple(seen)


# ---- the target ---------------------------------------------------------------------------------


class LlamaCppGrammarBackend(TargetBase):
    name = "backend-llamacpp-grammar"
    description = (
        f"llama.cpp's grammar sampler (llama-cpp-python {VERSION}) against the guard's GBNF "
        "verdict on the grammar field"
    )
    exercises = (
        "evaluate_body(grammar) then llama_sampler_init_grammar + masks/accepts in a forked "
        "child: crash, abort, memory, time, cost per byte, verdict disagreement"
    )
    kind = "guard"  # every finding is the guard's: a bypass, or a false refusal
    expected: tuple[type[BaseException], ...] = (GuardError, BuildStarved)
    isolate_by_default = True
    endpoint = ENDPOINT
    class_ = "guided_decoding"
    target_field = "grammar"
    max_size = 4096
    source = "guard/guided/grammar/_gbnf.py"
    # The worker's own budgets (the judging is the target's: the build runs in a child). Its
    # kill comes at 10 x wall_s when it is not burning CPU, after the child's wall limit.
    budgets = Budgets(wall_s=1.0, mem_bytes=256 * _MIB)
    _dictionary = GBNF_DICTIONARY
    limits = BuildLimits()
    # A grammar the guard refuses is only asked "does llama.cpp build and walk it within
    # budget?": a build past 1 s or 64 MiB agrees with the refusal, so it stops there (the
    # mutations make many that run away: {m,n} with n < m, left recursion through ws).
    refused_limits = BuildLimits(cpu_s=1, mem_bytes=64 << 20, wall_s=2.5)

    def __init__(self) -> None:
        self._env: LlamaCppGrammar | None = None
        self._policy: Any = None

    # -- setup ---------------------------------------------------------------------------------

    def available(self) -> bool:
        return locate().problem is None

    def missing_message(self) -> str:
        return locate().problem or ""

    def warmup(self) -> None:
        problem = locate().problem
        if problem is not None:
            # The worker's stderr tail is what the caller shows: one line, then exit.
            sys.stderr.write(problem + "\n")
            sys.stderr.flush()
            os._exit(2)
        self._ensure()
        for seed in self.seeds()[:2]:
            try:
                self.execute(seed)
            except Exception:
                continue

    def _ensure(self) -> LlamaCppGrammar:
        if self._env is None:
            located = locate()
            if located.problem is not None:
                raise ModuleNotFoundError(located.problem, name="llama_cpp")
            from guard.policy import default_policy

            self._policy = default_policy().with_upstream_kind("llama_cpp")
            self._env = load(located)
        return self._env

    # -- one input -----------------------------------------------------------------------------

    def verdict(self, data: bytes) -> GuardError | None:
        """The guard's refusal of the input as a request's grammar, None when it admits it."""
        from guard.pipeline import evaluate_body

        body, endpoint = self.payload_body(data)
        return evaluate_body(body, endpoint, [], self._policy).rejection

    def execute(self, data: bytes) -> Cost:
        env = self._ensure()
        refusal = self.verdict(data)
        if refusal is not None and refusal.code != _PARSE_CODE:
            raise refusal  # a cost refusal: the policy's budget, not llama.cpp's reading
        text = data.decode("utf-8", "replace")  # what a JSON body carries
        limits = self.limits if refusal is None else self.refused_limits
        out = build(env, text.encode("utf-8"), limits)
        if out.status == "starved":
            raise BuildStarved(f"{out.cpu_s:.2f} s CPU in {limits.wall_s} s")
        verdict = judge(refusal, out, len(data))
        if verdict.finding is not None:
            raise finding_type(verdict.finding)(verdict.message)
        if refusal is not None:
            raise refusal
        # Steps in the scalar's thousandths: the child's CPU microseconds, 1,000 per MiB.
        return Cost(steps=int(out.cpu_s * 1e6 + out.peak_bytes / _MIB * 1000))

    # -- mutation and payloads -----------------------------------------------------------------

    def seeds(self) -> list[bytes]:
        return [g.encode("utf-8", "surrogatepass") for g in _seed_grammars(self.max_size)]

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        return gbnf_mutate(data, max_size, rng, _seed_grammars(self.max_size))

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        body = {
            "model": "tiny-llama",
            "prompt": "h",
            "max_tokens": 8,
            "grammar": data.decode("utf-8", "replace"),
        }
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"), ENDPOINT

    def input_from_payload(
        self, body: bytes, endpoint: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes | None:
        try:
            grammar = grammar_of(json.loads(body))
        except (ValueError, RecursionError):
            return None
        return None if grammar is None else grammar.encode("utf-8", "surrogatepass")
