"""The policy reference of docs/POLICY.md, generated from the sections' field descriptions.

A section is a pydantic model or a limit set (a pydantic dataclass, see :mod:`guard._limits`);
both describe their fields with pydantic ``FieldInfo``.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from guard.policy._models import Policy, is_section, section_fields

BEGIN = "<!-- BEGIN GENERATED REFERENCE (python -m guard.policy --markdown) -->"
END = "<!-- END GENERATED REFERENCE -->"


@dataclass(frozen=True)
class FieldDoc:
    path: str
    type: str
    default: str
    description: str
    is_section: bool


def _model_of(annotation: Any) -> tuple[type | None, bool]:
    """The section a field holds, and whether it holds a tuple of them."""
    if is_section(annotation):
        return annotation, False
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if args and is_section(args[0]):
            return args[0], True
    return None, False


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if annotation is type(None):
        return "null"
    if annotation is SecretStr:
        return "string (secret)"
    if isinstance(annotation, type):
        return {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return ""
    if field.is_required():
        return "required"
    value = field.default
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def iter_fields(model: type = Policy, prefix: str = "") -> Iterator[FieldDoc]:
    """Every field of ``model``, depth first, sections before their fields."""
    for name, field in section_fields(model).items():
        path = prefix + (field.alias or name)
        sub, many = _model_of(field.annotation)
        if sub is not None:
            yield FieldDoc(
                path + ("[]" if many else ""),
                f"list of {sub.__name__}" if many else "section",
                "[]" if many else "",
                field.description or "",
                True,
            )
            yield from iter_fields(sub, path + ("[]." if many else "."))
            continue
        yield FieldDoc(
            path, _type_name(field.annotation), _default(field), field.description or "", False
        )


def policy_reference() -> str:
    """The generated reference: a table per section, the top-level fields first."""
    lines = [BEGIN, ""]
    _section(Policy, "", "Top-level fields.", "top level", lines)
    lines.append(END)
    return "\n".join(lines) + "\n"


def _section(model: type, prefix: str, description: str, title: str, lines: list[str]) -> None:
    lines.extend([f"### {title}", "", description, ""])
    rows = []
    subsections = []
    for name, field in section_fields(model).items():
        path = prefix + (field.alias or name)
        sub, many = _model_of(field.annotation)
        if sub is not None:
            subsections.append((sub, path + ("[]." if many else "."), field, path, many))
            continue
        default = _default(field)
        shown = f"`{default}`" if default else ""
        kind = _type_name(field.annotation).replace(" | ", " or ")
        rows.append(f"| `{path}` | {kind} | {shown} | {field.description or ''} |")
    if rows:
        lines.extend(["| field | type | default | meaning |", "|---|---|---|---|", *rows, ""])
    for sub, sub_prefix, field, path, many in subsections:
        heading = f"`{path}[]` (list)" if many else f"`{path}`"
        _section(sub, sub_prefix, field.description or "", heading, lines)


__all__ = ["BEGIN", "END", "FieldDoc", "iter_fields", "policy_reference"]
