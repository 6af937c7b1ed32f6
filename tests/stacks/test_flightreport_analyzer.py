"""numarun.stacks.flightreport's kept dumps, read by torch's own analyzer with the command the
summary shows: recorded gloo dumps (``tests/data/flight/skip``, 4 ranks) saved through
:class:`FlightReport`, with every rank's dump and with one rank's missing (a rank that died: the
command must then carry ``--allow-incomplete-ranks``, without which the analyzer stops on an
AssertionError). Runs the analyzer of the torch the tests run with."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.stacks.flightreport import ANALYZER, FlightReport
from numarun.stacks.rankhelper import FlightAnswer

DATA = Path(__file__).resolve().parents[1] / "data" / "flight" / "skip"


def answers(missing: int | None) -> list[FlightAnswer]:
    found = []
    for rank in range(4):
        if rank == missing:
            found.append(FlightAnswer(rank, rank, "unanswered", reason="its process is gone"))
        else:
            data = (DATA / f"comm_lib_trace_rank_{rank}").read_bytes()
            found.append(FlightAnswer(rank, rank, "ok", data))
    return found


def shown_command(report: FlightReport) -> list[str]:
    (line,) = report.where_lines()
    command = line.split("(read with: ", 1)[1].removesuffix(")")
    assert command.startswith(ANALYZER + " ")
    return [sys.executable, *shlex.split(command)[1:]]


@pytest.mark.parametrize("missing", [None, 2])
def test_the_command_shown_reads_the_kept_dumps(tmp_path: Path, missing: int | None) -> None:
    report = FlightReport(answers(missing), world=range(4))
    report.save(str(tmp_path / "flight_recorder"), why_not="")
    assert report.saved == str(tmp_path / "flight_recorder")
    command = shown_command(report)
    assert ("--allow-incomplete-ranks" in command) is (missing is not None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    if missing is None:
        assert "SIZE_OR_SYNTAX_MISMATCH" in done.stdout + done.stderr
    else:
        assert "missed FR dumps from ranks" in done.stdout + done.stderr
        without = [part for part in command if part != "--allow-incomplete-ranks"]
        refused = subprocess.run(without, capture_output=True, text=True, timeout=300)
        assert refused.returncode != 0 and "Missing dump files" in refused.stderr


def test_a_rank_of_the_world_that_never_answered_makes_it_incomplete(tmp_path: Path) -> None:
    report = FlightReport(answers(None)[:3], world=range(4))  # rank 3 not even asked
    assert report.incomplete
    assert not FlightReport(answers(None), world=range(4)).incomplete
