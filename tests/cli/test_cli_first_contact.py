"""A newcomer's first minutes with the ``numarun`` command: what it says when a job starts,
where the workers of several nodes meet, and what it says about the usual mistakes.

Every run begins with numarun's own line (run id, node k of n, workers and ranks, the meeting
point of a multi-node job, each rank's CPUs or "unbound", the log directory); ``-q`` keeps
numarun to errors and the failure summary. A master address that does not resolve and a busy
``--master-port`` on node 0 are one line and exit status 2 before anything starts. Near misses
(a misspelt option, ``numarun python train.py``, ``-m train.py``, ``--no-python train.py``) get
"did you mean" or the hint for that mistake.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from numarun.cli import main
from numarun.machine.cpulist import format_cpulist
from numarun.machine.topology import read_topology
from numarun.placement.workerenv import free_port

LIMIT = 60
# One write per line: workers run unbuffered (python -u), and print's pieces from two workers
# sharing a pipe would interleave.
HELLO = (
    "import os\n"
    "os.write(1, f\"hello from {os.environ['RANK']} {os.environ['WORLD_SIZE']}\\n\".encode())\n"
)
START = re.compile(r"numarun: run (?P<run>[\w-]+|'none' \([^)]*\)): (?P<rest>.*)")
shape_root = sysfs_fixtures.shape_root


def numarun(*argv: str, cwd: Path, merge: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *argv],
        cwd=cwd,
        capture_output=not merge,
        stdout=subprocess.PIPE if merge else None,
        stderr=subprocess.STDOUT if merge else None,
        text=True,
        timeout=LIMIT,
    )


@pytest.fixture
def hello(tmp_path: Path) -> str:
    (tmp_path / "train.py").write_text(HELLO)
    return "train.py"


@pytest.fixture
def marker_script(tmp_path: Path) -> tuple[str, Path]:
    """A worker that leaves a file behind: proof that something started."""
    marker = tmp_path / "started"
    (tmp_path / "mark.py").write_text(f"open({str(marker)!r}, 'a').close()\n")
    return "mark.py", marker


# --- item 3: the start line ---------------------------------------------------------------------


def test_the_first_line_of_a_run_is_numaruns_and_says_what_started(
    tmp_path: Path, hello: str
) -> None:
    done = numarun("--nproc-per-node", "2", hello, cwd=tmp_path, merge=True)
    assert done.returncode == 0, done.stdout
    first, *rest = done.stdout.splitlines()
    match = START.fullmatch(first)
    assert match, first  # before any worker's line, though they share the pipe
    assert re.fullmatch(r"[0-9a-f]{12}", match["run"])
    assert match["rest"] == (
        "node 0 of 1, 2 workers (ranks 0-1), CPUs: unbound, logs: console only"
    )
    assert sorted(rest) == ["hello from 0 2", "hello from 1 2"]


def test_the_start_line_gives_each_ranks_cpus_and_the_log_directory(
    tmp_path: Path, hello: str
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    first, second = allowed[0], allowed[-1]
    done = numarun(
        "--rank-cpus", str(first), "--rank-cpus", str(second), "--rdzv-id", "job7",
        "--log-dir", str(tmp_path / "logs"), "--redirects", "3", hello, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (
        f"numarun: run job7: node 0 of 1, 2 workers (ranks 0-1), CPUs (explicit): "
        f"rank 0: {first}; rank 1: {second}, logs in {tmp_path / 'logs' / 'job7'}"
    )
    bound = numarun("--numa-binding", "cpu", hello, cwd=tmp_path)
    assert f"CPUs (cpu): rank 0: {format_cpulist(allowed)}," in bound.stderr.splitlines()[0]


def test_quiet_keeps_numarun_to_errors_and_the_failure_summary(tmp_path: Path, hello: str) -> None:
    done = numarun("-q", "--nproc-per-node", "2", hello, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert sorted(done.stdout.splitlines()) == ["hello from 0 2", "hello from 1 2"]
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    failed = numarun("--quiet", "fail.py", cwd=tmp_path)
    assert failed.returncode == 3
    assert failed.stderr.startswith("=" * 72 + "\nnumarun: fail.py FAILED on ")
    assert "numarun: run " not in failed.stderr
    usage = numarun("-q", "--nproc-per-node", "x", hello, cwd=tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("numarun: error: ")


# --- item 4: where the workers of several nodes meet -------------------------------------------


def test_a_static_multi_node_job_says_where_its_workers_meet(tmp_path: Path, hello: str) -> None:
    port = str(free_port())
    argv = [sys.executable, "-m", "numarun", "--nnodes", "2", "--master-port", port, hello]
    nodes = [
        subprocess.Popen(
            [*argv[:3], "--node-rank", str(rank), *argv[3:]],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    ]
    try:
        outputs = [node.communicate(timeout=LIMIT) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
            node.wait()
    for rank, (stdout, stderr) in zip((1, 0), outputs, strict=True):
        start, note = stderr.splitlines()
        assert START.fullmatch(start)["rest"].startswith(  # type: ignore[index]
            f"node {rank} of 2, 1 worker (rank {rank}), meeting at 127.0.0.1:{port}, "
        ), start
        assert note.startswith(
            "numarun: the workers wait in init_process_group, silently, until those of all 2 "
            f"nodes reach 127.0.0.1:{port}; run this command on the other node with "
            f"--node-rank {1 - rank}"
        ), note
        assert "(127.0.0.1 is this host only: give --master-addr HOST)" in note
        assert stdout == f"hello from {rank} 2\n"


def test_under_a_torch_rendezvous_the_start_line_comes_from_the_round(
    tmp_path: Path, hello: str
) -> None:
    # --nnodes 1:2: the round (formed after last_call_timeout) decides the node and its ranks.
    done = numarun(
        "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "localhost:0", "--rdzv-conf", "last_call_timeout=1", hello,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    starts = [line for line in done.stderr.splitlines() if line.startswith("numarun: run ")]
    assert len(starts) == 1, done.stderr
    # No --rdzv-id: the job meets under torchrun's default id, and the line says so.
    assert starts[0].startswith(
        "numarun: run 'none' (torchrun's default --rdzv-id; name the job with --rdzv-id ID): "
    ), starts[0]
    rest = START.fullmatch(starts[0])["rest"]  # type: ignore[index]
    assert re.fullmatch(
        r"node 0 of 1, 2 workers \(ranks 0-1\), meeting at \S+:\d+, CPUs: unbound, "
        r"logs: console only",
        rest,
    ), rest
    assert sorted(done.stdout.splitlines()) == ["hello from 0 2", "hello from 1 2"]


def test_a_master_address_that_does_not_resolve_is_one_line_before_anything_starts(
    tmp_path: Path, marker_script: tuple[str, Path]
) -> None:
    script, marker = marker_script
    done = numarun(
        "--nnodes", "2", "--master-addr", "nosuchhost.invalid", script, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "numarun: error: --master-addr 'nosuchhost.invalid' does not resolve ("
    )
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert not marker.exists()


# --- item 5: a busy --master-port on node 0 -----------------------------------------------------


@pytest.mark.parametrize("where", ["127.0.0.1", "0.0.0.0"])
def test_a_busy_master_port_is_one_line_before_anything_starts(
    tmp_path: Path, marker_script: tuple[str, Path], where: str
) -> None:
    script, marker = marker_script
    with socket.socket() as holder:
        holder.bind((where, 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = numarun("--master-port", str(port), script, cwd=tmp_path)
        many = numarun("--nnodes", "2", "--master-port", str(port), script, cwd=tmp_path)
    for job in (done, many):
        assert job.returncode == 2
        assert job.stderr == (
            f"numarun: error: --master-port {port} is in use on this host, where rank 0's "
            "worker must host the job's store: stop what listens there or choose another "
            "--master-port\n"
        )
    assert not marker.exists()


def test_a_port_left_by_closed_connections_is_not_busy(tmp_path: Path, hello: str) -> None:
    # A connection closed by this side stays in TIME_WAIT on the port for a minute; a store
    # binds with SO_REUSEADDR, and so does the check.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: TIME_WAIT on the server's port
        client.close()
    done = numarun("--master-port", str(port), hello, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# --- item 6: near misses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--nprocs-per-node", "2", "train.py"],
            "unknown option --nprocs-per-node: did you mean --nproc-per-node?",
        ),
        (
            ["--nprocs_per_node=2", "train.py"],
            "unknown option --nprocs_per_node: did you mean --nproc_per_node?",
        ),
        (["--master-adress", "h", "train.py"], "unknown option --master-adress: did you mean "
                                               "--master-addr?"),
        (
            ["python", "train.py", "--lr", "3"],
            "training script 'python' not found: numarun runs Python itself; drop 'python' "
            "(numarun [options] train.py ...)",
        ),
        (
            ["python3", "-u", "-m", "pkg.train"],
            "training script 'python3' not found: numarun runs Python itself; drop 'python3' "
            "(numarun [options] -m pkg.train ...)",
        ),
        (
            ["-m", "train.py"],
            "-m takes a module name, not a file: numarun train.py runs the file, "
            "numarun -m train the module",
        ),
        (
            ["--no-python", "train.py"],
            "--no-python binary 'train.py' not found on PATH: a Python script runs without "
            "--no-python (numarun train.py)",
        ),
        (
            ["--no-python", "tool"],
            "--no-python binary 'tool' not found on PATH: a file in this directory is named "
            "with a path (--no-python ./tool)",
        ),
        (
            ["plan", "--numa-bindng", "cpu"],
            "unknown option --numa-bindng: did you mean --numa-binding?",
        ),
        (["topo", "--jsn"], "unknown option --jsn: did you mean --json?"),
    ],
)
def test_near_misses_get_the_hint_for_that_mistake(
    tmp_path: Path, hello: str, argv: list[str], expected: str
) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    done = numarun(*argv, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"numarun: error: {expected}\n"


def test_an_unknown_option_with_nothing_close_is_refused_as_before(tmp_path: Path) -> None:
    done = numarun("--frobnicate", "train.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "numarun: error: unrecognized arguments: --frobnicate (see 'numarun --help')\n"
    )


# --- items 7 and 8: numarun plan without flags, and why ------------------------------------------


def test_plan_without_flags_plans_for_this_machine_and_says_what_it_chose(
    tmp_path: Path,
) -> None:
    topo = read_topology("/")
    nodes = [n for n in topo.nodes if set(n.cpus) & set(topo.allowed_cpus)]
    done = numarun("plan", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    if topo.gpus:  # pragma: no cover - the test machines have none
        assert lines[0].startswith("numarun plan: planned with --nproc-per-node")
        return
    assert lines[0] == (
        f"numarun plan: planned with --nproc-per-node {len(nodes)} --numa-binding cpu for "
        "this machine (no visible GPUs, one rank per NUMA node with allowed CPUs)"
    )
    assert lines[1] == "numa-binding: cpu (bound)"
    rows = [line.split() for line in lines[3:] if line[:1].isdigit()]
    assert [row[0] for row in rows] == [str(rank) for rank in range(len(nodes))]
    if len(rows) == 1:
        assert rows[0][3] == format_cpulist(topo.allowed_cpus)
    alone = numarun("plan", "--numa-binding", "cpu", cwd=tmp_path)  # asked for --nproc-per-node
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith(
        f"numarun plan: planned with --nproc-per-node {len(nodes)} for this machine"
    )


@pytest.mark.parametrize(
    ("shape", "note"),
    [
        ("dgx_h100", "--nproc-per-node 8 --numa-binding exclusive for this machine "
                     "(8 visible GPUs, one rank per GPU)"),
        ("crowded_node", "--nproc-per-node 4 --numa-binding node for this machine (4 visible "
                         "GPUs, a node with more GPUs than cores, one rank per GPU)"),
        ("no_gpus", "--nproc-per-node 2 --numa-binding cpu for this machine (no visible GPUs, "
                    "one rank per NUMA node with allowed CPUs)"),
    ],
)  # fmt: skip
def test_plan_without_flags_on_saved_machines(
    shape_root: Callable[[str], Path], capsys: pytest.CaptureFixture[str], shape: str, note: str
) -> None:
    assert main(["plan", "--sysfs-root", str(shape_root(shape))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"numarun plan: planned with {note}"
    # Given flags, nothing is chosen and nothing is said (a GPU mode always had one rank
    # per GPU).
    h100 = str(shape_root("dgx_h100"))
    assert main(["plan", "--sysfs-root", h100, "--numa-binding", "node"]) == 0
    assert capsys.readouterr().out.startswith("numa-binding: node (bound)\n")


def test_plan_explain_says_why_each_rank_got_its_cpus(
    shape_root: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(shape_root("dgx_h100"))
    assert main(["plan", "--sysfs-root", root, "--numa-binding", "exclusive", "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    why = lines.index(next(line for line in lines if line.startswith("why (exclusive: ")))
    assert lines[why + 1] == (
        "  rank 0: GPU 0 (0000:18:00.0) on NUMA node 0; 14 cores (28 CPUs) on node 0: its share "
        "of node 0's 56 allowed cores, split among GPUs 0-3; shares no CPU, memory node 0 with "
        "ranks 1-3"
    )
    assert lines[why + 5].startswith("  rank 4: GPU 4 (0000:9a:00.0) on NUMA node 1; ")
    assert main(["plan", "--sysfs-root", root, "--numa-binding", "node", "--explain"]) == 0
    node = capsys.readouterr().out
    assert "rank 2: GPU 2 (0000:3a:00.0) on NUMA node 0; 56 cores (112 CPUs) on node 0: its " \
           "GPU's node; shares CPUs with ranks 0-1,3, memory node 0 with ranks 0-1,3" in node
    argv = ["plan", "--sysfs-root", root, "--numa-binding", "node", "--json", "--explain"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["version"] == 1
    assert document["rule"].startswith("node: each rank gets every allowed CPU of its GPU's")
    assert document["ranks"][5]["why"].startswith("GPU 5 (0000:ab:00.0) on NUMA node 1; ")


def test_cpu_mode_on_a_gpu_machine_warns_about_ranks_far_from_their_gpu(
    shape_root: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(shape_root("dgx_h100"))
    argv = ["plan", "--sysfs-root", root, "--numa-binding", "cpu", "--nproc-per-node", "16"]
    assert main([*argv, "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        "warning: --numa-binding cpu splits the cores without regard to GPUs: ranks 4-7 run on "
        "another NUMA node than the GPU of the same index (rank 4: GPU 4 on node 1, CPUs on "
        "node 0); for GPU jobs use --numa-binding node, socket, exclusive or core-complex"
    ) in lines
    (rank4,) = [line for line in lines if line.startswith("  rank 4: ")]
    assert rank4.startswith(
        "  rank 4: GPU 4 (0000:9a:00.0) on NUMA node 1; 7 cores (14 CPUs) on node 0: its GPU is "
        "on node 1, another node (cpu mode)"
    )
    assert main(["plan", "--sysfs-root", root, "--numa-binding", "cpu", "--nproc-per-node", "8"]) \
        == 0  # fmt: skip
    assert "warning:" not in capsys.readouterr().out  # 8 ranks: each on its GPU's node


# --- near misses: values, script names, options after the script, --h ---------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--numa-binding", "nodes"], "unknown --numa-binding 'nodes': did you mean 'node'? "
                                      "(one of node, socket, exclusive, core-complex, cpu, "
                                      "explicit)"),
        (["--numa-binding", "node", "--mem-binding", "binding"],
         "unknown --mem-binding 'binding': did you mean 'bind'?"),
        (["--start-method", "forkserve"], "unknown --start-method 'forkserve': did you mean "
                                          "'forkserver'?"),
        (["--numa-binding", "gpu"], "unknown --numa-binding 'gpu': use one of node, socket"),
    ],
)  # fmt: skip
def test_a_misspelt_value_gets_the_closest_choice(
    argv: list[str], line: str, tmp_path: Path, marker_script: tuple[str, Path]
) -> None:
    script, marker = marker_script
    done = numarun(*argv, script, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (error,) = done.stderr.splitlines()
    assert error.startswith(f"numarun: error: {line}"), error
    assert not marker.exists()


def test_plan_names_the_closest_mode_too(tmp_path: Path) -> None:
    root = sysfs_fixtures.write_sysfs(sysfs_fixtures.no_gpus(), tmp_path / "tree")
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "plan", "--sysfs-root", str(root), "--numa-binding",
         "sockets"], capture_output=True, text=True, timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown --numa-binding 'sockets': did you mean 'socket'?" in done.stderr


def test_a_script_that_does_not_exist_names_the_closest_file(
    tmp_path: Path, hello: str
) -> None:
    done = numarun("trian.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "numarun: error: training script 'trian.py' not found: did you mean 'train.py'?\n"
    )
    far = numarun(str(tmp_path / "tran.py"), cwd=tmp_path.parent)
    assert f"did you mean {str(tmp_path / 'train.py')!r}?" in far.stderr
    unrelated = numarun("evaluate.py", cwd=tmp_path)
    assert unrelated.stderr == "numarun: error: training script 'evaluate.py' not found\n"


def test_launcher_options_after_the_script_go_to_it_with_one_warning(
    tmp_path: Path,
) -> None:
    (tmp_path / "args.py").write_text("import sys\nprint(sys.argv[1:])\n")
    done = numarun(
        "args.py", "--nproc-per-node", "2", "--nnodes=1", "--nproc_per_node", "3", "--lr", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "numarun: warning: --nproc-per-node, --nnodes, --nproc_per_node after args.py go to "
        "the script, as with torchrun, not to numarun; put numarun's options before the script"
    ]
    # One worker (the launcher read none of them), which got them all, as under torchrun.
    assert done.stdout.splitlines() == [
        "['--nproc-per-node', '2', '--nnodes=1', '--nproc_per_node', '3', '--lr', '1']"
    ]
    plain = numarun("args.py", "--lr", "1", "--log-dir", "runs", cwd=tmp_path)
    assert "warning" not in plain.stderr


@pytest.mark.parametrize("prefix", ["--h", "--he", "--hel"])
def test_h_is_help_as_in_torchrun(prefix: str, tmp_path: Path) -> None:
    done = numarun(prefix, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: numarun ")
