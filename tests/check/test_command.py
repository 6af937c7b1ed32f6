"""``numarun check``: real ranks prove their binding on this machine; fake layouts plan the rest.

Every run here is the real command (``python -m numarun check``) with a short ``--seconds`` and
small buffers: the probes are started by numarun's supervisor, bound at birth, exactly as a
job's workers. The machine has one NUMA node and no GPU, so what needs more (far nodes, GPU
copies) is checked through fake sysfs trees (``--dry-run --sysfs-root``) and through the report
built from probe results as a multi-node GPU machine would give them.
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

from numarun.check import command, memory, report
from numarun.machine.topology import read_topology
from sysfs_fixtures import SHAPES, write_sysfs

CPUS = sorted(os.sched_getaffinity(0))
TWO_CPUS = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
QUICK = ["--seconds", "0.2", "--buffer-mib", "4"]


def run_check(
    *args: str,
    cpus: list[int] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``numarun check ARGS`` in a subprocess (under ``taskset -c CPUS`` when given)."""
    argv = [sys.executable, "-m", "numarun", "check", *args]
    if cpus is not None:
        taskset = shutil.which("taskset")
        if taskset is None:
            pytest.skip("taskset is not installed")
        argv = [taskset, "-c", ",".join(map(str, cpus)), *argv]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_json(*args: str, **kwargs: Any) -> tuple[int, dict[str, Any], str]:
    done = run_check(*args, "--json", *QUICK, **kwargs)
    try:
        document = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"not JSON: {done.stdout!r}\nstderr: {done.stderr}") from None
    return done.returncode, document, done.stderr


def assert_bound_as_planned(document: dict[str, Any], nprocs: int) -> None:
    assert document["exit_code"] == 0
    assert len(document["ranks"]) == nprocs
    for entry in document["ranks"]:
        assert entry["actual"]["cpus"] == entry["planned"]["cpus"], entry
        assert entry["bound_as_planned"] is True
        assert entry["actual"]["policy"] == entry["planned"]["policy"]
        # Its memory node(s): where the plan puts it and where its pages really are.
        assert entry["planned"]["local_nodes"]
        assert entry["actual"]["pages"]["nodes"]
        nodes = entry["actual"]["memory_nodes"]
        assert nodes and set(nodes) <= set(entry["planned"]["local_nodes"])
        assert entry["memory_local"] is True
        assert entry["memory_gbs"]["local"]["gbs"] > 0
    assert document["verdict"].startswith(f"bound as planned: {nprocs}/{nprocs} ranks")


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


# --- the probe itself ---------------------------------------------------------------------------


def test_the_probe_reads_its_cpus_in_its_first_statement() -> None:
    import ast

    source = Path(command.__file__).with_name("probe.py").read_text()
    body = ast.parse(source).body
    assert isinstance(body[0], ast.Expr)  # the docstring
    assert ast.unparse(body[1]) == "import os"
    assert ast.unparse(body[2]) == "CPUS_AT_START = sorted(os.sched_getaffinity(0))"


def probe_in_subprocess(
    tmp_path: Path, instructions: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    (tmp_path / "check.json").write_text(json.dumps(instructions))
    code = (
        "import sys\n"
        "from numarun.check import probe\n"
        "status = probe.main()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n"
        "sys.exit(status)\n"
    )
    env = {**os.environ, "NUMARUN_CHECK_DIR": str(tmp_path), "LOCAL_RANK": "0", "RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    return result, json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


def instructions_for(phases: list[str], gpu: int | None) -> dict[str, Any]:
    return {
        "nprocs": 1,
        "phases": phases,
        "phase_seconds": 0.05,
        "buffer_bytes": 1 << 20,
        "barrier_timeout": 10,
        "far_of": {"0": None},
        "ranks": [{"home": None, "gpu": gpu}],
    }


def test_the_probe_never_imports_torch_without_a_gpu_part(tmp_path: Path) -> None:
    result, heavy = probe_in_subprocess(tmp_path, instructions_for(["memory-local"], None))
    assert heavy == []
    assert result["cpus"] == CPUS and result["home"] == 0
    assert result["memory_gbs"]["local"]["gbs"] > 0


def test_the_gpu_part_says_why_it_cannot_run(tmp_path: Path) -> None:
    result, _ = probe_in_subprocess(
        tmp_path, instructions_for(["memory-local", "h2d-planned", "d2h-planned"], 0)
    )
    reasons = [line for line in result["not_measured"] if line.startswith("H2D/D2H")]
    assert len(reasons) == 1
    if shutil.which("nvidia-smi") is None:
        assert "CUDA" in reasons[0] or "torch" in reasons[0]
    assert result["gpu"]["index"] == 0 and result["h2d_gbs"] == {}


def test_the_probe_refuses_to_run_outside_a_check() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMARUN_CHECK_DIR", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-m", "numarun.check.probe"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "numarun check" in done.stderr


# --- memory: where pages are, placing them, copying ----------------------------------------------


def test_pages_are_found_on_their_node_and_untouched_ones_nowhere() -> None:
    with memory.Buffer(1 << 20) as buffer:
        counts, method = buffer.page_nodes()
        assert method == "move_pages"
        assert all(node < 0 for node in counts)  # nothing allocated before a touch
        buffer.touch()
        counts, _ = buffer.page_nodes()
        assert sum(counts.values()) == (1 << 20) // memory.PAGE_SIZE
        assert memory.majority_node(counts) in memory.mems_allowed()


def test_a_buffer_bound_to_a_node_that_does_not_exist_is_refused() -> None:
    with pytest.raises(OSError) as caught:
        memory.Buffer(1 << 20, node=63)
    assert caught.value.errno == 22


def test_numa_maps_lines_are_read_for_one_mapping() -> None:
    text = [
        "7f0000000000 default anon=3 dirty=3 N0=1 N1=2 kernelpagesize_kB=4\n",
        "7f0000200000 bind:1 anon=512 dirty=512 N1=512 kernelpagesize_kB=4\n",
        "7f0000400000 default\n",
    ]
    assert memory.numa_maps_nodes(text, 0x7F0000000000) == {0: 1, 1: 2}
    assert memory.numa_maps_nodes(text, 0x7F0000200000) == {1: 512}
    assert memory.numa_maps_nodes(text, 0x7F0000400000) == {}
    assert memory.numa_maps_nodes(text, 0x7F0000600000) is None


def test_copy_bandwidth_counts_reads_and_writes() -> None:
    with memory.Buffer(1 << 20, 0) as src, memory.Buffer(1 << 20, 0) as dst:
        src.touch()
        dst.touch()
        assert memory.copy_bandwidth(src, dst, 0.02, threads=2) > 0


def test_majority_node_ignores_pages_without_a_node() -> None:
    assert memory.majority_node({-2: 100, 1: 3, 0: 3}) == 0
    assert memory.majority_node({-14: 5}) is None
    assert memory.mems_allowed(["Name:\tx\n", "Mems_allowed_list:\t0-1,3\n"]) == (0, 1, 3)


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


# --- the report: verdicts and the JSON schema ----------------------------------------------------


def planned_rank(local_rank: int, home: int, gpu: int | None = None) -> dict[str, Any]:
    return {
        "local_rank": local_rank,
        "rank": local_rank,
        "cpus": [local_rank],
        "mems": [home],
        "policy": {"mode": "bind", "nodes": [home]},
        "home": home,
        "local_nodes": [home],
        "gpu": gpu,
        "pci_address": None if gpu is None else f"0000:{gpu:02x}:00.0",
    }


def probe_result(
    local_rank: int, home: int, far: int, *, pages_on: int | None = None, gpu: bool = False
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "local_rank": local_rank,
        "rank": local_rank,
        "pid": 100 + local_rank,
        "cpus": [local_rank],
        "cpus_at_end": [local_rank],
        "mem_policy": {"mode": "bind", "nodes": [home]},
        "mems_allowed": [0, 1],
        "pages": {
            "method": "move_pages",
            "nodes": {str(home if pages_on is None else pages_on): 9},
        },
        "home": home,
        "gpu": None,
        "memory_gbs": {"local": {"node": home, "gbs": 38.0}, "far": {"node": far, "gbs": 20.0}},
        "h2d_gbs": {},
        "d2h_gbs": {},
        "threads": 4,
        "not_measured": [],
        "late_phases": [],
    }
    if gpu:
        result["gpu"] = {"index": local_rank, "pci_address": f"0000:{local_rank:02x}:00.0",
                         "nvml_cpus": [0, 1, 2, 3]}  # fmt: skip
        result["h2d_gbs"] = {"planned": {"node": home, "gbs": 56.0},
                             "far": {"node": far, "gbs": 20.0}}  # fmt: skip
        result["d2h_gbs"] = {"planned": {"node": home, "gbs": 50.0}}
    return result


def two_node_document(results: list[dict[str, Any] | None]) -> dict[str, Any]:
    planned = [planned_rank(0, 0, 0), planned_rank(1, 1, 1)]
    phases = ["memory-local", "memory-far", "h2d-planned", "h2d-far", "d2h-planned", "d2h-far"]
    settings = {"nproc_per_node": 2, "numa_binding": "node", "mem_binding": "bind",
                "plan_bound": True, "seconds": 6.0, "buffer_mib": 256, "buffer_lowered": False,
                "dry_run": False}  # fmt: skip
    machine = {"numa_nodes": [0, 1], "cpu_memory_nodes": [0, 1], "gpus": 2, "torch": True}
    return report.build_document(
        settings, machine, planned, results, phases, {0: 1, 1: 0}, launch_code=0
    )


def test_a_two_node_gpu_machine_gives_the_issue_s_verdict() -> None:
    document = two_node_document([probe_result(0, 0, 1, gpu=True), probe_result(1, 1, 0, gpu=True)])
    assert document["exit_code"] == 0
    assert document["verdict"] == (
        "bound as planned: 2/2 ranks; memory local: 2/2; "
        "local/remote bandwidth 1.9x (76.0/40.0 GB/s); H2D planned/far 2.8x; "
        "D2H 100.0 GB/s, far not measured"
    )
    assert document["summary"]["h2d_gbs"] == {"planned": 112.0, "far": 40.0}
    assert [entry["gpu_as_planned"] for entry in document["ranks"]] == [True, True]
    assert [entry["gpu_local_by_nvml"] for entry in document["ranks"]] == [True, True]
    text = report.format_text(document)
    assert text.splitlines()[-1] == document["verdict"]
    assert "56.0/20.0" in text  # H2D planned/far of rank 0, side by side


def test_pages_on_another_node_are_not_local_and_do_not_decide_the_exit() -> None:
    document = two_node_document([probe_result(0, 0, 1, pages_on=1), probe_result(1, 1, 0)])
    assert [entry["memory_local"] for entry in document["ranks"]] == [False, True]
    assert document["exit_code"] == 0
    assert document["verdict"].startswith("bound as planned: 2/2 ranks; memory local: 1/2;")


def test_a_gpu_other_than_the_planned_one_is_reported() -> None:
    seen = probe_result(0, 0, 1, gpu=True)
    seen["gpu"]["pci_address"] = "0000:9a:00.0"
    seen["gpu"]["nvml_cpus"] = [56, 57]
    document = two_node_document([seen, None])
    first, second = document["ranks"]
    assert first["gpu_as_planned"] is False and first["gpu_local_by_nvml"] is False
    assert second["bound_as_planned"] is False and document["exit_code"] == 1
    assert "(sees another)" in report.format_text(document)


RANK_KEYS = {
    "local_rank", "rank", "pid", "planned", "actual", "cpus_as_planned", "policy_as_planned",
    "bound_as_planned", "memory_local", "gpu_as_planned", "gpu_local_by_nvml", "memory_gbs",
    "h2d_gbs", "d2h_gbs", "not_measured", "late_phases",
}  # fmt: skip
DOCUMENT_KEYS = {
    "schema", "exit_code", "dry_run", "settings", "machine", "phases", "far_of", "ranks",
    "summary", "not_measured", "verdict",
}  # fmt: skip
SUMMARY_KEYS = {
    "ranks", "bound_as_planned", "memory_local", "memory_local_unknown", "memory_gbs",
    "local_remote_ratio", "h2d_gbs", "h2d_planned_far_ratio", "d2h_gbs",
    "d2h_planned_far_ratio", "launch_exit_code",
}  # fmt: skip
PLANNED_KEYS = {
    "local_rank", "rank", "cpus", "mems", "policy", "home", "local_nodes", "gpu", "pci_address",
}  # fmt: skip
ACTUAL_KEYS = {
    "cpus", "cpus_at_end", "policy", "mems_allowed", "pages", "memory_nodes", "home", "gpu",
    "threads",
}  # fmt: skip


def check_schema(document: dict[str, Any]) -> None:
    assert document["schema"] == "numarun-check/1"
    assert set(document) == DOCUMENT_KEYS
    assert set(document["summary"]) == SUMMARY_KEYS
    for entry in document["ranks"]:
        assert set(entry) == RANK_KEYS
        assert set(entry["planned"]) == PLANNED_KEYS
        if entry["actual"] is not None:
            assert set(entry["actual"]) == ACTUAL_KEYS
        for key in ("memory_gbs", "h2d_gbs", "d2h_gbs"):
            for figure in entry[key].values():
                assert set(figure) == {"node", "gbs"} and figure["gbs"] > 0
    json.dumps(document)  # plain JSON types only


def test_the_json_schema_is_versioned_and_stable() -> None:
    check_schema(two_node_document([probe_result(0, 0, 1, gpu=True), None]))


@TWO_CPUS
def test_the_json_of_a_real_run_follows_the_schema() -> None:
    code, document, stderr = run_json("--numa-binding", "cpu", "--nproc-per-node", "2")
    assert code == 0, stderr
    check_schema(document)
    assert document["ranks"][1]["pid"] != document["ranks"][0]["pid"]


def test_bad_check_options_are_one_line() -> None:
    for args in (["--seconds", "0"], ["--seconds", "inf"], ["--seconds", "nan"],
                 ["--buffer-mib", "0"], ["--nproc-per-node", "1", "--mem-binding", "bind"],
                 ["--numa-binding", "nodes"],
                 ["--frobnicate"]):  # fmt: skip
        done = run_check(*args)
        assert done.returncode == 2, args
        # The last line says it; no traceback (a start line may come first).
        assert done.stderr.splitlines()[-1].startswith("numarun: error: "), args
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_help_lists_check() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "numarun check" in done.stdout


# --- NVML's view of the rank's GPU ---------------------------------------------------------------


def fake_nvml(devices: list[dict[str, Any]], *, memory_affinity: bool = True) -> Any:
    """A pynvml stand-in: each device a dict of busId, name, uuid, cpu_words, node_words."""
    import types

    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]
    module.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["busId"])  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: h["name"]  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: h["uuid"]  # type: ignore[attr-defined]

    def cpu_affinity(handle: dict[str, Any], words: int) -> list[int]:
        return (handle["cpu_words"] + [0] * words)[:words]

    def memory_affinity_of(handle: dict[str, Any], words: int, scope: int) -> list[int]:
        if not memory_affinity:
            raise RuntimeError("Function Not Found")
        assert scope == 0  # NVML_AFFINITY_SCOPE_NODE
        return (handle["node_words"] + [0] * words)[:words]

    module.nvmlDeviceGetCpuAffinity = cpu_affinity  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryAffinity = memory_affinity_of  # type: ignore[attr-defined]
    return module


H100S = [
    {"busId": "00000000:18:00.0", "name": "NVIDIA H100", "uuid": "GPU-aaaa-1111",
     "cpu_words": [0xFF, 0x1], "node_words": [0x1]},
    {"busId": b"00000000:9A:00.0", "name": b"NVIDIA H100", "uuid": b"GPU-bbbb-2222",
     "cpu_words": [0xFF00], "node_words": [0x2]},
]  # fmt: skip


def test_nvml_names_the_gpu_and_its_ideal_cpus_and_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.check.gpu import seen_gpu
    from numarun.machine import nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(H100S))
    first = nvml.visible_device("0", cpu_count=128)
    assert first == {
        "pci_address": "0000:18:00.0", "name": "NVIDIA H100", "uuid": "GPU-aaaa-1111",
        "cpus": (*range(8), 64), "mems": (0,),
    }  # fmt: skip
    by_uuid = nvml.visible_device("GPU-bbbb", cpu_count=64)
    assert by_uuid is not None and by_uuid["pci_address"] == "0000:9a:00.0"
    assert by_uuid["cpus"] == tuple(range(8, 16)) and by_uuid["mems"] == (1,)
    assert nvml.visible_device("GPU-", cpu_count=64) is None  # ambiguous prefix
    assert nvml.visible_device("7") is None
    # The rank's device is entry LOCAL_RANK of CUDA_VISIBLE_DEVICES.
    seen = seen_gpu(0, {"CUDA_VISIBLE_DEVICES": "1,0"})
    assert seen["visible_entry"] == "1" and seen["pci_address"] == "0000:9a:00.0"
    assert seen["source"] == "nvml" and seen["nvml_cpus"] == list(range(8, 16))
    assert seen_gpu(2, {"CUDA_VISIBLE_DEVICES": "1,0"})["source"] is None


def test_nvml_without_memory_affinity_still_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.machine import nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(H100S, memory_affinity=False))
    facts = nvml.visible_device("1", cpu_count=64)
    assert facts is not None and facts["mems"] is None and facts["uuid"] == "GPU-bbbb-2222"


def test_without_pynvml_the_gpu_is_only_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.check.gpu import seen_gpu

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    seen = seen_gpu(0, {})
    assert seen["visible_entry"] == "0" and seen["source"] is None and seen["pci_address"] is None


def test_a_failed_probe_job_fails_the_check_even_when_every_rank_was_bound() -> None:
    results = [probe_result(0, 0, 1), probe_result(1, 1, 0)]
    document = two_node_document(results)
    assert document["exit_code"] == 0
    planned = [entry["planned"] for entry in document["ranks"]]
    failed = report.build_document(
        document["settings"], document["machine"], planned, results, document["phases"],
        {0: 1, 1: 0}, launch_code=1,
    )  # fmt: skip
    assert failed["summary"]["bound_as_planned"] == 2 and failed["exit_code"] == 1
    assert failed["verdict"].endswith("; the probes' job failed (exit status 1)")


# --- the copy phases, with a stand-in for torch (no GPU here) -------------------------------------


class FakeTensor:
    def __init__(self, data: memoryview) -> None:
        self.data = data

    def copy_(self, other: FakeTensor, non_blocking: bool = False) -> None:
        self.data[:] = other.data


def fake_torch(registered: list[tuple[int, int]], unregistered: list[int]) -> Any:
    """What :class:`numarun.check.gpu.PinnedCopies` uses of torch, on the CPU: copies are
    memoryview copies, registrations are recorded."""
    import types

    def register(address: int, size: int, flags: int) -> int:
        registered.append((address, size))
        return 0

    def unregister(address: int) -> int:
        unregistered.append(address)
        return 0

    cudart = types.SimpleNamespace(cudaHostRegister=register, cudaHostUnregister=unregister)
    props = types.SimpleNamespace(
        name="Fake H100", uuid="1234-5678", pci_domain_id=0, pci_bus_id=0x18, pci_device_id=0
    )
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        set_device=lambda device: None,
        synchronize=lambda device=None: None,
        get_device_properties=lambda device: props,
        cudart=lambda: cudart,
    )
    module = types.ModuleType("torch")
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint8 = "uint8"  # type: ignore[attr-defined]
    module.device = lambda kind, index: (kind, index)  # type: ignore[attr-defined]
    module.empty = lambda size, dtype, device: FakeTensor(memoryview(bytearray(size)))  # type: ignore[attr-defined]
    module.frombuffer = lambda array, dtype: FakeTensor(memoryview(array).cast("B"))  # type: ignore[attr-defined]
    return module


def test_pinned_copies_place_register_copy_and_release(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.check.gpu import PinnedCopies

    registered: list[tuple[int, int]] = []
    unregistered: list[int] = []
    copies = PinnedCopies(fake_torch(registered, unregistered), 0, 1 << 20)
    host = copies.host_buffer(0)
    assert copies.host_buffer(0) is host  # one buffer per node
    assert registered == [(copies._hosts[0][0].address, 1 << 20)]
    assert copies._hosts[0][0].page_nodes()[0] == {0: 256}
    assert copies.rate(host, "h2d", 0.01) > 0
    assert bytes(copies.on_device.data[:4]) == b"\x01\x01\x01\x01"  # the touched host bytes
    assert copies.rate(host, "d2h", 0.01) > 0
    assert copies.describe() == {
        "name": "Fake H100", "uuid": "GPU-1234-5678", "pci_address": "0000:18:00.0",
    }  # fmt: skip
    copies.close()
    assert unregistered == [registered[0][0]]


def test_the_probe_runs_the_copy_phases_when_torch_has_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numarun.check import probe

    monkeypatch.setitem(sys.modules, "torch", fake_torch([], []))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    instructions = instructions_for(
        ["memory-local", "h2d-planned", "h2d-far", "d2h-planned", "d2h-far"], 0
    )
    run = probe.Probe(str(tmp_path), 0, instructions, {"LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"})
    run.read_binding()
    run.measure()
    result = run.result
    assert set(result["h2d_gbs"]) == {"planned"} and result["h2d_gbs"]["planned"]["node"] == 0
    assert set(result["d2h_gbs"]) == {"planned"}
    assert result["gpu"]["cuda"]["pci_address"] == "0000:18:00.0"
    far = [line for line in result["not_measured"] if "(far)" in line]
    assert far == [
        "H2D bandwidth (far): one NUMA node with CPUs and memory",
        "D2H bandwidth (far): one NUMA node with CPUs and memory",
    ]
    assert result["late_phases"] == []


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


def test_the_header_says_a_list_of_nodes_and_a_count_of_gpus_in_words() -> None:
    document = two_node_document([probe_result(0, 0, 1, gpu=True), probe_result(1, 1, 0, gpu=True)])
    head = report.format_text(document).splitlines()[0]
    assert head.endswith("; NUMA nodes with CPUs and memory: nodes 0-1; 2 GPUs"), head
    assert head.startswith("numarun check: 2 ranks, ")
    document["settings"]["nproc_per_node"] = 1
    document["machine"].update(cpu_memory_nodes=[0], gpus=0)
    head = report.format_text(document).splitlines()[0]
    assert head.startswith("numarun check: 1 rank, ")
    assert head.endswith("; NUMA nodes with CPUs and memory: node 0; no GPUs"), head


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


def test_ctrl_c_during_a_check_is_130_without_a_traceback_per_rank() -> None:
    import signal
    import time

    argv = [sys.executable, "-m", "numarun", "check", "--nproc-per-node", "2", "--seconds",
            "300", "--buffer-mib", "4"]  # fmt: skip
    check = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a terminal's Ctrl-C reaches the whole foreground group
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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
