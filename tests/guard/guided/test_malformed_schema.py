"""A schema xgrammar refuses for its form (guard.guided.schema._malformed), and the route vLLM's
``auto`` gives it: with patternProperties anywhere, outlines (docs/findings/
vllm-outlines-schema-regex-abort.yaml), which the default policy refuses.

TABLE is what xgrammar 0.2.8's ``Grammar.from_json_schema`` did with each schema (measured on
2026-12-07 in the upstream scripts' vLLM venv); where that venv is set up, the test measures it
again, so the table cannot drift from the library it describes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fuzz.targets._upstream_venv import upstreams_root
from guard.guided.backends import route_auto
from guard.guided.schema import xgrammar_refuses_form
from guard.pipeline import check_body
from guard.policy import policy_from_yaml

_PP = {"^x": {"type": "string"}}

# (schema, xgrammar refuses it)
TABLE: list[tuple[Any, bool]] = [
    ({"type": "objectobject"}, True),
    ({"type": 5}, True),
    ({"type": ["string", "bogus"]}, True),
    ({"type": []}, False),
    ({"type": ["null"]}, False),
    ({"items": {"type": "bogus"}}, True),
    ({"type": "object", "properties": 5}, True),
    ({"properties": {"a": 5}}, True),
    ({"properties": {"a": True}}, False),
    ({"properties": {"a": False}}, True),
    ({"properties": {"type": {"type": "string"}}}, False),  # a property named "type"
    ({"type": "object", "patternProperties": {"^x": 5}}, True),
    ({"type": "object", "required": "a"}, True),
    ({"type": "object", "required": [5]}, True),
    ({"type": "array", "items": 5}, True),
    ({"items": [{"type": "string"}]}, True),
    ({"type": "array", "prefixItems": 5}, True),
    ({"type": "array", "minItems": "3"}, True),
    ({"type": "array", "minItems": 5, "maxItems": 2}, True),
    ({"type": "string", "minLength": 5, "maxLength": 2}, True),
    ({"type": "string", "minLength": 1.0}, True),
    ({"type": "string", "maxLength": True}, True),
    ({"type": "object", "minProperties": 3, "maxProperties": 1}, True),
    ({"type": "integer", "minimum": 2, "maximum": 2}, False),
    ({"type": "integer", "minimum": 5, "maximum": 2}, True),
    ({"type": "integer", "exclusiveMinimum": 5, "maximum": 2}, True),
    ({"type": "integer", "minimum": True}, True),
    ({"type": "integer", "minimum": 1.5}, True),
    ({"type": "number", "exclusiveMaximum": "x"}, True),
    ({"type": "integer", "multipleOf": "x"}, True),
    ({"enum": 5}, True),
    ({"enum": []}, True),
    ({"enum": ["a", 1]}, False),
    ({"anyOf": []}, False),
    ({"anyOf": 5}, True),
    ({"anyOf": [5]}, True),
    ({"anyOf": [True]}, False),
    ({"oneOf": 5}, True),
    ({"allOf": 5}, True),
    ({"type": "string", "pattern": 5}, True),
    ({"type": "string", "format": 5}, True),
    ({"type": "object", "additionalProperties": 5}, True),
    ({"type": "object", "unevaluatedProperties": 5}, True),
    ({"type": "array", "unevaluatedItems": 5}, True),
    ({"type": "object", "propertyNames": 5}, True),
    ({"$ref": "#/$defs/missing"}, True),
    ({"$ref": "#"}, False),
    ({"$defs": {"a": {"type": "bogus"}}, "$ref": "#/$defs/a"}, True),  # through a reference
    (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"$ref": "#/properties/a"},
        },
        False,
    ),
    # What xgrammar does not read is not judged.
    ({"$defs": 5}, False),
    ({"$defs": {"a": 5}}, False),
    ({"type": "array", "contains": 5}, False),
    ({"not": 5}, False),
    ({"title": 5, "description": 6}, False),
    ({"default": {"type": "bogus"}}, False),
    ({"type": "string", "format": "bogus"}, False),  # a format: vLLM's own check, not form
    ({"type": "array", "items": {"type": "string"}, "minItems": -1}, False),
    ({"required": ["a"], "properties": 5}, True),
]


@pytest.mark.parametrize(("schema", "refused"), TABLE, ids=[json.dumps(s)[:60] for s, _ in TABLE])
def test_the_form_xgrammar_refuses(schema: Any, refused: bool) -> None:
    assert xgrammar_refuses_form(schema) is refused


def _nest(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    for _ in range(depth):
        leaf = {"type": "array", "items": leaf}
    return leaf


@pytest.mark.parametrize(
    ("schema", "route"),
    [
        # patternProperties and a form xgrammar refuses: outlines (the finding's shape) ...
        (_nest(18, {"type": "objectobject", "properties": {"a": {}}, "patternProperties": _PP}), "outlines"),
        (_nest(3, {"type": 5, "patternProperties": _PP}), "outlines"),
        ({**_nest(2, {"type": "object", "patternProperties": _PP}), "minItems": 3, "maxItems": 1}, "outlines"),
        # ... well-formed, xgrammar takes it; without patternProperties the form is guidance's
        # to refuse (bounded whatever the route), so the route stays xgrammar's.
        (_nest(3, {"type": ["object", "null"], "patternProperties": _PP}), "xgrammar"),
        (_nest(3, {"type": "objectobject"}), "xgrammar"),
    ],
)  # fmt: skip
def test_auto_sends_a_malformed_schema_with_pattern_properties_to_outlines(
    schema: Any, route: str
) -> None:
    assert route_auto("json", schema) == route


def _chat(schema: Any) -> bytes:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}},
    }
    return json.dumps(body).encode()


def test_the_findings_request_is_refused_naming_outlines_and_its_look_alike_served() -> None:
    policy = policy_from_yaml("{}")
    leaf = {"type": "objectobject", "properties": {"a": {}}, "patternProperties": {"^x": {}}}
    verdict = check_body(_chat(_nest(18, leaf)), "/v1/chat/completions", [], None, policy)
    assert verdict.rejection is not None
    assert verdict.rejection.code == "guided_backend_cost_exceeded"
    assert "outlines" in verdict.rejection.message
    look_alike = dict(leaf, type="object", properties={"a": {"type": "string"}})
    look_alike.pop("properties")
    verdict = check_body(_chat(_nest(18, look_alike)), "/v1/chat/completions", [], None, policy)
    assert verdict.allowed


def _vllm_python() -> Path | None:
    python = upstreams_root() / "vllm" / "venv" / "bin" / "python"
    return python if python.is_file() else None


_PROBE = """
import json, sys
import xgrammar as xgr
out = []
for schema in json.load(sys.stdin):
    try:
        xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        out.append(False)
    except Exception:
        out.append(True)
print(json.dumps(out))
"""


def test_the_table_is_what_the_installed_xgrammar_does() -> None:
    python = _vllm_python()
    if python is None:
        pytest.skip("vLLM (and its xgrammar) is not set up (scripts/upstreams/upstreams.py)")
    run = subprocess.run(
        [str(python), "-c", _PROBE],
        input=json.dumps([schema for schema, _ in TABLE]),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    differ = [s for (s, refused), got in zip(TABLE, measured, strict=True) if refused is not got]
    assert not differ, differ
