"""``backend-diff``: do the structured-output backends accept the same strings for a constraint?

vLLM serves one request with whichever backend it picks (xgrammar, guidance, outlines); a
constraint the backends read differently gives different outputs for the same request, or
output the client's own validator then refuses. For each input (a JSON schema or a regex, the
format of :mod:`fuzz.targets.backends`) this target compiles the constraint in every installed
backend, derives at most :data:`MAX_CANDIDATES` strings from it deterministically, and asks each
backend whether the whole string is accepted (outlines-core: a walk of the ``Index``;
llguidance: ``LLMatcher.consume_tokens`` then ``is_accepting``; xgrammar: ``GrammarMatcher``'s
``accept_token`` per token then the stop token, unexercised where xgrammar is not installed,
as in CI), tokenized with the shared vocabulary (:mod:`fuzz.targets._vocab`).

Candidates for a schema: its minimal instance
(:func:`scheduler_ref.schema_instance.minimal_instance`) and mutations of it (a leaf of another
type, a dropped key, an extra key, boundary numbers, escaped and raw non-ASCII strings), plus a string each backend generates itself (a seeded walk of its
token masks, as a model would under it). For a regex: the backends' walks and edits of them.

A finding is a **disagreement**: backend A accepts a candidate, backend B rejects it. The
reference says who is right (a JSON schema: ``jsonschema_rs``, Draft 2020-12 with formats
asserted, over the string parsed as strict JSON; a regex: Python's ``re.fullmatch``, when it
compiles), and the finding's type names the backend it faults, how, and the candidate's origin
(``Disagreement_outlines_rejects_valid_extra_key``), so the campaign keeps one finding per
distinct disagreement. Its message carries the constraint, the string and each backend's
answer (JSON). A compile over :data:`COMPILE_BUDGET_S` CPU seconds in one backend is a finding
too (:class:`CompileOverBudget`); a worker that dies is the oracle's. A backend that refuses
the constraint is left out of the comparison; fewer than two that compile it is the documented
rejection.

The backends' whitespace and key-order freedoms differ by design, so candidates are compact
JSON with keys in the schema's order (a walk's JSON re-serialised compactly): what they
disagree on then is the language itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import resource
import sys
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from fuzz.targets._base import Budgets, Cost
from fuzz.targets._common import TargetBase
from fuzz.targets._mutate import json_mutate
from fuzz.targets._upstream_venv import findable
from fuzz.targets.backends import (
    BackendRejected,
    guidance_matcher,
    join_input,
    split_input,
)

__all__ = [
    "BACKENDS",
    "COMPILE_BUDGET_S",
    "MAX_CANDIDATES",
    "CompileOverBudget",
    "DiffBackends",
    "Disagreement",
    "candidates",
]

MAX_CANDIDATES = 16
COMPILE_BUDGET_S = 1.0
_WALK_STEPS = 48
_MIB = 1 << 20
# name -> (module, extra): the backends compared when installed.
BACKENDS: dict[str, tuple[str, str]] = {
    "outlines": ("outlines_core", "backends"),
    "guidance": ("llguidance", "backends"),
    "xgrammar": ("xgrammar", "backends-xgrammar"),
}


class Disagreement(Exception):
    """Backends differ on a candidate string (subclassed per faulted backend and direction)."""


class CompileOverBudget(Exception):
    """One backend's compile took more CPU than :data:`COMPILE_BUDGET_S`."""


_KINDS: dict[str, type[Disagreement]] = {}


def disagreement_type(
    backend: str | None, how: str, origin: str, kind: str = "json"
) -> type[Disagreement]:
    """The exception type of a disagreement: its name is the finding's dedup key (the faulted
    backend, how, and the kind of candidate that showed it)."""
    name = f"Disagreement_{backend or 'unjudged'}_{how}_{origin}"
    if origin.startswith("walk"):  # a walk is of a regex or a schema: two different languages
        name += f"_{kind}"
    if name not in _KINDS:
        _KINDS[name] = type(name, (Disagreement,), {"__module__": __name__})
    return _KINDS[name]


# ---- candidates -------------------------------------------------------------------------------


def _dumps(value: Any, *, ascii_only: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only, allow_nan=False)


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    else:
        yield path, node


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in node.items()}
    return [_replace(v, rest, value) if i == head else v for i, v in enumerate(node)]


def _other_type(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int | float):
        return str(value)
    return None if isinstance(value, str) else 0


def _schema_numbers(schema: Any) -> list[int | float]:
    """Bounds named in the schema and one past each: where number ranges go wrong."""
    out: list[int | float] = []
    for _, v in _leaves(schema):
        if isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e15:
            out += [v, v + 1, v - 1]
    return out[:6]


def _instance_mutations(schema: Any, inst: Any) -> list[tuple[str, str]]:
    out = [("instance", _dumps(inst))]
    leaves = list(_leaves(inst))
    if leaves:  # an empty object or array has no leaf
        path, leaf = leaves[0]
        out.append(("other_type", _dumps(_replace(inst, path, _other_type(leaf)))))
    if isinstance(inst, dict):
        if inst:
            out.append(("dropped_key", _dumps(dict(list(inst.items())[1:]))))
        out.append(("extra_key", _dumps({**inst, "zz": 0})))
    for p, v in leaves:
        if isinstance(v, int | float) and not isinstance(v, bool):
            for n in [*_schema_numbers(schema), 0.5, -1, 2**53 + 1]:
                out.append(("number", _dumps(_replace(inst, p, n))))
            if p == ():  # the same number with an exponent: 2020-12 counts 1e0 as an integer
                out.append(("exponent", f"{_dumps(v)}e0"))
            break
    for p, v in leaves:
        if isinstance(v, str):
            for s in (v + "é", v + "\U0001f600", v + "\x01", v + "a"):
                out.append(("raw_string", _dumps(_replace(inst, p, s))))
                out.append(("escaped_string", _dumps(_replace(inst, p, s), ascii_only=True)))
            break
    return out


def _text_mutations(text: str) -> list[tuple[str, str]]:
    edits = [text[:-1], text + "a", text + text, "é" + text[1:], text + "\n"]
    return [("walk_edit", e) for e in edits]


def candidates(kind: str, spec: Any, walks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """At most :data:`MAX_CANDIDATES` distinct ``(origin, string)`` to ask every backend about,
    in order: the schema's minimal instance and its mutations, then the backends' own walks
    (origin ``walk_<backend>``) and edits of them. The origin is part of a finding's type."""
    out: list[tuple[str, str]] = []
    if kind == "json":
        from scheduler_ref.schema_instance import InstanceTooLarge, minimal_instance

        # no instance (too large, or a schema the generator cannot read): the walks remain
        with contextlib.suppress(InstanceTooLarge, RecursionError, TypeError, ValueError):
            out += _instance_mutations(spec, minimal_instance(spec))
    out += [(f"walk_{name}", w) for name, w in walks]
    for _, w in walks:
        out += _text_mutations(w)
    if kind == "regex":
        out += [("fixed", s) for s in ("", "a", "0", "é")]
    seen: dict[str, str] = {}
    for origin, text in out:
        if len(seen) >= MAX_CANDIDATES:
            break
        seen.setdefault(text, origin)
    return [(origin, text) for text, origin in seen.items()]


# ---- the reference ----------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# A class shorthand, not an escaped backslash before a letter.
_SHORTHAND = re.compile(r"(?<!\\)(?:\\\\)*\\[dwsbDWSB]")


def reference(kind: str, spec: Any, text: str) -> bool | None:
    """What the constraint's own semantics say of ``text`` (None: no reference for it)."""
    if kind == "json":
        import jsonschema_rs

        try:
            # formats asserted: the backends generate to them (a date-time has its offset)
            validator = jsonschema_rs.Draft202012Validator(spec, validate_formats=True)
        except (ValueError, TypeError, jsonschema_rs.ValidationError):
            return None
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return False
        return bool(validator.is_valid(value))
    if any(unicodedata.category(c) == "Cn" for c in text):
        # unassigned in this Python's Unicode tables, perhaps a digit or letter in the backend's
        return None
    if not text.isascii() and _SHORTHAND.search(spec):
        # \d \w \s \b: ASCII in ECMA-262 without the u flag (JSON Schema's dialect, which
        # xgrammar follows), Unicode in Python's, outlines-core's and llguidance's: two
        # readings, neither the constraint's own
        return None
    try:
        return re.fullmatch(spec, text) is not None
    except (re.error, RecursionError, OverflowError):
        return None


# ---- the backends -----------------------------------------------------------------------------


@dataclass
class _Vocab:
    size: int
    eos: int
    token_bytes: dict[int, bytes]
    encode: Callable[[str], list[int]]

    def tokens(self, text: str) -> list[int]:
        return self.encode(text)

    def text(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes.get(i, b"") for i in ids).decode("utf-8", "replace")


def _allowed(mask: bytes, size: int, eos: int) -> list[int]:
    out = []
    for byte_i, byte in enumerate(mask):
        for bit in range(8):
            tid = byte_i * 8 + bit
            if byte >> bit & 1 and tid < size and tid != eos:
                out.append(tid)
    return out


class _Backend:
    """One backend: compile a constraint, say whether it accepts a string, generate one."""

    name: ClassVar[str]

    def __init__(self, vocab: _Vocab, raw: Any) -> None:
        self.vocab = vocab

    def compile(self, kind: str, spec: Any) -> Any:
        raise NotImplementedError

    def accepts(self, compiled: Any, text: str) -> bool:
        raise NotImplementedError

    def walk(self, compiled: Any, rng: random.Random) -> str | None:
        return None


class _Outlines(_Backend):
    name = "outlines"

    def __init__(self, vocab: _Vocab, raw: Any) -> None:
        import outlines_core as oc

        super().__init__(vocab, raw)
        self.oc = oc
        self.voc = oc.Vocabulary(raw.eos, raw.token_bytes())

    def compile(self, kind: str, spec: Any) -> Any:
        regex = spec
        try:
            if kind == "json":
                from outlines_core.json_schema import build_regex_from_schema

                regex = build_regex_from_schema(json.dumps(spec))
            return self.oc.Index(regex, self.voc)
        except (ValueError, TypeError) as exc:
            raise BackendRejected(str(exc)[:200]) from None

    def accepts(self, compiled: Any, text: str) -> bool:
        state = compiled.get_initial_state()
        for tid in self.vocab.tokens(text):
            state = compiled.get_next_state(state, tid)
            if state is None:
                return False
        return bool(compiled.is_final_state(state))

    def walk(self, compiled: Any, rng: random.Random) -> str | None:
        state, ids = compiled.get_initial_state(), list[int]()
        for _ in range(_WALK_STEPS):
            final = compiled.is_final_state(state)
            allowed = [t for t in compiled.get_allowed_tokens(state) or () if t != self.vocab.eos]
            if final and (not allowed or rng.random() < 0.25):
                return self.vocab.text(ids)
            if not allowed:
                return None
            tid = rng.choice(allowed)
            ids.append(tid)
            state = compiled.get_next_state(state, tid)
        return self.vocab.text(ids) if compiled.is_final_state(state) else None


class _Guidance(_Backend):
    name = "guidance"

    def __init__(self, vocab: _Vocab, raw: Any) -> None:
        import llguidance

        super().__init__(vocab, raw)
        self.llg = llguidance
        self.tok = llguidance.LLTokenizer(raw.text, n_vocab=raw.size, eos_token=raw.eos)

    def compile(self, kind: str, spec: Any) -> Any:
        return guidance_matcher(self.llg, self.tok, kind, spec)  # as backend-guidance does

    def accepts(self, compiled: Any, text: str) -> bool:
        m = compiled.deep_copy()  # a rejected token leaves a matcher in its error state
        return bool(m.consume_tokens(self.vocab.tokens(text)) and m.is_accepting())

    def walk(self, compiled: Any, rng: random.Random) -> str | None:
        m, ids = compiled.deep_copy(), list[int]()
        for _ in range(_WALK_STEPS):
            if m.is_stopped():
                break
            allowed = _allowed(m.compute_bitmask(), self.vocab.size, self.vocab.eos)
            if m.is_accepting() and (not allowed or rng.random() < 0.25):
                break
            if not allowed:
                return None
            tid = rng.choice(allowed)
            if not m.consume_token(tid):
                return None
            ids.append(tid)
        return self.vocab.text(ids) if m.is_accepting() else None


class _Xgrammar(_Backend):
    name = "xgrammar"

    def __init__(self, vocab: _Vocab, raw: Any) -> None:
        from fuzz.targets._upstream_venv import load_module

        xgr = load_module("xgrammar")  # or vLLM's, from the upstream scripts' venv
        super().__init__(vocab, raw)
        self.xgr = xgr
        info = xgr.TokenizerInfo(
            raw.tokens, xgr.VocabType.BYTE_LEVEL, vocab_size=raw.size, stop_token_ids=[raw.eos]
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, kind: str, spec: Any) -> Any:
        try:
            if kind == "json":
                return self.compiler.compile_json_schema(
                    json.dumps(spec), any_whitespace=True, separators=None
                )
            return self.compiler.compile_regex(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise BackendRejected(str(exc)[:200]) from None

    def accepts(self, compiled: Any, text: str) -> bool:
        m = self.xgr.GrammarMatcher(compiled)
        for tid in self.vocab.tokens(text):
            if not m.accept_token(tid):
                return False
        return bool(m.accept_token(self.vocab.eos) and m.is_terminated())


_ADAPTERS: dict[str, type[_Backend]] = {
    "outlines": _Outlines,
    "guidance": _Guidance,
    "xgrammar": _Xgrammar,
}


def _installed(name: str) -> bool:
    return findable(BACKENDS[name][0])


# ---- the target -------------------------------------------------------------------------------


def _seeds() -> tuple[bytes, ...]:
    from fuzz.targets.backends_corpus import BENIGN

    near: list[tuple[str, Any]] = [
        ("json", {"type": "integer", "minimum": 0, "maximum": 10}),
        ("json", {"type": "number", "exclusiveMinimum": 0}),
        ("json", {"type": "string", "minLength": 2, "maxLength": 3}),
        ("json", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}),
        ("json", {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2}),
        ("json", {"enum": ["a", 1, None]}),
        ("json", {"type": "string", "pattern": "^[a-z]+$"}),
        ("regex", r"\w+"),
        ("regex", r"[^a]{2}"),
        ("regex", r"\d{2,3}(\.\d)?"),
    ]
    benign = [(k, s) for _, k, s in BENIGN if k in ("json", "regex")]
    # the small ones first: they compile fast, and an engine's first batch may be cut short
    return tuple(join_input(k, s) for k, s in [*near, *benign])


_DICTIONARY = (
    b'"type":"integer"',
    b'"type":"number"',
    b'"type":"string"',
    b'"type":"null"',
    b'"minimum":',
    b'"maximum":',
    b'"exclusiveMaximum":',
    b'"multipleOf":',
    b'"minLength":',
    b'"maxLength":',
    b'"pattern":',
    b'"format":"date"',
    b'"additionalProperties":false',
    b'"required":["a"]',
    b'"anyOf":[',
    b'"oneOf":[',
    b'"const":',
    b'"enum":[',
    b'"minItems":',
    b'"prefixItems":[',
    b"\\\\w",
    b"\\\\d",
    b"\\\\s",
    b"[^",
    b"{2,}",
    b"|",
)


# Schema keywords json_mutate sets, with values near where the backends' translations differ.
_FIELDS: dict[str, tuple[Any, ...]] = {
    "type": ("integer", "number", "string", "boolean", "null", "object", "array"),
    "minimum": (0, -1, 1.5, 10**16),
    "maximum": (0, 9, -0.5, 2**53),
    "exclusiveMinimum": (0, 1),
    "multipleOf": (2, 0.5, 3),
    "minLength": (0, 1, 2),
    "maxLength": (0, 1, 3),
    "pattern": ("^a$", "a", "[^a]", "\\w", "^$"),
    "format": ("date", "email", "uuid", "date-time"),
    "minItems": (0, 1, 2),
    "maxItems": (0, 1),
    "additionalProperties": (False, True, {"type": "integer"}),
    "const": (0, "a", None, [1]),
    "enum": (["a"], [0, "0"], [None, True]),
}


class DiffBackends(TargetBase):
    name = "backend-diff"
    description = (
        "the structured-output backends (outlines-core, llguidance, xgrammar) compared: does "
        "each accept the same strings for a JSON schema or a regex"
    )
    exercises = (
        "each installed backend's compile + full-string accept, jsonschema_rs / re as referee"
    )
    # Findings are the backends' bugs, not the guard's: expected, they do not fail CI.
    kind = "vulnerable"
    expected = (BackendRejected,)
    isolate_by_default = True
    endpoint = "/v1/chat/completions"
    class_ = "guided_decoding"
    target_field = "structured_outputs"
    max_size = 1024
    source = "fuzz/targets/backends_diff.py"
    # Every backend's compile and up to 16 candidate walks: the per-compile budget is enforced
    # in execute (CompileOverBudget); this is the whole input's backstop.
    budgets = Budgets(wall_s=3.0, mem_bytes=512 * _MIB)
    _seeds = _seeds()
    _dictionary = _DICTIONARY

    def __init__(self) -> None:
        self._backends: list[_Backend] | None = None

    # -- setup ---------------------------------------------------------------------------------

    def compared(self) -> list[str]:
        return [n for n in BACKENDS if _installed(n)]

    def available(self) -> bool:
        return len(self.compared()) >= 2

    def missing_message(self) -> str:
        """One line: which backends are not installed (and so not compared)."""
        missing = [n for n in BACKENDS if not _installed(n)]
        if not missing:
            return ""
        extras = sorted({BACKENDS[n][1] for n in missing})
        installs = " ".join(f"'schedguard[{e}]'" for e in extras)
        return (
            f"backend-diff: not comparing {', '.join(missing)} (not installed): "
            f"pip install {installs}; comparing {', '.join(self.compared()) or 'nothing'}"
        )

    def warmup(self) -> None:
        if self.missing_message():
            sys.stderr.write(self.missing_message() + "\n")
            sys.stderr.flush()
        if not self.available():
            os._exit(2)
        super().warmup()

    def backends(self) -> list[_Backend]:
        if self._backends is None:
            from tokenizers import Tokenizer

            from fuzz.targets._vocab import load_vocab

            raw = load_vocab()
            tok = Tokenizer.from_str(raw.text)
            by_id = {i: b for b, ids in raw.token_bytes().items() for i in ids}
            vocab = _Vocab(raw.size, raw.eos, by_id, lambda s: list(tok.encode(s).ids))
            self._backends = [_ADAPTERS[n](vocab, raw) for n in self.compared()]
        return self._backends

    # -- one input -----------------------------------------------------------------------------

    def execute(self, data: bytes) -> Cost:
        kind, spec = split_input(data)
        if kind not in ("json", "regex") or spec is None:
            raise BackendRejected(f"backend-diff compares json and regex, not {kind}")
        compiled: list[tuple[_Backend, Any]] = []
        for b in self.backends():
            t0 = _cpu()
            try:
                compiled.append((b, b.compile(kind, spec)))
            except BackendRejected:
                continue
            took = _cpu() - t0
            if took > COMPILE_BUDGET_S:
                raise CompileOverBudget(f"{b.name}: {took:.2f} s CPU to compile")
        if len(compiled) < 2:
            raise BackendRejected("fewer than two backends compile it")
        rng = random.Random(data)
        walks = [
            (b.name, _compact(kind, w)) for b, c in compiled if (w := b.walk(c, rng)) is not None
        ]
        checked = 0
        for origin, text in candidates(kind, spec, walks):
            answers = {b.name: b.accepts(c, text) for b, c in compiled}
            checked += 1
            if len(set(answers.values())) > 1:
                _raise_disagreement(kind, spec, origin, text, answers)
        return Cost(steps=checked)

    # -- mutation and payloads -----------------------------------------------------------------

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        kind, spec = split_input(data)
        if kind == "json" and spec is not None and rng.random() < 0.6:
            body = data.partition(b"\n")[2]
            out = b"json\n" + json_mutate(
                body, max_size - 5, rng, fields=_FIELDS, dictionary=self._dictionary
            )
            return out if len(out) <= max_size else data
        return super().mutate(data, max_size, rng)

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        from fuzz.targets.backends_corpus import request_body

        kind, spec = split_input(data)
        body = request_body(kind, spec)
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"), self.endpoint


def _compact(kind: str, text: str) -> str:
    """A generated JSON document re-serialised compactly: the backends' whitespace freedoms
    differ by design (vLLM lets guidance emit any whitespace, outlines one optional space)."""
    if kind != "json":
        return text
    try:
        return _dumps(json.loads(text, parse_constant=_no_constant))
    except (ValueError, RecursionError):
        return text


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # the backends' own threads included
    return r.ru_utime + r.ru_stime


def _raise_disagreement(
    kind: str, spec: Any, origin: str, text: str, answers: dict[str, bool]
) -> None:
    ref = reference(kind, spec, text)
    wrong = [n for n, a in answers.items() if ref is not None and a != ref]
    how = {False: "accepts_invalid", True: "rejects_valid", None: "differs"}[ref]
    detail = {
        "kind": kind,
        "constraint": spec,
        "string": text,
        "origin": origin,
        "answers": answers,
        "reference": ref,
    }
    raise disagreement_type(wrong[0] if wrong else None, how, origin, kind)(
        json.dumps(detail, ensure_ascii=True)
    )
