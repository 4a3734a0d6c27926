"""llama.cpp's GBNF parser mirrored (guard/guided/grammar/_gbnf.py) and the grammars llama-cpp-python
makes of schemas (guard/guided/grammar/_llamacpp.py).

The expectations come from llama.cpp itself (llama-cpp-python 0.3.36's vendored
``llama_grammar_init_impl``, through ``llama_sampler_init_grammar``): during development the
parser was run against it on ~12,000 mutated grammars (the grammars/ folder, the cases below)
with no disagreement; ``tests/e2e`` replays the corpus against the real server."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from guard.errors import GuardError, RegexRejected
from guard.guided import GuidedLimits, check_guided_decoding
from guard.guided.grammar import GbnfLimits, llama_cpp_schemas, parse_gbnf, schema_grammar_problem

DATA = Path(__file__).parent / "data"
LIMITS = GbnfLimits(
    max_depth=64, max_elements=262_144, max_steps=100_000, max_left_depth=4096, max_stacks=100
)


def _code(text: str, limits: GbnfLimits = LIMITS) -> str | None:
    try:
        parse_gbnf(text, limits)
    except RegexRejected as e:
        return e.code
    return None


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.gbnf")))
def test_llama_cpp_grammars_folder_parses(name: str) -> None:
    assert _code((DATA / name).read_text()) is None


# Accepted by llama.cpp 0.3.36 (checked against it).
ACCEPTED = [
    'root ::= "a"',
    'root::="a"',
    "root ::= []",
    'root ::= "\\u00e9\\U0001F600\\t\\r\\n\\\\\\"\\[\\]\\-"',
    'root ::= [^\\]] . "x" # c',
    'root ::= ( "a" |\n  "b" )',
    'root ::= "a" |\n  "b"',
    'root ::= "a"{ 2 , 3 }',
    'root ::= "a"{0,3000}',
    'root ::= ("a"{40}){50}',
    'root ::= ("a"{50}){50}',
    "root ::= <[12]> !<[13]>",
    'root ::= x-y\nx-y ::= "1"',
    'root ::= a\na ::= "x" | "y" a',
    'root ::= "a"\0garbage after a NUL: C stops reading there',
    # hidden left recursion in tail position: llama.cpp does not see it and terminates
    "root ::= c+\nc ::= h | k\nh ::= []\nk ::= [a]",
]

# Refused by llama.cpp (a NULL grammar: llama-cpp-python crashes) or never returns from it.
REFUSED = [
    "root ::= (",
    "root ::= foo",
    'root ::= "\\d"',
    "root ::= [\\d]",
    'my_rule ::= "a"\nroot ::= my_rule',
    'root ::= "a" "b"\nstray line',
    "o",
    "",
    "# only a comment",
    'root ::= root "a"',
    'root ::= a\na ::= b? root\nb ::= "x"',
    'root ::= "a"{2001}',
    'root ::= ("a"{0,50}){50}',  # 51 rules in the group x 50 > 2000
    "root ::= []*",
    'root ::= ""*',
    'root ::= "a"{0}*',
    "root ::= [a-",
    'root ::= "\\x4"',
    "root ::= {",
    'root ::= "a"{,3}',
    'root ::= "a"{99999999999999999999999}',
    'a ::= "x"',
    'root ::= a\na ::= "x" | a "y"',
    "root ::= <abc>",  # a token by its text: needs the vocabulary
    'root ::= "a"{5,2}',  # accepted by llama.cpp, then 2**64 rules: refused
    # hidden left recursion that grows the parse stacks (std::bad_alloc in llama.cpp)
    'root ::= term\nterm ::= "x" | ws term ")"\nws ::= [ ]*',
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted_as_llama_cpp_accepts(text: str) -> None:
    assert _code(text) is None


@pytest.mark.parametrize("text", REFUSED)
def test_refused_as_llama_cpp_refuses(text: str) -> None:
    assert _code(text) is not None


def test_depth_cap_below_the_crash_depth() -> None:
    deep = "root ::= " + "(" * 65 + '"a"' + ")" * 65
    assert _code(deep) == "guided_grammar_too_deep"
    assert _code("root ::= " + "(" * 64 + '"a"' + ")" * 64) is None
    # 60,000 groups crash llama-cpp-python; refused before any recursion here
    assert _code("root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000) == "guided_grammar_too_deep"


def test_left_recursion_check_cost_is_bounded() -> None:
    chain = "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1} | a{i + 1}\n" for i in range(40))
    assert _code(chain + 'a40 ::= "x"\n') == "guided_grammar_too_large"
    small = "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1} | a{i + 1}\n" for i in range(8))
    assert _code(small + 'a8 ::= "x"\n') is None


def test_unrolled_elements_are_bounded() -> None:
    assert _code('root ::= "' + "a" * 1000 + '"{1000}') == "guided_grammar_too_large"
    assert _code('root ::= "' + "a" * 10 + '"{1000}') is None


@pytest.mark.parametrize(
    "text",
    [
        'root ::= "[" root? root? "]"',  # each "[" nests two ways
        'root ::= "[" x{2} "]"\nx ::= root | ',  # the same, counted
        'root ::= "[" ws root? "]"\nws ::= " "? root?',  # a whitespace rule that may hold one
        # the backend-llamacpp-grammar campaign's shape (issue 24): JSON's ws may hold a value
        'root ::= value\nvalue ::= "x" | array\narray ::= "[" ws (value ("," ws value)*)? "]" ws\n'
        'ws ::= ([ \\t\\n] ws)? r\nr ::= value | "ab" | \n',
    ],
)
def test_ambiguous_recursion_is_refused(text: str) -> None:
    """llama.cpp keeps a parse stack per reading: these double theirs with every level of
    nesting generated (seconds a token after a dozen tokens in llama-cpp-python 0.3.36)."""
    assert _code(text) == "guided_grammar_unsafe"


@pytest.mark.parametrize(
    "text",
    [
        'root ::= "[" root? ("," root)* "]"',  # optional first element: one reading
        'root ::= "[" root? "]" root?',  # the second reference after a terminal
        'root ::= x? y\nx ::= "a"\ny ::= "a"',  # ambiguous, but no recursion to multiply
        'root ::= "(" ws root? ")" | "x"\nws ::= [ \\t]*',  # ws holds no rule of the recursion
    ],
)
def test_unambiguous_recursion_is_admitted(text: str) -> None:
    assert _code(text) is None


# Repetitions whose element can end where the next begins: llama.cpp keeps a parse stack per
# position the ended element could be in (guard/guided/grammar/_stacks.py). Each with the
# guard's estimate and the dearest token mask measured in llama-cpp-python 0.3.36 (4,096-token
# vocabulary, 100 tokens of forced letters, side by side with the look-alikes below, whose masks
# cost 0.0016-0.0034 s; 2026-12-07, a shared 2-core machine).
READ_MANY_WAYS = [
    # ~4,000 stacks; 0.092 s after 150 letters and growing with the text (the campaign: 1.95 s)
    'root ::= item+ | item+\nitem ::= [a-z]{1,999} (" "){0,3}\n',
    "root ::= item+\nitem ::= [a-z]{1,999}\n",  # ~2,000; 0.024 s after 150 letters, growing
    "root ::= item+\nitem ::= [a-z]{1,99}\n",  # ~200; 0.016 s
    # ~60 stacks a loop, admitted alone (below); two loops reading the same letters: twice that
    "root ::= item+ | item+\nitem ::= [a-z]{1,30}\n",
    'root ::= ([a-z]{1,30} " "?){1,30}\n',  # ~900 (30 x 30 positions); 0.196 s
    'root ::= ([a-z]{1,20} " "?){1,20}\n',  # ~400; 0.073 s
    "root ::= x\nx ::= [a-z]{1,150} x | [a-z]\n",  # right recursion: ~150
    'root ::= ws{9} "x"\nws ::= [ ]{0,30}\n',  # the copies of one rule: ~250
    # backend-llamacpp-grammar seed 4 (issue 24), minimised: admitted before, over 29 s of CPU
    # in the third mask ("\n"{1,9} runs into 16 copies of a group that may hold "\n": ~130)
    'root ::= r269  r269  "\\n"{1,9} ( ([^2x]+   r269)?\r){16}\nr269 ::= ( "\u00e9" | )  |  r150\n'
    'r150 ::= "ab"',
    # seed 4 after the fix, minimised: 30 copies of an optional letter, 1.97 s in a mask
    'root::=[z]{0} (" " [a-z]?{30})',
]

READ_ONE_WAY = [
    'root ::= [a-z]{1,30} (" " [a-z]{1,30})*\n',  # separated: one reading
    'root ::= item+\nitem ::= [a-z]{1,999} " "\n',  # 0.0019 s
    'root ::= item+\nitem ::= [a-z]+ " "?\n',  # ambiguous, one looping position: 0.0022 s
    "root ::= item+\nitem ::= [a-z]{1,30}\n",  # ~60: 0.0052 s, under the budget
    "root ::= (ws value)+\nvalue ::= [a-z]+ | [0-9]+\nws ::= [ \\t\\n]*\n",  # 0.0034 s
    "root ::= (ws value)+ ws\nvalue ::= [a-z]+ | [0-9]{1,10}\nws ::= [ \\t\\n]{0,20}\n",
    'root ::= (ws ws "x")+\nws ::= [ ]{0,30}\n',  # 0.0019 s
    # one item running into the next, once: as many stacks as the next can be in (0.002-0.0025 s)
    "root ::= .{1,799} .{1,799}\n",
    "root ::= [a-z]{1,999} [a-z]{1,999}\n",
    'root ::= .{0,200} "\\n"\n',  # the last character may be the "\n": two stacks, not 200
    'root ::= [0-9]?{3} "x"',  # a few optional copies
    'root ::= "a" (" "?){4} "b"',
    'root ::= line+\nline ::= [^\\n]{1,200} "\\n"\n',
    'root ::= (key "=" value "\\n")+\nkey ::= [a-zA-Z_]{1,64}\nvalue ::= [^\\n]{0,256}\n',
    'root ::= sentence+\nsentence ::= word (" " word)* [.!?] " "?\nword ::= [A-Za-z]{1,20}\n',
]


@pytest.mark.parametrize("text", READ_MANY_WAYS)
def test_repetition_read_many_ways_is_refused(text: str) -> None:
    assert _code(text) == "guided_grammar_unsafe"


@pytest.mark.parametrize("text", READ_ONE_WAY)
def test_repetition_read_few_ways_is_admitted(text: str) -> None:
    assert _code(text) is None


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.gbnf")))
def test_llama_cpp_grammars_keep_few_stacks(name: str) -> None:
    """llama.cpp's own grammars estimate at most 10 stacks (arithmetic.gbnf and chess.gbnf: a
    term's trailing whitespace may be the "\\n" after it): a tenth of the default budget."""
    assert _code((DATA / name).read_text(), replace(LIMITS, max_stacks=10)) is None


def test_the_estimate_follows_the_positions_of_the_repetition() -> None:
    """``item+`` with ``item ::= [a-z]{1,k}``: k positions an item can end in, counted for the
    loop and again where it starts: 2k + 1."""
    for k in (5, 50, 500):
        text = f"root ::= item+\nitem ::= [a-z]{{1,{k}}}\n"
        assert _code(text, replace(LIMITS, max_stacks=2 * k + 1)) is None
        assert _code(text, replace(LIMITS, max_stacks=2 * k)) == "guided_grammar_unsafe"


def test_the_stack_budget_is_the_policys() -> None:
    body: dict[str, object] = {"grammar": "root ::= item+\nitem ::= [a-z]{1,99}\n"}
    assert _check(body) == "guided_grammar_unsafe"
    assert _check(body, GuidedLimits(max_grammar_stacks=200)) is None


def _check(body: dict[str, object], limits: GuidedLimits | None = None) -> str | None:
    try:
        check_guided_decoding(body, limits or GuidedLimits())
    except GuardError as e:
        return e.code
    return None


def test_the_grammar_field_is_read_as_llama_cpp_reads_it() -> None:
    assert _check({"grammar": "o"}) == "guided_grammar_invalid"
    assert _check({"grammar": (DATA / "json.gbnf").read_text()}) is None
    # vLLM's grammar fields may be Lark or xgrammar EBNF: not read as GBNF
    assert _check({"structured_outputs": {"grammar": 'start: "a"'}}) is None


def _tool_body(pattern: str, choice: object) -> dict[str, object]:
    params = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}
    return {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
        "tool_choice": choice,
    }


def test_schemas_llama_cpp_python_converts() -> None:
    rf = {"response_format": {"type": "json_object", "schema": {"pattern": "^\\d+$"}}}
    assert _check(rf) == "guided_schema_grammar_invalid"
    named = {"type": "function", "function": {"name": "f"}}
    assert _check(_tool_body("^\\d+$", named)) == "guided_schema_grammar_invalid"
    assert _check(_tool_body("^[0-9]+$", named)) is None
    assert _check(_tool_body("^\\d+$", "auto")) is None  # not converted then
    legacy = {"functions": [{"name": "f", "parameters": {"enum": ["\f"]}}]}
    assert _check({**legacy, "function_call": {"name": "f"}}) == "guided_schema_grammar_invalid"
    deep = {
        "response_format": {"type": "json_object", "schema": {"type": "string", "maxLength": 6000}}
    }
    assert _check(deep) == "guided_schema_grammar_too_large"
    ok = {
        "response_format": {"type": "json_object", "schema": {"type": "string", "maxLength": 1000}}
    }
    assert _check(ok) is None
    # json_schema is vLLM's (llama-cpp-python 0.3.36 refuses the type): not converted
    vllm = {"response_format": {"type": "json_schema", "json_schema": {"schema": rf}}}
    assert _check(vllm) is None
    off = GuidedLimits(llama_cpp_schemas=False)
    assert _check(rf, off) is None


def test_converter_failures_fall_back_and_pass() -> None:
    # the converter raises on (?:...), llama-cpp-python then uses its JSON grammar
    assert schema_grammar_problem({"pattern": "^(?:a)$"}, GuidedLimits()) is None
    assert list(llama_cpp_schemas({"tool_choice": {"function": {"name": "g"}}})) == []
