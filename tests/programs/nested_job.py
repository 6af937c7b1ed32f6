"""A worker that runs a job of its own, for tests/process/test_teardown.py.

``python nested_job.py DIR``: local rank 0 becomes an inner ``numarun --nproc-per-node 2
escaping_daemons.py DIR stay`` (exec, same pid); local rank 1 calls ``numarun.spawn`` of
``teardown_spawn_funcs.escape_then_stay`` with 2 workers. Every inner worker leaves two escapees.
"""

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from programs import escaping_daemons, teardown_spawn_funcs  # noqa: E402


def main(directory: str) -> int:
    escaping_daemons.note(directory, f"outer.{os.getpid()}")
    if os.environ["LOCAL_RANK"] == "0":
        escape = str(TESTS / "programs" / "escaping_daemons.py")
        argv = [sys.executable, "-m", "numarun", "--nproc-per-node", "2", escape, directory]
        os.execv(sys.executable, [*argv, "stay"])
    import numarun

    numarun.spawn(
        teardown_spawn_funcs.escape_then_stay, args=(directory,), nprocs=2, start_method="spawn"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
