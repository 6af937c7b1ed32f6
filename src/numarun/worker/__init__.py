"""What runs inside a launched rank, before and around the user's code, under a strict import
budget: every numarun module a rank has loaded when its script starts is in this wing (and the
base modules).

- ``bootstrap``: ``python -m numarun.worker.bootstrap``: stacks armed, the user's script or
  module run as ``python`` would, the error file written for a worker without ``@record``.
- ``dumphandler``: the helper thread (stacks taken holding the GIL, the flight recorder, on the
  launcher's requests) and ``faulthandler.register`` on signal 42 for when the GIL cannot be
  had (also used by ``numarun.spawn``'s children). Imports only ``os``, ``sys``, ``_thread``,
  ``_signal`` and ``faulthandler``.
- ``preload``: inside a standby (``--preload``): the preloaded imports, the wait, the hand-over.
- ``errorfile``: torchrun's error-file JSON, written here and read by the launcher's summary.

May import: the base (``numarun.errors``) and this package, nothing else: the launcher's wings
import this one, never the other way. ``tests/project/test_architecture.py`` holds the budget.
"""
