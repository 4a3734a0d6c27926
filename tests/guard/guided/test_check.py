"""Guided-decoding checks: every code, the THREATS.md attack variants, benign look-alikes.

Attack payloads run through ``guard.isolation.run_limited`` (a child under RLIMIT_AS and a wall
clock), as every attack payload must; benign inputs and the small property-based inputs run
in-process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import GuardError, LimitExceeded, RegexRejected
from guard.guided import GuidedLimits, check_guided_decoding
from guard.guided.regex import scan_regex
from guard.isolation import preload, run_limited
from tests._support import bytecodes

preload("guard.guided")

LIMITS = GuidedLimits()


def code_of(body: dict[str, Any], limits: GuidedLimits = LIMITS) -> str | None:
    """In-process verdict: None when allowed, else the error code."""
    try:
        check_guided_decoding(body, limits)
    except GuardError as e:
        return e.code
    return None


def isolated_code(body: dict[str, Any], limits: GuidedLimits = LIMITS) -> str | None:
    """Verdict computed in a memory- and time-capped child; it must come back quickly."""
    result = run_limited(
        check_guided_decoding, body, limits, mem_limit_bytes=512 << 20, timeout_s=10.0
    )
    assert result.outcome in ("ok", "error"), result
    assert result.wall_s < 5.0
    if result.outcome == "ok":
        return None
    assert result.error_type in ("GuardError", "LimitExceeded"), result
    return result.error_code


def check_built(builder: str, arg: int, wrap: str, limits: GuidedLimits) -> None:
    """Child side: build a deep payload here, since pickling it would recurse."""
    schema = globals()[builder](arg)
    check_guided_decoding(WRAPPERS[wrap](schema), limits)


def isolated_built_code(builder: str, arg: int, wrap: str = "response_format") -> str | None:
    result = run_limited(
        check_built, builder, arg, wrap, LIMITS, mem_limit_bytes=512 << 20, timeout_s=20.0
    )
    assert result.outcome in ("ok", "error"), result
    return None if result.outcome == "ok" else result.error_code


def error_of(body: dict[str, Any], limits: GuidedLimits = LIMITS) -> GuardError:
    with pytest.raises(GuardError) as info:
        check_guided_decoding(body, limits)
    return info.value


def schema_body(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    }


def pattern_schema(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}


def tool_body(parameters: Any) -> dict[str, Any]:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]}


def nested_objects(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


def nested_arrays(depth: int) -> dict[str, Any]:
    items: Any = []
    for _ in range(depth):
        items = [items]
    return {"type": "array", "items": {"type": "array", "default": items}}


WRAPPERS = {
    "response_format": schema_body,
    "guided_json": lambda s: {"guided_json": s},
    "guided_json_text": lambda s: {"guided_json": json.dumps(s)},
    "tool": tool_body,
}


# ---- regexes ---------------------------------------------------------------------------------

ATTACK_REGEXES = [
    ("(a+)+b", "guided_regex_unsafe"),
    ("(a*)*b", "guided_regex_unsafe"),
    ("(a|a)*", "guided_regex_unsafe"),
    ("(a|aa)*c", "guided_regex_unsafe"),
    ("(.*a){20}", "guided_regex_unsafe"),
    ("(\\w+\\s?)+$", "guided_regex_unsafe"),
    ("^(\\d+|\\w+)+$", "guided_regex_unsafe"),
    ("(x+x+)+y", "guided_regex_unsafe"),
    ("(b*b*a)*", "guided_regex_unsafe"),
    ("((a|a){4}){5}", "guided_regex_unsafe"),
    ("(a()?)+", "guided_regex_unsafe"),
    ("(()?)*", "guided_regex_unsafe"),
    (".*.*.*.*.*=", "guided_regex_unsafe"),
    ("a{100}{100}{100}", "guided_regex_unsafe"),
    ("a{1000}{1000}", "guided_regex_unsafe"),
    ("(a{50}){50}", "guided_regex_unsafe"),
    ("((a{10}){10}){11}", "guided_regex_unsafe"),
    ("\\pL{100}", "guided_regex_unsafe"),  # ~120k RE2 instructions, refused before compiling
    ("(" * 40 + "a" + ")" * 40, "guided_regex_unsafe"),
    ("(" * 60000 + "a" + ")" * 60000, "guided_regex_too_long"),
    ("a" * 5000, "guided_regex_too_long"),
    ("(?=a)b", "guided_regex_invalid"),  # RE2 refuses lookaround
    ("(a)\\1", "guided_regex_invalid"),  # and backreferences
    ("a{1001}", "guided_regex_unsafe"),
    ("x{2,1}", "guided_regex_invalid"),
    ("(abc", "guided_regex_invalid"),
    ("abc)", "guided_regex_invalid"),
    ("[abc", "guided_regex_invalid"),
    ("*a", "guided_regex_invalid"),
    ("[]a]", "guided_regex_invalid"),  # JavaScript reads an empty class, RE2 a literal ]
    ("\\Q((\\E", "guided_regex_invalid"),
    ("\\x{41}{1000}", "guided_regex_invalid"),
    ("\ud800", "guided_regex_invalid"),  # a lone surrogate (possible after JSON decoding)
]

BENIGN_REGEXES = [
    "[a-z]+@[a-z]+\\.com",
    "\\d{3}-\\d{4}",
    "(ab)+",
    "(a|b)*c",
    "^[A-Z][a-z]{1,20}$",
    "^[a-zA-Z0-9._%+-]+@([a-zA-Z0-9-]+\\.)+[a-zA-Z]{2,}$",
    "^((25[0-5]|2[0-4]\\d|[01]?\\d\\d?)\\.){3}(25[0-5]|2[0-4]\\d|[01]?\\d\\d?)$",
    "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d+)?(Z|[+-]\\d{2}:\\d{2})$",
    "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "^(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)(?:-((?:0|[1-9]\\d*|\\d*[a-zA-Z-][0-9a-zA-Z-]*)"
    "(?:\\.(?:0|[1-9]\\d*|\\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\\+([0-9a-zA-Z-]+(?:\\.[0-9a-zA-Z-]+)*))?$",
    "^https?://[^\\s/$.?#].[^\\s]*$",
    "^\\+?[1-9]\\d{1,14}$",
    "^\\$?\\d{1,3}(,\\d{3})*(\\.\\d{2})?$",
    "^[a-z0-9]+(?:-[a-z0-9]+)*$",
    "^\\w+(\\s\\w+)*$",
    "^(\\d+,)*\\d+$",
    "^.*foo.*bar.*$",
    "^[\\u4e00-\\u9fa5]+$",  # ECMA \\u escapes, translated for RE2
    "(?i)^(red|green|blue)$",
    "^(?P<user>[a-z]+)@(?P<host>[a-z.]+)$",
    "^P(\\d+Y)?(\\d+M)?(\\d+D)?(T(\\d+H)?(\\d+M)?(\\d+S)?)?$",
    ".{1000}",
    "",
]


@pytest.mark.parametrize(("pattern", "code"), ATTACK_REGEXES)
def test_attack_regex_refused(pattern: str, code: str) -> None:
    assert isolated_code({"guided_regex": pattern}) == code


@pytest.mark.parametrize(
    ("pattern", "code"),
    [
        ("(a+)+b", "guided_regex_unsafe"),
        ("(a|aa)*c", "guided_regex_unsafe"),
        ("a{100}{100}{100}", "guided_regex_unsafe"),
        ("(?<=a)b", "guided_regex_invalid"),
    ],
)
def test_attack_regex_in_every_field(pattern: str, code: str) -> None:
    bodies: list[tuple[dict[str, Any], str]] = [
        ({"structured_outputs": {"regex": pattern}}, "structured_outputs.regex"),
        ({"regex": pattern}, "regex"),
        ({"guided_whitespace_pattern": pattern}, "guided_whitespace_pattern"),
        (
            schema_body(pattern_schema(pattern)),
            "response_format.json_schema.schema.properties.x.pattern",
        ),
        ({"guided_json": pattern_schema(pattern)}, "guided_json.properties.x.pattern"),
        (
            {"structured_outputs": {"json": pattern_schema(pattern)}},
            "structured_outputs.json.properties.x.pattern",
        ),
        (
            tool_body(pattern_schema(pattern)),
            "tools[0].function.parameters.properties.x.pattern",
        ),
        (
            {"guided_json": {"type": "object", "patternProperties": {pattern: {}}}},
            "guided_json.patternProperties",
        ),
        ({"grammar": {"type": "regex", "value": pattern}}, "grammar.value"),
    ]
    for body, param in bodies:
        err = error_of(body)
        assert err.code == code, param
        assert err.param is not None and err.param.startswith(param), (err.param, param)


@pytest.mark.parametrize("pattern", BENIGN_REGEXES)
def test_benign_regex_allowed(pattern: str) -> None:
    assert code_of({"guided_regex": pattern}) is None
    assert code_of(schema_body(pattern_schema(pattern))) is None


def test_regex_must_be_a_string() -> None:
    assert code_of({"guided_regex": 42}) == "guided_regex_invalid"
    assert code_of({"guided_json": {"type": "string", "pattern": ["a"]}}) == "guided_regex_invalid"


def test_regex_errors_never_echo_the_pattern() -> None:
    marker = "ZZMARKERZZ"
    for pattern in (f"({marker}+)+", f"({marker}", marker * 300, f"(?={marker})"):
        err = error_of({"guided_regex": pattern})
        assert marker not in err.message
        body = err.to_body()
        assert marker not in json.dumps(body)


def test_long_property_names_are_cut_in_param() -> None:
    name = "k" * 10_000
    err = error_of({"guided_json": {"properties": {name: {"pattern": "(a+)+"}}}})
    assert err.param is not None and len(err.param) <= 300
    assert "k" * 41 not in err.param


def test_per_request_regex_budgets() -> None:
    many = {"type": "object", "properties": {f"p{i}": {"pattern": "[a-z]+"} for i in range(200)}}
    assert code_of({"guided_json": many}) == "guided_regex_unsafe"  # more than 128 regexes
    limits = GuidedLimits(max_regex_total_length=100)
    long_ok = {"type": "object", "properties": {f"p{i}": {"pattern": "a" * 60} for i in range(2)}}
    assert code_of({"guided_json": long_ok}, limits) == "guided_regex_too_long"
    heavy = {"type": "object", "properties": {f"p{i}": {"pattern": ".{1000}"} for i in range(10)}}
    assert code_of({"guided_json": heavy}) == "guided_regex_unsafe"  # 50k instructions in all


def test_ambiguity_threshold_is_a_limit() -> None:
    ipv4 = "^((25[0-5]|2[0-4]\\d|[01]?\\d\\d?)\\.){3}(25[0-5]|2[0-4]\\d|[01]?\\d\\d?)$"
    assert code_of({"guided_regex": ipv4}) is None
    assert code_of({"guided_regex": ipv4}, GuidedLimits(max_regex_ambiguous_ways=8)) == (
        "guided_regex_unsafe"
    )


def test_program_size_estimate_bounds_re2() -> None:
    """The scan's estimate is an upper bound of RE2's program size on typical patterns, so a
    pattern refused by RE2's size is normally refused (cheaply) before compiling."""
    from guard.guided.regex import re2_program_size

    for pattern in [*BENIGN_REGEXES, "\\pL+", "[^a]{50}", "\\W\\S\\D", "(?i)[a-z]{40}", "é{30}"]:
        est = scan_regex(pattern, LIMITS).est_program_size
        actual = re2_program_size(pattern, max_mem=8 << 20, max_program_size=1 << 30)
        assert est >= actual, (pattern, est, actual)


# ---- JSON schemas ----------------------------------------------------------------------------


def _ref_laughs(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {"l0": {"type": "string"}}
    for i in range(1, levels):
        ref = {"$ref": f"#/$defs/l{i - 1}"}
        defs[f"l{i}"] = {"type": "array", "prefixItems": [ref, ref, ref]}
    return {"$defs": defs, "$ref": f"#/$defs/l{levels - 1}"}


def _ref_chain_depth(links: int, depth: int) -> dict[str, Any]:
    """Each definition is ``depth`` levels deep and refers to the next one at its bottom."""
    defs: dict[str, Any] = {}
    for i in range(links):
        leaf: dict[str, Any] = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < links else {}
        node = leaf
        for _ in range(depth):
            node = {"type": "array", "items": node}
        defs[f"d{i}"] = node
    return {"$defs": defs, "$ref": "#/$defs/d0"}


RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}


@pytest.mark.parametrize(
    ("builder", "depth", "wrap"),
    [
        ("nested_objects", 1000, "response_format"),
        ("nested_objects", 1000, "tool"),
        ("nested_objects", 100_000, "guided_json"),
        ("nested_arrays", 5000, "guided_json"),
        ("nested_objects", 400, "guided_json_text"),  # 800 levels, parsed from a string
    ],
)
def test_deeply_nested_schemas_refused(builder: str, depth: int, wrap: str) -> None:
    assert isolated_built_code(builder, depth, wrap) == "guided_schema_too_deep"


ATTACK_SCHEMAS = [
    (nested_objects(100), "guided_schema_too_deep"),
    ({"allOf": [{"allOf": [{"not": {"not": nested_objects(40)}}]}]}, "guided_schema_too_deep"),
    (_ref_chain_depth(10, 10), "guided_schema_too_deep"),  # 100 levels once expanded
    (_ref_laughs(12), "guided_schema_too_large"),  # 3**11 copies once expanded
    ({"enum": list(range(100_000))}, "guided_schema_too_large"),
    ({"type": "string", "maxLength": 10**9}, "guided_schema_too_large"),
    ({"type": "string", "minLength": 10**6}, "guided_schema_too_large"),
    ({"type": "array", "minItems": 10**6}, "guided_schema_too_large"),
    ({"type": "object", "maxProperties": 10**7}, "guided_schema_too_large"),
    ({"type": "integer", "minimum": -(10**300)}, "guided_schema_too_large"),
    ({"type": "number", "maximum": 1e300}, "guided_schema_too_large"),
    (
        {"type": "object", "properties": {f"p{i}": {} for i in range(20_000)}},
        "guided_schema_too_large",
    ),
    ({"description": "x" * 300_000}, "guided_schema_too_large"),
    ({"$ref": "https://attacker.example/schema.json"}, "guided_schema_invalid"),
    ({"$ref": "other.json#/a"}, "guided_schema_invalid"),
    ({"$ref": "#anchor"}, "guided_schema_invalid"),
    ({"$ref": "#/$defs/missing"}, "guided_schema_invalid"),
    ({"properties": {"a": {}}, "$ref": "#/properties"}, "guided_schema_invalid"),
    ({"enum": [{"a": 1}], "items": {"$ref": "#/enum/0"}}, "guided_schema_invalid"),
    ({"$ref": 5}, "guided_schema_invalid"),
    ({"properties": "x"}, "guided_schema_invalid"),
    ({"properties": {"a": 5}}, "guided_schema_invalid"),
    ({"anyOf": {"type": "string"}}, "guided_schema_invalid"),
    ({"items": 3}, "guided_schema_invalid"),
    ({"type": "string", "maxLength": "10"}, "guided_schema_invalid"),
    ({"type": "string", "maxLength": -1}, "guided_schema_invalid"),
    ({"type": "string", "maxLength": 2.5}, "guided_schema_invalid"),
    ({"type": "number", "multipleOf": 0}, "guided_schema_invalid"),
    ({"enum": "abc"}, "guided_schema_invalid"),
    ([{"type": "string"}], "guided_schema_invalid"),
    (42, "guided_schema_invalid"),
]


@pytest.mark.parametrize(("schema", "code"), ATTACK_SCHEMAS)
def test_attack_schema_refused(schema: Any, code: str) -> None:
    assert isolated_code(schema_body(schema)) == code


def test_attack_schema_in_other_fields() -> None:
    deep = nested_objects(200)
    for body in (
        {"guided_json": deep},
        {"guided_json": json.dumps(deep)},
        {"structured_outputs": {"json": json.dumps(deep)}},
        {"json_schema": deep},
        {"response_format": {"type": "json_object", "schema": deep}},
        {"response_format": {"type": "json_object", "value": deep}},
        {"grammar": {"type": "json", "value": deep}},
        {"text": {"format": {"type": "json_schema", "name": "s", "schema": deep}}},
        {"tools": [{"type": "function", "name": "f", "parameters": deep}]},
        {"functions": [{"name": "f", "parameters": deep}]},
        tool_body(deep),
    ):
        assert isolated_code(body) == "guided_schema_too_deep", body.keys()


def test_schema_json_strings() -> None:
    assert (
        isolated_code({"guided_json": "[" * 150_000 + "]" * 150_000}) == "guided_schema_too_large"
    )
    deep = "[" * 5_000 + "]" * 5_000
    assert isolated_code({"guided_json": deep}) == "guided_schema_too_deep"
    assert code_of({"guided_json": "{not json"}) == "guided_schema_invalid"
    assert code_of({"guided_json": '{"type": "string", "type": "integer"}'}) == (
        "guided_schema_invalid"
    )
    assert code_of({"guided_json": '{"maximum": NaN}'}) == "guided_schema_invalid"
    assert code_of({"guided_json": '{"maximum": 1e999}'}) == "guided_schema_invalid"
    assert code_of({"guided_json": '{"maximum": ' + "9" * 5000 + "}"}) == "guided_schema_invalid"
    assert code_of({"guided_json": json.dumps(nested_objects(5))}) is None


def test_recursive_refs_refused_for_outlines_or_by_policy() -> None:
    # Grammar backends make a recursive rule of a recursive $ref: accepted by default.
    assert code_of({"guided_json": RECURSIVE}) is None
    assert code_of({"guided_json": {"properties": {"a": {"$ref": "#"}}}}) is None
    # Outlines alone expands it without end; `false` refuses it whatever the backends.
    for limits in (GuidedLimits(backends=("outlines",)), GuidedLimits(allow_recursive_refs=False)):
        assert code_of({"guided_json": RECURSIVE}, limits) == "guided_schema_too_deep"
        body = {"guided_json": {"properties": {"a": {"$ref": "#"}}}}
        assert code_of(body, limits) == "guided_schema_too_deep"


def test_recursive_refs_allowed_by_policy() -> None:
    limits = GuidedLimits(allow_recursive_refs=True)
    assert code_of({"guided_json": RECURSIVE}, limits) is None
    assert code_of({"guided_json": {"properties": {"a": {"$ref": "#"}}}}, limits) is None
    # recursion does not open a door to expansion bombs
    assert code_of({"guided_json": _ref_laughs(12)}, limits) == "guided_schema_too_large"


def test_schema_param_names_the_field() -> None:
    err = error_of(tool_body({"type": "object", "properties": {"n": {"maxLength": 10**9}}}))
    assert err.param == "tools[0].function.parameters.properties.n.maxLength"
    assert isinstance(err, LimitExceeded)
    err = error_of({"guided_json": RECURSIVE}, GuidedLimits(allow_recursive_refs=False))
    assert err.param == "guided_json.$defs.node.properties.children.items.$ref"
    err = error_of({"guided_json": {"properties": {"a b": {"type": "string", "pattern": "(a"}}}})
    assert err.param == 'guided_json.properties["a b"].pattern'
    assert not isinstance(err, LimitExceeded) and err.status == 400


OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create_event",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "minLength": 1, "maxLength": 200},
                    "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                    "attendees": {
                        "type": "array",
                        "items": {"type": "string", "format": "email"},
                        "maxItems": 50,
                    },
                    "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                },
                "required": ["title", "date"],
            },
        },
    },
]

TYPICAL_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
                "geo": {
                    "type": "object",
                    "properties": {
                        "lat": {"type": "number", "minimum": -90, "maximum": 90},
                        "lon": {"type": "number", "minimum": -180, "maximum": 180},
                    },
                },
            },
        }
    },
    "properties": {
        "company": {
            "type": "object",
            "properties": {
                "hq": {"$ref": "#/$defs/address"},
                "departments": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "teams": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "lead": {
                                            "type": "object",
                                            "properties": {
                                                "email": {
                                                    "type": "string",
                                                    "pattern": "^[^\\s@]+@[^\\s@]+\\.[^\\s@]+$",
                                                },
                                                "office": {"$ref": "#/$defs/address"},
                                            },
                                        }
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
        "pattern": {"type": "string"},  # a property *named* pattern is not a regex
    },
    "examples": [{"pattern": "(a+)+"}],  # data, never compiled
    "default": {"company": {}},
}


def test_benign_schemas_allowed() -> None:
    assert code_of({"tools": OPENAI_TOOLS, "tool_choice": "auto"}) is None
    assert code_of(schema_body(TYPICAL_SCHEMA)) is None
    assert code_of({"guided_json": json.dumps(TYPICAL_SCHEMA)}) is None
    assert code_of(schema_body(nested_objects(5))) is None
    assert code_of(schema_body(True)) is None
    assert code_of({"guided_json": {"type": "integer", "exclusiveMinimum": True}}) is None
    assert code_of({"response_format": {"type": "json_object"}}) is None
    assert code_of({"response_format": {"type": "text"}, "guided_json": None}) is None
    assert code_of({"messages": [{"role": "user", "content": "(a+)+ {{ x }} ((("}]}) is None


# ---- grammars ---------------------------------------------------------------------------------

JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

LARK_GRAMMAR = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER -> number | "true" -> true | "null" -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
NAME: /[a-z_]([a-z0-9_])*/
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
"""

NESTED_GBNF = "root ::= " + "(" * 60000 + '"a"' + ")" * 60000


@pytest.mark.parametrize(
    ("body", "limits", "code"),
    [
        ({"grammar": NESTED_GBNF}, LIMITS, "guided_grammar_too_large"),
        (
            {"grammar": NESTED_GBNF},
            GuidedLimits(max_grammar_chars=1 << 20),
            "guided_grammar_too_deep",
        ),
        (
            {"grammar": "root ::= " + "(" * 1000 + '"a"' + ")" * 1000},
            LIMITS,
            "guided_grammar_too_deep",
        ),
        (
            {"guided_grammar": "start: " + "[" * 500 + '"a"' + "]" * 500},
            LIMITS,
            "guided_grammar_too_deep",
        ),
        (
            {"structured_outputs": {"grammar": "root ::= " + "(" * 65 + ")" * 65}},
            LIMITS,
            "guided_grammar_too_deep",
        ),
        ({"ebnf": "root ::= " + "(" * 100 + ")" * 100}, LIMITS, "guided_grammar_too_deep"),
        ({"grammar": 'root ::= ("a"*)*'}, LIMITS, "guided_grammar_unsafe"),
        ({"grammar": 'root ::= ("a" | "b"?)+'}, LIMITS, "guided_grammar_unsafe"),
        ({"grammar": 'root ::= ("")*'}, LIMITS, "guided_grammar_unsafe"),
        ({"grammar": 'root ::= "a"{1000}{1000}'}, LIMITS, "guided_grammar_too_large"),
        ({"grammar": 'root ::= ("a"{100}){100}'}, LIMITS, "guided_grammar_too_large"),
        ({"grammar": 'root ::= "a"{99999999999999999999}'}, LIMITS, "guided_grammar_too_large"),
        (
            {"grammar": "root ::= " + " ".join(['"a"{900}'] * 20)},
            LIMITS,
            "guided_grammar_too_large",
        ),
        (
            {"grammar": "\n".join(f"r{i} ::= r{i + 1}" for i in range(5000))},
            LIMITS,
            "guided_grammar_too_large",
        ),
        ({"grammar": ["root ::= x"]}, LIMITS, "guided_grammar_invalid"),
    ],
)
def test_attack_grammar_refused(body: dict[str, Any], limits: GuidedLimits, code: str) -> None:
    assert isolated_code(body, limits) == code


def test_benign_grammars_allowed() -> None:
    assert code_of({"grammar": JSON_GBNF}) is None
    assert code_of({"guided_grammar": JSON_GBNF}) is None
    assert code_of({"guided_grammar": LARK_GRAMMAR}) is None
    assert code_of({"grammar": 'root ::= "yes" | "no"'}) is None
    # brackets inside strings, classes and comments do not nest
    quoted = "root ::= " + " ".join(['"((((("'] * 100) + " [(((]" * 100 + "\n# " + "(" * 500
    assert code_of({"grammar": quoted}) is None
    # a GBNF class holding a quote, read the Lark way, drifts only within its own rule
    many_rules = "\n".join(f'r{i} ::= [^"(] "x"' for i in range(200))
    assert code_of({"guided_grammar": many_rules}) is None


# ---- choices, structural tags ---------------------------------------------------------------


def test_choices() -> None:
    assert code_of({"guided_choice": ["positive", "negative"]}) is None
    assert code_of({"structured_outputs": {"choice": ["a", "b"]}}) is None
    assert code_of({"guided_choice": ["x"] * 100_000}) == "guided_choice_too_large"
    assert code_of({"guided_choice": ["x" * 70_000]}) == "guided_choice_too_large"
    assert code_of({"structured_outputs": {"choice": ["a"] * 257}}) == "guided_choice_too_large"
    assert code_of({"guided_choice": "yes"}) == "guided_choice_invalid"
    err = error_of({"guided_choice": ["a", 3]})
    assert (err.code, err.param) == ("guided_choice_invalid", "guided_choice[1]")


def test_structural_tags() -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<function="],
            "tags": [
                {
                    "begin": "<function=f>",
                    "content": {"type": "json_schema", "json_schema": pattern_schema("(a|a)*")},
                    "end": "</function>",
                },
                {"begin": "<r>", "content": {"type": "regex", "pattern": "[a-z]+"}, "end": "</r>"},
            ],
        },
    }
    err = error_of({"structured_outputs": {"structural_tag": json.dumps(tag)}})
    assert err.code == "guided_regex_unsafe"
    assert err.param == (
        "structured_outputs.structural_tag.format.tags[0].content.json_schema.properties.x.pattern"
    )
    legacy = {
        "structures": [{"begin": "<f>", "schema": nested_objects(100), "end": "</f>"}],
        "triggers": ["<f"],
    }
    assert code_of({"response_format": {"type": "structural_tag", **legacy}}) == (
        "guided_schema_too_deep"
    )
    assert (
        code_of({"structural_tag": {"format": {"type": "grammar", "grammar": JSON_GBNF}}}) is None
    )
    regex_tool = {
        "type": "custom",
        "name": "id",
        "format": {"type": "grammar", "syntax": "regex", "definition": "(a+)+"},
    }
    assert code_of({"tools": [regex_tool]}) == "guided_regex_unsafe"
    lark_tool = {
        "type": "custom",
        "name": "sql",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: " + "(" * 99},
    }
    assert code_of({"tools": [lark_tool]}) == "guided_grammar_too_deep"


# ---- properties -----------------------------------------------------------------------------

_REGEX_ALPHABET = st.sampled_from(
    [*"ab()[]{}|*+?.^$\\-,:=!<>P'#09dwsDWSpLQExuiz", "(?:", "(?=", "{2}", "{1,3}", "[^", "é"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=60), st.lists(_REGEX_ALPHABET, max_size=40).map("".join)))
def test_any_text_as_regex_passes_or_raises_guard_error(pattern: str) -> None:
    for body in (
        {"guided_regex": pattern},
        {"grammar": pattern},
        {"guided_grammar": pattern},
        {"guided_json": pattern},
        {"structural_tag": pattern},
    ):
        try:
            check_guided_decoding(body, LIMITS)
        except GuardError as e:
            assert e.code.startswith("guided_")
            assert e.status == 400


@settings(max_examples=200, deadline=None)
@given(st.lists(_REGEX_ALPHABET, max_size=40).map("".join))
def test_scan_raises_only_regex_rejected(pattern: str) -> None:
    try:
        result = scan_regex(pattern, LIMITS)
    except RegexRejected as e:
        assert e.code in ("guided_regex_invalid", "guided_regex_unsafe")
    else:
        assert result.max_nesting <= 32 and result.max_repeat_product <= 1000


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "properties",
                    "items",
                    "pattern",
                    "$ref",
                    "enum",
                    "anyOf",
                    "maxLength",
                    "patternProperties",
                    "$defs",
                    "x",
                    "minimum",
                    "dependencies",
                    "not",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_any_json_as_schema_passes_or_raises_guard_error(schema: Any) -> None:
    for body in ({"guided_json": schema}, tool_body(schema), {"structural_tag": schema}):
        try:
            check_guided_decoding(body, LIMITS)
        except GuardError as e:
            assert e.code.startswith("guided_")


def test_scan_is_linear() -> None:
    """Eight times the pattern, at most about eight times the work (never quadratic), counted
    in bytecodes executed rather than timed (bench/guided_check.py times it)."""
    limits = GuidedLimits(max_regex_program_size=1 << 30, max_regex_adjacent_unbounded=1 << 30)

    def work(n: int) -> int:
        pattern = "(?:a|b)[a-z]+@" * n
        return bytecodes(lambda: scan_regex(pattern, limits))

    small, large = work(200), work(1600)
    assert small > 0
    assert large < small * 8 * 1.25, (small, large)
