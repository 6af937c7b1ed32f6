"""Shared test setup: tests/ is importable (fixtures such as ``sysfs_fixtures`` live there)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
