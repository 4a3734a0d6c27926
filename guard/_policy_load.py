"""Reading a policy: a YAML file, then ``SCHEDGUARD_*`` environment overrides, then validation.

Every failure becomes one :class:`PolicyError` listing each problem on its own line as
``path: what is wrong``, the path in the YAML's terms (``limits.tokens.max_prompt_tokens``) and,
for a value from the environment, the variable that set it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from guard._policy_models import Policy

ENV_PREFIX = "SCHEDGUARD_"
ENV_SEPARATOR = "__"


class PolicyError(ValueError):
    """The policy is invalid. ``problems`` holds one ``"path: message"`` line per problem."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f" ({source})" if source else ""
        super().__init__(f"invalid policy{where}:\n" + "\n".join(f"  {p}" for p in problems))


# -- YAML ---------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader refusing duplicate mapping keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError([f"not valid YAML: {str(exc)[:500]}"], source) from None


def read_policy_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([f"cannot read the policy file: {exc}"], path) from None
    data = parse_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyError(["the policy must be a YAML mapping"], path)
    return data


# -- environment --------------------------------------------------------------------------------


def apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Apply ``SCHEDGUARD_<SECTION>__<FIELD>...=<YAML value>`` overrides to ``data`` in place.

    Returns the dotted path each variable set, by path (for error messages). A variable whose
    first segment is not a policy section and which has no ``__`` is not a policy override
    (``SCHEDGUARD_POLICY``, say) and is ignored.
    """
    sections = {name: field.alias or name for name, field in Policy.model_fields.items()}
    known = set(sections.values())
    origins: dict[str, str] = {}
    problems: list[str] = []
    for var in sorted(env):
        if not var.upper().startswith(ENV_PREFIX) or var.upper() == ENV_PREFIX:
            continue
        rest = var[len(ENV_PREFIX) :]
        parts = [p.lower() for p in rest.split(ENV_SEPARATOR)]
        if parts[0] not in known and len(parts) == 1:
            continue
        if any(not p for p in parts):
            problems.append(f"{var}: empty path segment (use {ENV_SEPARATOR} between names)")
            continue
        path = ".".join(parts)
        value = parse_yaml(env[var], var) if env[var].strip() else None
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                problems.append(
                    f"{path}: cannot set from {var}: {'.'.join(parts[: i + 1])} is not a mapping"
                )
                break
            node = child
        else:
            node[parts[-1]] = value
            origins[path] = var
    if problems:
        raise PolicyError(problems, "environment")
    return origins


# -- validation messages ------------------------------------------------------------------------


def _loc(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(policy)"


def _number(value: Any) -> Any:
    """``0.0`` as ``0``: bounds read as the policy author wrote them."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    simple = {
        "greater_than": "must be > {gt}",
        "greater_than_equal": "must be >= {ge}",
        "less_than": "must be < {lt}",
        "less_than_equal": "must be <= {le}",
        "extra_forbidden": "unknown field",
        "missing": "required",
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "finite_number": "must be a finite number",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "string_type": "must be a string",
        "tuple_type": "must be a list",
        "model_type": "must be a mapping",
        "dict_type": "must be a mapping",
        "literal_error": "must be one of {expected}",
    }
    template = simple.get(kind)
    if template is not None:
        shown = {k: _number(v) for k, v in ctx.items()}
        try:
            return template.format(**shown)
        except (KeyError, IndexError):
            return template
    msg = error["msg"]
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def validation_problems(exc: ValidationError, origins: Mapping[str, str]) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))
        path = _loc(loc)
        line = f"{path}: {_message(error)}"
        # The variable that set this field or one of its parents.
        for candidate, var in origins.items():
            if (
                path == candidate
                or path.startswith(candidate + ".")
                or path.startswith(candidate + "[")
                or candidate.startswith(path + ".")
            ):
                line += f" (from {var})"
                break
        problems.append(line)
    return problems


def build_policy(data: Mapping[str, Any], origins: Mapping[str, str], source: str | None) -> Policy:
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(validation_problems(exc, origins), source) from None
