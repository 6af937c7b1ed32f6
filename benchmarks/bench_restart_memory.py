"""The launcher's memory over many restarts, ``numarun`` next to torchrun, side by side in one run.

One node, one worker that fails at once (``--no-python false``), ``--max-restarts N``: every
attempt fails and is restarted. While the launcher runs, its resident set size (``VmRSS`` in
``/proc/<pid>/status``) is read each time the count of ended attempts reaches a checkpoint
(the launchers' own lines: numarun's ``restarting (restart K of N)``, torchrun's ``failed
(exitcode: 1)``). A launcher that keeps something per attempt grows by the same amount
between every two checkpoints; one that keeps a bounded history levels off after the first
attempts (first-time imports, caches). torchrun is the anchor (its agent keeps nothing per
attempt that grows). The figure is the growth per 100 restarts between the last two
checkpoints.

Usage: ``python benchmarks/bench_restart_memory.py [--restarts 300] [--checkpoints 10,100,300]
[--no-torchrun]``. Run it with ``PYTHONPATH=<another checkout>/src`` to measure another
numarun (the table says which ``numarun`` it imported).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time

NUMARUN_ENDED = re.compile(r"^numarun: attempt_\d+: .*restarting \(restart (\d+) of")
TORCHRUN_ENDED = re.compile(r"failed \(exitcode: ")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measure(launcher: str, restarts: int, checkpoints: list[int]) -> dict[int, int]:
    """``{ended attempts: launcher RSS in KiB}`` at each checkpoint."""
    if launcher == "numarun":
        command = [sys.executable, "-m", "numarun"]
        pattern = NUMARUN_ENDED
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--master-port",
                   str(_free_port())]  # fmt: skip
        pattern = TORCHRUN_ENDED
    command += ["--nproc-per-node", "1", "--max-restarts", str(restarts), "--no-python", "false"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    found: dict[int, int] = {}
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        assert process.stderr is not None
        ended = 0
        for line in process.stderr:
            if not pattern.search(line):
                continue
            ended += 1
            if ended in checkpoints:
                rss = _rss_kib(process.pid)
                if rss is not None:
                    found[ended] = rss
        process.wait()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=300)
    parser.add_argument("--checkpoints", default="10,100,300")
    parser.add_argument("--no-torchrun", action="store_true")
    options = parser.parse_args()
    checkpoints = sorted(int(text) for text in options.checkpoints.split(","))
    if checkpoints[-1] > options.restarts:
        parser.error("a checkpoint beyond --restarts is never reached")
    import numarun

    launchers = ["numarun"] if options.no_torchrun else ["numarun", "torchrun"]
    results = {}
    for launcher in launchers:
        started = time.monotonic()
        results[launcher] = measure(launcher, options.restarts, checkpoints)
        print(f"{launcher}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(f"\nnumarun from {os.path.dirname(numarun.__file__)}\n")
    heads = " | ".join(f"after {n} restarts" for n in checkpoints)
    print(f"| launcher | {heads} | growth per 100 restarts ({checkpoints[-2]} -> "
          f"{checkpoints[-1]}) |")  # fmt: skip
    print("|---" * (len(checkpoints) + 2) + "|")
    for launcher, found in results.items():
        cells = " | ".join(
            f"{found[n] / 1024:.1f} MiB" if n in found else "n/a" for n in checkpoints
        )
        low, high = checkpoints[-2], checkpoints[-1]
        growth = "n/a"
        if low in found and high in found:
            growth = f"{(found[high] - found[low]) * 100 / (high - low):+.0f} KiB"
        print(f"| {launcher} | {cells} | {growth} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
