"""What numarun's worker bootstrap costs a worker: ``python -u script.py`` against the same
script started as the launcher starts it, side by side.

    python benchmarks/bench_bootstrap.py [--runs 200]

Contenders, started one after the other in interleaved rounds (so that load from elsewhere
hits all alike), each to completion (a script of one ``pass``):

* anchor: ``python -u script.py``;
* numarun: ``python -u -c "from numarun.worker.bootstrap import main; main()" -- script.py``
  with the stack dump armed (``NUMARUN_STACKS_FILE`` set, as every launched worker has it);
* for reference, the same bootstrap started as numarun started it before: ``python -u -m
  numarun.worker.bootstrap -- script.py`` (``-m`` adds :mod:`runpy` and the package's ``__main__``
  lookup).

Twice: with ``site`` as installed here, and with ``-S`` (no ``site``: what a bare
interpreter's start-up costs, without this machine's ``.pth`` files, which import a lot and
make every start slower). Medians; the difference to the anchor is the bootstrap's cost.
Target: numarun at most 5 ms above the anchor. Bytecode is cached under
``$TMPDIR/bench_bootstrap_pycache``, as an installed package has it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numarun
from numarun.launch.workersetup import SCRIPT_BOOTSTRAP

PYCACHE = Path(tempfile.gettempdir()) / "bench_bootstrap_pycache"


def _env(dump: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    # The numarun this script imported, also under -S (no site: no .pth, no editable install).
    source = str(Path(numarun.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
    env["NUMARUN_STACKS_FILE"] = str(dump)
    return env


def _run(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return time.perf_counter() - start


def measure(folder: Path, flags: list[str], runs: int) -> dict[str, float]:
    script = folder / "script.py"
    script.write_text("pass\n")
    dump = folder / "dump"
    env = _env(dump)
    python = [sys.executable, *flags, "-u"]
    contenders = {
        "anchor": [*python, str(script)],
        "numarun": [*python, "-c", SCRIPT_BOOTSTRAP, "--", str(script)],
        "-m (before)": [*python, "-m", "numarun.worker.bootstrap", "--", str(script)],
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(3):  # warm caches, fill the bytecode cache
        for command in contenders.values():
            dump.write_bytes(b"")
            _run(command, env)
    for _ in range(runs):
        for name, command in contenders.items():
            dump.write_bytes(b"")
            samples[name].append(_run(command, env))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="interleaved rounds")
    args = parser.parse_args()
    print(f"## worker bootstrap ({len(os.sched_getaffinity(0))} CPUs, Python "
          f"{sys.version.split()[0]}, {args.runs} interleaved rounds, medians)\n")  # fmt: skip
    print("| interpreter | `python -u script.py` | numarun's bootstrap | cost | ratio "
          "| `-m numarun.worker.bootstrap` | target |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench_bootstrap_") as tmp:
        for label, flags in (("site as installed", []), ("-S (no site)", ["-S"])):
            m = measure(Path(tmp), flags, args.runs)
            anchor, ours, before = m["anchor"], m["numarun"], m["-m (before)"]
            print(f"| {label} | {anchor * 1e3:.1f} ms | {ours * 1e3:.1f} ms | "
                  f"+{(ours - anchor) * 1e3:.1f} ms | {ours / anchor:.2f}x | "
                  f"{before * 1e3:.1f} ms (+{(before - anchor) * 1e3:.1f} ms) | "
                  "<= +5 ms |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
