"""docs/deploy/: the Grafana dashboard and the Prometheus alert rules name only metrics the
guard exports, promtool accepts the rules and their unit tests (the error rate counts proxied
requests only), and the Kubernetes example puts the guard in front of vLLM (the compose file:
tests/schedguard/test_compose.py).

promtool comes with Debian's ``prometheus`` package (.ci/run installs it); without it the
promtool tests are skipped, unless ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from guard.policy import PolicyError, key_digest, load_policy
from tests._exported_metrics import guard_metric_names
from tests._support import REPO_ROOT

DEPLOY = REPO_ROOT / "docs" / "deploy"
# Series Prometheus makes itself, not the guard.
PROMETHEUS_OWN = {"up"}
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)")


@pytest.fixture(scope="module")
def exported() -> frozenset[str]:
    """Every series name the guard's /metrics exposes, after some traffic."""
    return guard_metric_names()


def _exprs(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _exprs(item)


def _metric_names(expr: str) -> set[str]:
    found = set(_SELECTOR.findall(expr))
    found.update(re.findall(r"\bschedguard_[a-z0-9_]+\b", expr))
    return found


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    return data


def _alerts() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())
    return data


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_name_is_exported_by_the_guard(source: str, exported: frozenset[str]) -> None:
    doc = _dashboard() if source == "dashboard" else _alerts()
    exprs = list(_exprs(doc))
    assert len(exprs) >= 6
    used = set().union(*(_metric_names(e) for e in exprs))
    assert any(n.startswith("schedguard_") for n in used)
    missing = sorted(used - exported - PROMETHEUS_OWN)
    assert missing == [], f"{source} uses metrics the guard does not export: {missing}"


def test_dashboard_has_the_slo_panels() -> None:
    dash = _dashboard()
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    titles = " | ".join(p["title"] for p in panels)
    for wanted in ("P95 latency", "Error rate", "Saturation", "Rejections by code"):
        assert wanted in titles
    for p in panels:
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"])
        assert p["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    rejections = next(p for p in panels if p["title"] == "Rejections by code")
    assert "sum by (code)" in rejections["targets"][0]["expr"]


def test_alert_rules_are_complete() -> None:
    rules = [r for g in _alerts()["groups"] for r in g["rules"]]
    assert len(rules) >= 5
    for rule in rules:
        assert rule["alert"] and rule["expr"] and rule["for"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"]
    assert len({r["alert"] for r in rules}) == len(rules)


def _promtool() -> str:
    binary = shutil.which("promtool")
    if binary is not None:
        return binary
    message = "promtool not found: apt-get install -y prometheus"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: .ci/run installs it)", pytrace=False)
    pytest.skip(message)


def test_promtool_checks_the_alert_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(DEPLOY / "prometheus-alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# The error-rate alert divides 5xx of proxied requests by proxied requests: /readyz answering 503
# (an upstream still loading) is not an error rate of the traffic; 2% of /v1 requests failing is.
_ERROR_RATE_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'schedguard_guard_requests_total{{route="/readyz",status="503"}}'
        values: '0+100x30'
      - series: 'schedguard_guard_requests_total{{route="/metrics",status="500"}}'
        values: '0+5x30'
      - series: 'schedguard_guard_requests_total{{route="/v1/chat/completions",status="200"}}'
        values: '0+100x30'
    alert_rule_test:
      - {{eval_time: 20m, alertname: SchedguardErrorRateHigh, exp_alerts: []}}
  - interval: 1m
    input_series:
      - series: 'schedguard_guard_requests_total{{route="/v1/chat/completions",status="200"}}'
        values: '0+98x30'
      - series: 'schedguard_guard_requests_total{{route="/v1/completions",status="502"}}'
        values: '0+2x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: SchedguardErrorRateHigh
        exp_alerts:
          - exp_labels: {{severity: critical}}
            exp_annotations:
              summary: More than 1% of requests answered 5xx
              description: "{description}"
"""


def test_error_rate_alert_counts_proxied_requests_only(tmp_path: Path) -> None:
    rule = next(
        r
        for g in _alerts()["groups"]
        for r in g["rules"]
        if r["alert"] == "SchedguardErrorRateHigh"
    )
    description = rule["annotations"]["description"].replace(
        "{{ $value | humanizePercentage }}", "2%"
    )
    tests = tmp_path / "error-rate-test.yml"
    tests.write_text(
        _ERROR_RATE_TESTS.format(
            rules=json.dumps(str(DEPLOY / "prometheus-alerts.yml")),
            description=description.replace('"', '\\"'),
        )
    )
    result = subprocess.run(
        [_promtool(), "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_sidecar(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s-sidecar.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"ConfigMap", "Deployment", "Service"}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    vllm, guard = containers["vllm"], containers["guard"]
    assert "--host=127.0.0.1" in vllm["args"] and "--port=8000" in vllm["args"]
    assert guard["args"][:2] == ["--upstream", "http://127.0.0.1:8000"]
    # /metrics on the admin port, which Prometheus scrapes and the Service does not expose.
    admin_port = guard["args"][guard["args"].index("--admin-port") + 1]
    annotations = kinds["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == admin_port
    admin_name = next(p["name"] for p in guard["ports"] if str(p["containerPort"]) == admin_port)
    assert all(
        p["targetPort"] not in (admin_name, int(admin_port))
        for p in kinds["Service"]["spec"]["ports"]
    )
    assert guard["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert guard["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sc = guard["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert not sc["allowPrivilegeEscalation"]
    port_name = guard["ports"][0]["name"]
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == port_name
    # Valid but for the key's placeholder, which refuses to start until it is replaced.
    text = kinds["ConfigMap"]["data"]["policy.yaml"]
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(str(policy), {})
    assert info.value.problems == ["keys[0].key_sha256: must be 64 hexadecimal digits"]
    policy.write_text(text.replace(PLACEHOLDER, key_digest("a-key-made-at-deploy-time")))
    assert load_policy(str(policy), {}).keys[0].tenant == "team-a"


PLACEHOLDER = "REPLACE-with-the-digest-from-schedguard-policy-key"


def test_example_policy_is_valid() -> None:
    policy = load_policy(str(DEPLOY / "policy.yaml"), {})
    # The window comes from the upstream; no key is shipped (they are made at deploy time).
    assert policy.limits.tokens.context_length_from == "upstream"
    assert policy.keys == ()


def test_no_example_ships_a_key_digest() -> None:
    # A digest in an example is a key someone knows (the digests of "test" were shipped once):
    # no 64-hex-digit string anywhere in docs/ or the deploy files.
    digest = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])")
    for path in sorted(REPO_ROOT.joinpath("docs").rglob("*")):
        if path.is_file() and path.suffix in (".md", ".yaml", ".yml", ".json"):
            found = digest.findall(path.read_text(encoding="utf-8"))
            assert not found, f"{path.relative_to(REPO_ROOT)}: {found[0]}"
