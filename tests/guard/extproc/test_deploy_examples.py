"""The Envoy deployment examples in docs/deploy/envoy/ are what they say: the Envoy configurations
pass ``envoy --mode validate`` (the pinned wheel's Envoy), the ext_proc filter each gateway
example configures is the same contract (and its Istio typed_config validates in Envoy), and the
Kubernetes manifests are checked as the project checks its k8s examples (structure, probes, the
processor's CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench._envoy import ENVOY_YAML, envoy_binary, ext_proc_filter, http_filters
from guard.policy import load_policy
from schedguard.cli import build_parser

DEPLOY = ENVOY_YAML.parent
STANDARD = {
    "request_header_mode": "SEND",
    "request_body_mode": "BUFFERED",
    "response_header_mode": "SEND",
    "response_body_mode": "STREAMED",
}


def _validate(cfg: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def _docs(name: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")))
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("name", ["envoy.yaml", "envoy-inference-extension.yaml"])
def test_envoy_configs_validate(name: str, tmp_path: Path) -> None:
    cfg = yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))
    _validate(cfg, tmp_path)
    first = ext_proc_filter(cfg)
    assert first["failure_mode_allow"] is False
    assert first["request_attributes"] == ["source.address"]  # the fair queue's client
    assert {k: first["processing_mode"][k] for k in STANDARD} == STANDARD
    listener = cfg["static_resources"]["listeners"][0]
    policy = load_policy(None, {})
    assert listener["per_connection_buffer_limit_bytes"] == policy.limits.body.max_body_bytes


def test_schedguard_runs_before_the_endpoint_picker() -> None:
    cfg = yaml.safe_load((DEPLOY / "envoy-inference-extension.yaml").read_text(encoding="utf-8"))
    names = [f["typed_config"].get("grpc_service", {}).get("envoy_grpc", {}).get("cluster_name")
             for f in http_filters(cfg)]  # fmt: skip
    assert names[:2] == ["schedguard", "epp"]
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    pool = clusters["inference_pool"]
    assert pool["type"] == "ORIGINAL_DST"
    assert pool["original_dst_lb_config"]["http_header_name"] == "x-gateway-destination-endpoint"


def test_istio_envoyfilter_inserts_the_same_filter(tmp_path: Path) -> None:
    patch = _docs("istio-envoyfilter.yaml")["EnvoyFilter"]["spec"]["configPatches"][0]
    assert patch["applyTo"] == "HTTP_FILTER" and patch["patch"]["operation"] == "INSERT_BEFORE"
    assert patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"] == (
        "envoy.filters.http.router"
    )
    value = patch["patch"]["value"]
    # Its typed_config in the example Envoy (the Istio cluster name becomes the local one).
    cfg = yaml.safe_load(ENVOY_YAML.read_text(encoding="utf-8"))
    typed = dict(value["typed_config"])
    typed["grpc_service"] = {"envoy_grpc": {"cluster_name": "schedguard"}}
    filters = http_filters(cfg)
    filters[0] = {"name": value["name"], "typed_config": typed}
    _validate(cfg, tmp_path)
    assert {k: typed["processing_mode"][k] for k in STANDARD} == STANDARD
    assert typed["failure_mode_allow"] is False
    assert typed["request_attributes"] == ["source.address"]


@pytest.mark.parametrize("name", ["envoy-gateway.yaml", "envoy-ai-gateway.yaml"])
def test_envoy_gateway_policies_use_the_standard_contract(name: str) -> None:
    policy = _docs(name)["EnvoyExtensionPolicy"]
    ext = policy["spec"]["extProc"][0]
    assert ext["backendRefs"][0] == {
        "group": "", "kind": "Service", "name": "schedguard-extproc", "port": 50051,
    }  # fmt: skip
    assert ext["failOpen"] is False
    assert ext["processingMode"] == {
        "request": {"body": "Buffered", "attributes": ["source.address"]},
        "response": {"body": "Streamed"},
    }
    assert policy["spec"]["targetRefs"][0]["kind"] == "Gateway"
    timeout_s = float(ext["messageTimeout"].rstrip("s"))
    assert timeout_s > load_policy(None, {}).rate.queue_timeout_s


def test_the_processor_deployment(tmp_path: Path) -> None:
    kinds = _docs("schedguard-extproc.yaml")
    assert set(kinds) == {"ConfigMap", "Deployment", "Service"}
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["schedguard", "extproc"]
    args = build_parser().parse_args(["extproc", *container["args"]])  # the CLI accepts them
    assert args.port == 50051 and args.admin_port == 9091
    assert container["readinessProbe"]["grpc"]["port"] == args.port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service_ports = kinds["Service"]["spec"]["ports"]
    assert [p["port"] for p in service_ports] == [50051]  # not the admin port
    assert service_ports[0]["appProtocol"] == "kubernetes.io/h2c"
    policy = tmp_path / "policy.yaml"
    policy.write_text(kinds["ConfigMap"]["data"]["policy.yaml"], encoding="utf-8")
    load_policy(str(policy), {})
