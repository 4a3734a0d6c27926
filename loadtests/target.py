"""What a load test targets: the model it serves and the kind of server behind it.

Read from the target's ``GET /v1/models`` (through the guard, which relays the upstream's
answer): the model is the first entry's ``id``, the kind its ``owned_by`` (the reference
scheduler says ``schedguard``, vLLM ``vllm``, llama-cpp-python ``me``; the guard tells vLLM and
llama-cpp-python apart the same way, ``guard.http.upstream_kind_of``). ``schedguard load``
asks once before the run unless ``--model`` and ``--upstream-kind`` both say.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "ATTACK_KEY",
    "BENIGN_KEY",
    "FLOOD_KEY",
    "KINDS",
    "REFERENCE_MODEL",
    "LoadTargetKind",
    "Target",
    "TargetError",
    "discover",
    "first_model",
    "is_guard",
    "kind_of",
    "models_document",
]

LoadTargetKind = Literal["reference", "vllm", "llama_cpp", "other"]
KINDS: tuple[str, ...] = get_args(LoadTargetKind)
# The reference scheduler's model: the name the corpus's bodies carry.
REFERENCE_MODEL = "schedguard-ref"
# The benign users' key (loadtests/policy.yaml's tenant ``benign``): /v1/models is asked with
# it, since a guard with keys refuses anonymous callers.
BENIGN_KEY = "sk-load-benign"
ATTACK_KEY = "sk-load-attacker"  # its tenant ``attacker``
FLOOD_KEY = "sk-load-flood"  # its tenant ``flood``: the fair share phase's flood
_OWNERS: dict[str, LoadTargetKind] = {"schedguard": "reference", "vllm": "vllm", "me": "llama_cpp"}


class TargetError(Exception):
    """The target's models could not be read."""


@dataclass(frozen=True)
class Target:
    model: str
    kind: LoadTargetKind
    source: str  # where each came from, for the report: "--model", "/v1/models", ...


def _entries(models: Any) -> list[Any]:
    data = models.get("data") if isinstance(models, dict) else None
    return data if isinstance(data, list) else []


def kind_of(models: Any) -> LoadTargetKind:
    """The server behind a ``/v1/models`` document: every entry owned by the same known owner,
    else ``other``."""
    owners = {e.get("owned_by") if isinstance(e, dict) else None for e in _entries(models)}
    if len(owners) != 1:
        return "other"
    return _OWNERS.get(str(owners.pop()), "other")


def first_model(models: Any) -> str | None:
    """The first model's id (the one a single-model server serves)."""
    for entry in _entries(models):
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]:
            return str(entry["id"])
    return None


def models_document(host: str, *, api_key: str = BENIGN_KEY, timeout_s: float = 10.0) -> Any:
    """``GET host/v1/models`` as JSON; :class:`TargetError` when it does not answer 200 JSON."""
    request = urllib.request.Request(
        host.rstrip("/") + "/v1/models", headers={"authorization": f"Bearer {api_key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise TargetError(f"GET /v1/models answered {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise TargetError(f"GET /v1/models: {exc}") from exc


def discover(
    host: str,
    *,
    model: str | None = None,
    kind: LoadTargetKind | Literal["auto"] = "auto",
    api_key: str = BENIGN_KEY,
) -> Target:
    """The model and kind to load-test ``host`` with: those given, the rest from its
    ``/v1/models``. Raises :class:`TargetError` when the model is not given and cannot be
    read; a kind that cannot be read is ``other`` (the mix that fits any server)."""
    if model is not None and kind != "auto":
        return Target(model, kind, "--model, --upstream-kind")
    try:
        models = models_document(host, api_key=api_key)
    except TargetError as exc:
        if model is None:
            raise TargetError(f"{exc}: give --model") from exc
        return Target(model, "other", f"--model; kind unknown ({exc})")
    found = first_model(models)
    if model is None and found is None:
        raise TargetError("GET /v1/models lists no model: give --model")
    chosen = model if model is not None else str(found)
    detected = kind_of(models) if kind == "auto" else kind
    source = ("--model" if model is not None else "/v1/models") + (
        ", --upstream-kind" if kind != "auto" else "; kind from /v1/models owned_by"
    )
    return Target(chosen, detected, source)


def is_guard(host: str, timeout_s: float = 5.0) -> bool:
    """Whether ``host`` is a schedguard guard: its ``/readyz`` says which upstream kind and
    context window are in force (no other server's does)."""
    try:
        with urllib.request.urlopen(host.rstrip("/") + "/readyz", timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and "upstream_kind" in body and "context_length_source" in body
