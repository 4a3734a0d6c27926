"""Minimising a finding: the smallest input found that still shows it.

Every minimiser takes the input, a predicate ("still the same finding": the oracle of the
target, in-process or live, reports the same cause again), a budget of predicate calls and
seconds (:class:`MinimiseBudget`), and reports :class:`MinimiseStats`; it returns the smallest
input for which the predicate held (the input itself when it never did). Two shapes of input:

- :func:`ddmin`: bytes, Zeller's delta debugging (:mod:`._bytes`): the in-process targets'
  inputs, and a live request that is not JSON;
- :func:`shrink_json`: a JSON document, edited by its structure (:mod:`._json`): a live
  request's body.
"""

from __future__ import annotations

from fuzz.minimize._budget import MinimiseBudget, MinimiseStats
from fuzz.minimize._bytes import ddmin
from fuzz.minimize._json import shrink_json

__all__ = ["MinimiseBudget", "MinimiseStats", "ddmin", "shrink_json"]
