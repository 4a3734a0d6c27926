"""Every option of every ``schedguard`` command has help text and shows its default once;
``--version`` everywhere; flag errors named as the flags; a missing extra said in one line."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from schedguard import __version__, cli
from schedguard.cli import HelpFormatter, build_parser, iter_parsers, main, missing_extra
from tests._support import REPO_ROOT

ROOT = REPO_ROOT
PARSERS = list(iter_parsers(build_parser()))
_SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def _options() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    return [
        (prog, parser, action)
        for prog, parser in PARSERS
        for action in parser._actions
        if not isinstance(action, _SKIP)
    ]


def _name(option: tuple[str, argparse.ArgumentParser, argparse.Action]) -> str:
    prog, _, action = option
    return f"{prog} {'/'.join(action.option_strings) or action.dest}"


def test_every_command_is_walked() -> None:
    progs = {prog for prog, _ in PARSERS}
    for command in ("ref", "demo", "serve", "policy show", "load", "fuzz run", "fuzz replay"):
        assert f"schedguard {command}" in progs
    assert len(_options()) > 50


@pytest.mark.parametrize("option", _options(), ids=_name)
def test_option_has_help_and_one_default(
    option: tuple[str, argparse.ArgumentParser, argparse.Action],
) -> None:
    _, parser, action = option
    assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, (
        f"{_name(option)} has no help text"
    )
    assert parser.formatter_class is HelpFormatter
    shown = parser._get_formatter()._expand_help(action)
    assert shown.lower().count("default") <= 1, f"{_name(option)}: {shown!r}"
    assert "(default: None)" not in shown and "(default: False)" not in shown


def test_help_renders_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    for prog, _ in PARSERS:
        with pytest.raises(SystemExit) as exc:
            main([*prog.split()[1:], "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {prog}") and "--version" in out


def test_policy_default_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["serve", "--help"], ["policy", "show", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = " ".join(capsys.readouterr().out.split())
        out = out[out.index("options:") :]
        policy = out[out.index("--policy FILE") :].split("--host")[0].split("--json")[0]
        assert policy.count("SCHEDGUARD_POLICY") == 1 and "(default:" not in policy, policy


@pytest.mark.parametrize("words", [[], ["serve"], ["fuzz", "run"], ["policy", "show"]])
def test_version(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*words, "--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"schedguard {__version__}\n"


@pytest.mark.parametrize("words", [[], ["serve"], ["fuzz", "run"]])
def test_dash_v_is_the_version(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*words, "-V"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"schedguard {__version__}\n"


@pytest.mark.parametrize(
    ("argv", "prog", "meant"),
    [
        (["serve", "--upstrem", "http://x:1"], "schedguard serve", "--upstream"),
        (["serve", "--upstrem=http://x:1"], "schedguard serve", "--upstream"),
        (["extproc", "--admin-prot", "9"], "schedguard extproc", "--admin-port"),
        (["policy", "show", "--jsn"], "schedguard policy show", "--json"),
        (["fuzz", "list", "--jsno"], "schedguard fuzz list", "--json"),
        (["load", "--durattion", "5"], "schedguard load", "--duration"),
        # a required option mistyped: the typo is named, not only "--target is required"
        (["fuzz", "run", "--targt", "guard-app"], "schedguard fuzz run", "--target"),
    ],
)
def test_a_mistyped_flag_is_refused_by_its_command_with_the_closest(
    argv: list[str], prog: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} "), err  # the command's usage, not the top level's
    last = err.strip().splitlines()[-1]
    typo = next(word for word in argv if word.startswith("--"))
    assert last.startswith(f"{prog}: error: unrecognized arguments: {typo}"), last
    assert last.endswith(f"(did you mean {meant}?)"), last


def test_an_unknown_word_with_nothing_close_is_refused_plainly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--zzzzzz"])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "schedguard serve: error: unrecognized arguments: --zzzzzz"


def test_a_yaml_error_names_file_line_and_column_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCHEDGUARD_POLICY", raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("upstream:\n  url: http://x:1\n  read_timeout_s: [1\n")
    for argv, prog in (
        (["serve", "--policy", str(policy)], "schedguard serve"),
        (["policy", "show", "--policy", str(policy)], "schedguard policy show"),
        (["extproc", "--policy", str(policy)], "schedguard extproc"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[0] == f"{prog}: invalid policy ({policy}):", err
        assert err[1].startswith(f"  not valid YAML: {policy}, line 4, column 1: "), err
        assert len(err) == 2 and "Traceback" not in "\n".join(err)


def test_version_has_one_definition() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in meta["project"]["dynamic"] and "version" not in meta["project"]
    attr = meta["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "schedguard.__version__"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--upstream", "notaurl"], "schedguard serve: --upstream: must be an http://"),
        (
            ["serve", "--upstream", "http://x:1", "--redis", "notaurl"],
            "schedguard serve: --redis: must be a redis://",
        ),
        (
            ["serve", "--policy", "/nonexistent/policy.yaml"],
            "schedguard serve: --policy: cannot read the policy file",
        ),
        (
            ["policy", "show", "--policy", "/nonexistent/policy.yaml"],
            "schedguard policy show: --policy: cannot read the policy file",
        ),
    ],
)
def test_flag_errors_name_the_flag(
    argv: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCHEDGUARD_POLICY", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected), err
    assert "SCHEDGUARD_" not in err and len(err.strip().splitlines()) == 1


def test_a_variable_error_still_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDGUARD_UPSTREAM__URL", "notaurl")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "(from SCHEDGUARD_UPSTREAM__URL)" in err and "--upstream" not in err


def test_file_and_flag_errors_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCHEDGUARD_POLICY", raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("upstream:\n  connect_timeout_s: -1\n")
    assert main(["serve", "--policy", str(policy), "--upstream", "ftp://x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("schedguard serve: --upstream: ")
    assert err[1] == f"schedguard serve: invalid policy ({policy}):"
    assert err[2].startswith("  upstream.connect_timeout_s: ")


def test_missing_extra_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def needs(module: str) -> object:
        def dispatch(args: argparse.Namespace) -> int:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)

        return dispatch

    monkeypatch.setattr(cli, "_dispatch", needs("hypothesis.strategies"))
    assert main(["fuzz", "list"]) == 2
    assert capsys.readouterr().err == (
        "schedguard fuzz: needs hypothesis, which is not installed: "
        "pip install 'schedguard[fuzz]'\n"
    )
    monkeypatch.setattr(cli, "_dispatch", needs("fuzz"))
    assert main(["fuzz", "list"]) == 2
    assert "the fuzz package is not installed here" in capsys.readouterr().err
    monkeypatch.setattr(cli, "_dispatch", needs("numpy"))  # not ours to explain: a bug
    with pytest.raises(ModuleNotFoundError):
        main(["fuzz", "list"])


def test_every_extra_named_exists() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for module, extra in cli.EXTRAS.items():
        assert extra in extras, (module, extra)
        assert any(module.replace("_", "-") in dep for dep in extras[extra]) or module in (
            "gevent",  # locust's
        ), (module, extra)
    assert missing_extra(ModuleNotFoundError(name="locust")) == (
        "needs locust, which is not installed: pip install 'schedguard[load]'"
    )


def _clear_schedguard_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("SCHEDGUARD_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("variable", "value", "meant"),
    [
        ("SCHEDGUARD_UPSTREAM_URL", "http://127.0.0.1:9", "SCHEDGUARD_UPSTREAM__URL"),
        ("SCHEDGUARD_LIMITS_FANOUT_MAX_N", "4", "SCHEDGUARD_LIMITS__FANOUT__MAX_N"),
        (
            "SCHEDGUARD_LIMITS__TOKENS__MAX_PROMT_TOKENS",
            "4096",
            "SCHEDGUARD_LIMITS__TOKENS__MAX_PROMPT_TOKENS",
        ),
        ("SCHEDGUARD_PRESETS", "seed", "SCHEDGUARD_PRESET"),
    ],
)
@pytest.mark.parametrize(
    "command", [["serve", "--upstream", "http://127.0.0.1:9"], ["policy", "show"]]
)
def test_an_unknown_variable_exits_2_naming_the_right_one(
    variable: str,
    value: str,
    meant: str,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_schedguard_env(monkeypatch)
    monkeypatch.setenv(variable, value)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f"{variable}: not a variable schedguard reads" in err
    assert f"did you mean {meant}?" in err


def test_serve_without_an_upstream_exits_2_unless_the_reference_is_asked_for(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_schedguard_env(monkeypatch)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("schedguard serve: no upstream: pass --upstream URL")
    assert "--embedded-reference" in err
    assert main(["serve", "--embedded-reference", "--upstream", "http://127.0.0.1:9"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_the_preset_flag_chooses_the_preset(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_schedguard_env(monkeypatch)
    assert main(["policy", "show", "--preset", "seed"]) == 0
    out = capsys.readouterr().out
    assert "preset: seed" in out and "max_prompt_tokens: 2048" in out
    assert main(["policy", "show"]) == 0
    assert "max_prompt_tokens: null" in capsys.readouterr().out


def test_policy_key_makes_a_key_that_the_policy_admits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from guard.policy import key_digest, policy_from_yaml

    assert main(["policy", "key", "--tenant", "team-a", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["key_sha256"] == key_digest(made["key"]) and made["tenant"] == "team-a"
    assert main(["policy", "key", "--tenant", "team-a"]) == 0
    entry = capsys.readouterr().out
    policy = policy_from_yaml(entry)  # the printed entry pastes into a policy as it is
    assert policy.keys[0].tenant == "team-a"
    assert main(["policy", "key", "--tenant", "no spaces"]) == 2
    assert "--tenant: must be 1 to 64" in capsys.readouterr().err
