"""What a worker sees, first thing, as JSON: for comparing a cold worker with a warm one.

``python worker_view.py OUT_DIR`` (or ``-m worker_view OUT_DIR``) writes
``OUT_DIR/view.<restart count>.<rank>.json``; on attempt 0 rank 0 then exits 3 once every
rank wrote its view (a restart follows under ``--max-restarts``). RANK is read at import, as
scripts do.
"""

import json
import os
import resource
import signal
import sys
import threading
import warnings

RANK = os.environ["RANK"]  # at import: a standby is handed it before the script runs


def _proc_status() -> dict[str, str]:
    wanted = ("SigIgn", "SigCgt", "SigBlk", "Cpus_allowed_list", "Mems_allowed_list")
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in wanted:
                fields[name] = value.strip()
    return fields


def _mem_policy() -> list[object]:
    from numarun.placement.binding import get_mem_policy

    mode, nodes = get_mem_policy()
    return [mode, list(nodes)]


def _handlers() -> dict[str, str]:
    found = {}
    for signum in sorted(signal.valid_signals()):
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        found[str(int(signum))] = getattr(handler, "__qualname__", repr(handler))
    return found


def _limits() -> dict[str, list[int]]:
    return {
        name: list(resource.getrlimit(getattr(resource, name)))
        for name in sorted(dir(resource))
        if name.startswith("RLIMIT_")
    }


def _fds() -> list[str]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(f"{fd}:{os.readlink(f'/proc/self/fd/{fd}').split('[')[0]}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return sorted(fds)


def view() -> dict[str, object]:
    mask = os.umask(0)
    os.umask(mask)
    spec = globals().get("__spec__")
    stdin = os.fstat(0)
    return {
        "environ": dict(os.environ),
        "argv": sys.argv,
        "name": __name__,
        "file": globals().get("__file__"),
        "spec": [spec.name, spec.origin] if spec is not None else None,
        "path": sys.path,
        "cwd": os.getcwd(),
        "umask": mask,
        "affinity": sorted(os.sched_getaffinity(0)),
        "mem_policy": _mem_policy(),
        "status": _proc_status(),
        "handlers": _handlers(),
        "limits": _limits(),
        "fds": _fds(),
        "stdin": [stdin.st_dev, stdin.st_ino, stdin.st_mode],
        "flags": list(sys.flags),
        "unbuffered": [sys.stdout.write_through, sys.stderr.write_through],
        "warnings": [repr(f) for f in warnings.filters],
        "threads": threading.active_count(),
        "main_is_me": sys.modules["__main__"].__dict__ is globals(),
        "rank_at_import": RANK,
        "light": "light_preload_module" in sys.modules,
    }


if __name__ == "__main__":
    out = sys.argv[1]
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    seen = view()
    path = os.path.join(out, f"view.{attempt}.{RANK}.json")
    with open(path + ".partial", "w") as file:
        json.dump(seen, file)
    os.rename(path + ".partial", path)
    if attempt == "0" and RANK == "0":
        import time

        # Fail once every rank has written its view (the teardown would stop the others).
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out, f"view.0.{rank}.json")) for rank in range(world)
        ):
            time.sleep(0.02)
        sys.exit(3)
