"""A light module to ``--preload``: records which process imported it, and when.

With ``WM_IMPORTS`` set (a directory), writes ``<dir>/<pid>`` holding the monotonic time of
the import, so that a test can tell a worker that imported it before its script (a standby)
from one that did not.
"""

import os
import time

_where = os.environ.get("WM_IMPORTS")
if _where:
    with open(os.path.join(_where, str(os.getpid())), "w") as _file:
        _file.write(repr(time.monotonic()))
