"""Fault-injection worker for tests/process/test_supervisor.py: a worker with three grandchildren.

``python grandchildren_tree.py MODE`` starts a plain child, a child in a new session (``setsid``)
and a double-forked child in a new session (reparented when its parent exits). It prints ``W <pid>``
and one ``G <pid>`` per grandchild once each is running, then by MODE: ``stay`` sleeps, ``exit``
exits 0, ``fail`` exits 1. Grandchildren sleep for 60 s.
"""

import os
import subprocess
import sys
import time

SLEEPER = "import os, sys, time; os.write(int(sys.argv[1]), b'%d\\n' % os.getpid()); time.sleep(60)"


def main(mode: str) -> int:
    print(f"W {os.getpid()}", flush=True)
    read_end, write_end = os.pipe()
    for new_session in (False, True):
        subprocess.Popen(
            [sys.executable, "-c", SLEEPER, str(write_end)],
            pass_fds=[write_end],
            start_new_session=new_session,
        )
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, b"%d\n" % os.getpid())
            time.sleep(60)
        os._exit(0)
    os.waitpid(middle, 0)
    os.close(write_end)
    pending = b""
    seen = 0
    while seen < 3:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            print(f"G {int(line)}", flush=True)
            seen += 1
    if mode == "stay":
        time.sleep(60)
    return 1 if mode == "fail" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
