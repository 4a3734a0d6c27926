"""``SCHEDGUARD_*`` environment variables: policy overrides, and the few that are not.

A policy override is ``SCHEDGUARD_`` + a field's path, segments joined by ``__``
(``SCHEDGUARD_LIMITS__FANOUT__MAX_N=4``); its value is YAML. Any other ``SCHEDGUARD_*`` name is
one of :data:`OTHER_VARIABLES` (the policy file's path, the test and fuzz switches) or a
mistake: an unknown name is an error naming the closest valid one, never silently ignored. A
guard that ignored ``SCHEDGUARD_UPSTREAM_URL`` (one underscore) would serve its embedded
reference model to real clients.
"""

from __future__ import annotations

import difflib
import functools
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from guard.errors import PolicyError
from guard.policy._models import Policy, is_section, section_fields

ENV_PREFIX = "SCHEDGUARD_"
ENV_SEPARATOR = "__"

# The SCHEDGUARD_* variables that are not policy overrides, and what reads each.
OTHER_VARIABLES: Mapping[str, str] = {
    "SCHEDGUARD_POLICY": "the policy file the guard loads (schedguard serve --policy)",
    "SCHEDGUARD_UPSTREAMS_DIR": "where scripts/upstreams keeps the real test upstreams",
    "SCHEDGUARD_UPSTREAMS_PYTHON": "the Python scripts/upstreams builds their venvs with",
    "SCHEDGUARD_E2E": "1: run tests/e2e",
    "SCHEDGUARD_E2E_REQUIRED": "1: a missing upstream fails tests/e2e instead of skipping",
    "SCHEDGUARD_BACKENDS_VOCAB": "the vocabulary size of the guided-backend fuzz targets",
    "SCHEDGUARD_BACKENDS_TOKENIZER": "the tokenizer.json of the guided-backend fuzz targets",
    "SCHEDGUARD_BACKENDS_POLICY": "auto: the guided-backend fuzz targets judge with auto",
    "SCHEDGUARD_FUZZ_VULNERABLE": "1: ClusterFuzzLite builds the vulnerable targets too",
    "SCHEDGUARD_ATHERIS_EVENTS": "where an atheris worker reports its events",
}


def _field_paths(model: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every path a variable may set: each field of the policy, sections and their fields."""
    for name, field in section_fields(model).items():
        path = (*prefix, field.alias or name)
        yield path
        section = _section_in(field.annotation)
        if section is not None:
            yield from _field_paths(section, path)


def _section_in(annotation: Any) -> type | None:
    """The section an annotation holds as a value (``X``, ``X | None``), if any; a list of
    sections (``keys``) is set whole."""
    if is_section(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if is_section(arg):
                return arg
    return None


def variable_for(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + ENV_SEPARATOR.join(part.upper() for part in path)


@functools.cache
def policy_variables() -> dict[str, tuple[str, ...]]:
    """Every valid policy override variable and the field path it sets."""
    return {variable_for(path): path for path in _field_paths(Policy)}


def _squashed(name: str) -> str:
    return name.upper().replace("_", "")


def suggest_variable(name: str) -> str | None:
    """The valid variable closest to ``name``: the one it spells with other underscores
    (``SCHEDGUARD_UPSTREAM_URL`` for ``SCHEDGUARD_UPSTREAM__URL``), else the nearest by
    spelling."""
    known = [*policy_variables(), *OTHER_VARIABLES]
    squashed = _squashed(name)
    for candidate in known:
        if _squashed(candidate) == squashed:
            return candidate
    # Compared without the prefix they all share, which would make any two names look close.
    rest = {candidate[len(ENV_PREFIX) :]: candidate for candidate in known}
    close = difflib.get_close_matches(name.upper()[len(ENV_PREFIX) :], rest, n=1, cutoff=0.6)
    return rest[close[0]] if close else None


def _unknown(var: str) -> str:
    suggestion = suggest_variable(var)
    hint = f"; did you mean {suggestion}?" if suggestion else ""
    return (
        f"{var}: not a variable schedguard reads (policy overrides are SCHEDGUARD_ + the "
        f"field's path joined by {ENV_SEPARATOR}){hint}"
    )


def apply_env(
    data: dict[str, Any], env: Mapping[str, str], parse: Any, source: str = "environment"
) -> dict[str, str]:
    """Apply ``SCHEDGUARD_<SECTION>__<FIELD>...=<YAML value>`` overrides to ``data`` in place.

    Returns the dotted path each variable set, by path (for error messages). Raises
    :class:`PolicyError` naming every variable that is neither a policy field's nor one of
    :data:`OTHER_VARIABLES`, with the closest valid name. ``parse(text, var)`` reads a value.
    """
    variables = policy_variables()
    origins: dict[str, str] = {}
    problems: list[str] = []
    for var in sorted(env):
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX) or upper in OTHER_VARIABLES:
            continue
        path = variables.get(upper)
        if path is None:
            problems.append(_unknown(var))
            continue
        value = parse(env[var], var) if env[var].strip() else None
        node: Any = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                problems.append(
                    f"{'.'.join(path)}: cannot set from {var}: {'.'.join(path[: i + 1])} is "
                    "not a mapping"
                )
                break
            node = child
        else:
            node[path[-1]] = value
            origins[".".join(path)] = var
    if problems:
        raise PolicyError(problems, source)
    return origins
