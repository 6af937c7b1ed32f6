"""Usage errors as one line: the argparse parser of the launcher and of every ``numarun``
subcommand (:class:`OneLineParser`), and the "did you mean" for an option it does not know."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from numarun.errors import UsageError

__all__ = ["OneLineParser", "did_you_mean", "usage_error"]


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line (exit 2) naming ``<prog> --help`` instead of
    usage + error, with a "did you mean" for an option it does not know (:func:`usage_error`);
    the launcher's parser and every ``numarun`` subcommand's."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise usage_error(self, message, f"{self.prog} --help")


def usage_error(parser: argparse.ArgumentParser, message: str, help_command: str) -> UsageError:
    """argparse's ``message`` as one :class:`UsageError` line naming ``help_command``; for
    ``unrecognized arguments: --nprocs-per-node ...`` the closest of ``parser``'s long options
    (:func:`did_you_mean`) is named first."""
    prefix = "unrecognized arguments: "
    if message.startswith(prefix):
        unknown = message[len(prefix) :].split()
        first = next((token for token in unknown if token.startswith("--")), None)
        if first is not None:
            names = [name for name in parser._option_string_actions if name.startswith("--")]
            suggestion = did_you_mean(first.partition("=")[0], names)
            if suggestion:
                name = first.partition("=")[0]
                return UsageError(f"unknown option {name}: did you mean {suggestion}?")
    return UsageError(f"{message} (see '{help_command}')")


def did_you_mean(name: str, names: Sequence[str]) -> str | None:
    """The option of ``names`` closest to the unknown ``name`` (difflib's ratio >= 0.75, so a
    typo or a plural matches and an unrelated word does not); None when none is close. Of two
    spellings of one option the one in ``name``'s style (dashes or underscores) is named."""
    import difflib

    dashed = "_" not in name[2:]
    style = [n for n in names if ("_" not in n[2:]) == dashed] or list(names)
    close = difflib.get_close_matches(name, style, n=1, cutoff=0.75)
    return close[0] if close else None
