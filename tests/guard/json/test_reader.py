"""guard.json._reader: a bounded JSON body reader; every limit exact, every refusal a GuardError."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from guard.errors import GuardError, LimitExceeded
from guard.isolation import run_limited
from guard.json import JsonLimits, json_depth, parse_json_body
from guard.json import _reader as json_scan
from guard.json._pattern import MAX_SUPPORTED_DEPTH, neutralise

DEFAULT = JsonLimits()
# Small limits, so generated bodies reach them.
SMALL = JsonLimits(
    max_depth=4,
    max_keys_per_object=3,
    max_total_keys=8,
    max_array_length=4,
    max_string_bytes=8,
    max_number_chars=5,
    max_containers=12,
)
# More keys per object than array elements: arrays are then checked after parsing.
SMALL_ARRAYS = replace(SMALL, max_keys_per_object=6, max_array_length=2)


def refusal(
    body: bytes, limits: JsonLimits = DEFAULT, max_body_bytes: int | None = None
) -> GuardError:
    with pytest.raises(GuardError) as info:
        parse_json_body(body, limits, max_body_bytes)
    return info.value


def code(body: bytes, limits: JsonLimits = DEFAULT, max_body_bytes: int | None = None) -> str:
    try:
        parse_json_body(body, limits, max_body_bytes)
    except GuardError as exc:
        return exc.code
    return "ok"


# ---------------------------------------------------------------------------------- codes


@pytest.mark.parametrize(
    ("body", "limits", "expected", "error_type", "status", "param"),
    [
        (b'{"a":"\xc3"}', DEFAULT, "invalid_utf8", GuardError, 400, None),
        (b'{"a":["\\udc00"]}', DEFAULT, "invalid_utf8", GuardError, 400, "a[0]"),
        (b'{"a":[1,]}', DEFAULT, "invalid_json", GuardError, 400, None),
        (b'{"a":[[[[[1]]]]]}', SMALL, "json_depth_exceeded", LimitExceeded, 400, "a[0][0][0]"),
        (b'{"a":{"b":1,"c":2,"d":3,"e":4}}', SMALL, "json_too_many_keys", LimitExceeded, 400, "a"),
        (b'{"m":[{"r":1,"c":2,"r":3}]}', DEFAULT, "json_duplicate_key", GuardError, 400, "m[0].r"),
        (b'{"a":[1,2,3,4,5]}', SMALL, "json_array_too_long", LimitExceeded, 400, "a"),
        (b'{"a":["short","123456789"]}', SMALL, "json_string_too_long", LimitExceeded, 400, "a[1]"),
        (b'{"a":{"n":-1.5e10}}', SMALL, "json_number_too_long", LimitExceeded, 400, "a.n"),
        (
            b"[" + b",".join([b"[[],[]]"] * 4) + b"]",
            SMALL,
            "json_too_many_containers",
            LimitExceeded,
            400,
            "[3][1]",
        ),
        (
            b'{"t":[1,{"x":-Infinity}]}',
            DEFAULT,
            "json_non_finite_number",
            GuardError,
            400,
            "t[1].x",
        ),
    ],
)
def test_every_code(
    body: bytes,
    limits: JsonLimits,
    expected: str,
    error_type: type[GuardError],
    status: int,
    param: str | None,
) -> None:
    exc = refusal(body, limits)
    assert (exc.code, type(exc), exc.status, exc.param) == (expected, error_type, status, param)
    assert exc.to_body()["error"]["code"] == expected


def test_a_request_body_parses_like_json_loads() -> None:
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi {x} [y]"}]}],
            "temperature": 0.7,
            "max_tokens": 16,
            "stop": ["\n", "]"],
            "logit_bias": {"50256": -100},
            "stream": False,
            "user": None,
        }
    ).encode()
    assert parse_json_body(body, DEFAULT) == json.loads(body)


@pytest.mark.parametrize("body", [b"0", b"-1.5e-7", b'"s"', b"true", b"null", b"[]", b"{}"])
def test_any_json_value_at_the_top(body: bytes) -> None:
    assert parse_json_body(body, DEFAULT) == json.loads(body)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"[1] [2]",
        b"[1]]",
        b"[1}",
        b'{"a" 1}',
        b"'a'",
        b'"\\x"',
        b'"\t"',
        b"\xef\xbb\xbf{}",
    ],
    ids=[
        "empty",
        "blank",
        "two-values",
        "extra-close",
        "mismatch",
        "no-colon",
        "quote",
        "escape",
        "ctrl",
        "bom",
    ],
)
def test_malformed_bodies_are_invalid_json(body: bytes) -> None:
    exc = refusal(body)
    assert exc.code == "invalid_json"
    assert "byte" in exc.message


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_constants_are_refused_but_not_inside_strings(constant: bytes) -> None:
    assert code(b'["' + constant + b'", ' + constant + b"]") == "json_non_finite_number"
    assert parse_json_body(b'["' + constant + b'"]', DEFAULT) == [constant.decode()]
    assert refusal(b'["' + constant + b'", ' + constant + b"]").param == "[1]"


OVERFLOWING = [b"1e999", b"-1e999", b"1E+400", b"1e0400", b"2.5e308", b"-0.5E+309",
               b"0.001e312", b"1" + b"0" * 40 + b"e300"]  # fmt: skip
FINITE = [b"1.7e308", b"-1.7976931348623157e308", b"1e-999", b"-0.0", b"1e99", b"9" * 60,
          b"123456789.123456789e-50", b"1e+0300"]  # fmt: skip


@pytest.mark.parametrize("number", OVERFLOWING)
@pytest.mark.parametrize(
    ("template", "param"),
    [
        (b'{"temperature":%s}', "temperature"),
        (b'{"a":[1,{"b":%s}]}', "a[1].b"),
        (b'{"logit_bias":{"42":%s}}', 'logit_bias["42"]'),
        (b'{"s":"1e999","response_format":{"schema":{"maxLength":%s}}}', None),
        (b"[%s]", "[0]"),
    ],
    ids=["top", "nested", "map", "deep", "array"],
)
def test_numbers_overflowing_to_infinity_are_refused_anywhere(
    number: bytes, template: bytes, param: str | None
) -> None:
    exc = refusal(template % number)
    assert exc.code == "json_non_finite_number"
    assert exc.status == 400
    assert "infinity" in exc.message
    if param is not None:
        assert exc.param == param


@pytest.mark.parametrize("number", FINITE)
def test_large_but_finite_numbers_pass(number: bytes) -> None:
    value = parse_json_body(b'{"x":%s,"s":"1e999"}' % number, DEFAULT)
    assert math.isfinite(value["x"])
    assert value["s"] == "1e999"


def test_big_integers_are_refused_when_the_number_limit_lets_them_overflow() -> None:
    wide = replace(DEFAULT, max_number_chars=1000)
    exc = refusal(b'{"n":[1,' + b"9" * 400 + b"]}", wide)
    assert (exc.code, exc.param) == ("json_non_finite_number", "n[1]")
    assert parse_json_body(b'{"n":' + b"9" * 300 + b"}", wide)["n"] == int("9" * 300)
    # A long mantissa with an exponent under 100 overflows too once numbers may be that long.
    assert refusal(b'{"n":' + b"9" * 250 + b"e70}", wide).code == "json_non_finite_number"
    assert parse_json_body(b'{"n":' + b"9" * 250 + b"e50}", wide)["n"] == pytest.approx(1e300)


@settings(max_examples=200, deadline=None)
@given(
    mantissa=st.integers(min_value=0, max_value=10**30),
    exponent=st.integers(min_value=-400, max_value=400),
    negative=st.booleans(),
)
def test_overflow_verdict_matches_float(mantissa: int, exponent: int, negative: bool) -> None:
    literal = ("-" if negative else "") + f"{mantissa}e{exponent:+d}"
    body = b'{"x":' + literal.encode() + b"}"
    if math.isinf(float(literal)):
        assert refusal(body).code == "json_non_finite_number"
    else:
        assert parse_json_body(body, DEFAULT)["x"] == float(literal)


# ----------------------------------------------------------------------------- boundaries


def nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"k":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("limit", [1, 2, 32, MAX_SUPPORTED_DEPTH])
def test_depth_at_the_limit_passes_and_one_over_fails(kind: str, limit: int) -> None:
    limits = JsonLimits(max_depth=limit)
    parse_json_body(nested(limit, kind), limits)
    exc = refusal(nested(limit + 1, kind), limits)
    assert exc.code == "json_depth_exceeded"
    # The bracket that crossed is the last opening one.
    assert exc.message.endswith(
        f"(byte {nested(limit + 1, kind).rindex(b'[' if kind == 'array' else b'{')})"
    )


@pytest.mark.parametrize(("keys", "elements"), [(4, 6), (6, 4), (5, 5)])
def test_array_length_exact_whichever_member_bound_is_larger(keys: int, elements: int) -> None:
    # The scan counts members of both kinds up to the larger bound; the parser's hook and the
    # array walk cover the smaller one.
    limits = JsonLimits(max_keys_per_object=keys, max_array_length=elements)

    def array(n: int) -> bytes:
        return b'{"a":[' + b",".join([b"[]"] * n) + b"]}"

    def obj(n: int) -> bytes:
        return b'{"o":{' + b",".join(b'"k%d":0' % i for i in range(n)) + b"}}"

    assert code(array(elements), limits) == "ok"
    assert code(array(elements + 1), limits) == "json_array_too_long"
    assert refusal(array(elements + 1), limits).param == "a"
    assert code(obj(keys), limits) == "ok"
    assert code(obj(keys + 1), limits) == "json_too_many_keys"
    assert refusal(obj(keys + 1), limits).param == "o"


def test_empty_and_whitespace_containers_have_no_members() -> None:
    limits = JsonLimits(max_array_length=1, max_keys_per_object=1)
    assert parse_json_body(b"[ [ ] ]", limits) == [[]]
    assert parse_json_body(b'{ "a" : { } }', limits) == {"a": {}}
    assert code(b"[ [ ] , [ ] ]", limits) == "json_array_too_long"


def test_total_keys_at_the_limit_pass_and_one_over_fails() -> None:
    limits = JsonLimits(max_total_keys=5)
    assert code(b'{"a":{"b":1,"c":2},"d":[{"e":3}]}', limits) == "ok"
    exc = refusal(b'{"a":{"b":1,"c":2},"d":[{"e":3,"f":4,"g":5,"h":6}]}', limits)
    assert (exc.code, exc.param) == ("json_too_many_keys", "d[0]")


def test_an_object_crossing_two_key_limits_is_refused_for_the_first_documented() -> None:
    # Its own key count first, then a duplicate key, then the body's total.
    too_many_and_repeated = b'{"o":{"a":1,"b":2,"a":3}}'
    exc = refusal(too_many_and_repeated, JsonLimits(max_keys_per_object=2))
    assert (exc.code, "object of 3 keys" in exc.message) == ("json_too_many_keys", True)
    exc = refusal(too_many_and_repeated, JsonLimits(max_total_keys=3))
    assert (exc.code, exc.param) == ("json_duplicate_key", "o.a")
    exc = refusal(b'{"o":{"a":1,"b":2}}', JsonLimits(max_total_keys=2))
    assert (exc.code, "in total" in exc.message) == ("json_too_many_keys", True)


@pytest.mark.parametrize(
    "text",
    ["abcdefgh", "ééé\u00e9", "日本語x", "😀😀", 'a\nb\tc\\"', "\x7f\u2028\u2029\ufffd"],
)
@pytest.mark.parametrize("ascii_only", [False, True])
def test_string_length_is_exact_in_utf8_bytes_after_unescaping(text: str, ascii_only: bool) -> None:
    size = len(text.encode())
    for as_key in (False, True):
        value: Any = {text: 1} if as_key else [text]
        body = json.dumps(value, ensure_ascii=ascii_only).encode()
        assert parse_json_body(body, JsonLimits(max_string_bytes=size)) == value
        assert code(body, JsonLimits(max_string_bytes=size - 1)) == "json_string_too_long"


def test_long_escaped_strings_are_measured_decoded_and_later_ones_still_checked() -> None:
    # Raw forms far over the limit whose decoded forms fit; then one that does not fit.
    ok = json.dumps("é" * 4).encode()  # 26 raw bytes, 8 decoded
    limits = JsonLimits(max_string_bytes=8, max_depth=2, max_array_length=3)
    assert code(b"[" + ok + b"," + ok + b"]", limits) == "ok"
    exc = refusal(b"[" + ok + b"," + ok + b',"123456789"]', limits)
    assert (exc.code, exc.param) == ("json_string_too_long", "[2]")
    # Structure after the verified strings is still scanned.
    assert code(b"[" + ok + b",[[1]]]", limits) == "json_depth_exceeded"
    assert code(b"[" + ok + b",1,2,3]", limits) == "json_array_too_long"


@pytest.mark.parametrize(
    "number", [b"12345", b"-1234", b"1.5e9", b"-0.01", b"1E+10", b"0"], ids=lambda n: n.decode()
)
def test_number_length_counts_the_token_as_written(number: bytes) -> None:
    limits = JsonLimits(max_number_chars=len(number))
    assert parse_json_body(b'{"n":[' + number + b"]}", limits) == {"n": [json.loads(number)]}
    if len(number) > 1:
        exc = refusal(b'{"n":[' + number + b"]}", JsonLimits(max_number_chars=len(number) - 1))
        assert (exc.code, exc.param) == ("json_number_too_long", "n[0]")


def test_long_digit_strings_are_strings_not_numbers() -> None:
    assert parse_json_body(b'["' + b"9" * 100 + b'"]', JsonLimits(max_number_chars=5)) == [
        "9" * 100
    ]
    assert code(b'["' + b"9" * 100 + b'",' + b"9" * 6 + b"]", JsonLimits(max_number_chars=5)) == (
        "json_number_too_long"
    )


def test_a_number_over_python_int_digit_limit_is_refused_before_conversion() -> None:
    exc = refusal(b"[" + b"7" * 5000 + b"]", JsonLimits(max_number_chars=64))
    assert exc.code == "json_number_too_long"
    assert len(exc.message) < 100


def test_containers_at_the_limit_pass_and_one_over_fails() -> None:
    limits = JsonLimits(max_containers=5)
    assert code(b'[{"a":[]},[{}],"[{[{"]', limits) == "ok"
    exc = refusal(b'[{"a":[]},[{}],"[{[{",[]]', limits)
    assert (exc.code, exc.param) == ("json_too_many_containers", "[3]")


def test_body_size_at_the_limit_passes_and_one_over_is_413() -> None:
    body = b'["' + b"x" * 96 + b'"]'
    assert code(body, max_body_bytes=100) == "ok"
    exc = refusal(body + b" ", max_body_bytes=100)
    assert (exc.code, type(exc), exc.status, exc.param) == (
        "body_too_large",
        LimitExceeded,
        413,
        None,
    )
    # Checked first: a small cap refuses a body that is also invalid.
    assert code(b"[" + b"0," * 199 + b"0" + b"\xc3", SMALL, max_body_bytes=400) == "body_too_large"


def test_first_limit_crossed_in_the_body_is_the_one_reported() -> None:
    limits = JsonLimits(max_number_chars=3, max_containers=3, max_depth=2)
    assert code(b"[1234,[[[]]]]", limits) == "json_number_too_long"
    assert code(b"[[[]],1234]", limits) == "json_depth_exceeded"
    assert code(b"[[],[],[],1234]", limits) == "json_too_many_containers"


# ------------------------------------------------------------------------ strings, escapes


@pytest.mark.parametrize(
    "text",
    ['\\"[', "\\", '"', '\\\\"]]]', "[{", "\\u0022[", "\\\\\\", '}"}"{"', "\\\\u005b"],
)
def test_escapes_inside_strings_do_not_confuse_the_scan(text: str) -> None:
    limits = JsonLimits(max_depth=1, max_array_length=2, max_containers=1)
    value = [text, text]
    body = json.dumps(value).encode()
    assert parse_json_body(body, limits) == value
    assert parse_json_body(json.dumps({text: text}).encode(), limits) == {text: text}


@pytest.mark.parametrize("backslashes", range(6))
def test_runs_of_backslashes_before_a_quote(backslashes: int) -> None:
    # An odd run escapes the quote, so the brackets after it are text; an even run escapes
    # itself, so the quote closes the string and the brackets are structure.
    limits = JsonLimits(max_depth=2)
    run = b"\\" * backslashes
    if backslashes % 2:
        body = b'["' + run + b'"[[1]]"]'
        assert parse_json_body(body, limits) == json.loads(body)
    else:
        body = b'["' + run + b'",[[1]]]'
        assert code(body, limits) == "json_depth_exceeded"
        assert parse_json_body(body, JsonLimits(max_depth=3)) == json.loads(body)


@pytest.mark.parametrize(
    ("escape", "ok"),
    [
        ("\\ud83d\\ude00", True),
        ("\\uD83D\\uDE00", True),
        ("\\ud800", False),
        ("\\udfff", False),
        ("\\ud800\\ud800\\udc00", False),
        ("\\ud800\\udc00\\udc00", False),
        ("\\ud800x", False),
        ("\\\\ud800", True),  # an escaped backslash, then text
        ("\\\\\\ud800", False),
    ],
)
def test_lone_surrogate_escapes_are_invalid_utf8(escape: str, ok: bool) -> None:
    body = ('{"k":"' + escape + '"}').encode()
    if ok:
        assert parse_json_body(body, DEFAULT) == json.loads(body)
    else:
        exc = refusal(body)
        assert (exc.code, exc.param) == ("invalid_utf8", "k")


def test_a_lone_surrogate_in_a_key_leaves_the_message_encodable() -> None:
    exc = refusal(b'{"a\\ud800b":{"\\udfff":1}}')
    assert exc.code == "invalid_utf8"
    assert exc.param is not None
    json.dumps(exc.to_body(), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        (b'["\xc0\xaf"]', 2),  # overlong "/"
        (b'["\xed\xa0\x80"]', 2),  # an encoded surrogate
        (b'["ok", "\xf4\x90\x80\x80"]', 8),  # past U+10FFFF
        (b'["\xe6\x97"]', 2),  # truncated
        (b"\xff", 0),
    ],
)
def test_invalid_utf8_names_the_byte(body: bytes, offset: int) -> None:
    exc = refusal(body)
    assert exc.code == "invalid_utf8"
    assert exc.message.endswith(f"at byte {offset}")


def test_unicode_keys_and_values_round_trip_and_offsets_are_bytes() -> None:
    value = {"ключ": ["日本語", "😀", "\u0000"], "é": {"ü": "x"}}
    for ascii_only in (False, True):
        assert (
            parse_json_body(json.dumps(value, ensure_ascii=ascii_only).encode(), DEFAULT) == value
        )
    exc = refusal('{"é":[1,]}'.encode())
    assert exc.message.endswith("at byte 9")  # "é" is two bytes


# ----------------------------------------------------------------------- messages, paths


def test_messages_and_params_never_echo_attacker_sized_text() -> None:
    for size in (20_000, 100_000):  # the object ends before 64 KiB, then past it
        huge_key = "k" * size
        body = (
            json.dumps({huge_key: {huge_key: 1}}).encode()[:-2]
            + b',"'
            + huge_key.encode()
            + b'":2}}'
        )
        exc = refusal(body)
        assert exc.code == "json_duplicate_key" and len(exc.message) < 300
        assert ("k" * 33) not in exc.message
        if size == 20_000:
            assert exc.param is not None and len(exc.param) <= 160
            assert exc.param.startswith("k" * 32 + "…")
        else:  # past the first 64 KiB the path is not walked: the key alone, cut
            assert exc.param is None and "past byte 65536 (key " + "k" * 32 + "…)" in exc.message
    exc = refusal(b'{"' + b"x" * 200 + b'": [' + b"1" * 100_000 + b"]}", DEFAULT)
    assert exc.code == "json_number_too_long"
    assert len(exc.message) < 300


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"a b":{"c":[0,{"d":1,"d":2}]}}', '["a b"].c[1].d'),
        (b'[{"x":1},{"y":[{"z":0,"z":0}]}]', "[1].y[0].z"),
        (b'{"a":1,"a":2}', "a"),
        (b'{"msg":{"role":"u","role":"v"}}', "msg.role"),
        (b'{"\\u00e9":{"\\"q":0,"\\"q":1}}', '["é"]["\\"q"]'),
    ],
)
def test_duplicate_key_param_is_the_key_path(body: bytes, param: str) -> None:
    exc = refusal(body)
    assert (exc.code, exc.param) == ("json_duplicate_key", param)
    assert param in exc.message


def test_long_paths_keep_their_tail() -> None:
    body = b'{"aaaaaaaaaa":' * 30 + b'{"x":1,"x":2}' + b"}" * 30
    exc = refusal(body, JsonLimits(max_depth=40))
    assert exc.param is not None and len(exc.param) == 160
    assert exc.param.startswith("…") and exc.param.endswith("aaaaaaaaaa.x")


# --------------------------------------------------------------------------------- limits


@pytest.mark.parametrize("field", [f.name for f in fields(JsonLimits)])
@pytest.mark.parametrize("bad", [0, -1, 2**31, 1.5, True, None])
def test_limits_are_validated(field: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=field):
        replace(DEFAULT, **{field: bad})


def test_depth_beyond_what_the_pattern_supports_is_refused() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        JsonLimits(max_depth=MAX_SUPPORTED_DEPTH + 1)


# ----------------------------------------------------------------------------- json_depth


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"1", 0),
        (b'"[[["', 0),
        (b"[]", 1),
        (b'{"a":[[],{"b":"]]"}]}', 3),
        (b'["\\"[", ["\\\\"]]', 2),
        (b"[[[[[[[[]]]]]]]]", 8),
    ],
)
def test_json_depth(body: bytes, depth: int) -> None:
    assert json_depth(body, 8) == depth


def test_json_depth_refuses_one_over_the_limit_at_the_crossing_bracket() -> None:
    with pytest.raises(LimitExceeded) as info:
        json_depth(b'{"a":[[' + b"[" * 100, 3)
    assert info.value.code == "json_depth_exceeded"
    assert info.value.message.endswith("at byte 7")


@pytest.mark.parametrize("body", [b"[[]", b"]", b'["]', b'"', b"[]]"])
def test_json_depth_refuses_unbalanced_text(body: bytes) -> None:
    with pytest.raises(GuardError) as info:
        json_depth(body, 8)
    assert info.value.code == "invalid_json"


def test_json_depth_validates_its_limit() -> None:
    with pytest.raises(ValueError):
        json_depth(b"[]", 0)


# ------------------------------------------------------------------- huge hostile bodies


def read_code(body_factory: str, limits: JsonLimits) -> str:
    """Runs in a limited child: build one hostile body and read it."""
    body = HOSTILE[body_factory]()
    try:
        parse_json_body(body, limits)
    except GuardError as exc:
        return f"{exc.code} {exc.message}"
    return "ok"


HOSTILE = {
    "brackets_1M": lambda: b"[" * 1_000_000,
    "objects_100k": lambda: b'{"a":' * 100_000,
    "digits_1M": lambda: b'{"n":' + b"9" * 1_000_000 + b"}",
    "string_4MiB": lambda: b'["' + b"x" * (4 << 20) + b'"]',
    "array_1M": lambda: b"[" + b"0," * 1_000_000 + b"0]",
    "keys_200k": lambda: b"{" + b",".join(b'"%d":0' % i for i in range(200_000)) + b"}",
    "empty_arrays": lambda: b"[" + b",".join([b"[" + b"[]," * 3999 + b"[]]"] * 30) + b"]",
    "escapes_1M": lambda: b'["' + b"\\\\" * 1_100_000 + b'"]',
}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("brackets_1M", "json_depth_exceeded JSON nesting depth exceeds the limit of 32"),
        ("objects_100k", "json_depth_exceeded JSON nesting depth exceeds the limit of 32"),
        ("digits_1M", "json_number_too_long"),
        ("string_4MiB", "json_string_too_long"),
        ("array_1M", "json_array_too_long"),
        ("keys_200k", "json_too_many_keys"),
        ("empty_arrays", "json_too_many_containers"),
        ("escapes_1M", "json_string_too_long"),
    ],
)
def test_huge_hostile_bodies_are_refused_in_a_limited_child(name: str, expected: str) -> None:
    limits = JsonLimits()
    # An outer bound: the reads take milliseconds; the child's start-up is what a busy machine
    # slows down.
    result = run_limited(read_code, name, limits, mem_limit_bytes=1 << 30, timeout_s=120.0)
    assert result.ok, result
    assert result.value is not None and result.value.startswith(expected)


def test_refusal_stops_at_the_first_crossing() -> None:
    # The offsets show where reading stopped: right at the culprit, not at the end.
    assert refusal(b"[" * 200_000).message.endswith("(byte 32)")
    assert refusal(b'{"a":' * 50_000).message.endswith("(byte 160)")
    most = DEFAULT.max_array_length
    exc = refusal(b"[" + b"1," * (most + 1000) + b"1]" + b"[" * 200_000)
    crossing = f"byte {2 * most}"
    assert (exc.code, exc.message.endswith(crossing)) == ("json_array_too_long", True)


# --------------------------------------------------------------------------- properties

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
structural_text = st.text(alphabet=st.sampled_from('ab"\\[]{}:,/\n\té😀\u2028 '), max_size=12)
json_text = st.one_of(st.text(max_size=20), structural_text)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | finite_floats
    | json_text,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(json_text, children, max_size=6)
    ),
    max_leaves=30,
)


def stats(value: Any) -> dict[str, int]:
    """The smallest limits ``value`` satisfies, measured independently of the scanner."""
    out = dict(depth=0, array=0, keys=0, total=0, string=0, number=0, containers=0)

    def visit(v: Any, depth: int) -> None:  # depth: the containers around v
        if isinstance(v, list | dict):
            out["depth"] = max(out["depth"], depth + 1)
        if isinstance(v, list):
            out["containers"] += 1
            out["array"] = max(out["array"], len(v))
            for item in v:
                visit(item, depth + 1)
        elif isinstance(v, dict):
            out["containers"] += 1
            out["keys"] = max(out["keys"], len(v))
            out["total"] += len(v)
            for key, item in v.items():
                out["string"] = max(out["string"], len(key.encode()))
                visit(item, depth + 1)
        elif isinstance(v, str):
            out["string"] = max(out["string"], len(v.encode()))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out["number"] = max(out["number"], len(json.dumps(v)))

    visit(value, 0)
    return out


LIMIT_OF = {
    "depth": ("max_depth", "json_depth_exceeded"),
    "array": ("max_array_length", "json_array_too_long"),
    "keys": ("max_keys_per_object", "json_too_many_keys"),
    "total": ("max_total_keys", "json_too_many_keys"),
    "string": ("max_string_bytes", "json_string_too_long"),
    "number": ("max_number_chars", "json_number_too_long"),
    "containers": ("max_containers", "json_too_many_containers"),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_any_json_value_within_limits_round_trips(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    assume(stats(value)["depth"] <= DEFAULT.max_depth)
    body = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    assert parse_json_body(body, DEFAULT) == value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, ascii_only=st.booleans(), which=st.sampled_from(sorted(LIMIT_OF)))
def test_limits_are_exact_at_the_measured_values(value: Any, ascii_only: bool, which: str) -> None:
    measured = stats(value)
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    tight = JsonLimits(
        max_depth=max(1, measured["depth"]),
        max_keys_per_object=max(1, measured["keys"]),
        max_total_keys=max(1, measured["total"]),
        max_array_length=max(1, measured["array"]),
        max_string_bytes=max(1, measured["string"]),
        max_number_chars=max(1, measured["number"]),
        max_containers=max(1, measured["containers"]),
    )
    assert parse_json_body(body, tight, len(body)) == value
    if len(body) > 1:
        assert code(body, tight, max_body_bytes=len(body) - 1) == "body_too_large"
    field, expected = LIMIT_OF[which]
    assume(measured[which] >= 2)
    assert code(body, replace(tight, **{field: measured[which] - 1})) == expected


mutations = st.lists(
    st.tuples(
        st.integers(min_value=0),
        st.sampled_from([*b'[]{}",:\\ 0e-Nu', 0xFF, 0xC3]),
        st.booleans(),
    ),
    max_size=4,
)


def mutate(body: bytes, edits: list[tuple[int, int, bool]]) -> bytes:
    out = bytearray(body)
    for position, byte, insert in edits:
        at = position % (len(out) + 1)
        if insert or at == len(out):
            out.insert(at, byte)
        else:
            out[at] = byte
    return bytes(out)


def check_any(body: bytes, limits: JsonLimits) -> None:
    try:
        value = parse_json_body(body, limits)
    except GuardError as exc:
        assert exc.code
        assert len(exc.message) < 400
        assert exc.param is None or len(exc.param) <= 160
        json.dumps(exc.to_body(), ensure_ascii=False).encode()  # encodable: no lone surrogates
        return
    # Anything accepted is JSON the standard parser reads the same way.
    assert json.loads(body.decode("utf-8")) == value
    assert not (isinstance(value, float) and math.isnan(value))


any_limits = st.sampled_from([DEFAULT, SMALL, SMALL_ARRAYS])


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=200), limits=any_limits)
def test_arbitrary_bytes_return_or_raise_guard_error(body: bytes, limits: JsonLimits) -> None:
    check_any(body, limits)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, edits=mutations, limits=any_limits, ascii_only=st.booleans())
def test_mutated_json_returns_or_raises_guard_error(
    value: Any, edits: list[tuple[int, int, bool]], limits: JsonLimits, ascii_only: bool
) -> None:
    check_any(mutate(json.dumps(value, ensure_ascii=ascii_only).encode(), edits), limits)


def test_escaped_quotes_cannot_pass_string_brackets_off_as_structure() -> None:
    # Strings holding "]]]..." before a deep array and "[[[..." after it lower the nesting that
    # brackets and quotes alone would show, if escaped quotes were taken as string ends (the
    # shortcut reads the body as the parse gives it: escapes neutralised).
    limits = JsonLimits()
    k = limits.max_depth - 1
    inner = "[" * (limits.max_depth - 2) + "]" * (limits.max_depth - 2)
    closers, openers = json.dumps('"' + "]" * k + '"'), json.dumps('"' + "[" * k + '"')
    body = ("[" * k + closers + "," + inner + "," + openers + "]" * k).encode()
    assert not json_scan._within_structure_limits(neutralise(body), limits)
    with pytest.raises(GuardError) as err:
        parse_json_body(body, limits)
    assert err.value.code == "json_depth_exceeded"


def test_a_scan_refusal_far_into_the_body_names_its_byte_not_its_path() -> None:
    limits = JsonLimits(max_containers=1000)
    near = b'{"a": [' + b"[]," * 999 + b"[]]}"
    with pytest.raises(LimitExceeded) as err:
        parse_json_body(near, limits)
    # The 1,001st container: the object and the outer array, then inner array 998.
    assert err.value.code == "json_too_many_containers" and err.value.param == "a[998]"
    # Past the first 64 KiB, naming the path would re-read all of it: the offset alone.
    pad = json.dumps("x" * (json_scan._LOCATE_WITHIN + 10))
    far = b'{"pad": ' + pad.encode() + b', "a": [' + b"[]," * 999 + b"[]]}"
    with pytest.raises(LimitExceeded) as err:
        parse_json_body(far, limits)
    offset = far.index(b'"a": [') + len(b'"a": [') + 998 * len(b"[],")
    assert err.value.code == "json_too_many_containers" and err.value.param is None
    assert err.value.message.endswith(f"at byte {offset}")
