"""Shared test setup: tests/ is importable (fixtures such as ``sysfs_fixtures`` live there)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# A test run started in the background of a non-interactive shell (`cmd &` in a script, some CI
# runners) inherits SIGINT ignored, and so would every process the tests start: the tests of
# Ctrl-C would then test that disposition instead. Python's own handler gives the processes
# started here the default a terminal's user has.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
