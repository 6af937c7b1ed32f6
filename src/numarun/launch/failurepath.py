"""When a launch imports what acting on a failure needs.

What a failure needs is imported before any failure is acted on, in the main thread
(:func:`import_failure_path`): under a torch rendezvous once the workers started and before
the supervisor's loop serves its first event; on numarun's static rendezvous, where no other
thread runs then, :data:`FAILURE_PATH_DELAY` seconds after the workers started (not while their
interpreters start, which its few milliseconds would slow on a machine with few cores; nor at
the first worker's end, which in a short run comes while the others still start) or at the first
failure, before it is acted on, whichever comes first, and at the latest once the attempt ended:
a run that succeeds imports what one that fails does. Nothing is imported in another thread: an
import in progress elsewhere leaves a module in ``sys.modules`` half made (creating a dataclass
reads ``typing`` from there without the import lock, and failed with ``partially initialized
module 'typing' has no attribute 'ClassVar'`` when a background thread was importing it as a
worker failed).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from numarun.process.spec import WorkerExit

FAILURE_PATH_DELAY = 0.25  # seconds from the workers' start to the failure path's import


def after_import(
    call: Callable[[WorkerExit], None] | None, elastic: bool
) -> Callable[[WorkerExit], None]:
    """``call`` (or nothing), after :func:`import_failure_path`: a supervisor's
    ``on_failure``, so that the first failure is acted on with the failure path imported
    (this module's docstring)."""

    def after_importing(ended: WorkerExit) -> None:
        import_failure_path(elastic)
        if call is not None:
            call(ended)

    return after_importing


def import_failure_path(elastic: bool) -> None:
    """Import what acting on a failure needs, in the main thread, before any failure is acted
    on (module docstring says when): the stacks' parser
    (:meth:`numarun.stacks.dumps.RankDumps.take` at the failure, the hang watch), the summary
    and the error files it reads, under a torch rendezvous the post that carries this node's
    stacks to the others, and the flight recorders' reader (with :mod:`pickle`: 2 ms with its
    bytecode cached). A few milliseconds, once per launch (then a look in ``sys.modules``);
    nothing of it is imported in another thread.

    The first time, what was imported since the start-up's ``gc.freeze()`` (these modules, and
    the few the workers' start brought) is frozen too: it lives until exit as the start-up's
    objects do, and the collection at interpreter exit would otherwise walk it, milliseconds
    between a failure and the launcher's exit."""
    global _failure_path_imported
    import json  # noqa: F401  (read_error_file)

    import numarun.launch.summary  # with launch.errorfile and stacks.parse
    import numarun.stacks.flightreport  # the ranks' flight recorders (with pickle)

    if elastic:
        import numarun.stacks.digest  # noqa: F401  (ElasticNode.on_worker_failure's post)
    if not _failure_path_imported:
        _failure_path_imported = True
        import gc

        gc.freeze()


_failure_path_imported = False
