"""A signal to one thread of another process: ``tgkill(2)``, which Python's :mod:`os` and
:mod:`signal` do not offer for a process other than the caller.

What it is for: numarun's stack dumps, when a rank's helper thread cannot get the GIL
(:mod:`numarun.stacks.rankhelper`), fall back to faulthandler's signal handler, which must run on
the rank's main thread (the likely GIL holder) and not on the helper. A signal sent to a process
(``kill``, ``pidfd_send_signal``) goes to a thread of the kernel's choosing, usually but not
always the main thread; ``tgkill(tgid, tid, sig)`` goes to thread ``tid`` and only while it is a
thread of process ``tgid`` (else ``ESRCH``), so a thread id left over from an ended thread, or
reused elsewhere, is never hit.

Through :mod:`ctypes` (already loaded by :mod:`numarun.placement.binding` in every process that
starts workers): glibc's ``tgkill`` (2.30 and later), else ``syscall(2)`` with this
architecture's number. Where neither exists, :func:`thread_signals_work` is False and callers
signal the process instead.
"""

from __future__ import annotations

import ctypes
import errno
import os

# tgkill's system call number per 64-bit architecture (uname -m), where libc has no wrapper.
_TGKILL = {
    "x86_64": 234,
    "aarch64": 131,
    "arm64": 131,
    "riscv64": 131,
    "loongarch64": 131,
    "ppc64le": 250,
    "ppc64": 250,
    "s390x": 241,
}

_call: object = None  # the loaded function: None not tried yet, False unavailable


def _load() -> object:
    global _call
    if _call is None:
        _call = False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return _call
        wrapper = getattr(libc, "tgkill", None)
        if wrapper is not None:
            wrapper.restype = ctypes.c_int
            wrapper.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
            _call = wrapper
        else:
            number = _TGKILL.get(os.uname().machine)
            syscall = getattr(libc, "syscall", None)
            if number is not None and syscall is not None and ctypes.sizeof(ctypes.c_void_p) == 8:
                syscall.restype = ctypes.c_long

                def via_syscall(tgid: int, tid: int, signum: int) -> int:
                    return int(syscall(ctypes.c_long(number), ctypes.c_long(tgid),
                                       ctypes.c_long(tid), ctypes.c_long(signum)))  # fmt: skip

                _call = via_syscall
    return _call


def thread_signals_work() -> bool:
    """Whether :func:`send_to_thread` can work here."""
    return bool(_load())


def send_to_thread(pid: int, tid: int, signum: int) -> bool:
    """Send ``signum`` to thread ``tid`` of process ``pid``; False when that thread is not
    (or no longer) one of that process's. Raises OSError for anything else (``EPERM``, or
    ``ENOSYS`` where :func:`thread_signals_work` is False)."""
    call = _load()
    if not call:
        raise OSError(errno.ENOSYS, "tgkill is not available")
    if call(pid, tid, signum) == 0:  # type: ignore[operator]
        return True
    code = ctypes.get_errno()
    if code == errno.ESRCH:
        return False
    raise OSError(code, os.strerror(code))
