"""What numarun's worker bootstrap costs a worker: ``python -u script.py`` against the same
script started as the launcher starts it, side by side.

    python benchmarks/bench_bootstrap.py [--runs 200] [--before SRC]

Contenders, started one after the other in interleaved rounds (so that load from elsewhere
hits all alike), each to completion (a script of one ``pass``):

* anchor: ``python -u script.py``;
* numarun: ``python -u -c "from numarun.worker.bootstrap import main; main()" -- script.py``
  with the stack dump armed as every launched worker has it: ``NUMARUN_STACKS_FILE`` set and
  the helper's files there (``.fr``, ``.sig``, the ``.req`` FIFO), so the helper thread starts
  (:mod:`numarun.worker.dumphandler`);
* numarun without the helper: the same, without the helper's files (the handler alone, as
  before the helper existed);
* with ``--before SRC``: the same bootstrap from another source tree (``SRC``, a checkout's
  ``src/``: the bootstrap as it was there), with only ``NUMARUN_STACKS_FILE`` set;
* for reference, ``python -u -m numarun.worker.bootstrap -- script.py`` (``-m`` adds
  :mod:`runpy` and the package's ``__main__`` lookup).

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


def _env(dump: Path, source: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    # The numarun this script imported, also under -S (no site: no .pth, no editable install).
    source = source or str(Path(numarun.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
    env["NUMARUN_STACKS_FILE"] = str(dump)
    return env


def _run(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return time.perf_counter() - start


def _fresh(dump: Path, helper: bool) -> None:
    """The rank's files as the launcher makes them before each start (the helper's, or none)."""
    for suffix in ("", ".fr", ".sig", ".req"):
        Path(f"{dump}{suffix}").unlink(missing_ok=True)
    dump.write_bytes(b"")
    if helper:
        Path(f"{dump}.fr").write_bytes(b"")
        Path(f"{dump}.sig").write_bytes(b"")
        os.mkfifo(f"{dump}.req", 0o600)


def measure(folder: Path, flags: list[str], runs: int, before: str | None) -> dict[str, float]:
    script = folder / "script.py"
    script.write_text("pass\n")
    dump = folder / "dump"
    env = _env(dump)
    python = [sys.executable, *flags, "-u"]
    bootstrap = [*python, "-c", SCRIPT_BOOTSTRAP, "--", str(script)]
    contenders = {
        "anchor": ([*python, str(script)], env, False),
        "numarun": (bootstrap, env, True),
        "without helper": (bootstrap, env, False),
        "-m (before)": ([*python, "-m", "numarun.worker.bootstrap", "--", str(script)], env,
                        True),
    }  # fmt: skip
    if before is not None:
        contenders["--before"] = (bootstrap, _env(dump, before), False)
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(3):  # warm caches, fill the bytecode cache
        for command, environment, helper in contenders.values():
            _fresh(dump, helper)
            _run(command, environment)
    for _ in range(runs):
        for name, (command, environment, helper) in contenders.items():
            _fresh(dump, helper)
            samples[name].append(_run(command, environment))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="interleaved rounds")
    parser.add_argument("--before", help="another source tree's src/ (its bootstrap, side by side)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"## worker bootstrap ({len(os.sched_getaffinity(0))} CPUs, Python "
          f"{sys.version.split()[0]}, {args.runs} interleaved rounds, medians, "
          f"load {load:.1f})\n")  # fmt: skip
    print("| interpreter | `python -u script.py` | numarun's bootstrap | cost | ratio "
          "| without the helper | --before | `-m numarun.worker.bootstrap` | target |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench_bootstrap_") as tmp:
        for label, flags in (("site as installed", []), ("-S (no site)", ["-S"])):
            m = measure(Path(tmp), flags, args.runs, args.before)
            anchor, ours = m["anchor"], m["numarun"]

            def shown(name: str, m: dict[str, float] = m, anchor: float = anchor) -> str:
                if name not in m:
                    return "-"
                return f"{m[name] * 1e3:.1f} ms (+{(m[name] - anchor) * 1e3:.1f} ms)"

            print(f"| {label} | {anchor * 1e3:.1f} ms | {ours * 1e3:.1f} ms | "
                  f"+{(ours - anchor) * 1e3:.1f} ms | {ours / anchor:.2f}x | "
                  f"{shown('without helper')} | {shown('--before')} | {shown('-m (before)')} | "
                  "<= +5 ms |")  # fmt: skip
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
