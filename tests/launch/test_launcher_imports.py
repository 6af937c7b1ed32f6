"""What a launch imports before its workers start (issue 32 item 13).

The time from ``numarun`` to the last worker's first line is the launcher's own start followed by
the workers'; every module the launcher imports before it forks them is on that path.
``dataclasses`` (with ``inspect``, ``ast``, ``dis``, ``tokenize``: about 10 ms) came back once
through a value type; ``argparse`` (with ``shutil`` and ``locale`` from its formatter and
``gettext``) was the option parser's. ``benchmarks/bench_launch.py`` measures the time; this test
holds the list: the modules loaded when the launcher first forks (the watchdog, which forks the
workers), as the ``numarun`` command runs it (``numarun.cli.main``), less what the interpreter
had loaded before (a site-packages ``.pth`` may import more).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TIMEOUT = 240  # generous: the suite runs at load averages of 10-30

# The launcher, with the modules loaded at its first fork and at its end written to OUT.
HARNESS = r"""
import os, sys
out, argv = sys.argv[1], sys.argv[2:]
loaded = set(sys.modules)
at_fork = []


def before_fork():
    if not at_fork:
        at_fork.append(sorted(set(sys.modules) - loaded))


os.register_at_fork(before=before_fork)
code = 1
try:
    from numarun.cli import main

    code = main(argv)
finally:
    with open(out, "w") as f:
        f.write(" ".join(at_fork[0] if at_fork else ["-"]) + "\n")
        f.write(" ".join(sorted(set(sys.modules) - loaded)) + "\n")
sys.exit(code)
"""

# Never before the workers start: each costs a millisecond or more, and none is needed to start
# them (the failure path's json and re come after, once the workers started). socket, signal,
# selectors and threading are used through their C modules (_socket, _signal, select, _thread):
# the Python ones build enums, or import what does, at about a millisecond each; contextlib,
# functools and collections (with its keyword, operator and reprlib) cost the numarun command
# about 3 ms together (python -m numarun has them from runpy).
NOT_BEFORE_START = {
    "argparse", "dataclasses", "inspect", "typing", "pathlib", "ast", "dis", "tokenize",
    "re", "json", "shutil", "locale", "gettext", "difflib", "subprocess", "tempfile",
    "tarfile", "logging", "numarun.launch.summary", "numarun.stacks.parse",
    "enum", "signal", "socket", "selectors", "threading", "math",
    "contextlib", "functools", "collections", "collections.abc", "keyword", "operator",
    "reprlib", "ctypes", "struct",  # binding's few ctypes types come from _ctypes
    "numarun.stacks.channel",  # the `numarun stacks` socket opens once the workers started
}  # fmt: skip
# numarun's own modules loaded when the launcher first forks, all of them: a module of numarun's
# that comes onto the start-up path (each costs about 0.1-0.3 ms of every launch, before any
# worker starts) fails here until it is added, or imported where it is needed instead.
NUMARUN_BEFORE_START = {
    "numarun", "numarun.cli", "numarun.errors",
    "numarun.cmdline", "numarun.cmdline.config", "numarun.cmdline.nodes",
    "numarun.cmdline.options",
    "numarun.files", "numarun.files.logdir", "numarun.files.rundirs", "numarun.files.safedir",
    "numarun.launch", "numarun.launch.attempts", "numarun.launch.failurepath",
    "numarun.launch.launcher", "numarun.launch.outcome", "numarun.launch.startline",
    "numarun.launch.workersetup",
    "numarun.machine", "numarun.machine.cpulist", "numarun.machine.model",
    "numarun.placement", "numarun.placement.binding", "numarun.placement.workerenv",
    "numarun.process", "numarun.process.capacity", "numarun.process.forkexec",
    "numarun.process.loop", "numarun.process.proctable", "numarun.process.record",
    "numarun.process.signals", "numarun.process.spec", "numarun.process.starting",
    "numarun.process.streams", "numarun.process.supervisor", "numarun.process.teardown",
    "numarun.process.watchdog",
    "numarun.stacks", "numarun.stacks.dumps", "numarun.stacks.jobstacks",
    "numarun.stacks.rankhelper",
    "numarun.worker", "numarun.worker.dumphandler",
}  # fmt: skip
# Never in a launch on numarun's static rendezvous at all.
NEVER = {"argparse", "dataclasses", "inspect", "typing", "pathlib", "subprocess", "logging"}


def _env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_", "PYTHONPROFILE"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC")
    }


def test_a_launch_imports_only_what_starting_the_workers_needs(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    # One write per line: the two ranks share the console (print writes its parts apart).
    script.write_text("import os, sys\nsys.stdout.write(f\"hello from {os.environ['RANK']}\\n\")\n")
    out = tmp_path / "imports.txt"
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, str(out), "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["hello from 0", "hello from 1"]
    at_fork, at_end = (set(line.split()) for line in out.read_text().splitlines())
    assert "numarun.process.supervisor" in at_fork  # the workers' start is what was caught
    assert "numarun.launch.summary" in at_end - at_fork  # the failure path: after, not never
    assert sorted(at_fork & NOT_BEFORE_START) == []
    ours = {name for name in at_fork if name == "numarun" or name.startswith("numarun.")}
    assert sorted(ours - NUMARUN_BEFORE_START) == []
    assert sorted(at_end & NEVER) == []
