"""A real training program (DDP over gloo, a DataLoader with worker processes, a shared-memory
tensor and a Queue as arguments) runs the same under ``numarun.spawn`` as under
``torch.multiprocessing.spawn``, with nothing changed but the import line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "ddp_spawn_program.py"


def start_program(who: str, method: str, out: Path) -> subprocess.Popen[str]:
    from numarun.placement.workerenv import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "NUMARUN_"))}
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), who, method, str(out), str(free_port())],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def result_of(proc: subprocess.Popen[str], out: Path) -> dict:
    try:
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_a_ddp_program_trains_the_same_with_numarun_swapped_in(tmp_path: Path) -> None:
    # torch.multiprocessing.spawn runs its workers under spawn whatever the program asked for
    # (a fork-context Queue then fails there), so torch's run is the spawn one; numarun runs
    # the program under spawn and under fork. The three runs go side by side (each waits on
    # its ranks and DataLoader workers much of the time).
    runs = {name: (tmp_path / f"{name}.json") for name in ("torch", "spawn", "fork")}
    procs = {
        name: start_program("torch" if name == "torch" else "numarun",
                            "spawn" if name == "torch" else name, out)
        for name, out in runs.items()
    }  # fmt: skip
    try:
        results = {name: result_of(proc, runs[name]) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    theirs = results["torch"]
    assert theirs["ranks"] == [0, 1]
    assert any(value != 0.0 for value in theirs["params"][0])
    for method in ("spawn", "fork"):
        ours = results[method]
        assert ours["ranks"] == [0, 1]
        # DDP kept the replicas identical, and both launchers trained the very same model: the
        # ranks wrote their parameters into the parent's shared tensor in place.
        assert ours["params"][0] == ours["params"][1], method
        assert ours["params"] == theirs["params"], method
        assert ours["sums"] == theirs["sums"], method


def test_the_spawn_pages_dist_env_example_runs_as_written(tmp_path: Path) -> None:
    """Issue 16.6: the distributed variables are opt-in; docs/spawn.md's example of the opt-in
    (gloo over env://) runs as written and prints what its comment says."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "spawn.md").read_text()
    blocks = [block.split("\n", 1)[1].split("```")[0] for block in readme.split("```python")[1:]]
    example = next(block for block in blocks if "dist_env=True" in block)
    script = tmp_path / "example.py"
    script.write_text(example)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "NUMARUN_"))}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = example.rsplit("# ", 1)[1].strip()
    assert done.stdout.strip() == expected == "[3.0, 3.0]"
