"""Worker functions and callers for tests/process/test_signals_inherited.py: what a worker inherits
of its caller's signal state (ignored dispositions, the signal mask).

Module-level and free of pytest imports, so that every start method can pickle the functions and
a spawned worker loads the module quickly. Run as a script, it is a caller:

``python inherited_signal_funcs.py spawn METHOD``: with SIGCHLD ignored, ``numarun.spawn`` two
workers that each run ``sh -c 'exit 5'`` and return its status; prints the values as JSON.

``python inherited_signal_funcs.py dispositions``: with SIGCHLD, SIGUSR1 and SIGHUP ignored and
SIGUSR2 blocked in its thread, a Supervisor (``keep_ignored=(SIGHUP,)``) runs one exec worker that
prints its ``SigIgn`` and ``SigBlk`` masks; prints ``{"ignored": [...], "blocked": [...]}``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys


def child_status(local_rank: int) -> int:
    """The exit status a worker's own child reports (5 unless SIGCHLD is ignored: then 0)."""
    return subprocess.run(["sh", "-c", "exit 5"], check=False).returncode


def _mask(line: str) -> list[int]:
    bits = int(line.split(":", 1)[1], 16)
    return [bit + 1 for bit in range(64) if bits >> bit & 1]


def _spawn(method: str) -> None:
    import numarun

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print(json.dumps(numarun.spawn(child_status, nprocs=2, start_method=method)), flush=True)


def _dispositions() -> None:
    from numarun.process.spec import WorkerSpec
    from numarun.process.supervisor import Supervisor

    for signum in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    collected = bytearray()

    class Collect:
        def feed(self, data: bytes) -> None:
            collected.extend(data)

        def close(self) -> None:
            pass

    spec = WorkerSpec(
        local_rank=0,
        rank=0,
        env={"PATH": "/usr/bin:/bin"},
        argv=["grep", "-E", "^(SigIgn|SigBlk):", "/proc/self/status"],
        stdout=Collect(),
    )
    result = Supervisor([spec], keep_ignored=(signal.SIGHUP,)).run()
    assert result.workers[0].exit_code == 0, result
    lines = collected.decode().splitlines()
    masks = {line.split(":")[0]: _mask(line) for line in lines}
    print(json.dumps({"ignored": masks["SigIgn"], "blocked": masks["SigBlk"]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        _spawn(sys.argv[2])
    else:
        _dispositions()
