"""Polling a failed worker, under torch.multiprocessing or numarun, for
tests/launch/test_launcher_failure_imports.py: ``failed_worker_poll.py torch|numarun METHOD
FOLDER``.

Rank 0 fails at once; rank 1 notes any SIGTERM in FOLDER (``signal.1``) and ends. Once rank 0
has ended and rank 1 runs, the caller looks at the workers for half a second as a training
script might (``exitcode``, ``is_alive()``, ``join(0.05)``), then says on stdout, as JSON, whether
rank 1 is still running unsignalled, what rank 0's ``exitcode`` read, and what
``ProcessContext.join`` did after."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def work(rank: int, folder: str) -> None:
    if rank == 0:
        raise RuntimeError("rank 0 fails on purpose")

    def noted(signum: int, frame: object) -> None:
        with open(os.path.join(folder, f"signal.{rank}"), "w") as out:
            out.write(str(signum))
        os._exit(0)

    signal.signal(signal.SIGTERM, noted)
    with open(os.path.join(folder, f"ready.{rank}"), "w"):
        pass
    time.sleep(120)


def main() -> None:
    library, method, folder = sys.argv[1:4]
    if library == "torch":
        import torch.multiprocessing as library_module
    else:
        import numarun as library_module
    from multiprocessing.connection import wait

    context = library_module.start_processes(
        work, args=(folder,), nprocs=2, join=False, start_method=method
    )
    first, second = context.processes
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(folder, "ready.1")) and time.monotonic() < deadline:
        time.sleep(0.01)
    wait([first.sentinel], timeout=120)
    while first.exitcode is None and time.monotonic() < deadline:  # numarun: the watchdog's
        first.join(0.05)  # report of the end, which a loaded machine may delay past a second
    codes = set()
    looked_until = time.monotonic() + 0.5
    while time.monotonic() < looked_until:
        codes.add(first.exitcode)
        first.is_alive()
        first.join(0.05)
        codes.add(second.exitcode)  # rank 1 runs: None
        second.join(0.01)
    report = {
        "exitcodes_read": sorted(codes, key=str),
        "second_alive": second.is_alive(),
        "second_signalled": os.path.exists(os.path.join(folder, "signal.1")),
    }
    try:
        context.join()
        report["join"] = "returned"
    except Exception as error:  # the library's ProcessRaisedException
        report["join"] = type(error).__name__
    report["second_signalled_by_join"] = os.path.exists(os.path.join(folder, "signal.1"))
    report["second_alive_after_join"] = second.is_alive()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
