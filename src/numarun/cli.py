"""The ``numarun`` command: parses, prints, and maps errors to exit codes. Decides nothing.

``numarun topo | plan | snapshot | stacks | help ...`` are subcommands; anything else is a launch,
handled by :mod:`numarun.launch.launcher` with torchrun-compatible flags (``numarun --nproc-per-node
8 train.py``), whose ``--help`` lists the subcommands too. A binary literally named ``topo``,
``plan``, ``snapshot``, ``stacks`` or ``help`` is launched as ``./topo``. ``numarun check``
(:mod:`numarun.check`) is one too: a binary named ``check`` is launched as ``./check``.
"""

from __future__ import annotations

import os
import sys

from numarun.errors import NumarunError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

SUBCOMMANDS = ("topo", "plan", "check", "snapshot", "stacks")

# One line each for `numarun --help`; a subcommand is listed once it is in SUBCOMMANDS.
SUMMARIES = {
    "topo": "show the machine: packages, NUMA nodes, caches, GPUs and NICs",
    "plan": "print each local rank's GPU, CPUs and memory nodes; starts nothing",
    "check": "start the planned ranks, prove each got its CPUs and memory, measure the gain",
    "snapshot": "save the sysfs files numarun reads (replay with --sysfs-root)",
    "stacks": "print the Python stacks of every rank of a running job of yours, grouped",
    "help": "this help, or a subcommand's: numarun help plan",
}


def commands_help() -> str:
    """The subcommands part of ``numarun --help``."""
    names = [*SUBCOMMANDS, "help"]
    width = max(len(name) for name in names)
    lines = ["commands (numarun COMMAND --help for each):"]
    lines += [f"  numarun {name:<{width}}  {SUMMARIES.get(name, '')}".rstrip() for name in names]
    lines.append("  numarun [options] train.py ...  a launch, as torchrun (the options above)")
    return "\n".join(lines)


def _parser(**settings: object) -> argparse.ArgumentParser:
    """A subcommand's argparse parser, reporting bad usage as one line (exit 2) instead of
    usage + error, with a "did you mean" for an unknown option, as the launcher's parser.
    argparse is imported here, by the subcommands only: a launch reads its options without it
    (:func:`numarun.cmdline.options.read_options`)."""
    from numarun.cmdline.usage import OneLineParser

    return OneLineParser(**settings)  # type: ignore[arg-type]


def _topology_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sysfs-root",
        "--sysfs_root",
        metavar="DIR",
        default="/",
        help="read the machine from DIR/sys/... (a snapshot or fake tree) instead of /",
    )
    parser.add_argument(
        "--cpus-allowed",
        "--cpus_allowed",
        metavar="LIST",
        default=None,
        help="plan for these CPUs (e.g. 0-31,64-95) instead of this process's affinity",
    )


def _read(args: argparse.Namespace):  # -> Topology
    from numarun.machine.topology import read_topology

    return read_topology(args.sysfs_root, cpus_allowed=args.cpus_allowed)


def _cmd_topo(argv: Sequence[str]) -> int:
    parser = _parser(prog="numarun topo", description="Show the machine as numarun sees it.")
    _topology_args(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument(
        "--svg",
        metavar="FILE",
        default=None,
        help="also draw the machine as nested boxes (packages, NUMA nodes, L3 complexes, "
        "cores, their threads; GPUs and NICs) in an SVG file any browser shows",
    )
    args = parser.parse_args(argv)
    topo = _read(args)
    from numarun.machine.topotext import render_topology, topology_to_json

    if args.svg is not None:
        from numarun.machine.toposvg import topology_svg

        _write_text(args.svg, topology_svg(topo))
    if args.json:
        import json

        print(json.dumps(topology_to_json(topo), indent=2))
    else:
        print(render_topology(topo))
    return 0


def _plan_parser() -> argparse.ArgumentParser:
    from numarun.placement.plan import MODES

    parser = _parser(
        prog="numarun plan",
        description="Print each local rank's GPU, CPUs and memory nodes. Starts nothing. "
        "Without --numa-binding or --nproc-per-node, both are chosen for this machine "
        "(one rank per GPU in exclusive mode; without GPUs, one per NUMA node in cpu mode) "
        "and the first line says so.",
    )
    _topology_args(parser)
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        metavar="N",
        default=None,
        help="ranks on this node: an integer or 'gpu' (one per visible GPU); default: one "
        "per visible GPU in a GPU mode, one per NUMA node in cpu mode",
    )
    parser.add_argument(
        "--numa-binding",
        "--numa_binding",
        metavar="MODE",
        default=None,
        help=f"one of {', '.join(MODES)}; 'explicit' is implied by --rank-cpus; default: "
        "exclusive with GPUs, cpu without",
    )
    parser.add_argument(
        "--rank-cpus",
        "--rank_cpus",
        metavar="LIST",
        action="append",
        default=None,
        help="explicit CPUs for the next rank (repeat once per rank, in rank order)",
    )
    parser.add_argument(
        "--binding-fallback",
        "--binding_fallback",
        action="store_true",
        help="when binding is impossible, plan unbound with a warning instead of failing",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="say why: the mode's rule, each rank's GPU (PCI address, NUMA node), what it "
        "got there and what it shares with whom",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--svg",
        metavar="FILE",
        default=None,
        help="also draw the machine with each rank's CPUs coloured, as SVG (any browser)",
    )
    return parser


def _cmd_plan(argv: Sequence[str]) -> int:
    args = _plan_parser().parse_args(argv)
    from numarun.placement.defaults import plan_defaults, requested_mode
    from numarun.placement.plan import format_plan_table, make_plan, plan_to_json

    mode, rank_cpus = requested_mode(args.numa_binding, args.rank_cpus)
    topo = _read(args)
    nprocs, mode, note = plan_defaults(topo, mode, args.nproc_per_node, rank_cpus)
    plan = make_plan(topo, nprocs, mode, rank_cpus=rank_cpus, allow_unbound=args.binding_fallback)
    if args.svg is not None:
        from numarun.placement.plansvg import plan_svg

        _write_text(args.svg, plan_svg(plan, topo))
    if args.json:
        document = plan_to_json(plan, topo)
        if args.explain:
            from numarun.placement.explain import explain_json

            explain_json(document, plan, topo)
        if note is not None:
            print(f"numarun plan: {note}", file=sys.stderr)
        print(_json_one_rank_per_line(document))
        return 0
    if note is not None:
        print(f"numarun plan: {note}")
    print(format_plan_table(plan, topo))
    if args.explain:
        from numarun.placement.explain import explain_ranks, mode_rule

        print(f"why ({mode_rule(plan)}):")
        for line in explain_ranks(plan, topo):
            print(f"  {line}")
    if args.svg is not None:
        print(f"picture: {args.svg}")
    return 0


def _write_text(path: str, text: str, what: str = "--svg") -> None:
    """Write ``text`` (UTF-8) to ``path`` by
    :func:`numarun.files.safedir.replace_file`'s rules: another user's link or directory on
    the way refused, a new file renamed into place, so a failed write never truncates ``path``.
    Every refusal or failure is one line (exit 2)."""
    from numarun.files.safedir import replace_file

    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UsageError(f"cannot write {what} {path!r}: {error}") from None
    replace_file(path, lambda out: out.write(data), what=what)


def _json_one_rank_per_line(document: dict) -> str:
    """JSON with one rank per line: diffable, and readable without a pager at 256 CPUs."""
    import json

    ranks = document.get("ranks", [])
    rest = {key: value for key, value in document.items() if key != "ranks"}
    lines = ",\n".join("    " + json.dumps(rank) for rank in ranks)
    head = json.dumps(rest, indent=2)[:-2]  # drop the closing "\n}"
    return head + ',\n  "ranks": [\n' + lines + "\n  ]\n}"


def _cmd_snapshot(argv: Sequence[str]) -> int:
    parser = _parser(
        prog="numarun snapshot",
        description="Save exactly the sysfs files numarun reads, to attach to a bug report. "
        "Replay with --sysfs-root after extracting it.",
    )
    parser.add_argument("out", metavar="OUT.tar.gz", help="archive to write")
    parser.add_argument(
        "--sysfs-root",
        "--sysfs_root",
        metavar="DIR",
        default="/",
        help="snapshot a tree under DIR instead of this machine",
    )
    args = parser.parse_args(argv)
    from numarun.files.safedir import replace_file
    from numarun.machine.snapshot import snapshot

    counted: list[int] = []
    replace_file(
        args.out, lambda out: counted.append(snapshot(args.sysfs_root, out)), what="snapshot OUT"
    )
    count = counted[0] if counted else None
    print(f"wrote {args.out}" + (f" ({count} files)" if isinstance(count, int) else ""))
    return 0


def _cmd_stacks(argv: Sequence[str]) -> int:
    parser = _parser(
        prog="numarun stacks",
        description="Print the Python stacks of every thread of every rank of a running numarun "
        "job of yours on this host; ranks with identical stacks are grouped, the odd ones out "
        "after the largest group. The job goes on undisturbed. Exit status: 0; 1 when no job "
        "runs or it does not answer; 2 when several run and none is named (they are listed).",
    )
    parser.add_argument(
        "run_id",
        nargs="?",
        metavar="RUN_ID",
        help="the job's run id (--rdzv-id, or the one in its log paths) or its launcher's pid; "
        "default: the only job running",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for programs")
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the job's answer (default 5)",
    )
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be a number of seconds > 0, not {args.timeout}")
    from numarun.stacks.channel import stacks_command

    return stacks_command(args.run_id, as_json=args.json, timeout=args.timeout)


def _whole_mib(text: str) -> int:
    """``--buffer-mib``: a whole number of MiB, written as an integer or as ``1e3``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")) or value != int(value):
        raise UsageError(f"--buffer-mib must be a whole number of MiB, not {text!r}")
    return int(value)


def _cmd_check(argv: Sequence[str]) -> int:
    from numarun.check.command import DEFAULT_BUFFER_MIB, DEFAULT_SECONDS

    parser = _parser(
        prog="numarun check",
        description="Start the planned ranks exactly as a job's (bound at birth by numarun's "
        "supervisor), each running a built-in probe: it reads the CPUs it really has in its first "
        "statement, the memory policy in force, where its pages land and the GPU it sees; then "
        "all ranks at once measure memory bandwidth on their own node and on the farthest one "
        "(and, with torch and CUDA, pinned H2D/D2H bandwidth near and far). Prints a table "
        "whose last line is the verdict. Exit status: 0 when every rank was bound as planned, "
        "1 when not, 2 for bad input.",
    )
    parser.add_argument("--nproc-per-node", "--nproc_per_node", metavar="N", default=None,
                        help="ranks, as for a job: an integer, gpu, cpu or auto (default, with "
                        "no --numa-binding either: what numarun plan chooses)")
    parser.add_argument("--numa-binding", "--numa_binding", metavar="MODE", default=None,
                        help="the binding mode to check, as for a job (default, with no "
                        "--nproc-per-node either: what numarun plan chooses; else none)")
    parser.add_argument("--rank-cpus", "--rank_cpus", metavar="LIST", action="append",
                        default=None, help="explicit CPUs of the next rank (repeat per rank)")
    parser.add_argument("--mem-binding", "--mem_binding", metavar="POLICY", default=None,
                        help="memory policy: none (default), local, preferred, bind, interleave")
    parser.add_argument("--binding-fallback", "--binding_fallback", action="store_true",
                        default=None, help="as for a job: run with less binding instead of failing")
    parser.add_argument("--cpus-allowed", "--cpus_allowed", metavar="LIST", default=None,
                        help="plan within these CPUs instead of this process's affinity")
    parser.add_argument("--sysfs-root", "--sysfs_root", metavar="DIR", default=None,
                        help="with --dry-run: plan for the machine under DIR")
    parser.add_argument("--dry-run", "--dry_run", action="store_true",
                        help="print what would be checked and measured; start nothing")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, metavar="S",
                        help=f"measuring time, shared by the phases (default {DEFAULT_SECONDS:g})")
    parser.add_argument("--buffer-mib", "--buffer_mib", type=_whole_mib, default=DEFAULT_BUFFER_MIB,
                        metavar="MIB", help="size of each copy buffer per rank "
                        f"(default {DEFAULT_BUFFER_MIB}; lowered to fit memory)")
    parser.add_argument("--json", action="store_true", help="print JSON for programs")
    args = parser.parse_args(argv)  # fmt: skip
    from numarun.check.command import (
        CheckStopped,
        check_buffer_mib,
        chosen_binding,
        launch_argv,
        run_check,
    )
    from numarun.check.verdict import format_text
    from numarun.machine.topology import read_topology

    # Before anything is said or started (run_check checks it again, for its own callers).
    check_buffer_mib(args.buffer_mib, read_topology(args.sysfs_root or "/"),
                     real=not args.dry_run)  # fmt: skip
    nproc_per_node, numa_binding, note = chosen_binding(
        args.nproc_per_node,
        args.numa_binding,
        args.rank_cpus,
        sysfs_root=args.sysfs_root,
        cpus_allowed=args.cpus_allowed,
    )
    if note is not None:
        print(f"numarun check: {note}", file=sys.stderr)
    check_argv = launch_argv(
        nproc_per_node=nproc_per_node,
        numa_binding=numa_binding,
        rank_cpus=args.rank_cpus,
        mem_binding=args.mem_binding,
        binding_fallback=bool(args.binding_fallback),
        cpus_allowed=args.cpus_allowed,
        sysfs_root=args.sysfs_root,
        dry_run=args.dry_run,
    )
    try:
        document = run_check(check_argv, seconds=args.seconds, buffer_mib=args.buffer_mib)
    except CheckStopped as stopped:
        print(f"numarun check: {stopped}", file=sys.stderr)
        return stopped.exit_code
    if args.json:
        print(_json_one_rank_per_line(document))
    else:
        print(format_text(document))
    return document["exit_code"]


def _cmd_help(argv: Sequence[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] not in SUBCOMMANDS):
        raise UsageError(
            f"numarun help takes one of {', '.join(SUBCOMMANDS)}, not {' '.join(argv)!r}"
        )
    return main([*argv, "--help"])


def _leave(code: int) -> int:
    """After a launch on a torch rendezvous: end the process here, output flushed, when helper
    threads are still inside torch's store calls (a store that stopped answering): a daemon
    thread that returns from C++ while the interpreter finalizes aborts the process
    (``terminate called without an active exception``) instead of exiting with ``code``."""
    import contextlib
    import threading

    if "torch" not in sys.modules or threading.active_count() <= 1:
        return code
    if threading.current_thread() is not threading.main_thread():
        return code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 bad input).

    A launch's errors are turned into their line and status by
    :func:`numarun.launch.launcher.main` (the launch's one place for that); a subcommand's
    here."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in (*SUBCOMMANDS, "help"):
            return _subcommand(args[0], args[1:])
        launcher = _import_launcher()
        return _leave(launcher.main(args, epilog=commands_help()))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `numarun topo | head` closed our stdout: not an error worth a traceback.
        return 1


def _import_launcher():  # -> the module numarun.launch.launcher
    """The launcher, imported without cyclic collections (as launcher.main runs: its docstring
    says why): every launch's start-up path."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        from numarun.launch import launcher
    finally:
        if collecting:
            gc.enable()
    return launcher


def _subcommand(name: str, argv: list[str]) -> int:
    command = {
        "help": _cmd_help,
        "topo": _cmd_topo,
        "plan": _cmd_plan,
        "check": _cmd_check,
        "snapshot": _cmd_snapshot,
        "stacks": _cmd_stacks,
    }[name]
    try:
        return command(argv)
    except NumarunError as error:
        print(f"numarun: error: {error}", file=sys.stderr)
        return error.exit_code
