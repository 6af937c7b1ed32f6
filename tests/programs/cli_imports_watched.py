"""The launcher (``numarun.cli.main``) with its imports watched, for
tests/launch/test_launcher_failure_imports.py.

    python cli_imports_watched.py LOG GO HOLD [--] NUMARUN ARGS...

Every import the launcher starts goes to LOG at exit as ``<thread name>\\t<module>``. HOLD:

* ``typing`` forces the race of issue 24 item 1: ``typing`` imported by any thread but the
  main one is held half made (in ``sys.modules``, not yet run) until the process ends, and GO
  is created then;
* ``sigterm``: the launcher sends itself SIGTERM as its main thread starts importing
  ``numarun.launch.summary``;
* ``-``: nothing.

GO is also created when the main thread starts importing ``numarun.launch.summary`` (the
launcher preparing its failure path), so a rank that waits for GO fails either while the race
is set up or once the launcher is ready for it.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import os
import signal
import sys
import threading

log_path, go_path, hold = sys.argv[1], sys.argv[2], sys.argv[3]
argv = sys.argv[4:]
if argv[:1] == ["--"]:
    argv = argv[1:]
seen: list[str] = []
forever = threading.Event()


def _go() -> None:
    with open(go_path, "a"):
        pass


class _HeldLoader:
    """Runs ``typing`` only after ``forever``: the module stays half made in ``sys.modules``."""

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        _go()
        forever.wait()
        self._loader.exec_module(module)  # type: ignore[attr-defined]


class _Watch:
    """First on ``sys.meta_path``: notes every import, holds ``typing`` outside the main
    thread when asked to."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> object:
        thread = threading.current_thread()
        seen.append(f"{thread.name}\t{name}")
        main = thread is threading.main_thread()
        if main and name == "numarun.launch.summary":
            _go()
            if hold == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
        if hold == "typing" and name == "typing" and not main:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _HeldLoader(spec.loader)
            return spec
        return None


def _write_log() -> None:
    with open(log_path, "w") as log:
        log.write("\n".join(seen) + "\n")


atexit.register(_write_log)
sys.meta_path.insert(0, _Watch)

from numarun.cli import main  # noqa: E402

raise SystemExit(main(argv))
