"""``numarun [options] train.py args...``: torchrun's command line, bound workers, clear failures.

Three kinds of entry point, as in torchrun: a Python script (``train.py``), a module
(``-m pkg.module``) and a binary (``--no-python ./binary``). Python workers run
``$PYTHON_EXEC or sys.executable -u -m numarun._script ...`` so that a worker without ``@record``
still leaves an error file with its traceback. Each worker gets torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ... TORCHELASTIC_ERROR_FILE) and meets the others through
``env://``: numarun runs no rendezvous service, global rank 0 hosts the ``TCPStore``.

Flow: :func:`parse_args` (argv -> :class:`LaunchConfig`, no effects; defined in
:mod:`numarun.launch_config`, re-exported here) -> :func:`run` (entry point
checked, plan made, memory policy proven, workers started by the supervisor, summary printed,
exit code returned). :func:`main` joins the two and turns :class:`NumarunError` into one line on
stderr and exit status 2.

Start-up speed matters (``benchmarks/bench_launch.py`` compares it with bare interpreter
starts), so everything beyond argument parsing and the supervisor is imported only on the path
that needs it: the topology is read only when binding (or ``--nproc-per-node gpu|auto``) asks
for it, the log and failure modules only for redirected output or a failed run.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence

from numarun import workerenv
from numarun.errors import NumarunError, UsageError
from numarun.launch_config import DEFAULT_GRACE_PERIOD as DEFAULT_GRACE_PERIOD
from numarun.launch_config import DEFAULT_MULTI_NODE_PORT as DEFAULT_MULTI_NODE_PORT
from numarun.launch_config import FORWARD_SIGNALS as FORWARD_SIGNALS
from numarun.launch_config import TEARDOWN_SIGNALS as TEARDOWN_SIGNALS
from numarun.launch_config import LaunchConfig, parse_args

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.plan import Plan, RankBinding
    from numarun.supervisor import RunResult, WorkerSpec

SCRIPT_BOOTSTRAP = "numarun._script"


# --- what each worker gets -----------------------------------------------------------------------


def worker_argv(
    config: LaunchConfig, binary_path: str | None = None, local_rank: int | None = None
) -> list[str]:
    """The argv exec'd for a worker (no shell anywhere).

    Scripts: ``PYTHON -u -m numarun._script -- SCRIPT ARGS``; modules: ``PYTHON -u -m
    numarun._script -m MODULE ARGS``; binaries: ``BINARY ARGS`` with ``binary_path`` (the
    resolved path, when given) in place of the name. With ``local_rank``, ``${local_rank}`` in
    ARGS becomes that rank (:func:`substitute_local_rank`).
    """
    args = list(config.args)
    if local_rank is not None:
        args = substitute_local_rank(args, local_rank)
    if config.entrypoint_kind == "binary":
        return [binary_path or config.entrypoint, *args]
    head = [config.python_exec, "-u", "-m", SCRIPT_BOOTSTRAP]
    if config.entrypoint_kind == "module":
        return [*head, "-m", config.entrypoint, *args]
    return [*head, "--", config.entrypoint, *args]


# ``$$`` is matched so that ``$${local_rank}`` stays as written, as torchrun's
# string.Template escape; an identifier that only starts with local_rank is another name.
_LOCAL_RANK_MACRO = re.compile(r"\$(?:\$|\{local_rank\}|local_rank(?![A-Za-z0-9_]))")


def substitute_local_rank(args: Sequence[str], local_rank: int) -> list[str]:
    """torchrun's worker-argument macro: ``${local_rank}`` and ``$local_rank`` become the
    local rank. Everything else stays byte for byte, ``$$`` too (torchrun's
    ``string.Template`` turns it into ``$``)."""
    value = str(local_rank)

    def expand(match: re.Match[str]) -> str:
        return match.group(0) if match.group(0) == "$$" else value

    return [_LOCAL_RANK_MACRO.sub(expand, arg) if "$" in arg else arg for arg in args]


def rank_env(
    config: LaunchConfig,
    local_rank: int,
    *,
    base: Mapping[str, str],
    master_port: int,
    error_file: str,
    binding: RankBinding | None = None,
    plan_env: Sequence[tuple[str, str]] = (),
    unbound_threads: int = 1,
) -> dict[str, str]:
    """The variables numarun sets for ``local_rank`` on top of ``base`` (the launcher's env).

    torchrun's set (RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE,
    WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*),
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` and ``OMP_NUM_THREADS`` only when ``base`` lacks them
    (OMP: the rank's bound physical cores, else ``unbound_threads``), then ``plan_env`` (e.g.
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), which wins over ``base``.
    """
    rank = config.global_rank(local_rank)
    env = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(config.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": config.role,
        "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "WORLD_SIZE": str(config.world_size),
        "GROUP_WORLD_SIZE": str(config.nnodes),
        "ROLE_WORLD_SIZE": str(config.world_size),
        "MASTER_ADDR": config.master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": config.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": config.signals_to_handle,
    }
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in base:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if "OMP_NUM_THREADS" not in base:
        threads = binding.threads if binding is not None else unbound_threads
        env["OMP_NUM_THREADS"] = str(max(1, threads))
    env.update(plan_env)
    if config.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = virtual_device(base, local_rank)
    return env


def virtual_device(base: Mapping[str, str], local_rank: int) -> str:
    """``--virtual-local-rank``: the one device a rank sees, torchrun's way: the parent's
    ``CUDA_VISIBLE_DEVICES`` entry for the local rank, or the local rank itself when unset.
    Raises :class:`UsageError` when the parent's list is too short."""
    visible = base.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(local_rank)
    entries = visible.split(",")
    if local_rank >= len(entries):
        raise UsageError(
            f"--virtual-local-rank: local rank {local_rank} has no entry in "
            f"CUDA_VISIBLE_DEVICES={visible!r}; list one device per local rank"
        )
    return entries[local_rank].strip()


# --- exit codes ----------------------------------------------------------------------------------


def exit_code_for(result: RunResult) -> int:
    """The launcher's exit status for a finished run.

    128+N when the launcher itself received signal N (130 for Ctrl-C); else 0 when no worker
    failed; else the first failing worker's status: its exit code, 128+N when signal N killed
    it, 1 when it is unaccounted for (unkillable).
    """
    if result.received_signal:
        return 128 + int(result.received_signal)
    failure = result.first_failure
    if failure is None:
        return 0
    if failure.exit_code is None:
        return 1
    if failure.exit_code < 0:
        return 128 - failure.exit_code
    return failure.exit_code or 1


# --- running -------------------------------------------------------------------------------------


def main(argv: Sequence[str], *, epilog: str | None = None) -> int:
    """Parse ``argv`` (without the program name), launch, and return the exit status.

    Bad input prints ``numarun: error: <one line>`` on stderr and returns 2 with nothing
    started; ``--help`` prints the help (``epilog`` after the options) and ``--version`` the
    version, and return 0.
    """
    try:
        config = parse_args(argv, epilog=epilog)
        return run(config)
    except NumarunError as error:
        print(f"numarun: error: {error}", file=sys.stderr)
        return error.exit_code
    except SystemExit as stop:  # --help
        return stop.code if isinstance(stop.code, int) else 0


def run(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Check the entry point, plan, start every worker, wait, report; return the exit status.

    Before anything starts: the script must be a file, the module findable (without importing
    it), the binary executable; the plan and each memory policy must be applicable (or fall back
    with ``--binding-fallback``). Any of these raises a :class:`NumarunError` subclass. With
    ``--dry-run`` prints the plan, and per rank the argv and the environment added, and
    returns 0. Otherwise returns :func:`exit_code_for` the run (0, the first failing worker's
    status, 128+N for a worker killed by signal N, 128+N when the launcher got teardown signal
    N, also while the workers were still starting); a non-zero run ends with the failure
    summary as the last thing on stderr. ``environ`` (default ``os.environ``) is the base of
    every worker's environment.

    Side effect on the calling process: ``gc.freeze()`` just before the workers start; the
    launcher's start-up objects are never collected afterwards.
    """
    base = dict(os.environ if environ is None else environ)
    binary_path = check_entrypoint(config, base)
    if config.virtual_local_rank:
        virtual_device(base, config.nproc_per_node - 1)  # too few devices: refused before start
    plan = _make_plan(config)
    if plan is not None:
        for warning in plan.warnings:
            print(f"numarun: warning: {warning}", file=sys.stderr)
    port = config.master_port if config.master_port is not None else workerenv.free_port()
    if config.dry_run:
        print(_dry_run_text(config, plan, base, port, binary_path), end="")
        return 0
    return _launch(config, plan, base, port, binary_path)


def check_entrypoint(config: LaunchConfig, env: Mapping[str, str]) -> str | None:
    """Raise :class:`UsageError` unless the entry point can start; return a binary's path.

    A script must be an existing file (or a directory with ``__main__.py``). A module must be
    findable from the current directory and ``sys.path`` without importing it (parents are
    located through their ``submodule_search_locations``); a package needs a ``__main__``
    submodule. The module check is skipped when ``PYTHON_EXEC`` names another interpreter (its
    path may differ). A binary is looked up on ``PATH`` when it has no ``/`` and must be an
    executable file.
    """
    if config.entrypoint_kind == "script":
        path = config.entrypoint
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "__main__.py")):
                raise UsageError(f"training script {path!r} is a directory without __main__.py")
        elif not os.path.isfile(path):
            raise UsageError(f"training script {path!r} not found")
        return None
    if config.entrypoint_kind == "module":
        if config.python_exec == sys.executable:
            _check_module(config.entrypoint)
        return None
    return _resolve_binary(config.entrypoint, env)


def _check_module(name: str) -> None:
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(f"-m {name!r} is not a valid module name")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd(), *sys.path])
    if spec is None:
        spec = importlib.util.find_spec(parts[0])  # built-in and frozen modules
    for depth in range(1, len(parts) + 1):
        if spec is None:
            raise UsageError(
                f"module {'.'.join(parts[:depth])!r} not found (from {os.getcwd()} and sys.path)"
            )
        if depth == len(parts):
            break
        locations = spec.submodule_search_locations
        if locations is None:
            raise UsageError(
                f"module {name!r} not found: {'.'.join(parts[:depth])!r} is not a package"
            )
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    if spec is not None and spec.submodule_search_locations is not None:
        main_spec = importlib.machinery.PathFinder.find_spec(
            f"{name}.__main__", spec.submodule_search_locations
        )
        if main_spec is None:
            raise UsageError(
                f"-m {name}: {name!r} is a package without __main__; name a module inside it"
            )


def _resolve_binary(binary: str, env: Mapping[str, str]) -> str:
    import shutil

    if "/" in binary:
        if not os.path.isfile(binary):
            raise UsageError(f"--no-python binary {binary!r} not found")
        if not os.access(binary, os.X_OK):
            raise UsageError(f"--no-python binary {binary!r} is not executable (chmod +x it)")
        return binary
    found = shutil.which(binary, path=env.get("PATH", os.defpath))
    if found is None:
        raise UsageError(f"--no-python binary {binary!r} not found on PATH")
    return found


def _make_plan(config: LaunchConfig) -> Plan | None:
    if config.numa_binding is None:
        return None
    from numarun.plan import make_plan
    from numarun.topology import read_topology

    topology = read_topology(config.sysfs_root, cpus_allowed=config.cpus_allowed)
    return make_plan(
        topology,
        config.nproc_per_node,
        config.numa_binding,
        rank_cpus=config.rank_cpus,
        allow_unbound=config.binding_fallback,
    )


def _bound(plan: Plan | None, local_rank: int) -> RankBinding | None:
    if plan is None or not plan.bound:
        return None
    return plan.ranks[local_rank]


def _unbound_threads(config: LaunchConfig, base: Mapping[str, str]) -> int:
    if "OMP_NUM_THREADS" in base:
        return 1  # not used: the user's value is kept
    return workerenv.unbound_threads(config.nproc_per_node)


def _error_file(attempt_dir: str, local_rank: int) -> str:
    return os.path.join(attempt_dir, str(local_rank), "error.json")


def _dry_run_text(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    port: int,
    binary_path: str | None,
) -> str:
    import shlex

    lines: list[str] = []
    if plan is not None:
        from numarun.plan import format_plan_table

        lines.append(format_plan_table(plan))
        lines.append("")
    attempt_dir = os.path.join(config.log_dir or "<temporary dir>", config.run_id, "attempt_0")
    threads = _unbound_threads(config, base)
    for local_rank in range(config.nproc_per_node):
        env = rank_env(
            config,
            local_rank,
            base=base,
            master_port=port,
            error_file=_error_file(attempt_dir, local_rank),
            binding=_bound(plan, local_rank),
            plan_env=plan.env if plan is not None else (),
            unbound_threads=threads,
        )
        binding = _bound(plan, local_rank)
        where = "unbound" if binding is None else f"cpus {_cpus_text(binding.cpus)}"
        lines.append(f"local rank {local_rank} (rank {config.global_rank(local_rank)}, {where}):")
        lines.append(f"  argv: {shlex.join(worker_argv(config, binary_path, local_rank))}")
        for key in sorted(env):
            if base.get(key) != env[key]:
                lines.append(f"  env:  {key}={shlex.quote(env[key])}")
    return "\n".join(lines) + "\n"


def _cpus_text(cpus: Sequence[int]) -> str:
    from numarun.cpulist import format_cpulist

    return format_cpulist(cpus)


def _launch(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    port: int,
    binary_path: str | None,
) -> int:
    import gc
    import shutil

    from numarun.supervisor import Supervisor, WorkerSpec

    mem_policies = _mem_policies(config, plan)
    outputs = _output_levels(config)
    temporary = config.log_dir is None
    holds = _temp_dir_holds(config, outputs) if temporary else LOGS
    log_base = config.log_dir if config.log_dir is not None else _temp_log_dir()
    duplicates: tuple = (None, None)
    specs: list[WorkerSpec] = []
    nothing_ran = True  # until the workers started: then the directory may hold their output
    code = 2
    try:
        try:
            attempt_dir = _make_attempt_dir(log_base, config, fresh=temporary)
            duplicates = _line_filters(config, attempt_dir)
            threads = _unbound_threads(config, base)
            for local_rank in range(config.nproc_per_node):
                binding = _bound(plan, local_rank)
                env = {
                    **base,
                    **rank_env(
                        config,
                        local_rank,
                        base=base,
                        master_port=port,
                        error_file=_error_file(attempt_dir, local_rank),
                        binding=binding,
                        plan_env=plan.env if plan is not None else (),
                        unbound_threads=threads,
                    ),
                }
                stdout, stderr = _sinks(config, outputs, local_rank, attempt_dir, base, duplicates)
                specs.append(
                    WorkerSpec(
                        local_rank=local_rank,
                        rank=config.global_rank(local_rank),
                        env=env,
                        argv=worker_argv(config, binary_path, local_rank),
                        cpus=binding.cpus if binding is not None else None,
                        mem=mem_policies[local_rank],
                        stdout=stdout,
                        stderr=stderr,
                    )
                )
        except OSError as error:  # out of fds, an unwritable log file: nothing has started
            _close_sinks(specs)
            raise _setup_error(error, config) from None
        if temporary:
            _announce(log_base, holds)
        supervisor = Supervisor(
            specs,
            grace_period=config.grace_period,
            teardown_signals=config.teardown_signals,
            forward_signals=config.forward_signals,
            # torchrun's semantics: the workers get the signal numarun got (Ctrl-C: SIGINT, so
            # `except KeyboardInterrupt` runs); only a nohup'd SIGHUP stays ignored, so a
            # background job (started with SIGINT and SIGQUIT ignored) still stops on kill -INT.
            relay_signal=True,
            keep_ignored=(signal.SIGHUP,),
            # Killed (SIGKILL), numarun cannot clean up: its watchdog removes a temporary dir
            # that held nothing but error files; log files stay (the start said where).
            remove_if_killed=log_base if holds == ERRORS else None,
        )
        # Everything allocated so far lives until exit; freezing it keeps the collector from
        # walking it again, which on a slow machine costs 10+ ms at interpreter exit.
        gc.freeze()
        try:
            result = supervisor.run(on_started=_prefetch_failure_report)
        except NumarunError:
            raise  # a worker could not start: one line, and nothing of the run is kept
        except BaseException:
            nothing_ran = False
            raise
        finally:
            _close_sinks(specs)  # closed already when the run ended; not when start failed
        nothing_ran = False
        code = exit_code_for(result)
        lost = _lost_logs(specs)
        kept = not temporary or holds == LOGS or (holds == COPIES and code != 0)
        if code != 0:
            sys.stdout.flush()
            summary = _summary(
                config, result, attempt_dir, outputs, log_base if kept else None, lost
            )
            sys.stderr.write(summary + "\n")
            sys.stderr.flush()
        elif lost:
            from numarun import failures

            sys.stderr.write(failures.format_lost_logs(lost) + "\n")
        return code
    finally:
        for line_filter in duplicates:
            if line_filter is not None:
                line_filter.close()
        if temporary and (holds == ERRORS or nothing_ran or (holds == COPIES and code == 0)):
            shutil.rmtree(log_base, ignore_errors=True)


# What numarun's temporary log directory (no --log-dir) holds, which decides what becomes of it.
ERRORS = "errors"  # only the workers' error files: removed at the end (also if numarun is killed)
COPIES = "copies"  # log files whose every line was shown on the console: kept only on failure
LOGS = "logs"  # output that is nowhere else (--redirects, filters, hidden ranks): kept


def _temp_dir_holds(
    config: LaunchConfig, outputs: tuple[dict[int, int], dict[int, int], set[int]]
) -> str:
    """:data:`ERRORS`, :data:`COPIES` or :data:`LOGS` for a run without ``--log-dir``."""
    redirects, tee, shown = outputs
    if config.duplicate_stdout_filters or config.duplicate_stderr_filters:
        return LOGS
    only_in_files = any(
        redirects[rank] & ~tee[rank] or (tee[rank] and rank not in shown) for rank in tee
    )
    if only_in_files:
        return LOGS
    return COPIES if any(tee.values()) else ERRORS


def _close_sinks(specs: Sequence[WorkerSpec]) -> None:
    """Close the log files of sinks the supervisor never ran (closing twice is harmless)."""
    for spec in specs:
        for sink in (spec.stdout, spec.stderr):
            if sink is not None:
                sink.close()


def _setup_error(error: OSError, config: LaunchConfig) -> UsageError:
    """One line for an OSError while the workers' files were set up (nothing started)."""
    import errno

    if error.errno in (errno.EMFILE, errno.ENFILE):
        return UsageError(
            f"out of file descriptors ({error.strerror}) setting up "
            f"{config.nproc_per_node} workers' output: the limit is {_fd_limit()} "
            "(ulimit -n); raise it, or run fewer ranks or with less --tee/--redirects"
        )
    where = f" {error.filename}" if error.filename else ""
    return UsageError(f"cannot set up the workers' output{where}: {error.strerror or error}")


def _fd_limit() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "unknown"


def _line_filters(config: LaunchConfig, attempt_dir: str) -> tuple:
    """``--duplicate-std{out,err}-filters``: one shared filtered_std{out,err}.log each."""
    if not (config.duplicate_stdout_filters or config.duplicate_stderr_filters):
        return None, None
    from numarun.logs import LineFilter

    return tuple(
        LineFilter(os.path.join(attempt_dir, name), needles) if needles else None
        for name, needles in (
            ("filtered_stdout.log", config.duplicate_stdout_filters),
            ("filtered_stderr.log", config.duplicate_stderr_filters),
        )
    )


def _prefetch_failure_report(delay: float = 0.25) -> None:
    """Import the failure summary's modules in the background once the workers are under way.

    Importing :mod:`numarun.failures` (json, traceback, ...) costs 10-20 ms, which would
    otherwise sit between a worker's failure and the launcher's exit. The delay keeps the
    import off the CPUs while the workers start; a failure before it just imports in line.
    """
    import threading

    timer = threading.Timer(delay, _import_failures)
    timer.daemon = True
    timer.start()


def _import_failures() -> None:
    import numarun.failures  # noqa: F401


def _temp_log_dir() -> str:
    """A fresh private directory ``$TMPDIR/numarun_XXXXXXXXXXXX`` (mode 0700).

    Made by hand rather than with :func:`tempfile.mkdtemp`: :mod:`tempfile` and
    :mod:`numarun.logs` cost a few milliseconds to import on every launch's start-up path.
    ``$TMPDIR`` owned by another user (not root) is refused: its owner could swap our
    directory for a symbolic link between the checks and the writes.
    """
    base = os.environ.get("TMPDIR") or "/tmp"
    try:
        owner = os.stat(base).st_uid
    except OSError as error:
        raise UsageError(
            f"cannot create a temporary log directory in {base}: {error.strerror}; give --log-dir"
        ) from None
    if owner not in (0, os.geteuid()):
        raise UsageError(
            f"TMPDIR {base!r} belongs to another user (uid {owner}); numarun writes only into "
            "directories of yours or root's: set TMPDIR or give --log-dir"
        )
    for _ in range(100):
        path = os.path.join(base, f"numarun_{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError as error:
            raise UsageError(
                f"cannot create a temporary log directory in {base}: {error.strerror}; "
                "give --log-dir"
            ) from None
        return path
    raise UsageError(f"cannot create a temporary log directory in {base}; give --log-dir")


def _announce(log_base: str, holds: str) -> None:
    """One line on stderr where the temporary directory holds log files, and whether it stays."""
    if holds == LOGS:
        print(f"numarun: worker logs go to {log_base}", file=sys.stderr)
    elif holds == COPIES:
        print(
            f"numarun: worker logs go to {log_base} (removed if the run succeeds; "
            "--log-dir keeps them)",
            file=sys.stderr,
        )


def _make_attempt_dir(log_base: str, config: LaunchConfig, *, fresh: bool) -> str:
    """``log_base/<run_id>/attempt_0/<local_rank>/`` for every rank; returns the attempt dir.

    A ``fresh`` base (our own new temporary directory) cannot hold stale files, so the
    directories are made directly; otherwise :func:`numarun.logs.make_log_dirs` claims them,
    taking ``<run_id>_<random>/`` when ``<run_id>/`` already exists (it never deletes), so an
    old ``error.json`` of the same run id is never read as ours.
    """
    if fresh:
        attempt_dir = os.path.join(log_base, config.run_id, "attempt_0")
        for local_rank in range(config.nproc_per_node):
            os.makedirs(os.path.join(attempt_dir, str(local_rank)))
        return attempt_dir
    from numarun.logs import make_log_dirs

    return str(make_log_dirs(log_base, config.run_id, config.nproc_per_node))


def _mem_policies(config: LaunchConfig, plan: Plan | None) -> list:
    """Each rank's memory policy, proven applicable here; CPUs checked against our affinity."""
    if plan is None or not plan.bound:
        return [None] * config.nproc_per_node
    from numarun import binding

    for rank in plan.ranks:
        binding.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding.mem_policy_for(config.mem_binding, rank.mems) for rank in plan.ranks]
    applied, warnings = binding.check_mem_policy(policies, allow_fallback=config.binding_fallback)
    for warning in warnings:
        print(f"numarun: warning: {warning}", file=sys.stderr)
    return applied


def _output_levels(config: LaunchConfig) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """(redirects, tee, shown local ranks); the logs module is imported only when needed."""
    n = config.nproc_per_node
    if config.redirects == "0" and config.tee == "0" and not config.local_ranks_filter:
        return dict.fromkeys(range(n), 0), dict.fromkeys(range(n), 0), set(range(n))
    from numarun import logs

    return (
        logs.parse_std_spec(config.redirects, n, flag="--redirects"),
        logs.parse_std_spec(config.tee, n, flag="--tee"),
        logs.parse_ranks_filter(config.local_ranks_filter, n),
    )


def _sinks(
    config: LaunchConfig,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    local_rank: int,
    attempt_dir: str,
    base: Mapping[str, str],
    duplicates: tuple = (None, None),
) -> tuple[object, object]:
    redirects, tee, shown = outputs
    if not redirects[local_rank] and not tee[local_rank] and local_rank in shown:
        return None, None  # the worker writes straight to our stdout/stderr
    from pathlib import Path

    from numarun import logs

    rank = config.global_rank(local_rank)
    prefix = logs.make_prefix(rank, local_rank, role_name=config.role, environ=base)
    return logs.sinks_for(
        local_rank,
        rank,
        redirects[local_rank],
        tee[local_rank],
        Path(attempt_dir) / str(local_rank),
        local_rank in shown,
        prefix=prefix,
        duplicates=duplicates,
    )


def _lost_logs(specs: Sequence[WorkerSpec]) -> list[str]:
    """One line per log file that lost bytes for good (a full disk): rank, file, how many."""
    if not any(spec.stdout or spec.stderr for spec in specs):
        return []
    from numarun import logs

    lines = []
    for spec in specs:
        for sink in (spec.stdout, spec.stderr):
            loss = logs.log_loss(sink)
            if loss is not None:
                path, count, reason = loss
                lines.append(
                    f"rank {spec.rank} (local_rank {spec.local_rank}) {path.name}: "
                    f"{count:,} bytes lost ({reason}): {path}"
                )
    return lines


def _summary(
    config: LaunchConfig,
    result: RunResult,
    attempt_dir: str,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    log_dir: str | None,
    lost_logs: Sequence[str] = (),
) -> str:
    from pathlib import Path

    from numarun import failures

    redirects, tee, _ = outputs
    reports = []
    for worker in result.workers:
        to_files = redirects[worker.local_rank] or tee[worker.local_rank]
        reports.append(
            failures.rank_report(
                worker,
                error_file=_error_file(attempt_dir, worker.local_rank),
                log_dir=Path(attempt_dir) / str(worker.local_rank) if to_files else None,
            )
        )
    entrypoint = " ".join([config.entrypoint, *config.args])
    if len(entrypoint) > 200:
        entrypoint = entrypoint[:197] + "..."
    return failures.format_summary(
        reports,
        entrypoint=entrypoint,
        host=os.uname().nodename,
        log_dir=log_dir,
        lost_logs=lost_logs,
        stopped_by=_signal_text(result.received_signal),
    )


def _signal_text(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
