"""``numarun check`` on a GPU machine, in every mode it supports: docs/check.md's table in one call.

    python benchmarks/check_on_gpu_machine.py [--budget 240] [--out check_on_gpu.md]
                                              [--json-dir DIR] [--buffer-mib 256] [--nproc gpu]

For whoever is lent a GPU machine (one card or eight): runs ``numarun check --nproc-per-node gpu``
without ``--numa-binding`` (what a job gets by default), then with each mode the machine can
plan (``node``, ``node`` with ``--mem-binding bind``, ``socket``, ``exclusive``,
``core-complex``, ``cpu``; a mode it cannot plan is listed with numarun's one-line reason), all
ranks measuring at once. The measuring time is shared so that the whole run, GPU start-up
included, stays within ``--budget`` seconds (default 240: under 5 minutes with margin).

Records the card (``nvidia-smi --query-gpu=name,driver_version,pci.bus_id``), the CPU model and
NUMA layout (``lscpu``), the kernel, numarun's and torch's versions, and writes a markdown table
(``--out``, and on stdout) with, per run: ranks bound as planned, memory local, the copy
bandwidth of all ranks on their own node and on the farthest node (GB/s, sums over the ranks)
and its ratio, and pinned host-to-device / device-to-host bandwidth with the host buffer on
the GPU's node and on the farthest one, with their ratios. ``--json-dir`` keeps each run's JSON.

Then the flight recorder on NCCL (``--flight-seconds``, default 120, within the budget; 0: not
run; ``--flight-only``: only it): a two-rank NCCL job (``tests/programs/flight_cases.py --case
skip --backend nccl``: rank 1 skips one ``all_reduce``, then both call one of another size) run
with ``--hang-timeout`` and ``--log-dir``; the section says numarun's exit status (124 expected),
the flight-recorder lines of its summary, whether they name rank 1, the collective's sequence
number and the size mismatch, which dumps numarun kept and what torch's analyzer
(``python -m torch.distributed.flight_recorder.fr_trace``) says of them. With one GPU both ranks
share it, which NCCL may refuse ("Duplicate GPU"): the section then says so, quoting NCCL, and
runs the same job on one rank (a hang in its own code after its collectives) to check that
numarun takes and reads an NCCL recorder at all.

Runs this checkout's numarun (``src/`` first on the path, installed or not). Needs torch with
CUDA in the interpreter that runs it (the probes use it for the copies); without it the table
still shows the binding and memory figures and says what was missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# This checkout's numarun, installed or not (a bare machine with only the working tree).
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))

RUNS: list[tuple[str, list[str]]] = [
    ("none (no --numa-binding)", []),
    ("node", ["--numa-binding", "node"]),
    ("node + --mem-binding bind", ["--numa-binding", "node", "--mem-binding", "bind"]),
    ("socket", ["--numa-binding", "socket"]),
    ("exclusive", ["--numa-binding", "exclusive"]),
    ("core-complex", ["--numa-binding", "core-complex"]),
    ("cpu", ["--numa-binding", "cpu"]),
]
# Per run, besides the measuring: interpreter and CUDA start-up in every rank, buffers touched
# and pinned, the launcher's own start and teardown.
OVERHEAD_S = 12.0


NPROC = "gpu"


def check(args: list[str], *extra: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "numarun", "check", "--nproc-per-node", NPROC, *args, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def command_output(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        return f"({argv[0]} not found)"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr.strip()


def machine_lines() -> list[str]:
    """The card, the CPU and the software, as markdown list items."""
    cards = command_output(
        "nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"
    ).splitlines()
    count = "none found" if cards[0].startswith("(") else len(cards)
    lscpu = [" ".join(line.split()) for line in command_output("lscpu").splitlines()]
    wanted = ("Model name", "Socket(s)", "Core(s) per socket", "Thread(s) per core")
    cpu = [line for line in lscpu if line.split(":")[0] in wanted]
    numa = [line for line in lscpu if line.startswith("NUMA node")]
    try:
        import torch  # type: ignore[import-not-found]

        torch_text = f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    except ImportError:
        torch_text = "torch not installed"
    from numarun import __version__

    return [
        f"- GPUs ({count}): " + "; ".join(cards),
        "- CPU: " + "; ".join(cpu),
        "- NUMA: " + "; ".join(numa),
        f"- kernel {platform.release()}, Python {platform.python_version()}, "
        f"numarun {__version__}, {torch_text}",
    ]


FLIGHT_PROGRAM = Path(__file__).resolve().parents[1] / "tests" / "programs" / "flight_cases.py"
ANALYZER = ("-m", "torch.distributed.flight_recorder.fr_trace")
FLIGHT_EXPECTED = ("rank 1 is one collective behind", "(size mismatch)", "group 0 (default_pg)")


def flight_command(ranks: int, logs: Path, case: str = "skip") -> list[str]:
    """The NCCL job of the flight-recorder check, as numarun runs it."""
    return [sys.executable, "-m", "numarun", "--nproc-per-node", str(ranks), "--hang-timeout",
            "8", "--log-dir", str(logs), str(FLIGHT_PROGRAM), "--case", case, "--backend",
            "nccl"]  # fmt: skip


def flight_lines(stderr: str) -> list[str]:
    """The flight-recorder section of a numarun summary (its heading and indented lines)."""
    lines = stderr.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Flight recorder ("):
            found = [line]
            for more in lines[index + 1 :]:
                if not more.startswith("  "):
                    break
                found.append(more)
            return found
    return []


def flight_report(returncode: int, stderr: str, kept: list[str], analyzer: str) -> list[str]:
    """The markdown lines for one NCCL job: exit status, numarun's flight-recorder lines, what
    they name, the dumps kept and the analyzer's verdict."""
    section = flight_lines(stderr)
    named = [text for text in FLIGHT_EXPECTED if any(text in line for line in section)]
    out = [f"- exit status {returncode} (124: numarun declared the hang)",
           f"- names {len(named)}/{len(FLIGHT_EXPECTED)} of: " + "; ".join(FLIGHT_EXPECTED),
           "- numarun's flight-recorder lines:" if section else
           "- no flight-recorder lines in numarun's summary"]  # fmt: skip
    out += [f"      {line}" for line in section[:12]]
    out.append(f"- dumps kept: {', '.join(kept) if kept else 'none'}")
    verdict = [line.strip() for line in analyzer.splitlines()
               if "Culprit" in line or "missing ranks" in line or "Error" in line][:6]  # fmt: skip
    out.append("- torch's analyzer: " + ("; ".join(verdict) or analyzer.strip()[-300:] or "-"))
    if returncode != 124:
        out.append("- numarun's last lines: " + " | ".join(stderr.strip().splitlines()[-8:]))
    return out


def run_flight(ranks: int, seconds: float, case: str = "skip") -> tuple[list[str], str]:
    """Run the NCCL job; (its report lines, its stderr)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="flight_") as tmp:
        logs = Path(tmp) / "logs"
        try:
            done = subprocess.run(flight_command(ranks, logs, case), capture_output=True,
                                  text=True, timeout=seconds)  # fmt: skip
        except subprocess.TimeoutExpired:
            return [f"- did not end within {seconds:.0f} s"], ""
        found = sorted(logs.glob("*/attempt_0/flight_recorder"))
        kept = sorted(path.name for path in found[0].iterdir()) if found else []
        analyzer = ""
        if found:
            checked = subprocess.run([sys.executable, *ANALYZER, str(found[0]),
                                      "--allow-incomplete-ranks"],
                                     capture_output=True, text=True, timeout=120)  # fmt: skip
            analyzer = checked.stdout + checked.stderr
        return flight_report(done.returncode, done.stderr, kept, analyzer), done.stderr


def flight_section(seconds: float) -> list[str]:
    """The flight-recorder check: two ranks on NCCL (one rank when NCCL refuses two ranks on one
    GPU), as markdown."""
    started = time.monotonic()
    title = f"## flight recorder, NCCL (`{' '.join(flight_command(2, Path('LOGS'))[2:])}`)"
    lines, stderr = run_flight(2, seconds)
    out = [title, "", *lines]
    if "Duplicate GPU" in stderr or "duplicate GPU" in stderr.lower():
        quote = next(line for line in stderr.splitlines() if "uplicate GPU" in line)
        left = seconds - (time.monotonic() - started)
        out += ["", f"NCCL refused two ranks on one GPU: `{quote.strip()[:200]}`; one rank "
                "instead (a hang in its own code after its collectives):", ""]  # fmt: skip
        if left > 20:
            out += run_flight(1, left, case="idle")[0]
    return out


def gbs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def row(label: str, document: dict[str, Any]) -> str:
    summary = document["summary"]
    n = summary["ranks"]
    cells = [
        label,
        f"{summary['bound_as_planned']}/{n}",
        f"{summary['memory_local']}/{n}",
        gbs(summary["memory_gbs"]["local"]),
        gbs(summary["memory_gbs"]["far"]),
        ratio(summary["local_remote_ratio"]),
    ]
    for kind in ("h2d", "d2h"):
        figures = summary[f"{kind}_gbs"]
        cells += [
            gbs(figures["planned"]),
            gbs(figures["far"]),
            ratio(summary[f"{kind}_planned_far_ratio"]),
        ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| binding | bound as planned | memory local | memory GB/s own node | farthest node | "
    "own/far | H2D GB/s GPU's node | farthest node | ratio | D2H GB/s GPU's node | "
    "farthest node | ratio |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=240.0, help="seconds for everything")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here too")
    parser.add_argument("--json-dir", type=Path, default=None, help="keep each run's JSON here")
    parser.add_argument("--buffer-mib", type=int, default=256, help="copy buffer per rank")
    parser.add_argument(
        "--nproc", default="gpu", help="ranks (default gpu: one per GPU; a number to try it)"
    )
    parser.add_argument("--flight-seconds", type=float, default=120.0,
                        help="seconds for the NCCL flight-recorder check (0: not run)")
    parser.add_argument("--flight-only", action="store_true",
                        help="only the NCCL flight-recorder check")  # fmt: skip
    args = parser.parse_args()
    global NPROC
    NPROC = args.nproc
    started = time.monotonic()
    if args.flight_only:
        text = "\n".join(flight_section(args.flight_seconds or 120.0))
        print(text)
        if args.out is not None:
            args.out.write_text(text + "\n")
        return 0
    args.budget -= args.flight_seconds  # kept for the flight recorder, at the end

    # Which modes this machine can plan: dry runs, instant.
    runnable: list[tuple[str, list[str]]] = []
    refused: list[str] = []
    for label, flags in RUNS:
        done = check(flags, "--dry-run", timeout=60)
        if done.returncode == 0:
            runnable.append((label, flags))
        else:
            reason = (done.stderr.strip().splitlines() or ["?"])[-1]
            refused.append(f"- {label}: not run here: {reason}")
    seconds = max(2.0, (args.budget - len(runnable) * OVERHEAD_S) / max(1, len(runnable)))

    rows: list[str] = []
    notes: list[str] = []
    for label, flags in runnable:
        left = args.budget - (time.monotonic() - started)
        if left < OVERHEAD_S + 2:
            notes.append(f"- {label}: skipped, out of time budget")
            continue
        measure = min(seconds, left - OVERHEAD_S)
        extra = ("--json", "--seconds", f"{measure:.1f}", "--buffer-mib", str(args.buffer_mib))
        try:
            done = check(flags, *extra, timeout=measure + 120)
        except subprocess.TimeoutExpired:
            notes.append(f"- {label}: did not finish in {measure + 120:.0f} s")
            continue
        try:
            document = json.loads(done.stdout)
        except ValueError:
            reason = (done.stderr.strip().splitlines() or ["?"])[-1]
            notes.append(f"- {label}: exit {done.returncode}: {reason}")
            continue
        if args.json_dir is not None:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            name = label.split(" ")[0] + ("-bind" if "bind" in label else "") + ".json"
            (args.json_dir / name).write_text(done.stdout)
        rows.append(row(label, document))
        notes.extend(f"- {label}: not measured: {line}" for line in document["not_measured"])
        if document["exit_code"] != 0:
            notes.append(f"- {label}: {document['verdict']}")

    elapsed = time.monotonic() - started
    text = "\n".join(
        [
            *machine_lines(),  # after the runs: importing torch here would slow the first one
            "",
            f"`python benchmarks/check_on_gpu_machine.py --budget {args.budget:g}"
            + ("" if NPROC == "gpu" else f" --nproc {NPROC}")
            + "` "
            f"({len(runnable)} runs, {seconds:.0f} s of measuring each, all ranks at once; "
            f"{elapsed:.0f} s in all):",
            "",
            HEADER,
            *rows,
            "",
            *refused,
            *notes,
            *(["", *flight_section(args.flight_seconds)] if args.flight_seconds > 0 else []),
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
