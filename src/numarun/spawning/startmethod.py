"""One :class:`numarun.process.spec.WorkerSpec` per spawned rank, by start method: under
``"spawn"`` and ``"forkserver"`` the worker is pickled here as multiprocessing pickles for a
process it starts, so an argument that cannot go to another process raises before anything
starts."""

from __future__ import annotations

import functools
import os
import pickle
from typing import TYPE_CHECKING, Any

from numarun.errors import InvalidArgument
from numarun.spawning import childmain

if TYPE_CHECKING:
    from numarun.process.spec import WorkerSpec
    from numarun.spawning.ranks import Placement
    from numarun.spawning.workerrun import WorkerRun


def worker_specs(
    workers: list[childmain.WorkerProcess],
    method: str,
    worker_envs: list[dict[str, str]],
    placement: Placement,
    run: WorkerRun,
) -> list[WorkerSpec]:
    """One WorkerSpec per worker; under spawn/forkserver the worker is pickled here, so an
    argument that cannot go to another process raises before anything starts."""
    from numarun.process.spec import WorkerSpec

    argv: list[str] = []
    tracker: tuple[int, ...] = ()
    if method == "spawn":
        argv = _exec_argv()
        # As multiprocessing's spawn: children share this process's resource tracker.
        from multiprocessing import resource_tracker

        tracker = (resource_tracker.getfd(),)
    specs = []
    for rank, worker in enumerate(workers):
        result_fd = run.readers[rank].child_fd
        common: dict[str, Any] = {
            "local_rank": rank,
            "rank": rank,
            "env": worker_envs[rank],
            "cpus": placement.cpus[rank],
            "mem": placement.mems[rank],
        }
        if method == "fork":
            target = functools.partial(childmain.run_fork, worker)
            specs.append(
                WorkerSpec(start="fork", fork_target=target, pass_fds=(result_fd,), **common)
            )
            continue
        prep = _preparation_data(worker.name) if method == "spawn" else None
        body, fds = _pickle_worker(worker, prep, method)
        passed = [result_fd, *fds]
        if method == "forkserver":
            specs.append(
                WorkerSpec(
                    start="forkserver",
                    fork_target=childmain.run_forkserver,
                    payload=body,
                    pass_fds=tuple(passed),
                    **common,
                )
            )
            continue
        header = {"fds": passed, "tracker_fd": tracker[0] if tracker else None}
        payload = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL) + body
        specs.append(
            WorkerSpec(
                start="exec", argv=argv, payload=payload, pass_fds=(*passed, *tracker), **common
            )
        )
    return specs


def _exec_argv() -> list[str]:
    """What a spawned worker execs: multiprocessing's interpreter (``set_executable``) with
    this one's flags (``-O``, ``-X``, ``-W``, ``-S``, ...), as multiprocessing's spawn runs it.
    numarun's own directory is on ``sys.path`` only while ``numarun`` itself is imported (its
    submodules are found through the package), so the numarun this process imported is the one
    that runs, however it was found, and nothing else is shadowed."""
    import subprocess
    from multiprocessing import spawn as mp_spawn

    # src/numarun/spawning/startmethod.py -> src: the directory numarun itself was found in.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        f"import sys; sys.path.insert(0, {root!r}); import numarun; sys.path.remove({root!r}); "
        "from numarun.spawning.childmain import main; main()"
    )
    executable = os.fsdecode(mp_spawn.get_executable())
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    return [executable, *flags, "-c", code]


def _preparation_data(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a spawned child named ``name``."""
    from multiprocessing import spawn as mp_spawn

    return mp_spawn.get_preparation_data(name)  # type: ignore[no-any-return]


def _pickle_worker(
    worker: childmain.WorkerProcess, prep: dict[str, Any] | None, method: str
) -> tuple[memoryview, list[int]]:
    """The payload after its header: ``prep`` (spawn only) and the worker, and their fds."""
    objects = (worker,) if prep is None else (prep, worker)
    try:
        body, fds = childmain.dumps(*objects)
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidArgument(
            f"fn or args cannot be pickled for start_method={method!r}: {reason}; "
            "define fn at module level or use start_method='fork'"
        ) from None
    if (
        prep is not None
        and "init_main_from_path" not in prep
        and "init_main_from_name" not in prep
        and b"__main__" in body
    ):
        raise InvalidArgument(
            "fn or args come from an interactive __main__ that a spawned worker cannot import; "
            "move fn into a module or use start_method='fork'"
        )
    return body, fds
