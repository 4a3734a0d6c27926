"""The guided-decoding check: delegates to :func:`guard.guided.check_structured_outputs` with the
policy's ``limits.guided`` (regexes, JSON schemas, grammars, choice lists, and their estimated
cost on the structured-output backends that may compile them), priced at the vocabulary of the
tokenizer ``limits.tokens.tokenizer`` names unless ``limits.guided.vocab_size`` overrides it. A
pass carries the constraints the upstream will compile (``CheckResult.compiles``), which the
gateway charges to the tenant's compile budget.

Most requests carry no constraint at all. The top-level fields the delegate reads are learnt
once, by running it on an empty body that records every lookup (:func:`_fields_read`); a body
holding none of them gets exactly the delegate's answer on an empty body, a pass, without the
call. If the delegate ever reads the body other than by key (iterating it, say), nothing is
learnt and every body goes through it.

Codes: ``guided_*`` (see :mod:`guard.guided`: its regex, schema, grammar and backends checks).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult, pure_check
from guard.checks._tokens_limits import TokensLimits
from guard.guided import GuidedLimits, check_structured_outputs
from guard.request import RequestView
from guard.tokens import get_counter

__all__ = ["GuidedReads", "check_guided"]


class _Probe(Mapping[str, Any]):
    """An empty mapping that records the keys looked up and whether it was read otherwise."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.opaque = False

    def __getitem__(self, key: str) -> Any:
        self.seen.add(key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return default

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.seen.add(key)
        return False

    def __iter__(self) -> Iterator[str]:
        self.opaque = True
        return iter(())

    def __len__(self) -> int:
        self.opaque = True
        return 0


def _fields_read() -> frozenset[str] | None:
    """The top-level fields the delegate looks up in a body, or None if it reads it otherwise."""
    probe = _Probe()
    try:
        check_structured_outputs(probe, GuidedLimits())
    except Exception:  # pragma: no cover - an empty body passes; if not, learn nothing
        return None
    return None if probe.opaque else frozenset(probe.seen)


_FIELDS = _fields_read()


class GuidedReads(Protocol):
    """The limit sets the guided-decoding check reads."""

    @property
    def guided(self) -> GuidedLimits: ...

    @property
    def tokens(self) -> TokensLimits: ...


@pure_check
def check_guided(view: RequestView, policy: PolicyView[GuidedReads]) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    if _FIELDS is not None and _FIELDS.isdisjoint(body):
        return None
    guided = policy.limits.guided
    vocab = None
    if guided.vocab_size is None and guided.backends:
        vocab = get_counter(policy.limits.tokens.tokenizer).vocabulary_size or None
    compiles = check_structured_outputs(body, guided, vocab=vocab)
    return CheckResult.passed(compiles=compiles) if compiles else None
