"""The guided-decoding limits: the policy's ``limits.guided`` section (see :mod:`guard._limits`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from guard._limits import LIMITS_CONFIG, PosFloat, PosInt

__all__ = ["CALIBRATION_VOCAB", "GuidedLimits"]

# The vocabulary the cost models were calibrated at; the size assumed where no tokenizer is known.
CALIBRATION_VOCAB = 32_768


@dataclass(frozen=True, config=LIMITS_CONFIG)
class GuidedLimits:
    """Limits for guided-decoding constraints. Counts "per request" are summed over all
    regexes, schemas or grammars in one request body."""

    # Regexes. RE2 compile time grows with program size (~0.3 µs per instruction), so the
    # program size caps bound it; the structural scan estimates the size before compiling.
    max_regex_length: PosInt = Field(default=2048, description="Longest regex, in characters.")
    max_regex_nesting: PosInt = Field(default=32, description="Deepest group nesting in a regex.")
    max_regex_repeat_product: PosInt = Field(
        default=1000, description="Largest product of nested `{m,n}` counts (`a{100}{100}{100}`)."
    )
    max_regex_program_size: PosInt = Field(
        default=10_000,
        description="Largest RE2 program for one regex (compile time grows with it).",
    )
    max_regex_ambiguous_ways: PosInt = Field(
        default=4096, description="Most ways nested repetition can match the same text (`(a+)+b`)."
    )
    max_regex_adjacent_unbounded: PosInt = Field(
        default=4, description="Most adjacent unbounded repetitions over overlapping characters."
    )
    re2_max_mem: PosInt = Field(
        default=1 << 20, description="RE2's memory budget per regex, in bytes."
    )
    max_regexes: PosInt = Field(default=128, description="Most regexes per request.")
    max_regex_total_length: PosInt = Field(
        default=16_384, description="Most regex characters per request."
    )
    max_regex_total_program_size: PosInt = Field(
        default=50_000, description="Largest summed RE2 program size per request."
    )
    # JSON schemas.
    max_schema_depth: PosInt = Field(
        default=64, description="Deepest JSON-schema nesting, also after `$ref` expansion."
    )
    max_schema_nodes: PosInt = Field(
        default=10_000, description="Most schema nodes per request, after `$ref` expansion."
    )
    max_schema_chars: PosInt = Field(
        default=262_144, description="Most characters of schema keys and strings per request."
    )
    max_schema_refs: PosInt = Field(default=256, description="Most `$ref` per request.")
    allow_recursive_refs: bool | Literal["auto"] = Field(
        default="auto",
        description="Accept a recursive `$ref` (OpenAI's structured-outputs guide uses them: a "
        "UI component whose `children` are components). Grammar backends (xgrammar, "
        "guidance, llama.cpp's converter) make a recursive rule of it; outlines expands it "
        "into a regex without end. `auto` (default): accepted unless `backends` is outlines "
        "alone (vLLM pinned to outlines); `true`/`false`: always/never.",
    )
    max_schema_enum: PosInt = Field(default=1024, description="Largest `enum`.")
    max_schema_length_bound: PosInt = Field(
        default=10_000, description="Largest `minLength` / `maxLength`."
    )
    max_schema_items_bound: PosInt = Field(
        default=1_000, description="Largest `minItems`, `maxItems`, `minProperties`, ..."
    )
    max_schema_number: PosFloat = Field(
        default=1e15, description="Largest magnitude of `minimum`, `maximum`, `multipleOf`, ..."
    )
    max_schemas: PosInt = Field(default=128, description="Most JSON schemas per request.")
    max_schema_bound_product: PosInt = Field(
        default=1_000_000,
        description="Largest product of the size bounds nested along one path of a schema "
        "(`minItems`/`maxItems` of each array level times the `minLength`/`maxLength` "
        "inside): each within its cap, the product is what gets unrolled.",
    )
    # Grammars (GBNF, EBNF, Lark).
    max_grammar_chars: PosInt = Field(
        default=32_768, description="Longest grammar (GBNF, EBNF, Lark)."
    )
    max_grammar_depth: PosInt = Field(
        default=64, description="Deepest grammar nesting (llama.cpp recurses once per group)."
    )
    max_grammar_rules: PosInt = Field(default=1024, description="Most grammar rules.")
    max_grammar_repeat: PosInt = Field(
        default=1000, description="Largest product of nested `{m,n}` in a grammar."
    )
    max_grammar_repeat_total: PosInt = Field(
        default=10_000, description="Largest sum of `{m,n}` counts in one grammar."
    )
    # llama.cpp's GBNF parser (guard/guided/grammar/_gbnf.py): a grammar it refuses crashes
    # llama-cpp-python, so the `grammar` field is read as llama.cpp reads it.
    max_grammar_elements: PosInt = Field(
        default=262_144,
        description="Most elements llama.cpp builds of one grammar (characters of literals and "
        "classes, rule references, 4 a rule), after unrolling `{m,n}`: "
        '`"<30 KB>"{2000}` is 60 million.',
    )
    max_grammar_steps: PosInt = Field(
        default=100_000,
        description="Most calls of llama.cpp's left-recursion check on one grammar (it has no "
        "memo: `a0 ::= a1 | a1`, `a1 ::= a2 | a2`, ... costs 2^n; the number also bounds the "
        "parse stacks it builds at the start).",
    )
    max_grammar_left_depth: PosInt = Field(
        default=4096,
        description="Longest chain of rule references at the left of rules (llama.cpp's "
        "left-recursion check recurses along it on its native stack).",
    )
    max_grammar_stacks: PosInt = Field(
        default=100,
        description="Most parse stacks llama.cpp may keep alive at once for one grammar, as "
        "estimated (guard/guided/grammar/_stacks.py): one per way of reading the text so far, "
        "and every token mask walks each. A repetition whose element can end where the next "
        "begins keeps one per position the element could end in: `item+` with `item ::= "
        "[a-z]{1,999}` up to 999 (measured: a mask costs about 0.1 ms more per stack over a "
        "4,096-token vocabulary, in proportion to a larger one). llama.cpp's own grammars "
        "estimate 1-10.",
    )
    llama_cpp_schemas: bool | Literal["auto"] = Field(
        default="auto",
        description="Build the grammar llama-cpp-python 0.3.36 makes of a JSON schema "
        "(`response_format` `json_object` with a `schema`, the `parameters` of the tool or "
        "function that `tool_choice` / `function_call` names) with its own converter, and "
        "refuse the schema (`guided_schema_grammar_invalid`) when llama.cpp could not parse "
        'that grammar (it crashes): a `pattern` such as `"^\\d+$"` (copied as `"\\d"`, an '
        "escape GBNF does not have), a `\\b` or `\\f` in a constant or a property name. "
        "`auto` (default): on, unless the upstream's kind in force (`upstream.kind`, set or "
        "read from its `/v1/models`: entries `owned_by: vllm`) is vLLM (it reads those "
        "schemas itself, and a `\\d` in a date pattern is fine there); read at start-up and on "
        "readiness, on until it answers. "
        "`true`/`false`: always/never (`false` in front of vLLM only).",
    )
    max_schema_grammar_depth: PosInt = Field(
        default=4096,
        description="Deepest group nesting in the grammar llama-cpp-python makes of a schema "
        "(a `maxLength` or `maxItems` of n nests n groups; llama.cpp's parser overflows its "
        "8 MB thread stack at ~19,250).",
    )
    # Structured-output backends (see guard/guided/_backends.py and bench/README.md).
    backends: tuple[Literal["xgrammar", "guidance", "outlines"], ...] = Field(
        default=("xgrammar", "guidance", "outlines"),
        description="The structured-output backends the upstream may use. The default is "
        "everything vLLM's `auto` reaches (outlines through its `patternProperties` "
        "fallback); name just one when vLLM is pinned to it (`--structured-outputs-config`); "
        "empty: no backend cost check.",
    )
    outlines_fallback: Literal["refuse", "bound"] = Field(
        default="refuse",
        description="With several backends named: `refuse` a request that `auto` would send "
        "to outlines (the engine keeps the first backend it builds, so one such request "
        "would put every later one on outlines), or `bound` its outlines cost only.",
    )
    vocab_size: PosInt | None = Field(
        default=None,
        description="Override of the model's vocabulary size, which backend costs grow with. "
        "`null` (default): the size of the tokenizer `limits.tokens.tokenizer` names (its "
        "`tokenizer.json` or tiktoken encoding: cl100k_base has 100,277), or 32,768 (the "
        "calibration vocabulary) where no tokenizer is known. Set it only when the tokenizer "
        "the guard counts with is not the model's.",
    )
    backend_max_compile_s: PosFloat = Field(
        default=10.0,
        description="Ceiling of one constraint's estimated cold compile on xgrammar or "
        "guidance, in CPU seconds at a 100,000-token vocabulary whatever the model's (a "
        "property of the constraint's shape; 400 `guided_backend_cost_exceeded` over it). A "
        "ceiling, not a budget: vLLM compiles in a thread pool off the engine loop and caches "
        "grammars by their text, so what a key spends over time, at the model's vocabulary, "
        "is the compile bucket's (`rate.guided_compile_s_per_minute`); this refuses only what "
        "ordinary applications do not send (measured with xgrammar 0.2.8 at cl100k_base: "
        "an address, an invoice or a resume with bounded fields 6-8.4 s; bench/README.md).",
    )
    outlines_max_compile_s: PosFloat = Field(
        default=1.0,
        description="The ceiling for a constraint outlines may compile (vLLM pinned to "
        "outlines, or `outlines_fallback: bound`), in CPU seconds at the model's vocabulary: "
        "strict, since outlines' index build has no timeout that stops it.",
    )
    backend_max_compile_mb: PosFloat = Field(
        default=256.0,
        description="Estimated compile memory (MiB) one constraint may cost on a backend.",
    )
    backend_max_mask_s: PosFloat = Field(
        default=0.05,
        description="Estimated token-mask seconds per generated token (xgrammar on nested "
        "ambiguous repetition pays this on every decode step, for the whole batch).",
    )
    # The compile budget's global caps (guard/admission/_compile.py), per guard replica.
    upstream_compile_workers: PosInt = Field(
        default=4,
        description="The upstream's compile pool: workers compiling one grammar each at a time "
        "(vLLM 0.32: `(cpu_count + 1) // 2` threads; 4 for an 8-core server). The guard gives "
        "the pool cold compiles (their estimates) at most this many CPU-seconds a second, "
        "`compile_queue_s` ahead; one API key at most half. Exact repeats are not cold. Over "
        "it: 503 `guided_compile_pool_busy` with `retry-after` (a key over its half: 429 "
        "`guided_compile_budget_exhausted`). Per replica: divide by the guard's replicas.",
    )
    compile_queue_s: PosFloat = Field(
        default=60.0,
        description="Seconds of cold-compile work the upstream's pool may have ahead of it "
        "(`upstream_compile_workers` x this many CPU-seconds at once; one key's half, 120 s "
        "by default, is a tenant's whole compile burst): an application warming its schemas "
        "is queued there, as vLLM queues it; a flood of new constraints is refused beyond it.",
    )
    max_cold_compiles_per_s: PosFloat = Field(
        default=50.0,
        description="Cold compiles admitted per second over all tenants (a bucket of five "
        "seconds' worth: a suite of 250 distinct schemas replayed at once passes; the benign "
        "corpus has ~60), so a flood of unique constraints, however cheap each, cannot churn "
        "the upstream's grammar cache; beyond it 503 `guided_compile_pool_busy`. Per replica.",
    )
    upstream_grammar_cache_mb: PosFloat = Field(
        default=512.0,
        description="The upstream's compiled-grammar cache (vLLM: `VLLM_XGRAMMAR_CACHE_MB`, "
        "512 by default): the guard remembers the constraints it admitted in an LRU of this "
        "size (each weighed by its estimated compiled size), and charges a constraint to the "
        "tenant's compile bucket only when it is not there (kind and text, as vLLM keys its "
        "cache). Per replica.",
    )
    # Choice lists.
    max_choices: PosInt = Field(default=256, description="Most `guided_choice` entries.")
    max_choice_chars: PosInt = Field(
        default=65_536, description="Most characters over all `guided_choice` entries."
    )

    def vocabulary(self, tokenizer: int | None = None) -> int:
        """The vocabulary size the backend costs are priced at: ``vocab_size`` when set, else
        ``tokenizer`` (the configured tokenizer's size), else :data:`CALIBRATION_VOCAB`."""
        return self.vocab_size or tokenizer or CALIBRATION_VOCAB

    @property
    def recursive_refs_allowed(self) -> bool:
        """Whether a recursive ``$ref`` is accepted (``allow_recursive_refs`` decided)."""
        if self.allow_recursive_refs == "auto":
            return self.backends != ("outlines",)
        return self.allow_recursive_refs
