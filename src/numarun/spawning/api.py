"""``numarun.spawn`` / ``numarun.start_processes``: ``fn(local_rank, *args)`` in N bound workers.

A drop-in for ``torch.multiprocessing.spawn`` / ``start_processes`` (same arguments, exception
classes and messages, :class:`ProcessContext` API), with these additions: ``join=True`` returns
the list of return values; every worker is bound to its CPUs and memory policy before it runs
anything (``binding=``, ``mem_binding=``); ``fork`` and ``forkserver`` are used as asked (torch's
``spawn`` forces ``spawn``); and workers are supervised by
:class:`numarun.process.supervisor.Supervisor`, which tears down each worker's whole process
tree on the first failure and on SIGINT/SIGTERM/SIGHUP while joining.

Each worker is a :class:`multiprocessing.process.BaseProcess` (``ProcessContext.processes``) that
runs multiprocessing's own child bootstrap (:mod:`numarun.spawning.worker`), and its arguments and
return value are pickled as multiprocessing pickles for a process it starts (ForkingPickler in
multiprocessing's spawning context, fds handed over), so queues, pipes, locks, events, Manager
proxies and torch's shared-memory CPU tensors work under every start method:

* ``"spawn"`` (default): a fresh interpreter (with the caller's interpreter flags), bound at
  birth, reads multiprocessing's preparation data (``sys.argv``, ``sys.path``, the main module,
  imported as ``__mp_main__``) and the worker from a pipe.
* ``"fork"``: a forked copy of this process, bound, runs the worker it already holds (closures
  and lambdas work; nothing is pickled on the way in).
* ``"forkserver"``: :mod:`multiprocessing`'s fork server forks the worker; the binding is
  applied in that child and only then is the worker (``fn`` and ``args``) unpickled.
* ``None``: the platform's default (``multiprocessing.get_start_method()``), as torch.

Workers run as soon as the call returns, joined or not. The caller's side of a run (results,
sentinels, what ``processes`` call) is :mod:`numarun.spawning.caller`.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from numarun.errors import InvalidArgument
from numarun.placement import workerenv
from numarun.spawning import worker as _worker

if TYPE_CHECKING:
    from collections.abc import Callable

    from numarun.machine.model import Topology
    from numarun.placement.binding import MemPolicy
    from numarun.placement.plan import Plan
    from numarun.process.spec import RunResult, WorkerExit, WorkerSpec
    from numarun.spawning.caller import WorkerRun

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


# --- exceptions ----------------------------------------------------------------------------------


class ProcessException(Exception):
    """A worker failed. ``error_index`` is its local rank, ``error_pid`` (alias ``pid``) its pid.

    The exception raised is the first failure in time; ``failures`` holds the exceptions of the
    other workers that failed on their own (not those numarun terminated), in order of death.
    When ``torch.multiprocessing`` is loaded, the instances numarun raises also belong to
    torch's class of the same name (``except torch.multiprocessing.ProcessRaisedException``
    catches them); ``except numarun.ProcessRaisedException`` always does. Instances pickle with
    all attributes.
    """

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        # Not super(): with torch's class among the bases, the next __init__ is torch's.
        Exception.__init__(self, msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid
        self.failures: list[ProcessException] = []

    @property
    def pid(self) -> int:
        return self.error_pid

    def _init_args(self) -> tuple[Any, ...]:
        return (self.msg, self.error_index, self.error_pid)

    def __reduce__(self) -> tuple[Any, ...]:
        name = _numarun_class(type(self)).__name__
        return _rebuild_exception, (name, self._init_args()), self.__dict__


class ProcessRaisedException(ProcessException):
    """``fn`` raised in a worker; the message ends with the worker's formatted traceback."""


class ProcessExitedException(ProcessException):
    """A worker exited with a non-zero status or was killed by a signal.

    ``exit_code`` follows :class:`subprocess.Popen`: ``n`` for ``exit(n)``, ``-N`` when killed
    by signal ``N``; ``signal_name`` is then e.g. ``"SIGSEGV"``, else ``None``.
    """

    def __init__(
        self,
        msg: str,
        error_index: int,
        error_pid: int,
        exit_code: int,
        signal_name: str | None = None,
    ) -> None:
        ProcessException.__init__(self, msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def _init_args(self) -> tuple[Any, ...]:
        return (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name)


_EXCEPTIONS = {cls.__name__: cls for cls in (ProcessRaisedException, ProcessExitedException)}
_JOINED: dict[type, type] = {}


def _raised_as(cls: type[ProcessException]) -> type[ProcessException]:
    """``cls``, joined with torch's class of the same name when ``torch.multiprocessing`` is
    loaded (never imported here): real subclassing, which is what ``except`` checks."""
    peer = getattr(sys.modules.get("torch.multiprocessing.spawn"), cls.__name__, None)
    if not (isinstance(peer, type) and issubclass(peer, Exception)):
        return cls
    joined = _JOINED.get(cls)
    if joined is None:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        joined = _JOINED[cls] = type(cls.__name__, (cls, peer), namespace)
    return joined


def _numarun_class(cls: type) -> type:
    return next(base for base in cls.__mro__ if base.__module__ == __name__)


def _rebuild_exception(name: str, args: tuple[Any, ...]) -> ProcessException:
    return _raised_as(_EXCEPTIONS[name])(*args)


# --- the context ---------------------------------------------------------------------------------


class ProcessContext:
    """Running workers, returned by ``start_processes(..., join=False)``, as torch's.

    ``processes``: one :class:`multiprocessing.process.BaseProcess` per local rank (``pid``,
    ``name``, ``sentinel``, ``exitcode``, ``is_alive()``, ``join(timeout)``, ``terminate()``,
    ``kill()``, ``daemon``); ``sentinels``: ``{sentinel: local rank}`` of the workers
    :meth:`join` has not seen end; ``error_files``: ``None`` per rank (tracebacks come through
    a pipe, not files). Call :meth:`join` until it returns True, or use the context as a
    context manager: leaving the ``with`` block tears down workers still running (SIGTERM to
    each worker's tree, SIGKILL after the grace period) without raising for them.

    A context that is never joined: at interpreter exit multiprocessing's exit handler waits
    for non-daemon workers and terminates daemon ones; if this process dies, its workers die
    with it (parent-death signal). The thread that called ``start_processes`` must outlive the
    workers: the kernel's parent-death signal (SIGKILL) fires when the thread that created a
    worker exits.
    """

    def __init__(
        self, run: WorkerRun, processes: list[_worker.WorkerProcess], grace_period: float
    ) -> None:
        self.processes = processes
        self.error_files: list[str | None] = [None] * len(processes)
        self.sentinels = {process.sentinel: rank for rank, process in enumerate(processes)}
        self._run = run
        self._grace_period = grace_period
        self._values: list[Any] | None = None
        self._error: BaseException | None = None
        self._finished = False

    def pids(self) -> list[int]:
        """The workers' pids, by local rank."""
        return [int(process.pid) for process in self.processes]

    @property
    def return_values(self) -> list[Any] | None:
        """``fn``'s return values by local rank once :meth:`join` returned True, else None."""
        return self._values

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the end) for the workers.

        Returns True when every worker finished successfully (then :attr:`return_values` is
        set; later calls return True at once), False when the timeout passed first (workers keep
        running). On the first failure, as torch: with ``grace_period`` the other workers get
        that long to end on their own, then SIGTERM (with a ``Terminating process N via signal
        SIGTERM`` warning logged for each, as torch logs), then ``grace_period`` (default: the
        one given to ``spawn``) before SIGKILL; numarun sends these to each worker's whole
        process tree. Then :class:`ProcessRaisedException` or
        :class:`ProcessExitedException` is raised; later calls raise it again. A SIGINT
        received while waiting tears the workers down and raises :class:`KeyboardInterrupt`;
        SIGTERM or SIGHUP tear down, then are re-delivered to this process with its previous
        disposition, and if that returns, :class:`SystemExit` with ``128 + signal`` is raised.
        """
        if self._error is not None:
            raise self._error
        if self._finished:
            return True
        if grace_period is not None:
            _check_grace_period(grace_period)
        self._run.failure_grace = grace_period
        supervisor = self._run.supervisor
        assert supervisor is not None
        supervisor.grace_period = float(
            self._grace_period if grace_period is None else grace_period
        )
        self._run.joining = True
        try:
            result = self._run.join(timeout)
        except BaseException:
            self._finish_after_error()
            raise
        finally:
            self._run.joining = False
        for rank in range(len(self.processes)):
            if self._run.has_ended(rank):
                self.sentinels.pop(self.processes[rank].sentinel, None)
        if result is None:
            return False
        self._finished = True
        try:
            self._values = _outcome(result, self._run)
        except ProcessException as exc:
            self._error = exc
            raise
        finally:
            self._finish()
        return True

    def stop(self, grace_period: float | None = None) -> None:
        """Tear down workers still running now (SIGTERM, SIGKILL after ``grace_period``).

        Nothing is raised for the workers; afterwards :meth:`join` returns True and
        :attr:`return_values` stays None. Does nothing once :meth:`join` has finished.
        """
        if not self._finished:
            self._finished = True
            supervisor = self._run.supervisor
            assert supervisor is not None
            self._run.result = supervisor.stop(grace_period)
            self._finish()

    def _finish_after_error(self) -> None:
        self._finished = True
        supervisor = self._run.supervisor
        assert supervisor is not None
        self._run.result = supervisor.stop()
        self._finish()

    def _finish(self) -> None:
        """The run is over: results are decoded or dropped; multiprocessing forgets the
        workers (each ``sentinel`` stays valid until its process is closed or collected)."""
        from multiprocessing import process

        for worker in self.processes:
            process._children.discard(worker)  # type: ignore[attr-defined]
        for reader in self._run.readers:
            reader.close()
        self.sentinels.clear()

    def _release(self) -> None:
        """Close everything, sentinels too (the context was never handed out)."""
        self._finish()
        for worker in self.processes:
            if worker._popen is not None:  # type: ignore[attr-defined]
                worker._popen.close()  # type: ignore[attr-defined]
        self._run.close()

    def __enter__(self) -> ProcessContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


SpawnContext = ProcessContext  # torch's old name; numarun's name before ProcessContext


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
        nprocs: number of workers (>= 1); local rank ``i`` is also ``RANK`` ``i``.
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
        binding: None (inherit this process's CPUs), a planner mode (``"node"``, ``"socket"``,
            ``"exclusive"``, ``"core-complex"``, ``"cpu"``), a ready
            :class:`numarun.placement.plan.Plan` with one rank per worker, or one CPU set per
            rank (``[[0, 1], [2, 3]]`` or ``["0-1", "2-3"]``).
        mem_binding: None/``"none"``, ``"local"``, ``"preferred"``, ``"bind"`` or
            ``"interleave"`` over each rank's planned memory nodes (all but ``"local"`` need a
            ``binding``).
        grace_period: seconds between SIGTERM and SIGKILL when tearing down (>= 0).
        env: added to (and overriding) ``os.environ`` for the workers; this process's
            environment is never changed.
        binding_fallback: allow the planner and the memory policy check to fall back (no
            binding / weaker policy) instead of raising; each fallback is reported with
            :func:`warnings.warn`.
        master_addr, master_port: ``MASTER_ADDR`` / ``MASTER_PORT`` for the workers; defaults:
            the value in ``env`` or ``os.environ``, else ``127.0.0.1`` and a port that was free
            when checked (bind to port 0, then release: another process may take it meanwhile).

    Each worker's environment is ``os.environ`` + ``env``, then ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, the plan's variables
    (e.g. ``CUDA_DEVICE_ORDER``), and ``OMP_NUM_THREADS`` unless already set: the rank's bound
    physical cores, or for unbound workers this process's physical cores divided by ``nprocs``
    (at least 1). torchrun forces 1 instead.

    Raises, before any worker starts: :class:`numarun.errors.InvalidArgument` (a
    :class:`ValueError` and :class:`~numarun.errors.UsageError`: bad argument, unpicklable
    ``fn``/``args``, a call made while a spawned worker imports the main module),
    :class:`numarun.errors.UsageError` (unknown binding mode, from the planner),
    :class:`numarun.errors.PlanError` (binding impossible here),
    :class:`numarun.errors.BindingError` (CPUs or memory policy not allowed here).
    After start (join=True): :class:`ProcessRaisedException` when ``fn`` raised in a worker,
    :class:`ProcessExitedException` when a worker exited non-zero or was killed by a signal;
    the first failure in time is raised, every other worker is torn down first. SIGINT while
    waiting: teardown, then :class:`KeyboardInterrupt`. SIGTERM / SIGHUP: teardown, then the
    signal is re-delivered to this process with the disposition it had before (the default
    one ends the process); if that returns, ``SystemExit(128 + signal)`` is raised. Of these
    three, a signal this process ignores when ``spawn`` is called (SIGHUP under ``nohup``)
    stays ignored and tears nothing down. Signals are handled only when joining in the main
    thread; elsewhere they keep their usual effect on this process (the workers, in their own
    sessions, do not receive the terminal's Ctrl-C).
    """
    context = _start(
        fn,
        args,
        nprocs,
        daemon,
        start_method,
        binding=binding,
        mem_binding=mem_binding,
        grace_period=grace_period,
        env=env,
        binding_fallback=binding_fallback,
        master_addr=master_addr,
        master_port=master_port,
        hold_signals=join,
    )
    if not join:
        return context
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
    master_addr: str | None,
    master_port: int | None,
    hold_signals: bool = False,
) -> ProcessContext:
    """Check everything, plan, build the workers and start them; nothing starts on error.
    ``hold_signals``: see :meth:`numarun.process.supervisor.Supervisor.start`."""
    method = _check_arguments(fn, args, nprocs, start_method, grace_period, env)
    base_env = dict(os.environ)
    base_env.update(env or {})
    placement = _resolve_binding(binding, mem_binding, nprocs, binding_fallback, base_env)
    worker_envs = _worker_envs(base_env, nprocs, placement, master_addr, master_port)
    workers = [
        _worker.WorkerProcess(fn, rank, tuple(args), method, bool(daemon)) for rank in range(nprocs)
    ]
    # Importing multiprocessing.util registers multiprocessing's exit handler, which waits for
    # non-daemon workers and terminates daemon ones when this interpreter exits.
    from multiprocessing import process, util  # noqa: F401

    from numarun.process.supervisor import Supervisor
    from numarun.spawning.caller import WorkerRun
    from numarun.stacks.dumps import for_spawn

    run = WorkerRun(nprocs, method)
    stacks = None
    try:
        specs = _worker_specs(workers, method, worker_envs, placement, run)
        specs, stacks = for_spawn(specs, fn)  # `numarun stacks` reaches fn under every method

        def on_exit(ended: WorkerExit) -> None:
            run.on_exit(ended)
            if stacks is not None:
                stacks.on_exit(ended)

        supervisor = Supervisor(
            specs, grace_period=grace_period, on_exit=on_exit, on_failure=run.on_failure
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
    for worker, popen in zip(workers, run.attach(supervisor.pids()), strict=True):
        # What BaseProcess.start() does once its Popen runs.
        worker._popen = popen  # type: ignore[attr-defined]
        worker._sentinel = popen.sentinel  # type: ignore[attr-defined]
        process._children.add(worker)  # type: ignore[attr-defined]
    return ProcessContext(run, workers, grace_period)


def _check_arguments(
    fn: object,
    args: object,
    nprocs: object,
    start_method: object,
    grace_period: object,
    env: object,
) -> str:
    """Raise InvalidArgument for a bad argument; returns the start method to use."""
    worker = sys.modules.get("numarun.spawning.worker")
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
    if start_method is None:
        import multiprocessing

        start_method = multiprocessing.get_start_method()
    if start_method not in START_METHODS:
        raise InvalidArgument(
            f"unknown start_method {start_method!r}; choose one of {', '.join(START_METHODS)} "
            "(or None for the platform's default)"
        )
    _check_grace_period(grace_period)
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise InvalidArgument("env must be a mapping of str to str")
    return str(start_method)


def _check_grace_period(grace_period: object) -> None:
    if (
        isinstance(grace_period, bool)
        or not isinstance(grace_period, (int, float))
        or not grace_period >= 0
    ):
        raise InvalidArgument(
            f"grace_period must be a number of seconds >= 0, got {grace_period!r}"
        )


@dataclass(frozen=True)
class _Placement:
    """Per-rank CPUs (None: inherit), memory policies, suggested thread counts (None: unbound,
    use the unbound rule), and the plan's environment variables."""

    cpus: list[tuple[int, ...] | None]
    mems: list[MemPolicy | None]
    threads: list[int] | None
    env: tuple[tuple[str, str], ...]


def _resolve_binding(
    binding: object,
    mem_binding: str | None,
    nprocs: int,
    allow_fallback: bool,
    environ: Mapping[str, str],
) -> _Placement:
    """Turn ``binding`` / ``mem_binding`` into checked per-rank CPUs and memory policies."""
    if binding is None:
        return _unbound_placement(mem_binding, nprocs)
    from numarun.placement import binding as binding_module

    plan = _make_plan(binding, nprocs, allow_fallback, environ)
    for message in plan.warnings:
        _warn(message)
    if not plan.bound:
        if mem_binding not in (None, "none", "local"):
            _warn(
                f"mem_binding={mem_binding!r} dropped: the CPU binding fell back to none, so "
                "there are no memory nodes to bind to"
            )
            mem_binding = None
        return _unbound_placement(mem_binding, nprocs, env=plan.env)
    for rank in plan.ranks:
        binding_module.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding_module.mem_policy_for(mem_binding, rank.mems) for rank in plan.ranks]
    policies, messages = binding_module.check_mem_policy(policies, allow_fallback=allow_fallback)
    for message in messages:
        _warn(message)
    return _Placement(
        cpus=[tuple(rank.cpus) for rank in plan.ranks],
        mems=policies,
        threads=[max(1, rank.threads) for rank in plan.ranks],
        env=plan.env,
    )


def _warn(message: str) -> None:
    """``warnings.warn`` pointing at the first caller outside numarun."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("numarun."):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _unbound_placement(
    mem_binding: str | None, nprocs: int, env: tuple[tuple[str, str], ...] = ()
) -> _Placement:
    if mem_binding in (None, "none"):
        return _Placement([None] * nprocs, [None] * nprocs, None, env)
    if mem_binding != "local":
        raise InvalidArgument(
            f"mem_binding={mem_binding!r} needs memory nodes from a CPU binding; "
            "pass binding='node' (or another mode), or use mem_binding='local'"
        )
    from numarun.placement import binding as binding_module

    policy = binding_module.mem_policy_for("local", ())
    policies, _ = binding_module.check_mem_policy([policy] * nprocs, allow_fallback=False)
    return _Placement([None] * nprocs, policies, None, env)


def _make_plan(
    binding: object, nprocs: int, allow_fallback: bool, environ: Mapping[str, str]
) -> Plan:
    from numarun.placement.plan import Plan, make_plan

    if isinstance(binding, Plan):
        if len(binding.ranks) != nprocs:
            raise InvalidArgument(
                f"the plan has {len(binding.ranks)} ranks but nprocs is {nprocs}; "
                "make the plan for the same number of workers"
            )
        return binding
    topology = _read_topology(environ)
    if isinstance(binding, str):
        return make_plan(topology, nprocs, binding, allow_unbound=allow_fallback)
    rank_cpus = _explicit_cpus(binding, nprocs)
    return make_plan(
        topology, nprocs, "explicit", rank_cpus=rank_cpus, allow_unbound=allow_fallback
    )


def _explicit_cpus(binding: object, nprocs: int) -> list[tuple[int, ...]]:
    from numarun.machine.cpulist import parse_cpulist

    if not isinstance(binding, Sequence) or isinstance(binding, (bytes, bytearray)):
        raise InvalidArgument(
            "binding must be a mode name, a Plan or one CPU list per rank "
            f"(e.g. [[0], [1]]), got {type(binding).__name__}"
        )
    if len(binding) != nprocs:
        raise InvalidArgument(
            f"binding lists CPUs for {len(binding)} ranks but nprocs is {nprocs}; "
            "give one CPU list per rank"
        )
    rank_cpus = []
    for item in binding:
        if isinstance(item, str):
            rank_cpus.append(parse_cpulist(item))
        elif isinstance(item, Sequence) and all(
            isinstance(cpu, int) and not isinstance(cpu, bool) for cpu in item
        ):
            rank_cpus.append(tuple(sorted(set(item))))
        else:
            raise InvalidArgument(
                f"invalid CPU list {item!r} in binding; use a list of CPU numbers or a "
                "string like '0-3,8'"
            )
    return rank_cpus


def _read_topology(environ: Mapping[str, str]) -> Topology:
    from numarun.machine.topology import read_topology

    return read_topology("/", environ=environ)


# --- worker environment --------------------------------------------------------------------------


def _worker_envs(
    base: dict[str, str],
    nprocs: int,
    placement: _Placement,
    master_addr: str | None,
    master_port: int | None,
) -> list[dict[str, str]]:
    common = dict(base)
    common["WORLD_SIZE"] = str(nprocs)
    common["LOCAL_WORLD_SIZE"] = str(nprocs)
    common["MASTER_ADDR"] = master_addr or base.get("MASTER_ADDR") or "127.0.0.1"
    if master_port is not None:
        common["MASTER_PORT"] = str(master_port)
    elif not base.get("MASTER_PORT"):
        common["MASTER_PORT"] = str(workerenv.free_port())
    common.update(placement.env)
    threads = None
    if "OMP_NUM_THREADS" not in base:
        threads = placement.threads or [workerenv.unbound_threads(nprocs)] * nprocs
    envs = []
    for rank in range(nprocs):
        worker_env = dict(common)
        worker_env["RANK"] = str(rank)
        worker_env["LOCAL_RANK"] = str(rank)
        if threads is not None:
            worker_env["OMP_NUM_THREADS"] = str(threads[rank])
        envs.append(worker_env)
    return envs


# --- worker specs --------------------------------------------------------------------------------


def _worker_specs(
    workers: list[_worker.WorkerProcess],
    method: str,
    worker_envs: list[dict[str, str]],
    placement: _Placement,
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
            target = functools.partial(_worker.run_fork, worker)
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
                    fork_target=_worker.run_forkserver,
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

    # src/numarun/spawning/api.py -> src: the directory numarun itself was found in.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        f"import sys; sys.path.insert(0, {root!r}); import numarun; sys.path.remove({root!r}); "
        "from numarun.spawning.worker import main; main()"
    )
    executable = os.fsdecode(mp_spawn.get_executable())
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    return [executable, *flags, "-c", code]


def _preparation_data(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a spawned child named ``name``."""
    from multiprocessing import spawn as mp_spawn

    return mp_spawn.get_preparation_data(name)  # type: ignore[no-any-return]


def _pickle_worker(
    worker: _worker.WorkerProcess, prep: dict[str, Any] | None, method: str
) -> tuple[memoryview, list[int]]:
    """The payload after its header: ``prep`` (spawn only) and the worker, and their fds."""
    objects = (worker,) if prep is None else (prep, worker)
    try:
        body, fds = _worker.dumps(*objects)
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


# --- results -------------------------------------------------------------------------------------


def _outcome(result: RunResult, run: WorkerRun) -> list[Any]:
    """The workers' return values, or raise what the run's outcome calls for.

    Workers that survived SIGKILL (uninterruptible sleep) cannot be waited for; each gets a
    RuntimeWarning naming its pid and state before anything is returned or raised.
    """
    for worker in result.unkillable:
        _warn(
            f"local rank {worker.local_rank} (pid {worker.pid}) survived SIGKILL in state "
            f"{worker.proc_state or '?'}; it is still running and numarun stopped waiting for it"
        )
    if result.received_signal is not None:
        _raise_for_signal(result.received_signal)
    failed = [w for w in result.workers if w.state == "failed"]
    if result.first_failure is not None or failed:
        first = result.first_failure or min(failed, key=_death_time)
        others = sorted((w for w in failed if w.local_rank != first.local_rank), key=_death_time)
        error = _failure(first, run)
        error.failures = [_failure(w, run) for w in others]
        raise error
    by_rank = sorted(result.workers, key=lambda w: w.local_rank)
    if len(by_rank) != run.nprocs:
        raise RuntimeError(f"numarun: expected {run.nprocs} worker results, got {len(by_rank)}")
    return [_value_of(worker, run) for worker in by_rank]


def _death_time(worker: WorkerExit) -> float:
    return worker.ended_at if worker.ended_at is not None else float("inf")


def _value_of(worker: WorkerExit, run: WorkerRun) -> Any:
    """``fn``'s return value; None when the worker sent none (it left by ``SystemExit(0)``).
    Each result is unpickled from the one buffer it was read into, then dropped."""
    try:
        outcome = run.readers[worker.local_rank].outcome()
    except Exception as exc:
        raise _raised_as(ProcessRaisedException)(
            f"\n\n-- Process {worker.local_rank} returned a value that cannot be unpickled "
            f"here: {exc!r}\n",
            worker.local_rank,
            worker.pid,
        ) from exc
    if outcome is None or outcome[0] != "ok":
        return None
    return outcome[1]


def _failure(worker: WorkerExit, run: WorkerRun) -> ProcessException:
    """The exception describing one failed worker, in torch.multiprocessing's words."""
    from numarun.process.spec import signal_name

    index = worker.local_rank
    try:
        outcome = run.readers[index].outcome()
    except Exception:
        outcome = None
    if outcome is not None and outcome[0] == "raised":
        message = f"\n\n-- Process {index} terminated with the following error:\n{outcome[1]}"
        return _raised_as(ProcessRaisedException)(message, index, worker.pid)
    code = worker.exit_code if worker.exit_code is not None else -signal.SIGKILL
    exited = _raised_as(ProcessExitedException)
    if code < 0:
        name = worker.signal_name or signal_name(code)
        return exited(
            f"process {index} terminated with signal {name}", index, worker.pid, code, name
        )
    return exited(f"process {index} terminated with exit code {code}", index, worker.pid, code)


def _raise_for_signal(signum: int) -> None:
    """Act on the signal that made the supervisor tear down, after the teardown."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    # The supervisor has restored our previous disposition: the default one ends us the way
    # the signal meant to; a Python handler runs (and may raise) inside os.kill.
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)
