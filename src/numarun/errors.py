"""Errors numarun raises for bad input and for failed workers.

Every :class:`NumarunError` carries a one-line message that tells the user what is wrong and,
where there is one, how to fix it. The command line prints that line and exits with
:attr:`NumarunError.exit_code` (2, argparse's code for usage errors, unless stated otherwise);
it never shows a traceback for these.

One family for the Python API: every :class:`NumarunError` is a :class:`ValueError` (a bad
value, or a request this machine cannot meet, found before anything starts), so a caller of
``numarun.spawn`` catches any of them as ``except ValueError`` (as it would
``torch.multiprocessing``'s) or as ``except NumarunError``, and tells them apart by subclass:
:class:`InvalidArgument` (an argument of the API itself), :class:`UsageError` (a malformed or
conflicting value, as the command line's flags), :class:`PlanError`, :class:`BindingError`,
:class:`TopologyError`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


class NumarunError(ValueError):
    """Base class: bad input or an impossible request, detected before anything starts; a
    :class:`ValueError` (module docstring)."""

    exit_code = 2


class UsageError(NumarunError):
    """A malformed argument or a combination of arguments that cannot work."""


class InvalidArgument(UsageError):
    """A bad argument to numarun's Python API (``numarun.spawn``): a :class:`UsageError`, hence
    the :class:`ValueError` ``torch.multiprocessing`` raises for the same mistake, so code
    written against either catches it."""


class TopologyError(NumarunError):
    """The machine description cannot be read (missing or unreadable sysfs root)."""


class PlanError(NumarunError):
    """The requested binding cannot be planned on this machine (too many ranks, no CPUs...)."""


class BindingError(NumarunError):
    """A planned binding cannot be applied here (memory policy refused, CPUs not allowed)."""


def unknown_choice(what: str, value: object, choices: Sequence[str], *, quote: bool = True) -> str:
    """The one-line message for a value of ``what`` that is not one of ``choices``: the
    closest choice first when one is close (difflib's ratio >= 0.7: a typo, a plural), then
    every choice: ``unknown --numa-binding 'nodes': did you mean 'node'? (one of node,
    socket, ...)``."""
    import difflib

    shown = repr(value) if quote else str(value)
    close = difflib.get_close_matches(str(value).strip().lower(), list(choices), n=1, cutoff=0.7)
    listed = ", ".join(map(str, choices))
    if not close:
        return f"unknown {what} {shown}: use one of {listed}"
    return f"unknown {what} {shown}: did you mean {close[0]!r}? (one of {listed})"
