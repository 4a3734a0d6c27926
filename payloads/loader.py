"""Load the attack corpus: one YAML file per payload, validated strictly, bodies built lazily.

Layout under the corpus root (``payloads/`` by default)::

    attacks/<class>/<id>.yaml   curated attacks, one directory per THREATS.md class
    benign/<id>.yaml            look-alikes that must pass
    found/<target>/<id>.yaml    findings saved by the fuzzers (``source: fuzz``)
    public/<source>/<id>.yaml   ordinary traffic copied from public sources (class ``benign``),
                                judged in front of an upstream reporting a 32k window, so
                                loaded only with ``include_public=True``

Pure standard library plus PyYAML: the guard is not imported, so fuzzers, locust and tests that
run without it can read the corpus. The file format is documented in ``payloads/README.md``;
every field is checked at load time and an error names the file and the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

import yaml

import payloads._generate as gen
from payloads._exceptions import GeneratorError, PayloadError

__all__ = [
    "BENIGN",
    "CLASSES",
    "COST_METRICS",
    "DEFAULT_ROOT",
    "LAYERS",
    "OUTCOMES",
    "Expect",
    "FindingCost",
    "FindingMetadata",
    "Payload",
    "PayloadKind",
    "PayloadSource",
    "ProfileNotes",
    "ProfileOutcome",
    "Transport",
    "load_corpus",
    "load_payload",
    "parse_payload",
]

DEFAULT_ROOT = Path(__file__).resolve().parent

# The classes of THREATS.md, in its order, snake_case.
CLASSES: tuple[str, ...] = (
    "nested_prompt_template",
    "request_chat_template",
    "template_kwargs",
    "fan_out",
    "guided_decoding",
    "json_body_bomb",
    "http_framing",
    "multimodal_fan_out",
    "redos_parser",
    "volume",
    "upstream_control",
)
BENIGN = "benign"
PayloadKind = Literal["attack", "benign", "all"]
Layer = Literal["pipeline", "http"]
LAYERS: tuple[str, ...] = get_args(Layer)
PayloadSource = Literal["curated", "fuzz"]
# What a reference-scheduler profile does with a payload sent straight to it (no guard).
ProfileOutcome = Literal["exhausted", "degraded", "served", "rejected", "unsupported"]
OUTCOMES: tuple[str, ...] = get_args(ProfileOutcome)
# Cost fields a finding may record (before and after minimisation); all numbers.
COST_METRICS = frozenset(
    {
        "wall_s",
        "cpu_s",
        "peak_rss_bytes",
        "steps",
        "output_tokens",
        "expansion_bytes",
        "size_bytes",
        "cost_per_byte",
    }
)

_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})
_FIELDS = frozenset(
    {
        "id",
        "class",
        "description",
        "target_field",
        "endpoint",
        "method",
        "body",
        "body_text",
        "body_b64",
        "generator",
        "headers",
        "raw",
        "layer",
        "transport",
        "expect",
        "references",
        "profiles",
        "source",
        "found",
        "cost",
        "tags",
        "routes",
    }
)
_BODY_FIELDS = ("body", "body_text", "body_b64")


@dataclass(frozen=True)
class Expect:
    """What the guard answers under its default policy: ``code`` is ``None`` for benign payloads
    (and for fuzz findings, where any refusal with ``status`` will do)."""

    status: int
    code: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status < 400

    def matches(self, status: int, code: str | None) -> bool:
        return status == self.status and (self.code is None or code == self.code)


@dataclass(frozen=True)
class ProfileNotes:
    """What each reference-scheduler profile does with the payload when no guard is in front."""

    vulnerable: ProfileOutcome | None = None
    hardened: ProfileOutcome | None = None
    note: str = ""


@dataclass(frozen=True)
class Transport:
    """How an HTTP-layer payload is sent: in chunks of ``chunk_size`` bytes with
    ``chunk_delay_s`` between them, with an exact, omitted (chunked) or declared
    ``Content-Length``."""

    chunk_size: int | None = None
    chunk_delay_s: float | None = None
    content_length: Literal["exact", "omit"] | int = "exact"


@dataclass(frozen=True)
class FindingMetadata:
    """A saved fuzz finding's ``found`` record: which fuzzer found it on which target, and
    when. ``cause`` is the deduplication key."""

    target: str
    engine: str
    cause: str
    seed: int | None = None
    found_at: str | None = None
    minimised: bool = True


@dataclass(frozen=True)
class FindingCost:
    """A saved fuzz finding's ``cost`` record: what it cost the target before and after
    minimisation (keys from COST_METRICS); a replay is expected to cost about ``after``."""

    before: Mapping[str, float]
    after: Mapping[str, float]


@dataclass(frozen=True)
class _HeaderSpec:
    name: str
    value: gen.SpecNode
    count: int


@dataclass(frozen=True)
class _BodySpec:
    mode: Literal["bytes", "json_node", "bytes_node"]
    data: bytes = b""
    node: gen.SpecNode | None = None


@dataclass(frozen=True, eq=False)
class Payload:
    """One payload. Bodies and generated headers are built on each call (not cached), in time
    linear in ``size_bound``; literal ``headers`` are kept as given."""

    id: str
    class_: str
    description: str
    target_field: str
    endpoint: str
    method: str
    expect: Expect
    references: tuple[str, ...]
    profiles: ProfileNotes
    headers: Mapping[str, str]
    raw: bool
    layer: Layer
    path: Path
    size_bound: int
    transport: Transport | None = None
    source: PayloadSource = "curated"
    finding: FindingMetadata | None = None
    cost: FindingCost | None = None
    tags: tuple[str, ...] = ()
    # Upstream routes the policy must proxy for this payload to be judged (vLLM's pooling and
    # scoring routes are not proxied by default): added to the default policy's `routes`.
    routes: tuple[str, ...] = ()
    header_bound: int = 0
    _body: _BodySpec = field(default=_BodySpec("bytes"), repr=False)
    _generated_headers: tuple[_HeaderSpec, ...] = field(default=(), repr=False)

    @property
    def kind(self) -> Literal["attack", "benign"]:
        return "benign" if self.class_ == BENIGN else "attack"

    @property
    def generated(self) -> bool:
        """Whether the body comes from a generator (so files stay small)."""
        return self._body.mode != "bytes"

    def body_bytes(self) -> bytes:
        """The request body exactly as sent."""
        spec = self._body
        if spec.mode == "bytes":
            return spec.data
        assert spec.node is not None
        if spec.mode == "json_node":
            return gen.materialise_json(spec.node)
        return gen.materialise_bytes(spec.node)

    def body_json(self) -> Any:
        """The body parsed as JSON (``NaN`` allowed); raises ``ValueError`` for raw bodies that
        are not JSON. Materialises the body."""
        return json.loads(self.body_bytes())

    def header_items(self) -> list[tuple[str, str]]:
        """Every header to send, in order: ``content-type: application/json`` unless the file
        sets a content type, the literal ``headers``, then generated headers (a name with
        ``count`` > 1 becomes ``name-0`` .. ``name-<count-1>``)."""
        items = list(self.headers.items())
        if not any(k.lower() == "content-type" for k, _ in items):
            items.insert(0, ("content-type", "application/json"))
        for spec in self._generated_headers:
            value = gen.materialise_bytes(spec.value).decode("latin-1")
            if spec.count == 1:
                items.append((spec.name, value))
            else:
                items.extend((f"{spec.name}-{i}", value) for i in range(spec.count))
        return items

    def __repr__(self) -> str:
        return f"Payload(id={self.id!r}, class_={self.class_!r}, path={str(self.path)!r})"


# ---- parsing one file ------------------------------------------------------------------------


class _Reader:
    def __init__(self, path: Path, data: Mapping[str, Any]) -> None:
        self.path = path
        self.data = data

    def fail(self, field_name: str, message: str) -> PayloadError:
        return PayloadError(f"{self.path}: {field_name}: {message}")

    def str(self, name: str, *, required: bool = True, default: str = "") -> str:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.fail(name, "required")
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a non-empty string, not {value!r}")
        return value


def _mapping(r: _Reader, name: str, value: Any, allowed: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise r.fail(name, "must be a mapping")
    unknown = set(value) - set(allowed)
    if unknown:
        raise r.fail(name, f"unknown key(s) {sorted(map(str, unknown))}")
    return value


def _header_value(r: _Reader, name: str, value: Any) -> str:
    if not isinstance(value, str) or "\r" in value or "\n" in value:
        raise r.fail(name, "header values must be strings without CR or LF")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise r.fail(name, "header values must be Latin-1") from None
    return value


def _literal_headers(r: _Reader) -> Mapping[str, str]:
    value = r.data.get("headers")
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise r.fail("headers", "must be a mapping of header names to values")
    out: dict[str, str] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise r.fail("headers", f"invalid header name {name!r}")
        out[name] = _header_value(r, f"headers.{name}", v)
    return MappingProxyType(out)


def _generated_headers(r: _Reader, spec: Any) -> tuple[tuple[_HeaderSpec, ...], int]:
    if not isinstance(spec, list):
        raise r.fail("generator.headers", "must be a list of {name, value, count}")
    out: list[_HeaderSpec] = []
    bound = 0
    for i, item in enumerate(spec):
        where = f"generator.headers[{i}]"
        item = _mapping(r, where, item, ("name", "value", "count"))
        name = item.get("name")
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise r.fail(where, f"invalid header name {name!r}")
        count = item.get("count", 1)
        if type(count) is not int or not 1 <= count <= 1_000_000:
            raise r.fail(where, "count must be an integer from 1 to 1000000")
        try:
            node = gen.parse_expr(item.get("value", ""))
        except GeneratorError as exc:
            raise r.fail(where, str(exc)) from None
        if node.kind == "json":
            raise r.fail(where, "a header value must be text or bytes")
        out.append(_HeaderSpec(name, node, count))
        bound += count * (len(name) + len(str(count)) + 1 + node.out + 4)
    try:
        gen.check_out(bound, "generator.headers")
    except GeneratorError as exc:
        raise r.fail("generator.headers", str(exc)) from None
    return tuple(out), bound


def _body(r: _Reader) -> tuple[_BodySpec, int, bool, tuple[_HeaderSpec, ...], int]:
    """(body spec, size bound, raw, generated headers, header bound)."""
    given = [name for name in _BODY_FIELDS if name in r.data]
    generator = r.data.get("generator")
    headers: tuple[_HeaderSpec, ...] = ()
    header_bound = 0
    gen_body: tuple[str, Any] | None = None
    if generator is not None:
        generator = _mapping(r, "generator", generator, ("json", "bytes", "headers"))
        if "headers" in generator:
            headers, header_bound = _generated_headers(r, generator["headers"])
        modes = [m for m in ("json", "bytes") if m in generator]
        if len(modes) > 1:
            raise r.fail("generator", "give one of json or bytes, not both")
        if modes:
            gen_body = (modes[0], generator[modes[0]])
    sources = given + ([f"generator.{gen_body[0]}"] if gen_body else [])
    if len(sources) != 1:
        raise r.fail(
            "body",
            f"exactly one of body, body_text, body_b64, generator.json or .bytes ({sources})",
        )
    if gen_body is not None:
        mode, spec = gen_body
        try:
            node = gen.parse_expr(spec)
        except GeneratorError as exc:
            raise r.fail(f"generator.{mode}", str(exc)) from None
        if mode == "json":
            if node.kind == "bytes":
                raise r.fail("generator.json", f"{node.op} makes bytes; use generator.bytes")
            body = _BodySpec("json_node", node=node)
            bound, raw = gen.json_bound(node), gen.splices_raw(node)
        else:
            body, bound, raw = _BodySpec("bytes_node", node=node), node.out, True
        try:
            gen.check_out(bound, f"generator.{mode}")
        except GeneratorError as exc:
            raise r.fail(f"generator.{mode}", str(exc)) from None
        return body, bound, raw, headers, header_bound
    name = given[0]
    value = r.data[name]
    if name == "body":
        if not isinstance(value, Mapping):
            raise r.fail("body", "must be a JSON object (use body_text for anything else)")
        try:
            data = gen.dump_json(value)
        except (TypeError, ValueError) as exc:
            raise r.fail("body", f"not serialisable as JSON: {exc}") from None
        return _BodySpec("bytes", data), len(data), False, headers, header_bound
    if not isinstance(value, str):
        raise r.fail(name, "must be a string")
    if name == "body_text":
        data = value.encode("utf-8", "surrogatepass")
    else:
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise r.fail(name, f"not base64: {exc}") from None
    return _BodySpec("bytes", data), len(data), True, headers, header_bound


def _expect(r: _Reader, class_: str, source: str) -> Expect:
    value = _mapping(r, "expect", r.data.get("expect"), ("status", "code"))
    status = value.get("status")
    code = value.get("code")
    if type(status) is not int or not 100 <= status <= 599:
        raise r.fail("expect.status", f"must be an HTTP status, not {status!r}")
    if code is not None and (not isinstance(code, str) or not _CODE.fullmatch(code)):
        raise r.fail("expect.code", f"must be a snake_case code, not {code!r}")
    if class_ == BENIGN:
        if status != 200 or code is not None:
            raise r.fail("expect", "benign payloads expect {status: 200} and no code")
    else:
        if status < 400:
            raise r.fail("expect.status", "an attack must be refused (4xx or 5xx)")
        if code is None and source != "fuzz":
            raise r.fail("expect.code", "required for curated attacks")
    return Expect(status, code)


def _profiles(r: _Reader) -> ProfileNotes:
    value = r.data.get("profiles")
    if value is None:
        return ProfileNotes()
    value = _mapping(r, "profiles", value, ("vulnerable", "hardened", "note"))
    for name in ("vulnerable", "hardened"):
        if value.get(name) is not None and value[name] not in OUTCOMES:
            raise r.fail(f"profiles.{name}", f"must be one of {', '.join(OUTCOMES)}")
    note = value.get("note", "")
    if not isinstance(note, str):
        raise r.fail("profiles.note", "must be a string")
    return ProfileNotes(value.get("vulnerable"), value.get("hardened"), note.strip())


def _transport(r: _Reader) -> Transport | None:
    value = r.data.get("transport")
    if value is None:
        return None
    value = _mapping(r, "transport", value, ("chunk_size", "chunk_delay_s", "content_length"))
    size = value.get("chunk_size")
    if size is not None and (type(size) is not int or size < 1):
        raise r.fail("transport.chunk_size", "must be a positive integer")
    delay = value.get("chunk_delay_s")
    if delay is not None and (
        not isinstance(delay, int | float) or isinstance(delay, bool) or not 0 <= delay <= 60
    ):
        raise r.fail("transport.chunk_delay_s", "must be a number of seconds from 0 to 60")
    length = value.get("content_length", "exact")
    if length not in ("exact", "omit") and (type(length) is not int or length < 0):
        raise r.fail("transport.content_length", "must be exact, omit or a byte count")
    return Transport(size, None if delay is None else float(delay), length)


_ROUTE = re.compile(r"/[A-Za-z0-9._~/-]*")


def _routes(r: _Reader, endpoint: str) -> tuple[str, ...]:
    routes = _strings(r, "routes")
    for route in routes:
        if not _ROUTE.fullmatch(route) or "//" in route or ".." in route:
            raise r.fail("routes", f"{route[:80]!r} is not a plain absolute path")
    if routes and endpoint.split("?", 1)[0] not in routes:
        raise r.fail("routes", "lists routes but not the payload's own endpoint")
    return routes


def _strings(r: _Reader, name: str) -> tuple[str, ...]:
    value = r.data.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise r.fail(name, "must be a list of non-empty strings")
    return tuple(value)


def _cost_side(r: _Reader, name: str, value: Any) -> Mapping[str, float]:
    value = _mapping(r, name, value, COST_METRICS)
    out: dict[str, float] = {}
    for key, v in value.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise r.fail(f"{name}.{key}", "must be a finite non-negative number")
        out[key] = v
    return MappingProxyType(out)


def _found(r: _Reader, source: str) -> tuple[FindingMetadata | None, FindingCost | None]:
    found, cost = r.data.get("found"), r.data.get("cost")
    if source == "curated":
        if found is not None or cost is not None:
            raise r.fail("found", "found and cost belong to source: fuzz")
        return None, None
    if found is None or cost is None:
        raise r.fail("found", "source: fuzz needs found and cost")
    f = _mapping(r, "found", found, ("target", "engine", "cause", "seed", "found_at", "minimised"))
    for name in ("target", "engine", "cause"):
        if not isinstance(f.get(name), str) or not f[name]:
            raise r.fail(f"found.{name}", "required string")
    seed = f.get("seed")
    if seed is not None and type(seed) is not int:
        raise r.fail("found.seed", "must be an integer")
    found_at = f.get("found_at")
    if found_at is not None and not isinstance(found_at, str):
        raise r.fail("found.found_at", "must be an ISO 8601 string")
    minimised = f.get("minimised", True)
    if not isinstance(minimised, bool):
        raise r.fail("found.minimised", "must be true or false")
    c = _mapping(r, "cost", cost, ("before", "after"))
    if "before" not in c or "after" not in c:
        raise r.fail("cost", "needs before and after")
    return (
        FindingMetadata(f["target"], f["engine"], f["cause"], seed, found_at, minimised),
        FindingCost(
            _cost_side(r, "cost.before", c["before"]), _cost_side(r, "cost.after", c["after"])
        ),
    )


def parse_payload(data: Any, path: Path) -> Payload:
    """Validate one parsed YAML document; ``path`` is used for messages and kept on the result."""
    if not isinstance(data, Mapping):
        raise PayloadError(f"{path}: a payload file holds one mapping")
    unknown = set(data) - _FIELDS
    if unknown:
        raise PayloadError(f"{path}: unknown field(s) {sorted(map(str, unknown))}")
    r = _Reader(path, data)
    pid = r.str("id")
    if not _ID.fullmatch(pid):
        raise r.fail("id", "lowercase letters, digits, '.', '_' and '-' only, at most 100")
    class_ = r.str("class")
    if class_ not in CLASSES and class_ != BENIGN:
        raise r.fail("class", f"unknown class {class_!r}; one of {', '.join(CLASSES)} or benign")
    source = data.get("source", "curated")
    if source not in get_args(PayloadSource):
        raise r.fail("source", "must be curated or fuzz")
    endpoint = r.str("endpoint")
    if not endpoint.startswith("/"):
        raise r.fail("endpoint", "must be a path starting with /")
    method = data.get("method", "POST")
    if method not in _METHODS:
        raise r.fail("method", f"must be one of {sorted(_METHODS)}")
    layer = data.get("layer", "pipeline")
    if layer not in LAYERS:
        raise r.fail("layer", "must be pipeline or http")
    body, bound, raw, gen_headers, header_bound = _body(r)
    if "raw" in data:
        if not isinstance(data["raw"], bool):
            raise r.fail("raw", "must be true or false")
        if data["raw"] != raw:
            raise r.fail("raw", f"is {raw} for this body source (raw: true = bytes, not JSON)")
    transport = _transport(r)
    if transport is not None and layer != "http":
        raise r.fail("transport", "only layer: http payloads have a transport")
    finding, cost = _found(r, source)
    return Payload(
        id=pid,
        class_=class_,
        description=" ".join(r.str("description").split()),
        target_field=r.str("target_field"),
        endpoint=endpoint,
        method=method,
        expect=_expect(r, class_, source),
        references=_strings(r, "references"),
        profiles=_profiles(r),
        headers=_literal_headers(r),
        raw=raw,
        layer=layer,
        path=path,
        size_bound=bound,
        transport=transport,
        source=source,
        finding=finding,
        cost=cost,
        tags=_strings(r, "tags"),
        routes=_routes(r, endpoint),
        header_bound=header_bound,
        _body=body,
        _generated_headers=gen_headers,
    )


def load_payload(path: Path) -> Payload:
    """Load and validate one payload file."""
    try:
        # Read from the file, not its text, so that a YAML error names it (PyYAML says
        # "<unicode string>" of a string), with its line and column.
        with path.open(encoding="utf-8") as stream:
            data = yaml.load(stream, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        said = " ".join(str(exc).split())  # one line
        raise PayloadError(f"{path}: cannot read: {said}") from None
    return parse_payload(data, path)


# ---- the corpus ------------------------------------------------------------------------------


def _files(root: Path, include_found: bool, include_public: bool) -> list[tuple[Path, str]]:
    """(file, where) pairs; ``where`` is the class its directory implies, ``benign`` or
    ``found``."""
    out: list[tuple[Path, str]] = []
    attacks = root / "attacks"
    if attacks.is_dir():
        for sub in sorted(attacks.iterdir()):
            if sub.is_dir():
                out.extend((p, sub.name) for p in sorted(sub.rglob("*.yaml")))
    out.extend((p, BENIGN) for p in sorted((root / "benign").rglob("*.yaml")))
    if include_public:
        out.extend((p, BENIGN) for p in sorted((root / "public").rglob("*.yaml")))
    if include_found:
        out.extend((p, "found") for p in sorted((root / "found").rglob("*.yaml")))
    return out


def load_corpus(
    root: Path | None = None,
    *,
    classes: Iterable[str] | None = None,
    kind: PayloadKind = "all",
    include_found: bool = True,
    include_public: bool = False,
) -> list[Payload]:
    """Every payload under ``root`` (default: this package's directory), sorted by path.

    ``classes`` keeps those classes (THREATS.md classes, or ``"benign"``); ``kind`` keeps attacks
    or benign payloads; ``include_found`` adds the fuzzers' findings; ``include_public`` adds
    ``public/``, ordinary requests copied from public sources (API references, cookbooks,
    examples), which need an upstream with a 32k window: the seed-sized defaults, the load
    tests' benign traffic and the e2e servers' 4k window are not for them. Raises
    :class:`PayloadError` for a malformed file, a class that does not match its directory, or an
    id used twice.
    """
    root = DEFAULT_ROOT if root is None else Path(root)
    if kind not in ("attack", "benign", "all"):
        raise ValueError(f"kind must be attack, benign or all, not {kind!r}")
    wanted: frozenset[str] | None = None
    if classes is not None:
        wanted = frozenset([classes] if isinstance(classes, str) else classes)
        bad = wanted - {*CLASSES, BENIGN}
        if bad:
            raise ValueError(f"unknown class(es) {sorted(bad)}; one of {', '.join(CLASSES)}")
    seen: dict[str, Path] = {}
    out: list[Payload] = []
    for path, where in _files(root, include_found, include_public):
        p = load_payload(path)
        if where == "found":
            if p.source != "fuzz" or p.class_ == BENIGN:
                raise PayloadError(f"{path}: files under found/ are attacks with source: fuzz")
        elif p.class_ != where:
            raise PayloadError(f"{path}: class {p.class_!r} does not match its directory")
        if p.id in seen:
            raise PayloadError(f"{path}: id {p.id!r} is also used by {seen[p.id]}")
        seen[p.id] = path
        if wanted is not None and p.class_ not in wanted:
            continue
        if kind != "all" and p.kind != kind:
            continue
        out.append(p)
    return out
