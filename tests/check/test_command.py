"""numarun.check.command: ``numarun check``: real ranks prove their binding on this machine; fake
layouts plan the rest.

Every run here is the real command (``python -m numarun check``) with a short ``--seconds`` and
small buffers: the probes are started by numarun's supervisor, bound at birth, exactly as a
job's workers. The machine has one NUMA node and no GPU, so what needs more (far nodes, GPU
copies) is checked through fake sysfs trees (``--dry-run --sysfs-root``) and through the report
built from probe results as a multi-node GPU machine would give them (``test_verdict.py``; the
probe, its memory and GPU parts: ``test_probe.py``, ``test_memory.py``, ``test_gpu.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from check_runs import CPUS, QUICK, TWO_CPUS, assert_bound_as_planned, run_check, run_json
from numarun.check import command
from numarun.machine.topology import read_topology
from sysfs_fixtures import SHAPES, write_sysfs

# --- this machine: planned equals actual --------------------------------------------------------


MODES = {
    "no flags: what plan chooses": [],
    "unbound, 1 rank": ["--nproc-per-node", "1"],
    "unbound, 2 ranks": ["--nproc-per-node", "2"],
    "cpu, 1 rank": ["--numa-binding", "cpu"],
    "cpu, 2 ranks": ["--numa-binding", "cpu", "--nproc-per-node", "2"],
    "explicit, crossed": ["--rank-cpus", "1", "--rank-cpus", "0"],
    "cpu + mem local": ["--numa-binding", "cpu", "--nproc-per-node", "2", "--mem-binding", "local"],
    "cpu + mem preferred": ["--numa-binding", "cpu", "--mem-binding", "preferred"],
    "cpu + mem bind": ["--numa-binding", "cpu", "--nproc-per-node", "2", "--mem-binding", "bind"],
    "explicit + interleave": ["--rank-cpus", "0-1", "--mem-binding", "interleave"],
}


@TWO_CPUS
@pytest.mark.parametrize("args", MODES.values(), ids=MODES.keys())
def test_planned_equals_actual_in_every_mode_this_machine_allows(args: list[str]) -> None:
    code, document, stderr = run_json(*args)
    assert code == 0, stderr
    nprocs = document["settings"]["nproc_per_node"]
    assert_bound_as_planned(document, nprocs)
    if "--rank-cpus" in args:
        wanted = [args[i + 1] for i, arg in enumerate(args) if arg == "--rank-cpus"]
        got = [",".join(map(str, entry["actual"]["cpus"])) for entry in document["ranks"]]
        assert got == [w.replace("0-1", "0,1") for w in wanted]


def test_gpu_modes_need_gpus_here_and_say_so_in_one_line() -> None:
    done = run_check("--numa-binding", "node", *QUICK)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("numarun: error: ") and "GPU" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.slow
@TWO_CPUS
def test_under_taskset_rank_0_really_had_cpu_1() -> None:
    code, document, stderr = run_json(cpus=[1])
    assert code == 0, stderr
    assert document["ranks"][0]["actual"]["cpus"] == [1]
    assert document["ranks"][0]["planned"]["cpus"] == [1]
    code, document, stderr = run_json("--numa-binding", "cpu", cpus=[1])
    assert code == 0, stderr
    assert document["ranks"][0]["actual"]["cpus"] == [1] == document["ranks"][0]["planned"]["cpus"]


@TWO_CPUS
def test_under_taskset_a_cpu_outside_is_one_line_and_nothing_runs() -> None:
    done = run_check("--rank-cpus", "0", *QUICK, cpus=[1])
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("numarun: error: ") and "CPU 0" in last and "allowed" in last
    assert done.stdout == ""


@TWO_CPUS
def test_text_form_ends_with_the_verdict_counting_the_ranks() -> None:
    done = run_check("--numa-binding", "cpu", "--nproc-per-node", "2", *QUICK)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip("\n").splitlines()
    assert lines[-1].startswith("bound as planned: 2/2 ranks; memory local: 2/2; ")
    # One row per rank, planned and actual side by side.
    rows = [line.split() for line in lines if line[:2] in ("0 ", "1 ")]
    assert [row[:4] for row in rows] == [["0", "0", "0", "yes"], ["1", "1", "1", "yes"]]
    # What one node and no GPU cannot give is said, not left out.
    assert "remote not measured (one NUMA node with CPUs and memory)" in lines[-1]
    assert "H2D/D2H not measured (no GPU visible)" in lines[-1]


# --- broken on purpose, through real mechanisms -------------------------------------------------


def write_sitecustomize(directory: Path, body: str) -> dict[str, str]:
    """A ``sitecustomize`` module, which Python runs at start-up before any program (as an
    environment module, a conda activation or a site's Python does): env to put it in force."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(body)
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(directory) + (os.pathsep + path if path else "")}


@TWO_CPUS
def test_a_rank_whose_environment_resets_its_affinity_is_not_bound_and_exit_is_1(
    tmp_path: Path,
) -> None:
    env = write_sitecustomize(
        tmp_path,
        "import os\n"
        "if os.environ.get('LOCAL_RANK') == '1':\n"
        "    os.sched_setaffinity(0, range(os.cpu_count()))\n",
    )
    code, document, stderr = run_json("--numa-binding", "cpu", "--nproc-per-node", "2", env=env)
    assert code == 1, stderr
    assert document["exit_code"] == 1
    first, second = document["ranks"]
    assert first["bound_as_planned"] is True
    assert second["bound_as_planned"] is False and second["cpus_as_planned"] is False
    assert second["planned"]["cpus"] == [1] and second["actual"]["cpus"] == CPUS
    assert document["verdict"].startswith("bound as planned: 1/2 ranks")


@TWO_CPUS
def test_a_wrapper_interpreter_that_rebinds_is_caught(tmp_path: Path) -> None:
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset is not installed")
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {taskset} -c 0-1 {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    done = run_check(
        "--numa-binding", "cpu", "--nproc-per-node", "2", *QUICK, env={"PYTHON_EXEC": str(wrapper)}
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.rstrip().splitlines()[-1].startswith("bound as planned: 0/2 ranks")


def test_a_library_resetting_the_memory_policy_is_caught(tmp_path: Path) -> None:
    env = write_sitecustomize(
        tmp_path,
        "from numarun.placement.binding import MemPolicy, apply_in_child\n"
        "apply_in_child(None, MemPolicy('local', ()))\n",
    )
    code, document, stderr = run_json("--numa-binding", "cpu", "--mem-binding", "bind", env=env)
    assert code == 1, stderr
    entry = document["ranks"][0]
    assert entry["cpus_as_planned"] is True
    assert entry["policy_as_planned"] is False
    assert entry["planned"]["policy"] == {"mode": "bind", "nodes": [0]}
    assert entry["actual"]["policy"]["mode"] == "local"


def test_a_probe_that_dies_leaves_its_rank_unverified_and_exit_is_1(tmp_path: Path) -> None:
    env = write_sitecustomize(
        tmp_path, "import os\nif os.environ.get('LOCAL_RANK') == '0':\n    os._exit(3)\n"
    )
    code, document, _ = run_json(env=env)
    assert code == 1
    entry = document["ranks"][0]
    assert entry["actual"] is None and entry["bound_as_planned"] is False
    assert document["summary"]["launch_exit_code"] == 3
    assert any("left no result" in line for line in document["not_measured"])


# --- fake NUMA layouts -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shape_root(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``shape_root("dgx_h100")``: that fake machine's sysfs tree, written once per module."""
    base = tmp_path_factory.mktemp("shapes")
    roots: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in roots:
            roots[name] = write_sysfs(SHAPES[name](), base / name)
        return roots[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "allowed", "expected"),
    [
        ("dgx_h100", None, {0: 1, 1: 0}),
        ("dgx_a100", None, {0: 4, 1: 4, 2: 4, 3: 4, 4: 0, 5: 0, 6: 0, 7: 0}),
        ("dgx_a100", (0, 1, 2, 3), {0: 1, 1: 0, 2: 0, 3: 0}),
        # GPU memory (node 1) is no DRAM node: nothing to compare with.
        ("grace_hopper", None, {0: None}),
        ("grace_hopper_x2", None, {0: 1, 1: 0}),
        ("one_node_small", None, {0: None}),
    ],
)
def test_the_farthest_node_comes_from_the_distance_table(
    shape_root: Callable[[str], Path],
    shape: str,
    allowed: tuple[int, ...] | None,
    expected: dict[int, int | None],
) -> None:
    topology = read_topology(str(shape_root(shape)))
    assert command.far_nodes(topology, allowed) == expected


def dry_run(root: Path, *args: str) -> dict[str, Any]:
    done = run_check("--dry-run", "--sysfs-root", str(root), "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_dry_run_on_a_dgx_a100_plans_home_and_far_nodes(
    shape_root: Callable[[str], Path],
) -> None:
    document = dry_run(
        shape_root("dgx_a100"), "--nproc-per-node", "gpu", "--numa-binding", "node",
        "--mem-binding", "bind",
    )  # fmt: skip
    assert document["exit_code"] == 0 and document["dry_run"] is True
    homes = [entry["planned"]["home"] for entry in document["ranks"]]
    assert homes == [3, 3, 1, 1, 7, 7, 5, 5]
    assert {document["far_of"][str(home)] for home in homes[:4]} == {4}
    assert [entry["planned"]["policy"] for entry in document["ranks"][:2]] == [
        {"mode": "bind", "nodes": [3]}
    ] * 2
    assert document["ranks"][0]["planned"]["pci_address"] == "0000:07:00.0"
    assert "memory-far" in document["phases"]
    assert all(entry["actual"] is None for entry in document["ranks"])


def test_a_dry_run_on_socket_mode_prefers_many_nodes(shape_root: Callable[[str], Path]) -> None:
    document = dry_run(
        shape_root("dgx_a100"), "--nproc-per-node", "2", "--numa-binding", "socket",
        "--mem-binding", "preferred",
    )  # fmt: skip
    first = document["ranks"][0]["planned"]
    assert first["mems"] == [0, 1, 2, 3] and first["home"] == 3
    assert first["policy"] == {"mode": "preferred_many", "nodes": [0, 1, 2, 3]}


def test_a_dry_run_on_grace_hopper_has_nothing_far(shape_root: Callable[[str], Path]) -> None:
    document = dry_run(shape_root("grace_hopper"), "--numa-binding", "node")
    assert document["phases"][:1] == ["memory-local"]
    assert "memory-far" not in document["phases"]
    assert not any(phase.endswith("-far") for phase in document["phases"])


def test_a_dry_run_text_names_home_and_far_nodes(shape_root: Callable[[str], Path]) -> None:
    done = run_check(
        "--dry-run", "--sysfs-root", str(shape_root("dgx_h100")), "--nproc-per-node", "8",
        "--numa-binding", "exclusive",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = lines[2].split()
    assert header[-4:] == ["home", "node", "far", "node"]
    assert lines[3].split()[-2:] == ["0", "1"] and lines[10].split()[-2:] == ["1", "0"]
    assert lines[-1] == "dry run: 8 ranks planned, nothing started"


def test_sysfs_root_without_dry_run_is_refused_as_for_a_job(
    shape_root: Callable[[str], Path],
) -> None:
    done = run_check("--sysfs-root", str(shape_root("dgx_h100")), "--numa-binding", "node")
    assert done.returncode == 2
    assert "--dry-run" in done.stderr.strip().splitlines()[-1]


def test_bad_check_options_are_one_line() -> None:
    for args in (["--seconds", "0"], ["--seconds", "inf"], ["--seconds", "nan"],
                 ["--buffer-mib", "0"], ["--buffer-mib", "1.5"], ["--buffer-mib", "x"],
                 ["--nproc-per-node", "1", "--mem-binding", "bind"],
                 ["--numa-binding", "nodes"],
                 ["--frobnicate"]):  # fmt: skip
        done = run_check(*args)
        assert done.returncode == 2, args
        # The last line says it; no traceback (a start line may come first).
        assert done.stderr.splitlines()[-1].startswith("numarun: error: "), args
        assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("size", ["1e12", "1000000000000"])
def test_a_buffer_beyond_the_machines_memory_is_one_line_and_nothing_starts(size: str) -> None:
    # A unit slip (bytes for MiB) ran for over a minute and measured nothing.
    total = command._meminfo("MemTotal:")
    assert total is not None
    done = run_check("--buffer-mib", size, "--seconds", "0.2")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"numarun: error: --buffer-mib 1000000000000 is more than this machine's memory "
        f"({total >> 20} MiB in all): give at most {total >> 20}; a size that does not fit in "
        "the memory available now is lowered to fit\n"
    )


def test_a_buffer_beyond_a_planned_machines_memory_is_refused_in_a_dry_run(
    shape_root: Callable[[str], Path],
) -> None:
    root = shape_root("dgx_h100")
    total = sum(node.memory_bytes for node in read_topology(str(root)).nodes)
    assert total > 0
    fits = str(total >> 20)
    assert dry_run(root, "--buffer-mib", fits)["settings"]["buffer_mib"] == total >> 20
    assert dry_run(root, "--buffer-mib", "1e3")["settings"]["buffer_mib"] == 1000
    done = run_check("--dry-run", "--sysfs-root", str(root), "--buffer-mib", str((total >> 20) + 1))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"numarun: error: --buffer-mib {(total >> 20) + 1} is more than")
    assert len(done.stderr.splitlines()) == 1


def test_help_lists_check() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "numarun check" in done.stdout


# --- first contact: what it chooses, what it says while it measures, Ctrl-C ---------------------


def test_without_flags_the_check_chooses_what_plan_chooses(
    shape_root: Callable[[str], Path],
) -> None:
    for shape in ("dgx_h100", "no_gpus"):
        root = str(shape_root(shape))
        plan = subprocess.run(
            [sys.executable, "-m", "numarun", "plan", "--sysfs-root", root],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        note = plan.stdout.splitlines()[0]
        assert note.startswith("numarun plan: planned with "), plan.stdout
        done = run_check("--dry-run", "--sysfs-root", root, "--json")
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines()[0] == note.replace("numarun plan:", "numarun check:")
        settings = json.loads(done.stdout)["settings"]
        chosen = note.split("planned with ")[1].split(" for this machine")[0].split()
        assert ["--nproc-per-node", str(settings["nproc_per_node"]),
                "--numa-binding", settings["numa_binding"]] == chosen  # fmt: skip


def test_a_pet_variable_or_a_flag_turns_the_choice_off() -> None:
    code, document, stderr = run_json("--nproc-per-node", "1")
    assert code == 0 and document["settings"]["numa_binding"] is None, stderr
    assert "planned with" not in stderr
    code, document, stderr = run_json(env={"PET_NPROC_PER_NODE": "1"})
    assert code == 0 and document["settings"]["numa_binding"] is None, stderr


def test_each_phase_says_what_it_measures_and_how_long_is_left() -> None:
    from numarun.check.probe import progress_line

    phases = ["memory-local", "memory-far", "h2d-planned", "d2h-planned"]
    assert [progress_line(phases, i, 15) for i in range(4)] == [
        "numarun check: measuring memory bandwidth on each rank's own node (phase 1 of 4), "
        "about 60 s left",
        "numarun check: measuring memory bandwidth on the farthest node (phase 2 of 4), "
        "about 45 s left",
        "numarun check: measuring host-to-GPU copies from each rank's own node (phase 3 of 4), "
        "about 30 s left",
        "numarun check: measuring GPU-to-host copies to each rank's own node (phase 4 of 4), "
        "about 15 s left",
    ]
    done = run_check("--nproc-per-node", "2", *QUICK)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "measuring" in line]
    assert lines == [
        "numarun check: measuring memory bandwidth on each rank's own node (phase 1 of 1), "
        "about 0 s left"
    ]


def test_ctrl_c_during_a_check_is_130_without_a_traceback_per_rank(tmp_path: Path) -> None:
    import signal
    import time

    argv = [sys.executable, "-m", "numarun", "check", "--nproc-per-node", "2", "--seconds",
            "300", "--buffer-mib", "4"]  # fmt: skip
    check = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the whole foreground group
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where the check's directory goes
    )  # fmt: skip
    try:
        assert check.stderr is not None
        seen = []
        deadline = time.monotonic() + 120
        for line in check.stderr:  # wait for the measuring to begin, however slow
            seen.append(line)
            if "measuring" in line or time.monotonic() > deadline:
                break
        assert "measuring" in seen[-1], "".join(seen)
        # Rank 0 says so as it begins the phase; under load rank 1 may still be starting (an
        # interpreter's Ctrl-C then is a KeyboardInterrupt in its imports): the check is
        # measuring once both ranks reached the phase's barrier.
        marks = [f"numarun-check-*/barrier/memory-local.{rank}" for rank in (0, 1)]
        while not all(list(tmp_path.glob(mark)) for mark in marks):
            assert time.monotonic() < deadline and check.poll() is None, "".join(seen)
            time.sleep(0.05)
        os.killpg(check.pid, signal.SIGINT)
        stdout, rest = check.communicate(timeout=120)
    finally:
        if check.poll() is None:
            os.killpg(check.pid, signal.SIGKILL)
            check.communicate()
    stderr = "".join(seen) + rest
    assert check.returncode == 130, stderr
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr
    assert stderr.rstrip().splitlines()[-1] == (
        "numarun check: the check was stopped by SIGINT; no report"
    )
    assert stdout == ""
