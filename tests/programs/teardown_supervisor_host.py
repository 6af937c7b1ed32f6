"""A supervisor in its own process, for the tests that SIGKILL it (tests/process/test_teardown.py).

``python teardown_supervisor_host.py START N``: prints ``S <its pid>``, ``R <run id>``, then runs N
workers of start method START (``exec``: a sleeper; ``forkserver``:
``teardown_spawn_funcs.sleep_target``) and waits; each worker prints ``W <pid>`` once running.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor
from programs import teardown_spawn_funcs

SLEEPER = "import os, time; print('W', os.getpid(), flush=True); time.sleep(120)"


def main(start: str, nworkers: int) -> int:
    specs = [
        WorkerSpec(
            local_rank=k,
            rank=k,
            env=dict(os.environ),
            start=start,
            argv=[sys.executable, "-c", SLEEPER] if start == "exec" else None,
            fork_target=teardown_spawn_funcs.sleep_target if start != "exec" else None,
        )
        for k in range(nworkers)
    ]
    supervisor = Supervisor(specs, grace_period=1.0)
    print(f"S {os.getpid()}\nR {supervisor.run_id}", flush=True)
    supervisor.start()
    supervisor.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
