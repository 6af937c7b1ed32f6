"""``numarun.spawn`` / ``numarun.start_processes``: ``fn(local_rank, *args)`` in N bound workers.

A drop-in for ``torch.multiprocessing.spawn`` / ``start_processes`` (same arguments, exception
classes and messages, :class:`ProcessContext` API), plus: ``join=True`` returns the list of
return values; every worker is bound to its CPUs and memory policy before it runs anything
(``binding=``, ``mem_binding=``); ``fork`` and ``forkserver`` are used as asked (torch's
``spawn`` forces ``spawn``); one :class:`numarun.process.supervisor.Supervisor` tears every
worker's process tree down at the first failure and on a signal while joining. Workers run as
soon as the call returns, joined or not.

The exact semantics are in one place each: the arguments, each worker's environment and the
errors, :func:`spawn`'s docstring; failures and signals while joining,
:meth:`ProcessContext.join`'s; what runs inside a worker under each start method and how
arguments and results travel (multiprocessing's pickles, fds included),
:mod:`numarun.spawning.childmain`; the caller's side of a run, :mod:`numarun.spawning.workerrun`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from numarun.errors import InvalidArgument, NumarunError
from numarun.spawning import childmain
from numarun.spawning.context import ProcessContext, SpawnContext, check_grace_period
from numarun.spawning.exceptions import (
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
)
from numarun.spawning.ranks import check_dist_env, resolve_binding, worker_envs
from numarun.spawning.startmethod import worker_specs

if TYPE_CHECKING:
    from collections.abc import Callable

    from numarun.placement.plan import Plan
    from numarun.process.spec import WorkerExit
    from numarun.spawning.workerrun import WorkerPopen

__all__ = [
    "START_METHODS",
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "spawn",
    "start_processes",
]

START_METHODS = ("spawn", "fork", "forkserver")


def spawn(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str | None = "spawn",
    *,
    binding: str | Plan | Sequence[Sequence[int] | str] | None = None,
    mem_binding: str | None = None,
    grace_period: float = 30.0,
    env: Mapping[str, str] | None = None,
    binding_fallback: bool = False,
    dist_env: bool = False,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[Any] | ProcessContext:
    """Run ``fn(local_rank, *args)`` in ``nprocs`` workers; by default wait and return their values.

    Args:
        fn: called as ``fn(local_rank, *args)`` in each worker. Under ``"spawn"`` and
            ``"forkserver"`` it and ``args`` must pickle (a module-level function); under
            ``"fork"`` anything callable works. ``args`` may hold what multiprocessing passes to
            a process it starts: queues, pipes, locks, events, ``Manager`` proxies, shared
            ``Value``/``Array``, sockets, CPU tensors (shared memory: changes in place are seen
            by the caller).
        nprocs: number of workers (>= 1).
        join: True: wait, return ``[fn's value for rank 0, ...]`` (pickled as arguments are,
            so a returned tensor comes back in shared memory). False: return a
            :class:`ProcessContext` at once; the workers are already running.
        daemon: the workers' daemon flag, as multiprocessing's: daemon workers cannot start
            multiprocessing children and are terminated when this process exits; non-daemon
            workers are waited for at exit. Either way workers never outlive a process that is
            killed (parent-death signal), and are torn down when a worker fails or this process
            is signalled while joining.
        start_method: ``"spawn"``, ``"fork"``, ``"forkserver"``, or None for the platform's
            default, as torch.
        binding: None or ``"none"`` (inherit this process's CPUs), a planner mode
            (``"node"``, ``"socket"``, ``"exclusive"``, ``"core-complex"``, ``"cpu"``), a ready
            :class:`numarun.placement.plan.Plan` with one rank per worker, or one CPU set per
            rank (``[[0, 1], [2, 3]]`` or ``["0-1", "2-3"]``).
        mem_binding: None/``"none"``, ``"local"``, ``"preferred"``, ``"bind"`` or
            ``"interleave"`` over each rank's planned memory nodes (all but ``"local"`` need a
            ``binding``).
        grace_period: seconds between the first signal of a teardown (SIGTERM, or the
            signal this process received) and SIGKILL (>= 0).
        env: added to (and overriding) ``os.environ`` for the workers; this process's
            environment is never changed.
        binding_fallback: allow the planner and the memory policy check to fall back (no
            binding / weaker policy) instead of raising; each fallback is reported with
            :func:`warnings.warn`.
        dist_env: also give each worker what ``init_process_group("env://")`` reads, as
            torchrun does: ``RANK`` and ``LOCAL_RANK`` (the local rank), ``WORLD_SIZE`` and
            ``LOCAL_WORLD_SIZE`` (``nprocs``), ``MASTER_ADDR``, ``MASTER_PORT``. Off by default,
            as in torch: code that tests ``"RANK" in os.environ`` to detect torchrun must not
            take the wrong branch.
        master_addr, master_port: with ``dist_env=True``, ``MASTER_ADDR`` / ``MASTER_PORT``;
            defaults: the value in ``env`` or ``os.environ``, else ``127.0.0.1`` and a port that
            was free when checked (bind to port 0, then release: another process may take it
            meanwhile). Given without ``dist_env=True``: :class:`InvalidArgument`.

    Each worker's environment is ``os.environ`` + ``env``, unchanged, as under
    ``torch.multiprocessing.spawn``, plus ``NUMARUN_RUN_ID`` (how the teardown recognises the
    run's processes). With a ``binding`` in force: the plan's variables (e.g.
    ``CUDA_DEVICE_ORDER``) and ``OMP_NUM_THREADS`` = the rank's bound physical cores, unless
    ``os.environ`` or ``env`` sets it (unbound workers get no ``OMP_NUM_THREADS``: OpenMP's own
    default, as under torch; torchrun forces 1). With ``dist_env=True``: the variables above.

    Raises, before any worker starts, a :class:`numarun.errors.NumarunError`, which is a
    :class:`ValueError` (``except ValueError`` catches every one, as torch's), with a one-line
    message naming the keyword: :class:`~numarun.errors.InvalidArgument` (a bad argument:
    type, value or unknown name, ``nprocs`` beyond the machine's limits, unpicklable
    ``fn``/``args``, a call made while a spawned worker imports the main module),
    :class:`~numarun.errors.UsageError` (a malformed CPU list or memory policy),
    :class:`~numarun.errors.PlanError` (the binding cannot be planned here: too many ranks,
    no GPUs), :class:`~numarun.errors.BindingError` (CPUs or memory policy not allowed here),
    :class:`~numarun.errors.TopologyError` (the machine cannot be read).
    After start (join=True): :class:`ProcessRaisedException` when ``fn`` raised in a worker,
    :class:`ProcessExitedException` when a worker exited non-zero or was killed by a signal;
    the first failure in time is raised, every other worker is torn down first. SIGINT, SIGTERM
    and SIGHUP while joining tear the job down as :meth:`ProcessContext.join` says.
    """
    try:
        context = _start(fn, args, nprocs, daemon, start_method, binding=binding,
                         mem_binding=mem_binding, grace_period=grace_period, env=env,
                         binding_fallback=binding_fallback, dist_env=dist_env,
                         master_addr=master_addr, master_port=master_port,
                         hold_signals=join)  # fmt: skip
    except NumarunError as error:
        # Bad input, nothing started: the traceback ends here, at the caller's call, not in
        # the planner's depths (its message says everything).
        raise error.with_traceback(None) from None
    return _join_all(context) if join else context


def _join_all(context: ProcessContext) -> list[Any]:
    """Wait for the end (``join=True``): the return values, or what
    :meth:`ProcessContext.join` raises."""
    try:
        with context:
            while not context.join():
                pass
        values = context.return_values
    finally:
        context._release()
    assert values is not None
    return values


start_processes = spawn


# --- starting ------------------------------------------------------------------------------------


def _start(
    fn: Callable[..., Any],
    args: Sequence[Any],
    nprocs: int,
    daemon: bool,
    start_method: str | None,
    *,
    binding: object,
    mem_binding: str | None,
    grace_period: float,
    env: Mapping[str, str] | None,
    binding_fallback: bool,
    dist_env: bool,
    master_addr: str | None,
    master_port: int | None,
    hold_signals: bool = False,
) -> ProcessContext:
    """Check everything, plan, build the workers and start them; nothing starts on error.
    ``hold_signals``: see :meth:`numarun.process.supervisor.Supervisor.start`."""
    method = _check_arguments(fn, args, nprocs, start_method, grace_period, env)
    check_dist_env(dist_env, master_addr, master_port)
    base_env = dict(os.environ)
    base_env.update(env or {})
    placement = resolve_binding(binding, mem_binding, nprocs, binding_fallback, base_env)
    envs = worker_envs(
        base_env,
        nprocs,
        placement,
        dist_env=dist_env,
        master_addr=master_addr,
        master_port=master_port,
    )
    workers = [
        childmain.WorkerProcess(fn, rank, tuple(args), method, bool(daemon))
        for rank in range(nprocs)
    ]
    # Importing multiprocessing.util registers multiprocessing's exit handler, which waits for
    # non-daemon workers and terminates daemon ones when this interpreter exits.
    from multiprocessing import util  # noqa: F401

    from numarun.process.supervisor import Supervisor
    from numarun.spawning.workerrun import WorkerRun
    from numarun.stacks.jobstacks import for_spawn

    run = WorkerRun(nprocs, method)
    stacks = None
    try:
        specs = worker_specs(workers, method, envs, placement, run)
        specs, stacks = for_spawn(specs, fn)  # `numarun stacks` reaches fn under every method

        def on_exit(ended: WorkerExit) -> None:
            run.on_exit(ended)
            if stacks is not None:
                stacks.on_exit(ended)

        # relay_signal: Ctrl-C reaches the workers as SIGINT, as the terminal's does under
        # torch (its workers share the caller's process group; numarun's have sessions of
        # their own), so checkpoint-on-interrupt code runs; as the numarun command does.
        supervisor = Supervisor(
            specs,
            grace_period=grace_period,
            on_exit=on_exit,
            on_failure=run.on_failure,
            relay_signal=True,
        )
        run.watch(supervisor)
        if stacks is not None:
            stacks.attach(supervisor)
            stacks.listen()
        # join=True: the signal handling stays until the join that follows, so that a SIGTERM
        # in between tears the workers down instead of leaving them to an exiting caller.
        supervisor.start(hold_signals=hold_signals)
    except BaseException:
        run.close()
        if stacks is not None:
            stacks.close()
        raise
    _started(workers, run.attach(supervisor.pids()))
    return ProcessContext(run, workers, grace_period)


def _started(workers: Sequence[childmain.WorkerProcess], popens: Sequence[WorkerPopen]) -> None:
    """What ``BaseProcess.start()`` does once its Popen runs, for each worker and its Popen."""
    from multiprocessing import process

    for worker, popen in zip(workers, popens, strict=True):
        worker._popen = popen  # type: ignore[attr-defined]
        worker._sentinel = popen.sentinel  # type: ignore[attr-defined]
        process._children.add(worker)  # type: ignore[attr-defined]


def _check_arguments(
    fn: object,
    args: object,
    nprocs: object,
    start_method: object,
    grace_period: object,
    env: object,
) -> str:
    """Raise InvalidArgument for a bad argument; returns the start method to use."""
    worker = sys.modules.get("numarun.spawning.childmain")
    if worker is not None and getattr(worker, "importing_main", False):
        raise InvalidArgument(
            "numarun.spawn was called while a worker imported the main module; "
            'put the call under if __name__ == "__main__":'
        )
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise InvalidArgument(
            f"args must be a tuple of arguments for fn, got {type(args).__name__}"
        )
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise InvalidArgument(f"nprocs must be an integer >= 1, got {nprocs!r}")
    from numarun.process.capacity import worker_count_problem

    if (problem := worker_count_problem(nprocs)) is not None:
        raise InvalidArgument(f"nprocs={nprocs}: {problem}")
    if start_method is None:
        import multiprocessing

        start_method = multiprocessing.get_start_method()
    if start_method not in START_METHODS:
        raise InvalidArgument(
            f"unknown start_method {start_method!r}; choose one of {', '.join(START_METHODS)} "
            "(or None for the platform's default)"
        )
    check_grace_period(grace_period)
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise InvalidArgument("env must be a mapping of str to str")
    return str(start_method)
