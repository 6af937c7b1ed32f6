"""benchmarks/check_on_gpu_machine.py's flight-recorder check, without a GPU: its report read from
a summary, and its whole pipeline (the job, numarun's summary, the kept dumps, torch's analyzer)
run on gloo in place of NCCL, so what a lent GPU machine runs is known to work but for NCCL."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "check_on_gpu_machine.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("check_on_gpu_machine", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SUMMARY = """\
========================================================================
numarun: flight_cases.py --case skip --backend nccl HUNG on gpu (2 workers: 2 terminated)
------------------------------------------------------------------------
Hang: no rank made progress for 8.0 s (--hang-timeout 8): stacks unchanged.
Flight recorder (each rank's collectives, as torch recorded them):
  group 0 (default_pg): rank 0 waits in all_reduce #4 ([8] float32); rank 1 is one collective \
behind, waiting in all_reduce #3 ([8] float32): at #3 rank 0 called all_reduce [4] float32, rank \
1 called all_reduce [8] float32 (size mismatch)
  dumps: /tmp/l/x/attempt_0/flight_recorder/comm_lib_trace_rank_<rank> (read with: ...)
Likely culprit (flight recorder: behind, or calling something else, where the others wait):
  rank 1 (pid 42): in main (flight_cases.py:99)
"""


def test_the_report_names_what_was_found_and_what_was_not(gpu_check) -> None:
    section = gpu_check.flight_lines(SUMMARY)
    assert section[0].startswith("Flight recorder (") and len(section) == 3
    report = gpu_check.flight_report(124, SUMMARY, ["comm_lib_trace_rank_0"], "Culprit rank 1")
    assert report[0] == "- exit status 124 (124: numarun declared the hang)"
    assert report[1].startswith("- names 3/3 of: ")
    assert "- torch's analyzer: Culprit rank 1" in report
    missing = gpu_check.flight_report(1, "Traceback\nNCCL error", [], "")
    assert "- names 0/3 of: " in missing[1] and "- no flight-recorder lines" in missing[2]
    assert missing[-1].startswith("- numarun's last lines: Traceback | NCCL error")


def test_the_command_runs_the_nccl_case_of_the_test_program(gpu_check) -> None:
    command = gpu_check.flight_command(2, Path("/logs"))
    assert command[1:3] == ["-m", "numarun"] and "--hang-timeout" in command
    assert command[-4:] == ["--case", "skip", "--backend", "nccl"]
    assert Path(command[command.index("--log-dir") + 2]).is_file()  # the program exists


@pytest.mark.slow
def test_the_pipeline_on_gloo_names_the_rank_behind(
    gpu_check, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    original = gpu_check.flight_command

    def on_gloo(ranks: int, logs: Path, case: str = "skip") -> list[str]:
        # The same job on gloo (the default backend), whose two ranks would abort at the size
        # mismatch where NCCL's hang: four ranks, rank 1 skipping, as on the GPU machine.
        return [*original(4, logs, case)[:-2], "--skip-rank", "1"]

    monkeypatch.setattr(gpu_check, "flight_command", on_gloo)
    monkeypatch.setenv("NUMARUN_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = gpu_check.flight_section(240.0)
    text = "\n".join(report)
    assert "- exit status 124" in text, text
    assert "- names 3/3 of:" in text, text
    assert "comm_lib_trace_rank_0, comm_lib_trace_rank_1, comm_lib_trace_rank_2" in text
    # The analyzer's "Culprit rank" depends on which file it reads first; the rest does not.
    assert "SIZE_OR_SYNTAX_MISMATCH" in text and "missing ranks: {1}" in text


def test_the_script_still_parses_its_options(gpu_check, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["check_on_gpu_machine.py", "--help"])
    with pytest.raises(SystemExit) as done:
        gpu_check.main()
    assert done.value.code == 0
