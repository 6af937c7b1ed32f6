"""A supervisor in its own process, for the test that SIGKILLs it mid-run.

``python supervisor_host.py NWORKERS`` runs NWORKERS ``grandchildren_tree.py stay`` workers under a
Supervisor and copies their stdout to its own stdout (``W``/``G`` lines), after a first line ``S
<its pid>``.
"""

import os
import sys
from pathlib import Path

from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor

TREE = str(Path(__file__).with_name("grandchildren_tree.py"))


class Forward:
    """Copies whole lines of one worker's stdout to fd 1 (workers' chunks never interleave)."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, data: bytes) -> None:
        self.pending += data
        lines, _, self.pending = self.pending.rpartition(b"\n")
        if lines:
            os.write(1, lines + b"\n")

    def close(self) -> None:
        if self.pending:
            os.write(1, self.pending + b"\n")


def main(nworkers: int) -> int:
    os.write(1, b"S %d\n" % os.getpid())
    specs = [
        WorkerSpec(
            local_rank=k,
            rank=k,
            env=dict(os.environ),
            argv=[sys.executable, TREE, "stay"],
            stdout=Forward(),
        )
        for k in range(nworkers)
    ]
    supervisor = Supervisor(specs, grace_period=1.0)
    supervisor.start()
    supervisor.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
