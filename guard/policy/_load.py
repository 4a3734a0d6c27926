"""Reading a policy: a YAML file, then ``SCHEDGUARD_*`` environment overrides, then validation.

Every failure becomes one :class:`PolicyError` listing each problem on its own line as
``path: what is wrong``, the path in the YAML's terms (``limits.tokens.max_prompt_tokens``) and,
for a value from the environment, the variable that set it.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from guard.errors import PolicyError
from guard.policy._env import apply_env
from guard.policy._models import Policy, is_section, model_dump_for, section_fields
from guard.prompt import check_chat_template_source
from guard.tokens import get_counter

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
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
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
        raise PolicyError([yaml_problem(exc, source)], source) from None


def yaml_problem(exc: yaml.YAMLError, source: str) -> str:
    """One line for a YAML error: where (``source``, line and column, counted from 1), what
    the parser expected, and where the construct it was reading began. PyYAML's own text names
    ``"<unicode string>"`` and spreads over several lines."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"not valid YAML in {source}: {str(exc)[:300]}"
    mark = exc.problem_mark or exc.context_mark
    where = source if mark is None else f"{source}, line {mark.line + 1}, column {mark.column + 1}"
    what = exc.problem or exc.context or "not valid YAML"
    context = exc.context_mark
    if exc.problem and exc.context and context is not None and context is not mark:
        what += f" ({exc.context} from line {context.line + 1}, column {context.column + 1})"
    return f"not valid YAML: {where}: {what[:300]}"


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


# -- validation messages ------------------------------------------------------------------------


# The error types of an unknown field: in a model, in a limit set (a pydantic dataclass).
_UNKNOWN_FIELD = frozenset({"extra_forbidden", "unexpected_keyword_argument"})


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
        "unexpected_keyword_argument": "unknown field",
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
        "dataclass_type": "must be a mapping",
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


def _model_in(annotation: Any) -> type | None:
    """The section class an annotation holds (``X``, ``X | None``, ``tuple[X, ...]``), if any."""
    if is_section(annotation):
        return annotation
    if typing.get_origin(annotation) in (
        typing.Union,
        types.UnionType,
        tuple,
        list,
        typing.Annotated,
    ):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """The field names (as written in YAML) of the section at ``loc``; [] when not a section."""
    model: type | None = Policy
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue  # an index into a list of sections
        fields = section_fields(model).items()
        field = next((f for name, f in fields if part in (name, f.alias)), None)
        model = _model_in(field.annotation) if field is not None else None
    if model is None:
        return []
    return [f.alias or name for name, f in section_fields(model).items()]


def suggest_field(loc: tuple[str | int, ...]) -> str | None:
    """The known field closest to the unknown one at ``loc`` (a misspelling), or None."""
    if not loc or not isinstance(loc[-1], str):
        return None
    close = difflib.get_close_matches(loc[-1].lower(), _fields_at(loc[:-1]), n=1, cutoff=0.6)
    return close[0] if close else None


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
        suggestion = suggest_field(loc) if error["type"] in _UNKNOWN_FIELD else None
        if suggestion is not None:
            line += f"; did you mean {suggestion}?"
        problems.append(line)
    return problems


def build_policy(data: Mapping[str, Any], origins: Mapping[str, str], source: str | None) -> Policy:
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(validation_problems(exc, origins), source) from None


# -- entry points -----------------------------------------------------------------------------


def load_policy(path: str | None = None, env: Mapping[str, str] = os.environ) -> Policy:
    """The effective policy: ``path``'s YAML (defaults when ``None``), then ``env``'s
    ``SCHEDGUARD_*`` overrides; validated, with the tokenizer loaded once to prove it exists.

    Raises :class:`PolicyError` listing every problem found.
    """
    data = read_policy_file(path) if path is not None else {}
    origins = apply_env(data, env, parse_yaml)
    policy = build_policy(data, origins, path)
    _check_tokenizer(policy, origins, path)
    return policy


def policy_from_yaml(text: str, env: Mapping[str, str] | None = None) -> Policy:
    """A policy from YAML text (and optional environment overrides); for tests and tools."""
    data = parse_yaml(text, "<yaml>")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(["the policy must be a YAML mapping"], "<yaml>")
    origins = apply_env(data, env or {}, parse_yaml)
    policy = build_policy(data, origins, "<yaml>")
    _check_tokenizer(policy, origins, "<yaml>")
    return policy


def default_policy() -> Policy:
    """The defaults, ignoring the environment."""
    return _DEFAULT


_DEFAULT = Policy()


def _check_tokenizer(policy: Policy, origins: Mapping[str, str], source: str | None) -> None:
    tokens = policy.limits.tokens
    sandbox = policy.limits.templates.chat_template
    for name, spec, load in (
        ("tokenizer", tokens.tokenizer, lambda: get_counter(tokens.tokenizer)),
        (
            "chat_template",
            tokens.chat_template,
            lambda: check_chat_template_source(tokens.chat_template, tokens.tokenizer, sandbox),
        ),
    ):
        try:
            load()
        except Exception as exc:
            var = origins.get(f"limits.tokens.{name}")
            where = f" (from {var})" if var else ""
            raise PolicyError(
                [f"limits.tokens.{name}: cannot load {str(spec)[:200]!r}: {str(exc)[:300]}{where}"],
                source,
            ) from None


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def policy_to_yaml(policy: Policy, *, reveal_secrets: bool = False) -> str:
    """The policy as YAML, every field present, in the models' order.

    API keys appear as ``key_sha256`` (loadable again) and a Redis password as ``***`` unless
    ``reveal_secrets``.
    """
    data: dict[str, Any] = model_dump_for(policy)
    keys = []
    for entry, dumped in zip(policy.keys, data["keys"], strict=True):
        if reveal_secrets and entry.key is not None:
            dumped["key"] = entry.key.get_secret_value()
            dumped.pop("key_sha256", None)
        else:
            dumped.pop("key", None)
            dumped["key_sha256"] = entry.digest
        # Only the overrides actually set, so that the output loads back to the same policy.
        dumped["rate"] = {k: dumped["rate"][k] for k in entry.rate.model_fields_set}
        keys.append({k: dumped[k] for k in ("key", "key_sha256", "tenant", "rate") if k in dumped})
    data["keys"] = keys
    redis_url = data["rate"].get("redis_url")
    if redis_url and not reveal_secrets:
        data["rate"]["redis_url"] = _redact_url(redis_url)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
