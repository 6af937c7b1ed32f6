"""``numarun [options] train.py args...``: torchrun's command line, bound workers, clear failures.

Three kinds of entry point, as in torchrun: a Python script (``train.py``), a module
(``-m pkg.module``) and a binary (``--no-python ./binary``). Python workers run
``$PYTHON_EXEC or sys.executable -u -c "from numarun.worker.bootstrap import main; main()" ...``
(cheaper than ``-m numarun.worker.bootstrap``, which imports :mod:`runpy` first) so that a worker
without ``@record`` still leaves an error file with its traceback, and its stacks can be taken
(:mod:`numarun.stacks.dumps`). Each worker gets torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ... TORCHELASTIC_ERROR_FILE) and meets the others through
``env://``. With the static rendezvous (the default) numarun runs no rendezvous service and
global rank 0's worker hosts the ``TCPStore``; with a PyTorch backend (``--rdzv-backend
c10d``) :mod:`numarun.rendezvous.torchrdzv` joins torch's rendezvous and the launcher hosts the
store, as torchrun's does.

Flow: :func:`parse_args` (argv -> :class:`LaunchConfig`, no effects; defined in
:mod:`numarun.cmdline.config`, re-exported here) -> :func:`run` (entry point checked, plan
made, memory policy proven; then :class:`numarun.launch.attempts.Job`: one attempt after another,
each started and watched by a supervisor, until one succeeds, ``--max-restarts`` is used up, a
signal or the rendezvous ends the job; summary printed, exit code returned). :func:`main` joins
the two and turns :class:`NumarunError` into one line on stderr and its exit status (2 for bad
input, 1 for a rendezvous that fails).

Start-up speed matters (``benchmarks/bench_launch.py`` compares it with bare interpreter
starts), so everything beyond argument parsing and the supervisor is imported only on the path
that needs it: the topology is read only when binding (or ``--nproc-per-node gpu|auto``) asks
for it, the log and failure modules only for redirected output or a failed run.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Mapping, Sequence

from numarun.cmdline.config import LaunchConfig, parse_args
from numarun.errors import NumarunError, UsageError
from numarun.launch import workersetup as workers
from numarun.placement import workerenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.machine.model import Topology
    from numarun.placement.plan import Plan


def main(argv: Sequence[str], *, epilog: str | None = None) -> int:
    """Parse ``argv`` (without the program name), launch, and return the exit status.

    Bad input prints ``numarun: error: <one line>`` on stderr and returns 2 with nothing
    started; ``--help`` prints the help (``epilog`` after the options) and ``--version`` the
    version, and return 0.
    """
    global _collector_held
    import gc

    # No cyclic collection while the launcher starts: what start-up allocates lives until
    # exit, and collections walking it cost every launch about a millisecond before its
    # workers start. The first attempt turns the collector back on as its workers start, once
    # gc.freeze() has set those objects aside (Job.resume_collector); this, on return.
    collecting = gc.isenabled()
    gc.disable()
    _collector_held = collecting
    try:
        config = parse_args(argv, epilog=epilog)
        if config.elastic and collecting:
            # A torch rendezvous: torch's import and a wait for the other nodes (minutes,
            # maybe) come first, and their garbage must be collected.
            _collector_held = False
            gc.enable()
        return run(config)
    except NumarunError as error:
        print(f"numarun: error: {error}", file=sys.stderr)
        return error.exit_code
    except OSError as error:
        if error.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        # Out of fds anywhere on the way (a socket for the port, a log file): one line too.
        print(f"numarun: error: {_out_of_fds(error)}", file=sys.stderr)
        return 2
    except SystemExit as stop:  # --help
        return stop.code if isinstance(stop.code, int) else 0
    finally:
        _collector_held = False
        if collecting:
            gc.enable()


_collector_held = False  # main() turned the collector off for the start-up: Job turns it on


def _out_of_fds(error: OSError) -> str:
    try:
        import resource

        limit = f"the open-file limit is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
    except (ImportError, OSError, ValueError):
        limit = "the open-file limit is reached"
    return f"out of file descriptors ({error.strerror}): {limit}; raise it (ulimit -n)"


def run(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Check the entry point, plan, start every worker, wait, report; return the exit status.

    Before anything starts: the script must be a file, the module findable (without importing
    it), the binary executable; the plan and each memory policy must be applicable (or fall back
    with ``--binding-fallback``). Any of these raises a :class:`NumarunError` subclass. With
    ``--dry-run`` prints the plan, and per rank the argv and the environment added, and
    returns 0. Otherwise returns :func:`numarun.launch.outcome.exit_code_for` the run (0, the
    first failing worker's status, 128+N for a worker killed by signal N, 128+N when the
    launcher got teardown signal N, also while the workers were still starting); a non-zero run
    ends with the failure summary as the last thing on stderr. ``environ`` (default
    ``os.environ``) is the base of every worker's environment.

    Side effect on the calling process: ``gc.freeze()`` just before the workers start; the
    launcher's start-up objects are never collected afterwards.
    """
    base = dict(os.environ if environ is None else environ)
    if not config.quiet:
        for warning in config.warnings:
            print(f"numarun: warning: {warning}", file=sys.stderr)
    binary_path = check_entrypoint(config, base)
    if config.virtual_local_rank:
        # Too few devices: refused before anything starts.
        workers.virtual_device(base, config.nproc_per_node - 1)
    plan = make_plan(config)
    if plan is not None and not config.quiet:
        for warning in plan.warnings:
            print(f"numarun: warning: {warning}", file=sys.stderr)
    if config.elastic:
        port = 0  # the rendezvous names the store
    else:
        port = config.master_port if config.master_port is not None else workerenv.free_port()
    if config.dry_run:
        print(_dry_run_text(config, plan, base, port, binary_path), end="")
        return 0
    check_meeting_point(config, port)
    preload_off = preload_problem(config) if config.preload else None
    if preload_off is not None and config.preload_required:
        raise UsageError(f"--preload-required: {preload_off}")
    return _launch(config, plan, base, port, binary_path, preload_off)


def check_meeting_point(config: LaunchConfig, port: int) -> None:
    """Raise :class:`UsageError` before anything starts when the workers could never meet: the
    master address (or a torch rendezvous's endpoint host) does not resolve, or, on the node
    whose rank 0 worker hosts the store (static rendezvous, node rank 0), a fixed
    ``--master-port`` is already in use on this host (a free port picked here needs no check).
    """
    from numarun.launch import startline

    if config.elastic:
        host = _endpoint_host(config)
        if host:
            startline.check_host_resolves(host, "--rdzv-endpoint host")
        return
    source = "--master-addr"
    if config.node_source != "flags":
        source = f"the master address from the {config.node_source} environment"
    startline.check_host_resolves(config.master_addr, source)
    if config.node_rank == 0 and config.master_port is not None:
        startline.check_port_free(port, "--master-port")


def _endpoint_host(config: LaunchConfig) -> str | None:
    """The host of ``--rdzv-endpoint`` (None for a file store, whose endpoint is a path)."""
    if dict(config.rdzv_conf).get("store_type", "tcp").strip().lower() == "file":
        return None
    from numarun.cmdline.nodes import split_endpoint

    return split_endpoint(config.rdzv_endpoint)[0]


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
            raise UsageError(f"training script {path!r} not found{_script_hint(config)}")
        return None
    if config.entrypoint_kind == "module":
        if config.python_exec == sys.executable:
            _check_module(config.entrypoint)
        return None
    return _resolve_binary(config.entrypoint, env)


def _script_hint(config: LaunchConfig) -> str:
    """What a user who typed ``numarun python train.py`` (as after ``torchrun``'s cousins,
    ``mpirun python ...``) meant: numarun starts the interpreter itself."""
    import re

    name = os.path.basename(config.entrypoint)
    if not re.fullmatch(r"python[0-9.]*", name):
        return _close_file(config.entrypoint)
    args = list(config.args)
    if "-m" in args[:-1]:
        meant = f"-m {args[args.index('-m') + 1]}"
    else:
        meant = next((arg for arg in args if not arg.startswith("-")), "train.py")
    return f": numarun runs Python itself; drop {name!r} (numarun [options] {meant} ...)"


def _close_file(path: str) -> str:
    """``: did you mean 'train.py'?`` for a script path whose directory holds a file of a close
    name (a typo: ``trian.py``), else ``""``."""
    import difflib

    folder, name = os.path.split(path)
    try:
        with os.scandir(folder or ".") as entries:
            files = [entry.name for entry in entries if entry.is_file()][:10000]
    except OSError:
        return ""
    close = difflib.get_close_matches(name, files, n=1, cutoff=0.75)
    return f": did you mean {os.path.join(folder, close[0])!r}?" if close else ""


def _check_module(name: str) -> None:
    import importlib.machinery
    import importlib.util

    if name.endswith(".py"):
        module = name[:-3].replace("/", ".")
        raise UsageError(
            f"-m takes a module name, not a file: numarun {name} runs the file, "
            f"numarun -m {module} the module"
        )
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


def preload_problem(config: LaunchConfig) -> str | None:
    """Why ``--preload`` cannot work as given, told before anything starts and without
    importing anything: the first module whose top-level name the workers' interpreter would
    not find (from the script's directory, or the working directory for ``-m``, then
    ``sys.path``, through the same finders), with the closest name that is there. None when
    every one is found, or where this interpreter cannot judge: ``PYTHON_EXEC`` names
    another, or the launcher runs with ``-I``, ``-E``, ``-s`` or ``-S``, which the workers do
    not."""
    flags = sys.flags
    if config.python_exec != sys.executable or (
        flags.isolated or flags.ignore_environment or flags.no_user_site or flags.no_site
    ):
        return None
    path = _workers_path(config)
    for name in config.preload:
        top = name.partition(".")[0]
        if not _findable(top, path):
            hint = _close_module(top, path)
            return f"no module named {top!r} where the workers import from{hint}"
    return None


def _workers_path(config: LaunchConfig) -> list[str]:
    """The workers' ``sys.path`` when their script's first line runs (numarun.worker.bootstrap):
    the script's directory (the current one for ``-m``; the path itself for a directory or
    archive), then this interpreter's entries but its own first one."""
    safe = bool(getattr(sys.flags, "safe_path", False))
    rest = sys.path if safe else sys.path[1:]
    if config.entrypoint_kind == "module":
        return rest if safe else [os.getcwd(), *rest]
    script = config.entrypoint
    if os.path.isdir(script) or _is_zip(script):
        return [os.path.abspath(script), *rest]
    return rest if safe else [os.path.dirname(os.path.realpath(script)), *rest]


def _is_zip(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _findable(name: str, path: list[str]) -> bool:
    """Whether a top-level module ``name`` is found by ``sys.meta_path``'s finders, the path
    finder searching ``path``; nothing is imported (a finder that fails counts as not
    finding it)."""
    import importlib.machinery

    for finder in sys.meta_path:
        try:
            if finder is importlib.machinery.PathFinder:
                spec = importlib.machinery.PathFinder.find_spec(name, path)
            else:
                find = getattr(finder, "find_spec", None)
                spec = find(name, None) if find is not None else None
        except Exception:
            continue
        if spec is not None:
            return True
    return False


def _close_module(name: str, path: list[str]) -> str:
    """`` (did you mean 'torch'?)`` for the module of ``path`` (or a built-in one) closest
    to ``name``, else ``""``."""
    import difflib
    import pkgutil

    names = {module.name for module in pkgutil.iter_modules(path)}
    names.update(sys.builtin_module_names)
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
        hint = ""
        if binary.endswith(".py"):
            hint = f": a Python script runs without --no-python (numarun {binary})"
        elif os.path.isfile(binary):
            # As in a shell, a name without a slash is looked up on PATH only.
            hint = f": a file in this directory is named with a path (--no-python ./{binary})"
        raise UsageError(f"--no-python binary {binary!r} not found on PATH{hint}")
    return found


def make_plan(config: LaunchConfig, topology: Topology | None = None) -> Plan | None:
    """The plan :func:`run` binds the workers by: None without ``--numa-binding``.

    ``topology`` (default: read from ``config.sysfs_root`` with ``config.cpus_allowed``) lets a
    caller that has read the machine already plan on the same reading (``numarun check``).
    Raises :class:`numarun.errors.PlanError` as :func:`numarun.placement.plan.make_plan` does.
    """
    if config.numa_binding is None:
        return None
    from numarun.placement import plan

    if topology is None:
        from numarun.machine.topology import read_topology

        topology = read_topology(config.sysfs_root, cpus_allowed=config.cpus_allowed)
    return plan.make_plan(
        topology,
        config.nproc_per_node,
        config.numa_binding,
        rank_cpus=config.rank_cpus,
        allow_unbound=config.binding_fallback,
    )


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
        from numarun.placement.plan import format_plan_table

        lines.append(format_plan_table(plan))
        lines.append("")
    attempt_dir = os.path.join(config.log_dir or "<temporary dir>", config.run_id, "attempt_0")
    from_rendezvous: tuple[str, ...] = ()
    if config.elastic:
        from_rendezvous = workers.ROUND_VARIABLES  # the dry run cannot know them
        lines.append(
            f"rendezvous: {config.rdzv_backend} at {config.rdzv_endpoint or '(default endpoint)'}"
            f", run id {config.run_id}, {config.min_nodes}:{config.max_nodes} nodes; "
            f"{', '.join(from_rendezvous)} come from its rounds"
        )
    if config.preload:
        lines.append(
            f"preload: {', '.join(config.preload)}: one standby per local rank, started as its "
            "worker below, imports them ahead of each attempt and is handed the variables "
            "known only then (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...)"
        )
    for setup in workers.rank_setups(config, plan, base, binary_path, attempt_dir=attempt_dir,
                                     port=port):  # fmt: skip
        where = "unbound" if setup.cpus is None else f"cpus {_cpus_text(setup.cpus)}"
        rank = "rank from the rendezvous" if config.elastic else f"rank {setup.rank}"
        lines.append(f"local rank {setup.local_rank} ({rank}, {where}):")
        lines.append(f"  argv: {shlex.join(setup.argv)}")
        for key in sorted(setup.env):
            if base.get(key) != setup.env[key] and key not in from_rendezvous:
                lines.append(f"  env:  {key}={shlex.quote(setup.env[key])}")
    return "\n".join(lines) + "\n"


def _cpus_text(cpus: Sequence[int]) -> str:
    from numarun.machine.cpulist import format_cpulist

    return format_cpulist(cpus)


def _launch(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    port: int,
    binary_path: str | None,
    preload_off: str | None = None,
) -> int:
    """Set up the log directory, run the job, return its exit status. A temporary log
    directory is removed at the end unless it keeps what is nowhere else: log files after a
    failure, or output shown nowhere (:class:`numarun.files.rundirs.RunDirs`).
    ``preload_off``: why ``--preload`` cannot work (the job runs cold, one warning line)."""
    from numarun.files.rundirs import RunDirs
    from numarun.launch.attempts import Interrupted, Job, SignalGuard
    from numarun.launch.outcome import signal_text

    outputs = workers.output_levels(config)
    dirs = RunDirs(config, outputs)
    job = Job(config, plan, base, binary_path, workers.mem_policies(config, plan), outputs, dirs)
    job.resume_collector = _collector_held
    job.preload_off = preload_off
    code = 2
    # From the first directory on, a teardown signal ends the launch with 128+N and leaves
    # nothing: thousands of ranks take seconds to set up before the supervisor takes over.
    # The one guard of the launch: the job's attempts run under it too.
    try:
        with SignalGuard(config.teardown_signals):
            job.waiting_for = "setting up the workers"
            dirs.open()
            code = job.run(port)
            return code
    except Interrupted as stop:
        sys.stderr.write(
            f"numarun: stopped on {signal_text(stop.signum)} while {job.waiting_for}; "
            "no worker was running\n"
        )
        code = 128 + stop.signum
        return code
    finally:
        dirs.close(code, workers_ran=job.started)
