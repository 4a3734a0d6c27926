"""The attack corpus as data: every file valid, every class covered, bodies bounded and
deterministic, and the loader, generators and writer behaving as documented.

Nothing here imports the guard: the corpus must load without it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from payloads import (
    BENIGN,
    CLASSES,
    DEFAULT_ROOT,
    GeneratorError,
    PayloadError,
    finding_id,
    load_corpus,
    load_payload,
    parse_payload,
    save_found,
)
from payloads import _generate as gen
from tests._support import REPO_ROOT

REPO = REPO_ROOT
THREATS = (REPO / "docs" / "THREATS.md").read_text(encoding="utf-8")

MIN_VARIANTS_PER_CLASS = 3
MIN_BENIGN = 20
MIN_ATTACKS = 60
MAX_CORPUS_DISK_BYTES = 500_000
# The guard's default body cap (limits.body.max_body_bytes): a pipeline payload must reach the
# checks over HTTP too, so it must not be refused for its size first.
GUARD_MAX_BODY_BYTES = 4 * 1_048_576
# Rows of the THREATS.md table and the class each one is.
THREAT_ROWS = {
    "nested prompt template": "nested_prompt_template",
    "request-supplied chat template": "request_chat_template",
    "template kwargs": "template_kwargs",
    "fan-out parameters": "fan_out",
    "guided-decoding grammars": "guided_decoding",
    "JSON body bombs": "json_body_bomb",
    "HTTP framing": "http_framing",
    "multimodal fan-out": "multimodal_fan_out",
    "ReDoS in parsers": "redos_parser",
    "volume": "volume",
    "upstream control fields": "upstream_control",
}
OTHER_REFERENCES = {"SEED.md", "OWASP-LLM10", "TGI-defaults"}


def _advisory_ids(text: str) -> set[str]:
    """Advisory ids in THREATS.md, with its shorthand expanded (CVE-2025-48942/48943/48944)."""
    ids = set(re.findall(r"GHSA-[0-9a-z]{4}-[0-9a-z]{4}-[0-9a-z]{4}|PYSEC-\d{4}-\d+", text))
    for prefix, first, rest in re.findall(r"(CVE-\d{4}-)(\d+)((?:/\d+)*)", text):
        ids.update(prefix + n for n in [first, *rest.split("/")[1:]])
    return ids


ADVISORIES = _advisory_ids(THREATS)

CORPUS = load_corpus(include_public=True)
FILES = sorted(
    p
    for sub in ("attacks", "benign", "found", "public")
    for p in (DEFAULT_ROOT / sub).rglob("*.yaml")
)
# Where a public/ payload was copied from: a URL, or a package and the file in it.
SOURCE_REFERENCE = re.compile(r"https://\S+|(pypi|debian):\S+")


def _ids(items: list[Any]) -> list[str]:
    return [p.id for p in items]


# ---- the corpus ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_file_loads_and_is_named_by_its_id(path: Path) -> None:
    payload = load_payload(path)
    assert payload.id == path.stem
    assert payload.description and payload.target_field


def test_ids_are_unique() -> None:
    ids = _ids(CORPUS)
    assert len(ids) == len(set(ids)) == len(FILES)


def test_classes_match_threats_table() -> None:
    rows = re.findall(r"^\| ([^|]+?) \|", THREATS, flags=re.MULTILINE)
    labels = [r for r in rows if r not in ("class",) and not set(r) <= {"-"}]
    assert labels == list(THREAT_ROWS), "THREATS.md's table changed: update CLASSES and THREAT_ROWS"
    assert tuple(THREAT_ROWS.values()) == CLASSES


def test_every_class_has_variants_and_enough_benign() -> None:
    counts = {c: 0 for c in (*CLASSES, BENIGN)}
    for p in CORPUS:
        counts[p.class_] += 1
    thin = {c: n for c, n in counts.items() if c != BENIGN and n < MIN_VARIANTS_PER_CLASS}
    assert not thin, f"classes with fewer than {MIN_VARIANTS_PER_CLASS} variants: {thin}"
    assert counts[BENIGN] >= MIN_BENIGN
    assert sum(n for c, n in counts.items() if c != BENIGN) >= MIN_ATTACKS


def test_every_class_has_a_pipeline_variant_except_framing() -> None:
    # Most classes must be judged by the pipeline itself; framing is the HTTP layer's.
    judged = {p.class_ for p in CORPUS if p.layer == "pipeline"}
    assert set(CLASSES) - judged == {"http_framing"}


def test_kind_and_class_filters() -> None:
    attacks = load_corpus(kind="attack", include_public=True)
    benign = load_corpus(kind="benign", include_public=True)
    assert all(p.kind == "attack" for p in attacks)
    assert all(p.kind == "benign" and p.expect.allowed for p in benign)
    assert len(attacks) + len(benign) == len(CORPUS)
    public = set(_ids(benign)) - set(_ids(load_corpus(kind="benign")))
    assert public and all("public" in p.path.parts for p in benign if p.id in public)
    fan = load_corpus(classes=["fan_out"])
    assert fan and {p.class_ for p in fan} == {"fan_out"}
    assert _ids(load_corpus(classes="fan_out")) == _ids(fan)
    with pytest.raises(ValueError, match="unknown class"):
        load_corpus(classes=["fanout"])
    with pytest.raises(ValueError, match="kind"):
        load_corpus(kind="attacks")  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", CORPUS, ids=_ids(CORPUS))
def test_payload_metadata(payload: Any) -> None:
    if payload.kind == "attack":
        assert payload.expect.status >= 400
        if payload.source == "curated":
            # Fuzz findings carry their measured cost instead; the guard e2e test checks them.
            assert payload.expect.code
            assert payload.references, "cite the published case (THREATS.md) behind the attack"
        if payload.source == "curated":
            assert payload.profiles.vulnerable and payload.profiles.hardened
    public = payload.path.parent.parent.name == "public"
    if public:
        assert payload.kind == "benign", "public/ holds ordinary traffic only"
        assert any(SOURCE_REFERENCE.fullmatch(r) for r in payload.references), (
            "name the public source it was copied from (a URL, or pypi:/debian: package and path)"
        )
    for ref in payload.references:
        if public and SOURCE_REFERENCE.fullmatch(ref):
            continue
        if re.fullmatch(
            r"(GHSA-[0-9a-z]{4}-[0-9a-z]{4}-[0-9a-z]{4}|CVE-\d{4}-\d+|PYSEC-\d{4}-\d+)", ref
        ):
            assert ref in ADVISORIES, f"{ref} is not in THREATS.md"
        elif "#" in ref:
            number = ref.rsplit("#", 1)[1]
            assert number.isdigit() and re.search(rf"\b{number}\b", THREATS), ref
        else:
            assert ref in OTHER_REFERENCES, ref
    if payload.class_ == "http_framing":
        assert payload.layer == "http"
    if payload.layer == "http":
        # Benign look-alikes of framing attacks (a model id outside Latin-1) are judged there too.
        assert payload.class_ in ("http_framing", "benign") or "flood" in payload.tags
    else:
        assert payload.transport is None
    # An OpenAI route, or one of vLLM's own the payload asks the policy to proxy (`routes`).
    assert payload.endpoint.startswith("/v1/") or payload.endpoint in payload.routes


# ---- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", CORPUS, ids=_ids(CORPUS))
def test_body_within_bound_and_well_formed(payload: Any) -> None:
    body = payload.body_bytes()
    assert len(body) <= payload.size_bound <= gen.MAX_OUT_BYTES
    assert body or payload.method == "GET"  # a GET route takes no body
    if payload.layer == "pipeline":
        assert len(body) <= GUARD_MAX_BODY_BYTES
    if not payload.raw:
        try:
            assert isinstance(json.loads(body), dict | list)
        except RecursionError:  # deeper than the parser recurses: check the brackets instead
            assert _balanced(body)
    headers = payload.header_items()
    assert any(k.lower() == "content-type" for k, _ in headers)
    literal = sum(len(k) + len(v) + 4 for k, v in payload.headers.items())
    generated = sum(len(k) + len(v) + 4 for k, v in headers) - literal
    assert generated <= payload.header_bound + 64  # + the default content-type
    assert body == payload.body_bytes(), "bodies must be the same on every call"


def _balanced(body: bytes) -> bool:
    """Brackets outside strings balance (iteratively: no recursion on deep bodies)."""
    stack: list[int] = []
    pairs = {ord("]"): ord("["), ord("}"): ord("{")}
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string = False
        elif byte == ord('"'):
            in_string = True
        elif byte in (ord("["), ord("{")):
            stack.append(byte)
        elif byte in pairs and (not stack or stack.pop() != pairs[byte]):
            return False
    return not stack and not in_string


def test_total_corpus_on_disk_is_small() -> None:
    total = sum(p.stat().st_size for p in DEFAULT_ROOT.rglob("*") if p.is_file())
    assert total < MAX_CORPUS_DISK_BYTES, f"payloads/ holds {total} bytes; use generators"


def test_big_bodies_come_from_generators() -> None:
    for p in CORPUS:
        if p.size_bound > 16_384:
            assert p.generated, f"{p.id}: a body over 16 KB belongs in a generator"


_DIGESTS = """
import hashlib, json, sys
from payloads import load_corpus
print(json.dumps({p.id: hashlib.sha256(p.body_bytes()).hexdigest() for p in load_corpus(include_public=True)}))
"""


def test_generators_are_deterministic_across_processes() -> None:
    here = {p.id: hashlib.sha256(p.body_bytes()).hexdigest() for p in CORPUS}
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _DIGESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout) == here


# ---- specific shapes -------------------------------------------------------------------------


def _by_id(pid: str) -> Any:
    (payload,) = [p for p in CORPUS if p.id == pid]
    return payload


def test_seed_payload_is_the_seed() -> None:
    body = _by_id("npt-seed").body_json()
    assert body["prompt_template"] == "{{" * 1024 + "system_prompt}}" * 512


def test_gzip_bomb_inflates_to_its_declared_size() -> None:
    payload = _by_id("hf-gzip-bomb")
    data = payload.body_bytes()
    assert dict(payload.header_items())["content-encoding"] == "gzip"
    assert len(data) < 100_000
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    head = b""
    chunk = data
    while chunk:  # bounded steps: never holds the inflated body
        out = inflater.decompress(chunk, 1 << 20)
        if not head:
            head = out[:64]
        total += len(out)
        chunk = inflater.unconsumed_tail
    total += len(inflater.flush())
    assert head.startswith(b'{"model":"schedguard-ref"')
    assert total > 48 * 1_048_576
    assert total / len(data) > 500


def test_png_bomb_is_a_valid_png_of_the_declared_size() -> None:
    body = _by_id("mm-png-bomb").body_json()
    url = body["messages"][0]["content"][1]["image_url"]["url"]
    png = base64.b64decode(url.split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (12000, 12000)
    (idat_len,) = struct.unpack(">I", png[33:37])
    assert png[37:41] == b"IDAT"
    idat = png[41 : 41 + idat_len]
    assert (
        zlib.crc32(b"IDAT" + idat) & 0xFFFFFFFF == struct.unpack(">I", png[41 + idat_len :][:4])[0]
    )
    inflater = zlib.decompressobj()
    total = len(inflater.decompress(idat))
    assert total == height * (1 + math.ceil(width / 8))


def test_video_frames_are_counted_by_commas() -> None:
    body = _by_id("mm-video-jpeg-frames").body_json()
    url = body["messages"][0]["content"][1]["video_url"]["url"]
    header, frames = url.split(",", 1)
    assert header == "data:video/jpeg;base64"
    parts = frames.split(",")
    assert len(parts) == 1000
    assert base64.b64decode(parts[0])[:2] == b"\xff\xd8"


def test_many_headers_are_generated() -> None:
    headers = _by_id("hf-many-headers").header_items()
    names = [k for k, _ in headers if k.startswith("x-h-")]
    assert len(names) == len(set(names)) == 5000


# ---- generator language ----------------------------------------------------------------------


def _json(spec: Any) -> bytes:
    return gen.materialise_json(gen.parse_expr(spec))


def _bytes(spec: Any) -> bytes:
    return gen.materialise_bytes(gen.parse_expr(spec))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"$repeat": ["ab", 3]}, b'"ababab"'),
        ({"$repeat": {"value": "x", "times": 0}}, b'""'),
        ({"$concat": ["a", {"$repeat": ["b", 2]}, "c"]}, b'"abbc"'),
        ({"$list": {"item": {"a": 1}, "times": 3}}, b'[{"a":1},{"a":1},{"a":1}]'),
        (
            {"$object": {"key_prefix": "k", "times": 3, "value": None}},
            b'{"k0":null,"k1":null,"k2":null}',
        ),
        ({"$nest": {"depth": 3, "key": "a", "inner": 1}}, b'{"a":{"a":{"a":1}}}'),
        ({"$nest": {"depth": 2, "key": None, "inner": []}}, b"[[[]]]"),
        ({"x": {"$json": {"a": [1, "b"]}}}, b'{"x":"{\\"a\\":[1,\\"b\\"]}"}'),
        ({"x": {"$raw_json": "[[["}}, b'{"x":[[[}'),
        ({"$b64": {"$hex": "00 ff"}}, b'"AP8="'),
        ({"t": float("nan"), "u": "é"}, '{"t":NaN,"u":"é"}'.encode()),
        ("__import__('os').system('true')", b"\"__import__('os').system('true')\""),
    ],
)
def test_generator_operations(spec: Any, expected: bytes) -> None:
    node = gen.parse_expr(spec)
    out = gen.materialise_json(node)
    assert out == expected
    assert len(out) <= gen.json_bound(node)


def test_bytes_operations_and_bounds() -> None:
    spec = {"$concat": ["ab", {"$hex": "c3 28"}, {"$repeat": [{"$hex": "00"}, 5]}]}
    node = gen.parse_expr(spec)
    assert node.kind == "bytes"
    assert gen.materialise_bytes(node) == b"ab\xc3\x28" + b"\x00" * 5 == _bytes(spec)
    assert node.out == 9
    data = _bytes({"$gzip": {"$repeat": ["abc", 100_000]}})
    assert gzip.decompress(data) == b"abc" * 100_000
    assert data[4:8] == b"\x00\x00\x00\x00"  # mtime 0: deterministic
    assert _bytes({"$gzip": {"$repeat": ["abc", 100_000]}}) == data
    png = _bytes({"$png": {"width": 100, "height": 50, "rows": 0}})
    assert struct.unpack(">II", png[16:24]) == (100, 50)
    assert gen.parse_expr({"$png": {"width": 100, "height": 50}}).out >= len(
        _bytes({"$png": {"width": 100, "height": 50}})
    )


def test_raw_json_and_nest_mark_raw_only_when_spliced() -> None:
    assert gen.splices_raw(gen.parse_expr({"a": [{"b": {"$raw_json": "{"}}]}))
    assert not gen.splices_raw(gen.parse_expr({"a": {"$nest": {"depth": 2, "key": "x"}}}))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"$eval": "1+1"}, "unknown operation"),
        ({"$repeat": ["a", 2], "other": 1}, "only key"),
        ({"$repeat": ["a", -1]}, "integer from 0"),
        ({"$repeat": ["a", True]}, "integer from 0"),
        ({"$repeat": ["a", 1 << 40]}, "integer from 0"),
        ({"$repeat": [{"$repeat": ["abcdefgh", 1 << 20]}, 64]}, "cap"),
        ({"a": {"$hex": "00"}}, "needs text or json"),
        ({"$list": {"item": 1}}, "missing"),
        ({"$list": {"item": 1, "times": 2, "extra": 0}}, "unknown argument"),
        ({"$hex": "zz"}, r"\$hex"),
        ({"$nest": {"depth": 2, "key": 5}}, "key must be"),
        ({1: 2}, "keys must be strings"),
        ({"$b64": {"a": 1}}, "needs text or bytes"),
    ],
)
def test_generator_errors(spec: Any, message: str) -> None:
    with pytest.raises(GeneratorError, match=message):
        gen.parse_expr(spec)


def test_out_cap_is_checked_before_building() -> None:
    with pytest.raises(GeneratorError, match="cap"):
        gen.check_out(gen.parse_expr({"$repeat": ["abcdefgh", 9 << 20]}).out, "body")


# ---- loader errors ---------------------------------------------------------------------------


def _write(root: Path, rel: str, data: dict[str, Any]) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _attack(pid: str, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": pid,
        "class": "fan_out",
        "description": "d",
        "target_field": "n",
        "endpoint": "/v1/completions",
        "body": {"model": "m", "prompt": "hi", "n": 100},
        "expect": {"status": 400, "code": "n_exceeded"},
        "references": ["GHSA-3mwp-wvh9-7528"],
    }
    record.update(extra)
    return record


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"class": "fanout"}, "class: unknown class"),
        ({"surprise": 1}, "unknown field"),
        ({"expect": {"status": 200}}, "must be refused"),
        ({"expect": {"status": 400}}, "expect.code: required"),
        ({"expect": {"status": 400, "code": "Bad Code"}}, "snake_case"),
        ({"body_text": "{}"}, "exactly one of"),
        ({"body": [1, 2]}, "JSON object"),
        ({"id": "Upper"}, "id:"),
        ({"endpoint": "v1/x"}, "endpoint"),
        ({"layer": "tcp"}, "layer"),
        ({"transport": {"chunk_size": 1}}, "only layer: http"),
        ({"raw": True}, "raw"),
        ({"profiles": {"vulnerable": "melted"}}, "profiles.vulnerable"),
        ({"headers": {"x-a": "b\r\nc"}}, "CR or LF"),
        ({"headers": {"bad name": "b"}}, "invalid header name"),
        ({"references": "GHSA"}, "references"),
        ({"routes": ["/score"]}, "not the payload's own endpoint"),
        ({"routes": ["score"]}, "not a plain absolute path"),
        ({"found": {"target": "t"}}, "source: fuzz"),
        ({"source": "fuzz"}, "needs found and cost"),
        ({"generator": {"json": {"$repeat": ["a", 2]}, "bytes": "x"}}, "not both"),
    ],
)
def test_loader_names_file_and_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    record = _attack("a1")
    if "generator" in change:
        del record["body"]
    record.update(change)
    path = _write(tmp_path, "attacks/fan_out/a1.yaml", record)
    with pytest.raises(PayloadError, match=message) as info:
        load_payload(path)
    assert str(path) in str(info.value)


def test_corpus_checks_directories_and_duplicates(tmp_path: Path) -> None:
    _write(tmp_path, "attacks/fan_out/a1.yaml", _attack("a1"))
    _write(tmp_path, "attacks/fan_out/a2.yaml", _attack("a2"))
    assert _ids(load_corpus(tmp_path)) == ["a1", "a2"]
    _write(tmp_path, "attacks/volume/a3.yaml", _attack("a3"))
    with pytest.raises(PayloadError, match="does not match its directory"):
        load_corpus(tmp_path)
    (tmp_path / "attacks/volume/a3.yaml").unlink()
    _write(
        tmp_path, "benign/a1.yaml", _attack("a1", **{"class": "benign", "expect": {"status": 200}})
    )
    with pytest.raises(PayloadError, match="also used by"):
        load_corpus(tmp_path)


def test_benign_expectations(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "benign/b.yaml",
        _attack("b", **{"class": "benign", "expect": {"status": 200, "code": "n_exceeded"}}),
    )
    with pytest.raises(PayloadError, match="benign payloads expect"):
        load_payload(path)


def test_parse_payload_accepts_the_documented_example() -> None:
    p = parse_payload(
        {
            "id": "x",
            "class": "nested_prompt_template",
            "description": "seed",
            "target_field": "prompt_template",
            "endpoint": "/v1/completions",
            "generator": {
                "json": {
                    "model": "m",
                    "prompt_template": {
                        "$concat": [
                            {"$repeat": ["{{", 1024]},
                            {"$repeat": ["system_prompt}}", 512]},
                        ]
                    },
                },
                "headers": [{"name": "x-pad", "value": {"$repeat": ["a", 3]}, "count": 2}],
            },
            "expect": {"status": 400, "code": "template_depth_exceeded"},
        },
        Path("x.yaml"),
    )
    assert p.size_bound == len(p.body_bytes())
    assert p.header_items() == [
        ("content-type", "application/json"),
        ("x-pad-0", "aaa"),
        ("x-pad-1", "aaa"),
    ]
    assert not p.raw and p.generated


# ---- fuzz findings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","prompt_template":"' + b"{{" * 40 + b'"}',
        b"\xff\xfe not utf-8 \x00",
        "line one\r\nline two \u2028 \t tab \x1b esc".encode(),
    ],
)
def test_save_found_round_trips(tmp_path: Path, body: bytes) -> None:
    saved = save_found(
        target="placeholder-vulnerable",
        class_="nested_prompt_template",
        body=body,
        endpoint="/v1/completions",
        target_field="prompt_template",
        description="found by the search engine",
        engine="search",
        cause="template_depth",
        cost_before={"wall_s": 2.5, "peak_rss_bytes": 900_000_000, "size_bytes": 4096},
        cost_after={"wall_s": 2.1, "peak_rss_bytes": 800_000_000, "size_bytes": len(body)},
        seed=7,
        root=tmp_path,
    )
    assert saved.body_bytes() == body
    assert saved.id == finding_id("placeholder-vulnerable", body)
    assert saved.path == tmp_path / "found" / "placeholder-vulnerable" / f"{saved.id}.yaml"
    assert saved.source == "fuzz" and saved.finding is not None and saved.cost is not None
    assert saved.finding.target == "placeholder-vulnerable" and saved.finding.seed == 7
    assert saved.cost.before["wall_s"] == 2.5 and saved.cost.after["size_bytes"] == len(body)
    assert saved.expect.status == 400 and saved.expect.code is None
    assert saved.raw
    again = save_found(
        target="placeholder-vulnerable",
        class_="nested_prompt_template",
        body=body,
        endpoint="/v1/completions",
        target_field="prompt_template",
        description="the same input again",
        engine="atheris",
        cause="template_depth",
        cost_before={},
        cost_after={},
        root=tmp_path,
    )
    assert again.finding is not None and again.finding.engine == "search"  # kept, not rewritten
    assert _ids(load_corpus(tmp_path)) == [saved.id]
    assert load_corpus(tmp_path, include_found=False) == []


def test_save_found_refuses_bad_records(tmp_path: Path) -> None:
    args: dict[str, Any] = {
        "body": b"{}",
        "endpoint": "/v1/completions",
        "target_field": "body",
        "description": "d",
        "engine": "search",
        "cause": "c",
        "cost_before": {},
        "cost_after": {},
        "root": tmp_path,
    }
    with pytest.raises(PayloadError, match="class"):
        save_found(target="t", class_="benign", **args)
    with pytest.raises(PayloadError, match="target"):
        save_found(target="../escape", class_="fan_out", **args)
    with pytest.raises(PayloadError, match=r"cost\.before\.wall_s"):
        save_found(target="t", class_="fan_out", **{**args, "cost_before": {"wall_s": -1}})
    assert not (tmp_path / "found").exists() or not list((tmp_path / "found").rglob("*.yaml"))


def test_a_yaml_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("id: x\nclass: [a\n")
    with pytest.raises(PayloadError) as exc:
        load_payload(path)
    said = str(exc.value)
    assert f'in "{path}", line 2, column 8' in said
    assert "<unicode string>" not in said and "\n" not in said
