"""Errors numarun raises for bad input and for failed workers.

Every :class:`NumarunError` carries a one-line message that tells the user what is wrong and,
where there is one, how to fix it. The command line prints that line and exits with
:attr:`NumarunError.exit_code` (2, argparse's code for usage errors, unless stated otherwise);
it never shows a traceback for these.
"""

from __future__ import annotations


class NumarunError(Exception):
    """Base class: bad input or an impossible request, detected before anything starts."""

    exit_code = 2


class UsageError(NumarunError):
    """A malformed argument or a combination of arguments that cannot work."""


class InvalidArgument(UsageError, ValueError):
    """A bad argument to numarun's Python API (``numarun.spawn``): a :class:`UsageError` that
    is also the :class:`ValueError` ``torch.multiprocessing`` raises for the same mistake, so
    code written against either catches it."""


class TopologyError(NumarunError):
    """The machine description cannot be read (missing or unreadable sysfs root)."""


class PlanError(NumarunError):
    """The requested binding cannot be planned on this machine (too many ranks, no CPUs...)."""


class BindingError(NumarunError):
    """A planned binding cannot be applied here (memory policy refused, CPUs not allowed)."""
