"""Inside a standby: the preloaded imports, the wait for its attempt, the hand-over.

With ``--preload MODULES`` the launcher keeps standbys per local rank
(:mod:`numarun.launch.warm`): processes exec'd exactly as that rank's worker would be (the same
argv through :mod:`numarun.worker.bootstrap`, CPUs, memory policy, working directory, limits,
signal dispositions), with that rank's environment less the variables known only once an
attempt starts (:data:`numarun.launch.warm.HAND_OVER`), plus two markers: ``NUMARUN_PRELOAD``
(the modules) and ``NUMARUN_STANDBY_FD`` (its end of a Unix stream socket to the launcher), and
the stack-dump file its attempt will read. The bootstrap first makes ``sys.argv``, ``sys.path``
and ``__main__`` what the cold worker has at its script's first line and arms the stack dumps,
then calls :func:`standby`; it returns once the standby was handed its attempt, and the
bootstrap then goes on exactly as in a cold worker (the script or module run as ``python``
would, in that same ``__main__``).

:func:`standby`, in this order:

1. takes both markers out of ``os.environ`` (the user's code never sees them);
2. imports each module (``__import__``), in order; after each, checks that CUDA was not
   initialised (:func:`cuda_initialised`): a standby imports, it never holds a GPU;
3. tells the launcher, one line: ``ready``, ``failed\t<module>\t<error>`` (the first module
   that could not be imported, with its exception in one line) or ``cuda\t<module>``;
4. waits for the hand-over: the attempt's complete environment, ``NAME=value`` entries
   separated by NUL bytes, up to end of file (nothing at all: the launcher is gone or
   discarded this standby; it exits 0); after ``ready`` it checks CUDA once more (a thread
   a module started may have initialised it since) and, if so, tells the launcher
   ``cuda\t<modules>\tlater``;
5. closes the socket, and then: after ``ready``, makes ``os.environ`` (and the C
   environment, through it, without racing other threads' ``getenv``: :func:`_apply`)
   exactly the attempt's environment and returns; after a failure it runs *cold*: it
   ``execve``s its own command line (``sys.orig_argv``) with the attempt's environment, after
   putting back the signal dispositions and mask it had before the imports, so the same
   process (same pid, same binding) becomes the worker a cold start would have made.

Effects of the imports stay, as if the script's first line had made them: ``sys.modules``,
``sys.path`` and ``sys.argv`` changes, warning filters, handlers or threads a module sets up. A
module that reads a hand-over variable (``RANK``, ...) at import sees it unset: those are not
known yet.

Imports only ``os`` and ``sys`` (loaded by every interpreter) besides the preloaded modules;
``signal`` on the failure path, ``ctypes`` only where the CUDA driver library is loaded or
where another thread runs at the hand-over.
"""

import os
import sys

PRELOAD_ENV = "NUMARUN_PRELOAD"
STANDBY_FD_ENV = "NUMARUN_STANDBY_FD"
STACKS_FILE_ENV = "NUMARUN_STACKS_FILE"  # numarun.worker.dumphandler's
READY = b"ready"
_MAX_HAND_OVER = 64 * 1024 * 1024  # bytes; an environment is a few KiB
_CUDA_ERROR_NOT_INITIALIZED = 3


def standby() -> "str | None":
    """Steps 1 to 5 of the module docstring; returns only after a hand-over whose imports
    succeeded, with the attempt's stack-dump file (``NUMARUN_STACKS_FILE``), which is taken
    out of the environment as a cold worker's bootstrap takes it out (None without one)."""
    fd = int(os.environ.pop(STANDBY_FD_ENV))
    modules = [name for name in os.environ.pop(PRELOAD_ENV, "").split(",") if name]
    born = dict(os.environ)
    ignored, blocked = _signal_state()
    status = _preload(modules)
    try:
        _send(fd, status + b"\n")
        environment = _receive(fd)
        if environment is not None and status == READY and cuda_initialised():
            # Not at any import's end, now: a thread a preloaded module started did it.
            status = b"cuda\t" + ",".join(modules).encode("utf-8", "replace") + b"\tlater"
            _send(fd, status + b"\n")
    except OSError:
        environment = None  # the launcher is gone
    os.close(fd)
    if environment is None:
        os._exit(0)
    if status != READY:
        _exec_cold(environment, ignored, blocked)
    stacks_file = environment.pop(STACKS_FILE_ENV, None)
    _apply(environment, born)
    return stacks_file


def _preload(modules: "list[str]") -> bytes:
    """Import ``modules`` in order; the status line (without its newline)."""
    for name in modules:
        try:
            __import__(name)
        except BaseException as error:  # SystemExit and KeyboardInterrupt in an import too
            text = f"{type(error).__name__}: {error}".replace("\n", " ").replace("\t", " ")
            return b"failed\t" + name.encode("utf-8", "replace") + b"\t" + text[:500].encode(
                "utf-8", "replace"
            )
        if cuda_initialised():
            return b"cuda\t" + name.encode("utf-8", "replace")
    return READY


def cuda_initialised() -> bool:
    """Whether this process initialised CUDA: torch says so (``torch.cuda.is_initialized()``,
    when torch is loaded), or the CUDA driver library is loaded and holds a context (the
    current one, or an active primary context of any device: GPU memory held). Never loads
    the driver itself; False when it cannot be asked."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return True
    except Exception:
        pass
    return _driver_has_context()


def _driver_has_context() -> bool:
    try:
        with open("/proc/self/maps", "rb") as maps:
            if b"/libcuda.so" not in maps.read():
                return False
        import ctypes

        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    context = ctypes.c_void_p()
    code = driver.cuCtxGetCurrent(ctypes.byref(context))
    if code == _CUDA_ERROR_NOT_INITIALIZED:
        return False  # cuInit was never called: no context can exist
    if code == 0 and context.value:
        return True
    count = ctypes.c_int()
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    for ordinal in range(count.value):
        device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        state = driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active))
        if state == 0 and active.value:
            return True
    return False


def _send(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd: int) -> "dict[str, str] | None":
    """The hand-over (module docstring, step 4): the environment, or None for nothing."""
    chunks = []
    size = 0
    while size <= _MAX_HAND_OVER:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    if not data:
        return None
    environment = {}
    for entry in data.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name:
            environment[os.fsdecode(name)] = os.fsdecode(value)
    return environment


def _apply(environment: "dict[str, str]", born: "dict[str, str]") -> None:
    """``os.environ`` (and with it the C environment) becomes ``environment`` where it differs
    from what this process was ``born`` with (the variables of the hand-over); what the
    imports set, changed or removed themselves stays, as in a cold worker, where they run
    with the attempt's environment already there.

    With this process's main thread alone, entries are removed, changed and added one by one
    (``unsetenv``/``setenv``). With other threads (started by a preloaded module), which may
    call ``getenv`` at any time, ``setenv`` is not safe: glibc may move and free the array a
    reader walks. Then the C environment is a new array, installed with one pointer store
    (:func:`_swap_environ`): a reader sees the old one or the new one, and the old one is
    never freed."""
    removed = [name for name in born if name not in environment]
    changed = {name: value for name, value in environment.items() if born.get(name) != value}
    current = os.environ
    if _other_threads():
        _swap_environ(removed, changed)
        data = current._data  # type: ignore[attr-defined]
        for name in removed:
            data.pop(current.encodekey(name), None)  # type: ignore[attr-defined]
        for name, value in changed.items():
            data[current.encodekey(name)] = current.encodevalue(value)  # type: ignore[attr-defined]
        return
    for name in removed:
        current.pop(name, None)
    for name, value in changed.items():
        current[name] = value


def _other_threads() -> bool:
    """Whether this process runs another thread than this one (OpenMP's too)."""
    try:
        return len(os.listdir("/proc/self/task")) > 1
    except OSError:
        return True


def _swap_environ(removed: "list[str]", changed: "dict[str, str]") -> None:
    """The C ``environ`` pointer set to a new array: the entries it holds now, less
    ``removed``, with ``changed`` set. The array and its strings are kept for good (a reader
    may still walk it), and so is the old one. ``ctypes`` is imported for it and taken out of
    ``sys.modules`` again when nothing had imported it before (the user's program finds what
    a cold worker finds)."""
    before = set(sys.modules)
    import ctypes

    pointer = ctypes.c_void_p.in_dll(ctypes.CDLL(None), "environ")
    old = ctypes.cast(pointer.value, ctypes.POINTER(ctypes.c_char_p))
    gone = {os.fsencode(name) for name in [*removed, *changed]}
    entries = []
    index = 0
    while old and old[index] is not None:
        entry = old[index]
        if entry.partition(b"=")[0] not in gone:
            entries.append(entry)
        index += 1
    entries += [os.fsencode(name) + b"=" + os.fsencode(value) for name, value in changed.items()]
    array = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(array))  # never freed, nowhere to be seen
    pointer.value = ctypes.addressof(array)
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _signal_state() -> "tuple[int, int]":
    """(ignored, blocked) signal bit masks of this thread, from ``/proc/thread-self/status``
    (0, 0 where it cannot be read)."""
    ignored = blocked = 0
    try:
        with open("/proc/thread-self/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigIgn:"):
                    ignored = int(line.split()[1], 16)
                elif line.startswith(b"SigBlk:"):
                    blocked = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return ignored, blocked


def _exec_cold(environment: "dict[str, str]", ignored: int, blocked: int) -> None:
    """Become this rank's cold worker (module docstring, step 5); never returns."""
    import signal

    now_ignored, _ = _signal_state()
    for bit in range(64):
        if now_ignored >> bit & 1 and not ignored >> bit & 1:
            try:  # noqa: SIM105 (contextlib costs a millisecond here)
                signal.signal(bit + 1, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    valid = signal.valid_signals()
    mask = [bit + 1 for bit in range(64) if blocked >> bit & 1 and bit + 1 in valid]
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    try:
        os.execve(sys.executable, sys.orig_argv, environment)
    except OSError as error:
        os.write(2, f"numarun: the standby could not start cold: {error}\n".encode())
    os._exit(127)
