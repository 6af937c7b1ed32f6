"""The probe each rank of ``numarun check`` runs: ``python -m numarun.check.probe``.

Started by the launcher like any job's worker (through :mod:`numarun.worker.bootstrap`, bound at
birth by the supervisor), so it sees what a training script would see. Its first statement reads
the CPUs it may run on (``os.sched_getaffinity``), before any other import: nothing of numarun's
or the user's can have changed them since the process began, except what ran before Python
handed over (``sitecustomize``, ``.pth`` files, a wrapper in ``PYTHON_EXEC``), which is exactly
what the check is there to catch.

Then, with its instructions from ``$NUMARUN_CHECK_DIR/check.json`` (written by
:mod:`numarun.check.command`) and its ``LOCAL_RANK``:

1. the memory policy in force (``get_mempolicy(2)``) and the cpuset's ``Mems_allowed_list``;
2. where pages it touches land: a buffer allocated under that policy, its pages located with
   ``move_pages(2)`` (:mod:`numarun.check.memory`); the node holding most of them is the rank's
   home when the plan names none;
3. the GPU it sees (:mod:`numarun.check.gpu`), when the plan gave it one;
4. the measuring phases, each started together with every other rank (a file barrier in the
   check's directory, at most ``barrier_timeout`` seconds per phase, after which it goes on and
   says the phase was not concurrent): copy bandwidth with both buffers on the home node and on
   the farthest node; pinned host-to-device and device-to-host bandwidth with the host buffer on
   the home node and on the farthest one (torch with CUDA only, imported only then);
5. its CPUs again at the end (torch or a library may have changed them meanwhile).

The result is ``$NUMARUN_CHECK_DIR/rank<LOCAL_RANK>.json``, written atomically after step 3 and
again at the end (see :func:`numarun.check.verdict.rank_verdict` for its fields). Exit status 0
when the result was written (whatever it says), 2 for a missing instruction, 1 for an error.
Nothing is printed on stdout.
"""

import os

CPUS_AT_START = sorted(os.sched_getaffinity(0))

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DIR_ENV = "NUMARUN_CHECK_DIR"
INSTRUCTIONS = "check.json"
# The buffer whose pages show where the rank's memory lands (as allocated, no mbind).
PLACED_BYTES_MAX = 64 << 20
# Threads per rank for the copy bandwidth: the rank's OMP_NUM_THREADS, at most this many.
MAX_COPY_THREADS = 8


def result_path(directory: str, local_rank: int) -> str:
    return os.path.join(directory, f"rank{local_rank}.json")


def write_json(path: str, document: "dict[str, Any]") -> None:
    """Write ``document`` to ``path`` atomically (a reader sees the old or the new file)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(document, out)
    os.replace(temporary, path)


class Barrier:
    """All ranks start each phase together: rank ``r`` creates ``<dir>/barrier/<phase>.<r>``
    and waits, polling every millisecond, until every rank's file is there or ``timeout``
    seconds pass (then :attr:`late` names the phase and the rank goes on alone)."""

    def __init__(self, directory: str, local_rank: int, nprocs: int, timeout: float) -> None:
        self.directory = os.path.join(directory, "barrier")
        os.makedirs(self.directory, exist_ok=True)
        self.local_rank = local_rank
        self.nprocs = nprocs
        self.timeout = timeout
        self.late: list[str] = []

    def wait(self, phase: str) -> None:
        mark = os.path.join(self.directory, f"{phase}.{self.local_rank}")
        os.close(os.open(mark, os.O_CREAT | os.O_WRONLY, 0o600))
        expected = {f"{phase}.{rank}" for rank in range(self.nprocs)}
        deadline = time.monotonic() + self.timeout
        while not expected <= set(os.listdir(self.directory)):
            if time.monotonic() >= deadline:
                self.late.append(phase)
                return
            time.sleep(0.001)


# What each phase measures, for the progress line local rank 0 prints as it begins.
PHASE_WORDS = {
    "memory-local": "memory bandwidth on each rank's own node",
    "memory-far": "memory bandwidth on the farthest node",
    "h2d-planned": "host-to-GPU copies from each rank's own node",
    "h2d-far": "host-to-GPU copies from the farthest node",
    "d2h-planned": "GPU-to-host copies to each rank's own node",
    "d2h-far": "GPU-to-host copies to the farthest node",
}


def progress_line(phases: "list[str]", index: int, phase_seconds: float) -> str:
    """``numarun check: measuring WHAT (phase K of N), about S s left``."""
    left = phase_seconds * (len(phases) - index)
    what = PHASE_WORDS.get(phases[index], phases[index])
    return (
        f"numarun check: measuring {what} (phase {index + 1} of {len(phases)}), "
        f"about {left:.0f} s left"
    )


def main(environ: "dict[str, str] | None" = None) -> int:
    import signal

    # Ctrl-C (relayed by the launcher) ends a rank at once, as the signal's default does:
    # no traceback per rank, and no buffer unmapped under a copy thread still using it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    env = dict(os.environ if environ is None else environ)
    directory = env.get(DIR_ENV)
    if not directory or "LOCAL_RANK" not in env:
        sys.stderr.write(
            f"numarun check probe: run by `numarun check` only ({DIR_ENV} and LOCAL_RANK unset)\n"
        )
        return 2
    local_rank = int(env["LOCAL_RANK"])
    with open(os.path.join(directory, INSTRUCTIONS), encoding="utf-8") as source:
        instructions = json.load(source)
    probe = Probe(directory, local_rank, instructions, env)
    probe.read_binding()
    write_json(result_path(directory, local_rank), probe.result)
    probe.measure()
    probe.result["cpus_at_end"] = sorted(os.sched_getaffinity(0))
    write_json(result_path(directory, local_rank), probe.result)
    return 0


class Probe:
    """One rank's probe: :meth:`read_binding` then :meth:`measure`, filling :attr:`result`."""

    def __init__(
        self,
        directory: str,
        local_rank: int,
        instructions: "dict[str, Any]",
        env: "dict[str, str]",
    ) -> None:
        self.directory = directory
        self.local_rank = local_rank
        self.instructions = instructions
        self.env = env
        self.me: dict[str, Any] = instructions["ranks"][local_rank]
        self.home: int | None = self.me.get("home")
        self.result: dict[str, Any] = {
            "local_rank": local_rank,
            "rank": int(env.get("RANK", local_rank)),
            "pid": os.getpid(),
            "cpus": CPUS_AT_START,
            "cpus_at_end": None,
            "mem_policy": None,
            "mems_allowed": None,
            "pages": None,
            "home": self.home,
            "gpu": None,
            "memory_gbs": {},
            "h2d_gbs": {},
            "d2h_gbs": {},
            "threads": None,
            "not_measured": [],
            "late_phases": [],
        }

    def _skip(self, what: str, why: str) -> None:
        self.result["not_measured"].append(f"{what}: {why}")

    def read_binding(self) -> None:
        """Memory policy, Mems_allowed, where touched pages land, the GPU seen."""
        from numarun.check import memory
        from numarun.errors import BindingError
        from numarun.placement.binding import get_mem_policy

        try:
            mode, nodes = get_mem_policy()
            self.result["mem_policy"] = {"mode": mode, "nodes": list(nodes)}
        except (OSError, BindingError) as error:
            self.result["mem_policy"] = {"error": str(error)}
        allowed = memory.mems_allowed()
        self.result["mems_allowed"] = list(allowed) if allowed is not None else None
        size = min(PLACED_BYTES_MAX, self.instructions["buffer_bytes"])
        try:
            with memory.Buffer(size) as placed:
                placed.touch()
                counts, method = placed.page_nodes()
            self.result["pages"] = {
                "method": method,
                "nodes": {str(node): pages for node, pages in sorted(counts.items())},
            }
            if self.home is None:
                self.home = memory.majority_node(counts)
                self.result["home"] = self.home
        except OSError as error:
            self.result["pages"] = {"error": str(error)}
        if self.me.get("gpu") is not None:
            from numarun.check.gpu import seen_gpu

            self.result["gpu"] = seen_gpu(self.me["gpu"], self.env)

    def far_node(self) -> "tuple[int | None, str | None]":
        """The node farthest from home that this rank may use, or (None, why not)."""
        if self.home is None:
            return None, "the rank's home node is unknown"
        far_of = self.instructions["far_of"]
        if str(self.home) not in far_of:
            return None, f"node {self.home}, where its memory is, has no CPUs to compare from"
        far = far_of[str(self.home)]
        if far is None:
            return None, "one NUMA node with CPUs and memory"
        allowed = self.result["mems_allowed"]
        if allowed is not None and far not in allowed:
            return None, f"node {far} is not in this rank's Mems_allowed (cpuset)"
        return far, None

    def measure(self) -> None:
        """Every phase of the instructions, each begun with the other ranks."""
        barrier = Barrier(
            self.directory,
            self.local_rank,
            self.instructions["nprocs"],
            self.instructions["barrier_timeout"],
        )
        seconds = self.instructions["phase_seconds"]
        threads = _copy_threads(self.env, len(CPUS_AT_START))
        self.result["threads"] = threads
        copies = None
        phases = self.instructions["phases"]
        try:
            for index, phase in enumerate(phases):
                if self.local_rank == 0:
                    # The phase's setup (touching buffers, a CUDA context) comes first: said
                    # when the rank gets there, the others start with it at the barrier.
                    sys.stderr.write(progress_line(phases, index, seconds) + "\n")
                    sys.stderr.flush()
                kind, _, where = phase.partition("-")
                if kind == "memory":
                    self._memory_phase(barrier, phase, where, seconds, threads)
                else:
                    if copies is None:
                        copies = self._cuda_setup()
                    self._copy_phase(barrier, phase, kind, where, seconds, copies)
        finally:
            if copies:
                copies.close()
            self.result["late_phases"] = barrier.late

    def _memory_phase(
        self, barrier: Barrier, phase: str, where: str, seconds: float, threads: int
    ) -> None:
        from numarun.check import memory

        node, why = (self.home, None) if where == "local" else self.far_node()
        if where == "local" and node is None:
            why = "the rank's home node is unknown"
        buffers: list[memory.Buffer] = []
        try:
            if why is None:
                size = self.instructions["buffer_bytes"]
                for _ in range(2):
                    buffers.append(memory.Buffer(size, node))
                    buffers[-1].touch()
        except OSError as error:
            why = f"cannot place memory on node {node}: {error.strerror or error}"
        try:
            barrier.wait(phase)
            if why is not None:
                self._skip(f"memory bandwidth ({where})", why)
                return
            rate = memory.copy_bandwidth(buffers[0], buffers[1], seconds, threads)
            self.result["memory_gbs"][where] = {"node": node, "gbs": round(rate, 3)}
        finally:
            for buffer in buffers:
                buffer.close()

    def _cuda_setup(self) -> "Any":
        """The device buffers for the copy phases, or False (and why, once) when they cannot
        be made: no GPU planned for this rank, no torch, no CUDA."""
        if self.me.get("gpu") is None:
            self._skip("H2D/D2H bandwidth", "no GPU planned for this rank")
            return False
        from numarun.check.gpu import PinnedCopies, load_torch_cuda

        torch, why = load_torch_cuda()
        if torch is None:
            self._skip("H2D/D2H bandwidth", why or "no CUDA")
            return False
        try:
            copies = PinnedCopies(torch, self.me["gpu"], self.instructions["buffer_bytes"])
        except Exception as error:
            self._skip("H2D/D2H bandwidth", f"cannot use the GPU: {error}")
            return False
        if self.result["gpu"] is not None:
            self.result["gpu"]["cuda"] = copies.describe()
        return copies

    def _copy_phase(
        self,
        barrier: Barrier,
        phase: str,
        kind: str,
        where: str,
        seconds: float,
        copies: "Any",
    ) -> None:
        if not copies:
            barrier.wait(phase)
            return
        node, why = (self.home, None) if where == "planned" else self.far_node()
        if node is None and why is None:
            why = "the rank's home node is unknown"
        host = None
        if why is None:
            try:
                host = copies.host_buffer(node)
            except (OSError, RuntimeError) as error:
                why = f"cannot pin memory on node {node}: {error}"
        barrier.wait(phase)
        if host is None:
            self._skip(f"{kind.upper()} bandwidth ({where})", why or "no host buffer")
            return
        rate = copies.rate(host, kind, seconds)
        self.result[f"{kind}_gbs"][where] = {"node": node, "gbs": round(rate, 3)}


def _copy_threads(env: "dict[str, str]", cpus: int) -> int:
    try:
        wanted = int(env.get("OMP_NUM_THREADS", "1"))
    except ValueError:
        wanted = 1
    return max(1, min(wanted, cpus, MAX_COPY_THREADS))


if __name__ == "__main__":
    sys.exit(main())
