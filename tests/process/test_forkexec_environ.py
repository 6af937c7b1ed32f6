"""numarun.process.forkexec._become_environ: a fork worker's environment made ``env`` by writing
only what differs (issue 32 item 12); what the C library sees (getenv) must be ``env`` too."""

from __future__ import annotations

import ctypes
import os

from numarun.process import forkexec


def _c_getenv(name: str) -> str | None:
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(name.encode())
    return None if value is None else value.decode()


def test_the_environment_becomes_env_for_python_and_for_c() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child, as a fork worker: the caller's environ first
        status = 1
        try:
            os.environ["NR_KEPT"] = "same"
            os.environ["NR_CHANGED"] = "old"
            os.environ["NR_DROPPED"] = "gone soon"
            env = {k: v for k, v in os.environ.items() if k != "NR_DROPPED"}
            env.update({"NR_CHANGED": "new", "NR_ADDED": "added"})
            forkexec._become_environ(env)
            ok = (
                dict(os.environ) == env
                and [_c_getenv(k) for k in ("NR_KEPT", "NR_CHANGED", "NR_ADDED", "NR_DROPPED")]
                == ["same", "new", "added", None]
            )
            status = 0 if ok else 3
        finally:
            os.write(write, b"%d" % status)
            os._exit(status)
    os.close(write)
    answer = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"0"
