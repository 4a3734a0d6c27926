"""The ``schedguard`` command's argument parser: an unknown option is refused by the parser of
the command it was given to, with that command's usage and the closest option it has.

argparse leaves a subcommand's unknown arguments to the top-level parser, which says
``usage: schedguard [-h] ... COMMAND ...`` and ``unrecognized arguments: --upstrem X``: neither
the command's options nor what was meant. Here ``schedguard serve --upstrem X`` says
``usage: schedguard serve ...`` and ``unrecognized arguments: --upstrem X (did you mean
--upstream?)``, exit 2.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

__all__ = ["Parser", "did_you_mean"]


def did_you_mean(word: str, options: Sequence[str]) -> str | None:
    """The option of ``options`` closest to ``word`` (an unknown ``--flag`` or
    ``--flag=value``), or None when none is close."""
    flag = word.partition("=")[0]
    close = difflib.get_close_matches(flag, list(options), n=1, cutoff=0.6)
    return close[0] if close else None


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose subcommands refuse unknown arguments
    themselves. Subcommand parsers made by :meth:`add_subparsers` are of this class too."""

    def parse_known_args(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and self._is_subcommand() and not self._has_subcommands():
            # Before argparse's own checks, which would say "the following arguments are
            # required: --target" for `fuzz run --targt x` and never name the typo.
            unknown = self._unknown_options(args)
            if unknown:
                self.error(self.unrecognized(unknown))
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self._is_subcommand():
            self.error(self.unrecognized(extras))
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return parsed

    def unrecognized(self, extras: Sequence[str]) -> str:
        """argparse's message for ``extras``, with the closest option of this parser for the
        first unknown option among them."""
        message = f"unrecognized arguments: {' '.join(extras)}"
        options = [opt for action in self._actions for opt in action.option_strings]
        for word in extras:
            if word.startswith("-") and word not in ("-", "--"):
                close = did_you_mean(word, options)
                if close is not None:
                    return f"{message} (did you mean {close}?)"
                break
        return message

    def _unknown_options(self, args: Sequence[str]) -> list[str]:
        """The ``--words`` of ``args`` (up to a ``--``) that are no option of this parser nor
        an abbreviation argparse would accept."""
        options = [opt for action in self._actions for opt in action.option_strings]
        unknown = []
        for word in args:
            if word == "--":
                break
            if not word.startswith("--"):
                continue
            flag = word.partition("=")[0]
            if flag not in options and not any(opt.startswith(flag) for opt in options):
                unknown.append(word)
        return unknown

    def _has_subcommands(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self._actions)

    def _is_subcommand(self) -> bool:
        # The top-level parser's own prog is one word; a subcommand's is "schedguard CMD ...".
        return " " in self.prog
