"""Every environment variable, command-line flag and policy field the documentation and the
deployment files name is one the code reads (issue 19): a name the code does not read is a
setting that would be silently ignored, or now refused at start."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from guard.policy import OTHER_VARIABLES, KeyEntry, policy_variables
from schedguard.cli import build_parser, iter_parsers
from tests._support import REPO_ROOT

# What operators read: the README, docs/ (deployment files included), the other READMEs.
DOCUMENTS = sorted(
    {
        REPO_ROOT / "README.md",
        REPO_ROOT / "Dockerfile",
        *(p for p in (REPO_ROOT / "docs").rglob("*") if p.suffix in (".md", ".yml", ".yaml")),
        *REPO_ROOT.glob("*/README.md"),
        *REPO_ROOT.glob("scripts/*/README.md"),
    }
)
# A line quoting the guard's refusal of an unknown name shows that name on purpose.
_REFUSAL_QUOTED = "not a variable schedguard reads"

_VARIABLE = re.compile(r"SCHEDGUARD_[A-Z0-9_]*")
_FIELD = re.compile(
    r"`((?:limits|upstream|rate|admin|observability|keys)(?:\.[a-z_0-9]+|\[\d+\])+)"
)
_COMMAND = re.compile(
    r"\bschedguard\s+([a-z]+(?:\s+(?:show|key|run|replay|list|report|findings-doc))?)\b([^`\n|]*)"
)
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _REFUSAL_QUOTED not in line:
            yield number, line


def _where(path: Path, number: int) -> str:
    return f"{path.relative_to(REPO_ROOT)}:{number}"


def test_the_documents_are_found() -> None:
    names = {p.relative_to(REPO_ROOT).as_posix() for p in DOCUMENTS}
    for needed in ("README.md", "docs/POLICY.md", "docs/deploy/docker-compose.yml",
                   "docs/deploy/k8s-sidecar.yaml", "docs/deploy/README.md"):  # fmt: skip
        assert needed in names


def test_every_variable_named_is_read() -> None:
    known = set(policy_variables()) | set(OTHER_VARIABLES)
    unknown = []
    for path in DOCUMENTS:
        for number, line in _lines(path):
            for name in _VARIABLE.findall(line):
                if name.endswith("_") and any(k.startswith(name) for k in known):
                    continue  # a family: SCHEDGUARD_LIMITS__... or SCHEDGUARD_<SECTION>__...
                if name not in known:
                    unknown.append(f"{_where(path, number)}: {name}")
    assert not unknown, "\n".join(unknown)


def _field_exists(dotted: str) -> bool:
    parts = tuple(p for p in re.split(r"\.|\[\d+\]", dotted) if p)
    if parts[0] == "keys":  # a list of entries: the entry's own fields
        return len(parts) == 1 or parts[1] in KeyEntry.model_fields
    return parts in set(policy_variables().values())


def test_every_policy_field_named_exists() -> None:
    unknown = []
    for path in DOCUMENTS:
        for number, line in _lines(path):
            for dotted in _FIELD.findall(line):
                if not _field_exists(dotted):
                    unknown.append(f"{_where(path, number)}: {dotted}")
    assert not unknown, "\n".join(unknown)


def _options() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for prog, parser in iter_parsers(build_parser()):
        words = prog.split()[1:]
        out[" ".join(words)] = {opt for action in parser._actions for opt in action.option_strings}
    return out


def test_every_flag_named_is_a_flag_of_its_command() -> None:
    options = _options()
    unknown = []
    for path in DOCUMENTS:
        for number, line in _lines(path):
            for command, rest in _COMMAND.findall(line):
                command = " ".join(command.split())
                if command not in options:
                    continue  # prose ("schedguard is ..."), not a command line
                for flag in _FLAG.findall(rest.split("#")[0]):
                    if flag not in options[command]:
                        unknown.append(f"{_where(path, number)}: schedguard {command} {flag}")
    assert not unknown, "\n".join(unknown)


def test_the_deployments_arguments_parse() -> None:
    # The k8s sidecar's guard args (compose's are parsed by test_compose.py).
    docs = list(yaml.safe_load_all((REPO_ROOT / "docs/deploy/k8s-sidecar.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    guard = next(c for c in containers if c["name"] == "guard")
    args = build_parser().parse_args(["serve", *guard["args"]])
    assert args.command == "serve" and args.upstream
    for env in guard.get("env", []):
        assert env["name"] in set(policy_variables()) | set(OTHER_VARIABLES), env["name"]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("`limits.tokens.context_length`", True),
        ("`limits.tokens.max_promt_tokens`", False),
        ("`keys[0].key_sha256`", True),
        ("`keys[0].secret`", False),
    ],
)
def test_the_field_reader_tells_known_from_unknown(text: str, ok: bool) -> None:
    (dotted,) = _FIELD.findall(text)
    assert _field_exists(dotted) is ok


def test_the_flag_reader_sees_a_wrong_flag() -> None:
    ((command, rest),) = _COMMAND.findall("`schedguard serve --upstrem http://x`")
    assert command == "serve"
    assert _FLAG.findall(rest) == ["--upstrem"]
    assert "--upstrem" not in _options()["serve"]
    assert isinstance(build_parser(), argparse.ArgumentParser)
