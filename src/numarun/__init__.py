"""numarun: start one worker per GPU or CPU slice, bound near its device, and supervise them.

The spawn API is exported lazily (PEP 562), so ``import numarun`` costs next to nothing: the
names below load :mod:`numarun.spawning.api` on first use.
"""

_SPAWN_EXPORTS = (
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "spawn",
    "start_processes",
)

__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "__version__",
    "spawn",
    "start_processes",
]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun._version import __version__
    from numarun.spawning.api import (
        ProcessContext,
        ProcessException,
        ProcessExitedException,
        ProcessRaisedException,
        SpawnContext,
        spawn,
        start_processes,
    )


def __getattr__(name: str) -> object:
    if name == "__version__":  # lazily too: every worker imports this package first
        from numarun._version import __version__

        return __version__
    if name not in _SPAWN_EXPORTS:
        raise AttributeError(f"module 'numarun' has no attribute {name!r}")
    import importlib

    module = importlib.import_module("numarun.spawning.api")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SPAWN_EXPORTS) | {"__version__"})
