"""The structured-output backends vLLM 0.32 may compile a constraint with (outlines-core,
xgrammar, llguidance): which one a request reaches (:mod:`._routing`) and a static estimate of
what compiling it costs there (:mod:`._cost`), refused over the policy's budgets.
"""

from __future__ import annotations

from guard.guided.backends._cost import (
    Estimate,
    guidance_cost,
    outlines_cost,
    trie_size,
    xgrammar_cost,
)
from guard.guided.backends._routing import (
    BACKEND_COST_CODE,
    CEILING_VOCAB,
    check_backend_costs,
    check_constraint,
    constraints,
    fmt_path,
    reachable_backends,
    route_auto,
)

__all__ = [
    "BACKEND_COST_CODE",
    "CEILING_VOCAB",
    "Estimate",
    "check_backend_costs",
    "check_constraint",
    "constraints",
    "fmt_path",
    "guidance_cost",
    "outlines_cost",
    "reachable_backends",
    "route_auto",
    "trie_size",
    "xgrammar_cost",
]
