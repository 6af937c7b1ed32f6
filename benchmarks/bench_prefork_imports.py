"""What importing the launcher's start-up modules costs, and how much of it is the import machinery.

Issue 32 item 13: every module the launcher loads before it forks its watchdog (which forks the
workers) is on the start-up path. This finds that set as a launch has it (a launch of 2 trivial
workers with ``os.register_at_fork`` noting ``sys.modules`` at the first fork, as
``tests/launch/test_launcher_imports.py`` does), keeps numarun's own modules of it, and then
measures in fresh interpreters, alternated, the CPU time (``time.thread_time``) of importing
them:

* as Python imports them (finders, ``stat`` calls, the ``.pyc`` read and checked, unmarshalled,
  the module run);
* from one file holding all their code objects, through a finder of a dozen lines that only
  looks a name up, unmarshals and runs the module: the difference is what the import machinery
  costs per module; what is left is unmarshalling and running the modules' code, which only
  loading less code before the fork removes.

Not numarun's way of importing: a figure for deciding what is worth changing. Bytecode is
cached under ``$TMPDIR/bench_launch_pycache``, as ``bench_launch.py`` has it.

Usage: ``python benchmarks/bench_prefork_imports.py [--runs 21]``. Medians, CPU milliseconds.
"""

from __future__ import annotations

import argparse
import marshal
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PYCACHE = Path(tempfile.gettempdir()) / "bench_launch_pycache"

# A launch of 2 trivial workers; prints the modules loaded at its first fork.
AT_FORK = r"""
import os, sys
loaded = set(sys.modules)
at_fork = []
os.register_at_fork(before=lambda: at_fork or at_fork.append(sorted(set(sys.modules) - loaded)))
from numarun.cli import main
code = main(["--nproc-per-node", "2", sys.argv[1]])
sys.stderr.write(" ".join(at_fork[0]) + "\n")
sys.exit(code)
"""

# Import the modules named in argv[2:] (argv[1]: "python" or a bundle file), print CPU ms.
TIMED = r"""
import sys, time
start = time.thread_time()
if sys.argv[1] != "python":
    import marshal
    from _frozen_importlib import ModuleSpec
    with open(sys.argv[1], "rb") as file:
        bundle = marshal.loads(file.read())

    class Bundled:
        @staticmethod
        def find_spec(name, path=None, target=None):
            entry = bundle.get(name)
            if entry is None:
                return None
            spec = ModuleSpec(name, Bundled, origin=entry[0], is_package=entry[1] is not None)
            spec.submodule_search_locations = entry[1]
            spec.has_location = True
            return spec

        @staticmethod
        def create_module(spec):
            return None

        @staticmethod
        def exec_module(module):
            exec(marshal.loads(bundle[module.__name__][2]), module.__dict__)

    sys.meta_path.insert(0, Bundled)
for name in sys.argv[2:]:
    __import__(name)
print((time.thread_time() - start) * 1e3)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def modules_at_fork(folder: Path) -> list[str]:
    """numarun's modules loaded when a launch first forks, in the order they were loaded."""
    script = folder / "hello.py"
    script.write_text("pass\n")
    done = subprocess.run(
        [sys.executable, "-c", AT_FORK, str(script)],
        capture_output=True, text=True, env=_env(), cwd=folder, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the launch failed: {done.stderr[-2000:]}")
    names = done.stderr.splitlines()[-1].split()
    ours = [name for name in names if name == "numarun" or name.startswith("numarun.")]
    return sorted(ours, key=lambda name: (name.count("."), name))  # parents first


def write_bundle(names: list[str], path: Path) -> int:
    """Every module's code object, compiled as its ``.pyc`` is, in one file; its size."""
    import importlib.util

    bundle = {}
    for name in names:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        source = Path(spec.origin).read_bytes()
        code = compile(source, spec.origin, "exec", dont_inherit=True)
        locations = list(spec.submodule_search_locations or []) or None
        bundle[name] = (spec.origin, locations, marshal.dumps(code))
    data = marshal.dumps(bundle)
    path.write_bytes(data)
    return len(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="interpreters per way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_prefork_") as tmp:
        folder = Path(tmp)
        names = modules_at_fork(folder)
        size = write_bundle(names, folder / "bundle.marshal")
        ways = {"python": "python", "bundle": str(folder / "bundle.marshal")}
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for run in range(args.runs + 1):  # the first round warms the caches
            for way, source in ways.items():
                done = subprocess.run(
                    [sys.executable, "-c", TIMED, source, *names],
                    capture_output=True, text=True, env=_env(), check=True, timeout=120,
                )  # fmt: skip
                if run:
                    samples[way].append(float(done.stdout))
    plain = statistics.median(samples["python"])
    bundled = statistics.median(samples["bundle"])
    print(f"{len(names)} numarun modules loaded at a launch's first fork ({size} bytes of code)")
    print(f"imported as Python does:          {plain:.2f} ms CPU (median of {args.runs})")
    print(f"from one file, a finder that only looks up: {bundled:.2f} ms CPU")
    print(
        f"the import machinery: {plain - bundled:.2f} ms, "
        f"{(plain - bundled) / len(names) * 1e3:.0f} us a module"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
