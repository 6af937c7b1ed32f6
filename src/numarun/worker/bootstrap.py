"""Worker bootstrap: run a Python script or module exactly as ``python`` would, recording failures.

Command line (what the launcher puts in a worker's argv)::

    python -u -c "from numarun.worker.bootstrap import main; main()" [--] SCRIPT [ARG...]
    python -u -c "from numarun.worker.bootstrap import main; main()" -m MODULE [ARG...]

like ``python -u SCRIPT ARG...`` and ``python -u -m MODULE ARG...``. ``-c`` rather than ``-m``:
``-m`` makes every worker import :mod:`runpy` first (3 to 4 ms on a bare interpreter), and running
this file by its path would compile it at every start (no bytecode cache for ``__main__``). ``python
-m numarun.worker.bootstrap ...`` works the same way. ``--`` is needed only when SCRIPT starts with
``-``. The user's program sees what it would see under plain ``python``: ``sys.argv`` (``[SCRIPT,
ARG...]``; for ``-m`` the module's file path first), ``sys.path[0]`` (the script's directory with
symlinks resolved; the current directory for ``-m``; nothing added under ``-P``/``-I``), a fresh
``__main__`` module with an absolute ``__file__``, and the same exit status: 0 at the end, ``n`` for
``SystemExit(n)``, 1 for an uncaught exception (traceback on stderr through ``sys.excepthook``,
without this bootstrap's frames), death by SIGINT for an uncaught ``KeyboardInterrupt``, 2 with
Python's message when SCRIPT cannot be opened, 1 with Python's message when MODULE is not found. A
directory or zip archive as SCRIPT runs its ``__main__`` module, as python does. Bad bootstrap usage
(no SCRIPT or MODULE) prints a usage line and exits 2.

What it adds, as torchrun's ``@record`` does: ``faulthandler`` is enabled for all threads (a
SIGSEGV prints Python tracebacks on stderr), and an uncaught exception other than
``KeyboardInterrupt`` is written to ``$TORCHELASTIC_ERROR_FILE`` in torchrun's format -- unless
that file already exists, i.e. the user's own ``@record`` wrote it first. And, before the
user's code, numarun's stack dumps are armed (:mod:`numarun.worker.dumphandler`). A ``--preload``
standby (``NUMARUN_STANDBY_FD`` set) first becomes what the cold worker is when its script's
first line runs (``sys.argv``, ``sys.path[0]``, a fresh ``__main__`` with its ``__file__``: the
imports find the files the cold worker's would, never the working directory's in place of the
script directory's), arms the stack dumps on the file its attempt reads (a hang in an import is
seen and declared as in a cold worker), then imports its modules and waits for its attempt
(:mod:`numarun.worker.preload`); from its hand-over on, everything here is as in a cold worker,
the script running in that same ``__main__``.

Imports stay minimal because every worker pays for them (``benchmarks/bench_bootstrap.py``
holds it within 5 ms of ``python -u script.py``): only ``os``, ``sys`` (loaded by every
interpreter), the built-in ``faulthandler`` and the tiny :mod:`numarun.worker.dumphandler`;
``runpy`` only for ``-m``, a directory or a zip archive (as ``python`` itself), and
``json``/``traceback`` only on the failure path.
"""

import faulthandler
import os
import sys

# typing is not imported at run time: this module is on every worker's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

USAGE = "usage: python -m numarun.worker.bootstrap [--] SCRIPT [ARG...] | -m MODULE [ARG...]"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
STANDBY_FD_ENV = "NUMARUN_STANDBY_FD"  # numarun.worker.preload's, not imported on the cold path


def main(argv: "list[str] | None" = None) -> None:
    """Run ``argv`` (this module's arguments; default ``sys.argv[1:]``); never returns normally
    from a failure."""
    if argv is None:
        argv = sys.argv[1:]
    # No usable stderr (closed, or an object without a fileno): run anyway. Not
    # contextlib.suppress: importing contextlib costs a bare interpreter about 3 ms.
    try:  # noqa: SIM105
        faulthandler.enable(all_threads=True)
    except (AttributeError, OSError, RuntimeError, ValueError):
        pass
    target, args, as_module = _target(argv)
    namespace = None
    if STANDBY_FD_ENV in os.environ:  # a --preload standby: imports, then its attempt
        namespace = _as_at_first_line(target, args, as_module)
        armed = _arm_stacks()  # before the imports: a hang in them is seen as in a cold worker
        _keep_armed(armed, _standby())
    else:
        _arm_stacks()
    try:
        if as_module:
            _run_module(target, args, namespace)
        else:
            _run_script(target, args, namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        _fail(exc)


def _target(argv: "list[str]") -> "tuple[str, list[str], bool]":
    """(script or module, its arguments, whether it is a module) from the bootstrap's argv;
    bad usage exits 2."""
    if argv[:1] == ["-m"]:
        if len(argv) < 2 or not argv[1] or argv[1].startswith("-"):
            _usage()
        return argv[1], argv[2:], True
    if argv[:1] == ["--"]:
        argv = argv[1:]
    elif argv[:1] and argv[0].startswith("-"):
        _usage()
    if not argv:
        _usage()
    return argv[0], argv[1:], False


def _usage() -> None:
    sys.stderr.write(USAGE + "\n")
    sys.exit(2)


def _fresh_main() -> dict[str, object]:
    # A new __main__ so the user's globals never mix with this bootstrap's.
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = sys.modules["builtins"]
    sys.modules["__main__"] = module
    return module.__dict__


def _standby() -> "str | None":
    from numarun.worker.preload import standby

    stacks_file = standby()
    sys.modules.pop("numarun.worker.preload", None)  # the launcher's, not the user's
    return stacks_file


def _as_at_first_line(target: str, args: "list[str]", as_module: bool) -> "dict[str, object]":
    """A standby, before its imports: ``sys.argv``, ``sys.path`` and ``__main__`` as the
    cold worker has them when its script's (or module's) first line runs, so that the
    preloaded imports find the same files and see the same process (the working directory
    is the cold worker's already). Returns ``__main__``'s namespace, which the script runs in
    after the hand-over (what the imports did to these stays, as in a cold worker)."""
    if as_module:
        origin = _module_file(target)
        sys.argv = [origin or "-m", *args]
        if not _safe_path():
            _set_path0(os.getcwd())
        namespace = _fresh_main()
        if origin is not None:
            namespace["__file__"] = origin
        return namespace
    sys.argv = [target, *args]
    if os.path.isdir(target) or not _is_plain_file(target):
        _path_entry(target)
        return _fresh_main()
    if not _safe_path():
        _set_path0(os.path.dirname(os.path.realpath(target)))
    return _script_main(os.path.abspath(target))


def _module_file(name: str) -> "str | None":
    """Where ``python -m name`` finds the module's file (its ``sys.argv[0]``), located
    without importing anything (a package's ``__path__`` as its directory); None when not
    found here (the run then says why, as ``python -m`` would)."""
    from _frozen_importlib_external import PathFinder

    safe = _safe_path()
    path = [*([] if safe else [os.getcwd()]), *sys.path[0 if safe else 1 :]]
    parts = name.split(".")
    try:
        for depth in range(1, len(parts) + 1):
            spec = PathFinder.find_spec(".".join(parts[:depth]), path)
            if spec is None:
                return None
            path = list(spec.submodule_search_locations or ())
        if spec.submodule_search_locations is not None:  # a package: its __main__ runs
            spec = PathFinder.find_spec(f"{name}.__main__", path)
        return spec.origin if spec is not None else None
    except (ImportError, OSError, ValueError):
        return None


def _keep_armed(armed: "tuple[str, int] | None", handed: "str | None") -> None:
    """After the hand-over (``handed``: the attempt's stack-dump file): the stack dumps stay
    armed on the file they were armed on before the imports when the attempt's is the same
    (the launcher gives a standby its attempt's file at birth). Otherwise the attempt's file
    is armed instead (unarmed without one), and the first file's fd is closed."""
    if armed is not None and handed == armed[0]:
        return
    if _arm_stacks(handed) is None and armed is not None:
        from numarun.worker.dumphandler import STACKS_SIGNAL

        faulthandler.unregister(STACKS_SIGNAL)  # never a dump into a closed (reused) fd
    if armed is not None:
        try:  # noqa: SIM105
            os.close(armed[1])
        except OSError:
            pass


def _arm_stacks(path: "str | None" = None) -> "tuple[str, int] | None":
    try:
        from numarun.worker.dumphandler import arm
    except ImportError:  # a copy of this file run outside its package: run unarmed
        return None
    return arm(path)


def _run_module(name: str, args: list[str], namespace: "dict[str, object] | None") -> None:
    import runpy  # `python -m MODULE` imports it too

    if namespace is None:
        sys.argv = ["-m", *args]
        if not _safe_path():
            _set_path0(os.getcwd())  # what `python -m` puts first
        _fresh_main()
    # The same entry point `python -m` uses: argv[0] becomes the module's file, the code runs
    # in sys.modules["__main__"], "No module named x" exits 1 with python's message.
    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]


def _run_script(path: str, args: list[str], namespace: "dict[str, object] | None") -> None:
    if namespace is None:
        sys.argv = [path, *args]
    if os.path.isdir(path) or not _is_plain_file(path):
        _run_path(path, prepared=namespace is not None)
        return
    absolute = os.path.abspath(path)
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as err:
        sys.stderr.write(
            f"{sys.executable}: can't open file {absolute!r}: [Errno {err.errno}] {err.strerror}\n"
        )
        sys.exit(2)
    if namespace is None:
        if not _safe_path():
            _set_path0(os.path.dirname(os.path.realpath(path)))
        namespace = _script_main(absolute)
    code = compile(source, absolute, "exec", dont_inherit=True)
    exec(code, namespace)


def _script_main(absolute: str) -> "dict[str, object]":
    namespace = _fresh_main()
    namespace.update(__file__=absolute, __cached__=None, __package__=None, __spec__=None)
    namespace["__loader__"] = _source_loader(absolute)
    return namespace


def _is_plain_file(path: str) -> bool:
    # A zip archive runs through runpy like `python app.zip`; a missing path reports below.
    if not os.path.exists(path):
        return True
    try:
        with open(path, "rb") as file:
            return file.read(4) != b"PK\x03\x04"
    except OSError:
        return True


def _run_path(path: str, *, prepared: bool = False) -> None:
    import runpy

    if not prepared:
        _path_entry(path)
        _fresh_main()
    runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]


def _path_entry(path: str) -> None:
    # What python does for a directory or zip archive: the path itself, absolute, becomes
    # sys.path[0] (even under -P) and its __main__ module runs; sys.argv[0] stays as given.
    if _safe_path():
        sys.path.insert(0, os.path.abspath(path))
    else:
        _set_path0(os.path.abspath(path))


def _safe_path() -> bool:
    return bool(getattr(sys.flags, "safe_path", False) or sys.flags.isolated)


def _set_path0(directory: str) -> None:
    # sys.path[0] is '' (under -c) or the current directory (under `python -m
    # numarun.worker.bootstrap`); python SCRIPT would have put the script's directory there.
    if sys.path:
        sys.path[0] = directory
    else:
        sys.path.insert(0, directory)


def _source_loader(path: str) -> object:
    # importlib.machinery's class, from the frozen module every interpreter has loaded
    # (importing importlib.machinery would cost a worker about a millisecond).
    from _frozen_importlib_external import SourceFileLoader

    return SourceFileLoader("__main__", path)


def _own_frame(filename: str) -> bool:
    return filename in (__file__, "<frozen runpy>") or filename.endswith(f"{os.sep}runpy.py")


def _user_traceback(tb: "TracebackType | None") -> "TracebackType | None":
    while tb is not None and _own_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _fail(exc: BaseException) -> None:
    exc = exc.with_traceback(_user_traceback(exc.__traceback__))
    if not isinstance(exc, KeyboardInterrupt):
        _record(exc)
    hook = sys.excepthook
    try:
        hook(type(exc), exc, exc.__traceback__)
    except BaseException:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    if type(exc) is KeyboardInterrupt:
        # Re-raise with a silent hook: the interpreter itself then exits the way it does for
        # an uncaught Ctrl-C (full shutdown, then death by SIGINT), which we cannot fake.
        sys.excepthook = _silent_hook
        raise exc
    sys.exit(1)


def _silent_hook(*_: object) -> None:
    pass


def _record(exc: BaseException) -> None:
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or os.path.exists(path):
        return  # no error file wanted, or the user's @record wrote it first
    try:
        from numarun.worker.errorfile import write_error_file

        write_error_file(path, exc)
    except Exception as err:  # a full disk must not hide the user's traceback
        sys.stderr.write(f"numarun: could not write error file {path}: {err}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
