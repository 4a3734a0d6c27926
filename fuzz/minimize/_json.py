"""Delta debugging on a JSON document (a live server's findings are request bodies).

Byte-level ddmin (:mod:`._bytes`) would spend its tests on bodies a server cannot even
parse. :func:`shrink_json` edits the structure instead, each edit kept when the predicate still
holds (the live server still shows the same finding):

1. remove object keys and list elements, ddmin-style (all the removable ones at once, then
   halves, quarters ... down to one at a time), top-down so a removed subtree costs one test;
2. replace a container by one of its children (unwraps nesting);
3. shorten strings: collapse repeated runs (``((((a))))`` -> ``((a))``: every run halved at
   once keeps brackets balanced), keep the first or last half, cut the middle out;
4. make numbers 0 or 1.

It stops at ``max_tests`` predicate calls or ``deadline_s`` and returns the smallest document
for which the predicate held (the input itself when none did). Each distinct candidate is
tested once.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from fuzz.minimize._budget import MinimiseBudget, MinimiseStats

__all__ = ["shrink_json"]

_RUN = re.compile(r"(.)\1{7,}", re.DOTALL)
_UNIT = re.compile(r"(.{2,16}?)\1{7,}", re.DOTALL)


class _OutOfBudget(Exception):
    pass


def _key(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False, sort_keys=True, default=str)


def shrink_json(
    doc: Any,
    still_fails: Callable[[Any], bool],
    *,
    max_tests: int = 200,
    deadline_s: float | None = None,
    stats: MinimiseStats | None = None,
    keep: frozenset[str] = frozenset(),
) -> Any:
    """A smaller ``doc`` for which ``still_fails`` holds. ``keep``: top-level keys neither
    removed nor changed (``model``, say)."""
    stats = stats if stats is not None else MinimiseStats()
    budget = MinimiseBudget(max_tests, deadline_s, stats)
    tried: set[str] = {_key(doc)}
    current = [copy.deepcopy(doc)]

    def test(candidate: Any) -> bool:
        k = _key(candidate)
        if k in tried:
            return False
        if budget.spent():
            raise _OutOfBudget
        tried.add(k)
        stats.tests += 1
        if still_fails(candidate):
            current[0] = candidate
            return True
        return False

    try:
        progress = True
        while progress:
            progress = False
            for path in list(_paths(current[0])):
                if _remove_children(current, path, test, keep if not path else frozenset()):
                    progress = True
            for path in list(_paths(current[0])):
                progress |= _unwrap(current, path, test)
            for path in list(_leaves(current[0])):
                if len(path) == 1 and path[0] in keep:
                    continue
                progress |= _simplify_leaf(current, path, test)
        stats.complete = True
    except _OutOfBudget:
        pass
    return current[0]


# ------------------------------------------------------------------------------- traversal


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Containers, top-down (breadth-first)."""
    queue: list[tuple[tuple[Any, ...], Any]] = [(path, doc)]
    while queue:
        p, node = queue.pop(0)
        if isinstance(node, dict):
            yield p
            queue.extend(((*p, k), v) for k, v in node.items())
        elif isinstance(node, list):
            yield p
            queue.extend(((*p, i), v) for i, v in enumerate(node))


def _leaves(doc: Any) -> Iterator[tuple[Any, ...]]:
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        p, node = stack.pop()
        if isinstance(node, dict):
            stack.extend(((*p, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*p, i), v) for i, v in enumerate(node))
        elif isinstance(node, str | int | float) and not isinstance(node, bool):
            yield p


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _exists(doc: Any, path: tuple[Any, ...]) -> bool:
    try:
        _get(doc, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _with(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    _get(out, path[:-1])[path[-1]] = value
    return out


# ---------------------------------------------------------------------------------- steps


def _remove_children(
    current: list[Any], path: tuple[Any, ...], test: Callable[[Any], bool], keep: frozenset[str]
) -> bool:
    """ddmin over the children of the container at ``path``."""
    if not _exists(current[0], path):
        return False
    node = _get(current[0], path)
    if isinstance(node, dict):
        keys: list[Any] = [k for k in node if k not in keep]
    elif isinstance(node, list):
        keys = list(range(len(node)))
    else:
        return False
    if not keys:
        return False
    changed = False
    n = 1  # first try removing all of them
    while keys:
        chunk = max(1, -(-len(keys) // n))
        removed = False
        for start in range(0, len(keys), chunk):
            drop = set(keys[start : start + chunk])
            node = _get(current[0], path)
            if isinstance(node, dict):
                smaller: Any = {k: v for k, v in node.items() if k not in drop}
            else:
                smaller = [v for i, v in enumerate(node) if i not in drop]
            if test(_with(current[0], path, smaller)):
                if isinstance(node, dict):
                    keys = [k for k in keys if k not in drop]
                else:  # indices shift: renumber what is left
                    keys = list(range(len(smaller)))
                changed = removed = True
                n = max(n - 1, 1)
                break
        if removed:
            continue
        if chunk == 1:
            break
        n = min(len(keys), n * 2)
    return changed


def _unwrap(current: list[Any], path: tuple[Any, ...], test: Callable[[Any], bool]) -> bool:
    """Replace the container at ``path`` by its only (or first) child."""
    if not path or not _exists(current[0], path):
        return False
    node = _get(current[0], path)
    children = list(node.values()) if isinstance(node, dict) else node
    if not isinstance(children, list) or not children:
        return False
    child = children[0]
    if not isinstance(child, dict | list):
        return False
    return test(_with(current[0], path, child))


def _string_candidates(s: str) -> Iterator[str]:
    if len(s) >= 16:
        for pattern in (_RUN, _UNIT):
            if pattern.search(s):

                def halve(m: re.Match[str]) -> str:
                    unit = m.group(1)
                    reps = len(m.group(0)) // len(unit)
                    return unit * max(1, reps // 2)

                yield pattern.sub(halve, s)
    if len(s) > 1:
        half = len(s) // 2
        yield s[:half]
        yield s[half:]
        q = len(s) // 4
        if q:
            yield s[:q] + s[len(s) - q :]
    if s:
        yield ""


def _simplify_leaf(current: list[Any], path: tuple[Any, ...], test: Callable[[Any], bool]) -> bool:
    changed = False
    while _exists(current[0], path):
        value = _get(current[0], path)
        if isinstance(value, str):
            candidates: list[Any] = list(_string_candidates(value))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            candidates = [v for v in (0, 1) if v != value]
            if isinstance(value, int) and abs(value) > 2:
                candidates.append(value // 2)
        else:
            return changed
        for cand in candidates:
            if test(_with(current[0], path, cand)):
                changed = True
                break
        else:
            return changed
    return changed
