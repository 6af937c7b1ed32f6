"""The whole job from any node: stacks, the hang verdict and failures across nodes through the
rendezvous store; the store off the supervisor's loop; launches without torch's private names
(the names read one by one: ``tests/rendezvous/test_torchcompat.py``).

Each "node" is one launcher on this machine with its own ``NUMARUN_RUNTIME_DIR`` (as two hosts
have); the nodes meet in a c10d rendezvous on 127.0.0.1. Workers:
``tests/programs/gloo_multinode.py``, ``gloo_stuck_rank.py``, ``rdzv_restart_modes.py``. Every test
ends what it started and checks that nothing of its job is left (each job has its own
``--rdzv-id``, carried by every worker).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from job_processes import processes_with_run_id
from rdzv_jobs import (
    LIMIT,
    PROGRAMS,
    Job,
    env,
    finish,
    gone,
    numarun_lines,
    read_ready,
    stacks,
    stacks_until,
    started_job,
    view_store,
    with_signal,
)
from torch_python import TORCH_PYTHON, require_torch, torch_release

TORCH_VERSION = require_torch()

JW = str(PROGRAMS / "gloo_multinode.py")
ST = str(PROGRAMS / "gloo_stuck_rank.py")
ELASTIC = str(PROGRAMS / "rdzv_restart_modes.py")
TORCHRUN = [TORCH_PYTHON, "-m", "torch.distributed.run"]
TORCH_RELEASE = torch_release(TORCH_VERSION)


@pytest.fixture
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    yield from started_job(request, tmp_path)

# torch 2.4's TCPStore client gives up when a signal interrupts its connect (retried from 2.5 on,
# pytorch/pytorch#129261), and under torch 2.4 a worker waits in that connect until rank 0's
# worker hosts the store: a stack sample of --hang-timeout (signal 42) then and there ends it in
# init_process_group with "DistNetworkError: Interrupted system call". The README's table says so.
SAMPLES_MAY_INTERRUPT_INIT = pytest.mark.xfail(
    TORCH_RELEASE < (2, 5),
    reason="torch 2.4: a stack sample can interrupt the workers' TCPStore connect (EINTR)",
    strict=False,
)


# --- stacks of the whole job ---------------------------------------------------------------------


def test_stacks_asked_on_either_node_show_every_rank_of_both(job: Job) -> None:
    # Rank 3 (node 1) sleeps in a named function; ranks 0-2 wait for it in all_reduce. Asked on
    # node 0, the stacks of main showed ranks 0 and 1 only.
    nodes = [job.start(n, *job.flags(), ST, "--stuck-rank", "3", "--sleep", "120") for n in (0, 1)]
    pids = read_ready(nodes, 4)
    for node in (0, 1):
        text = stacks_until(
            job.runtime(node), f"rank 3 (pid {pids[3]}): in sleep_in_the_named_function",
            "ranks 0-2 (3): in wait_for",
        )  # fmt: skip
        lines = text.splitlines()
        assert lines[0].startswith(f"numarun stacks: job {job.run_id} (4 ranks on 2 of 2 nodes)")
        assert "ranks 0-2 (3): in wait_for_the_others (" in text
        host = os.uname().nodename
        assert f"    on node 0 ({host}): ranks 0-1 (2); node 1 ({host}): rank 2" in lines
        assert f"    on node 1 ({host})" in lines
        # The odd one first, the largest class last.
        assert text.index("rank 3 (pid") < text.index("ranks 0-2 (3)")
    # The job goes on undisturbed, and stops on SIGTERM as usual.
    assert all(node.poll() is None for node in nodes)
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    for node in nodes:
        code, _, err = finish(node)
        assert code == 128 + signal.SIGTERM, err
    assert gone(list(pids.values()))
    assert processes_with_run_id(job.run_id) == []


@SAMPLES_MAY_INTERRUPT_INIT
def test_hang_timeout_is_judged_over_the_whole_job_on_every_node(job: Job) -> None:
    nodes = [
        job.start(n, *job.flags(), "--hang-timeout", "5", ST, "--stuck-rank", "3",
                  "--stuck-in", "blocked_here_by_the_test", "--sleep", "120")
        for n in (0, 1)
    ]  # fmt: skip
    pids = read_ready(nodes, 4)
    results = [finish(node) for node in nodes]
    for code, _, err in results:
        assert code == 124, err
        assert "HUNG on" in err and "no rank on any of the 2 nodes made progress" in err
        assert "Likely culprit (stacks differ from the other ranks'):" in err
        assert "  rank 3 (on node 1 (" in err and "in blocked_here_by_the_test (" in err
        assert "while ranks 0-2 (3): in wait_for_the_others (" in err
    assert gone(list(pids.values()))
    assert processes_with_run_id(job.run_id) == []
    assert all(os.listdir(job.runtime(node)) == [] for node in (0, 1))


@SAMPLES_MAY_INTERRUPT_INIT
def test_a_rank_computing_silently_on_one_node_while_the_other_waits_is_no_hang(job: Job) -> None:
    # Node 1's rank 1 computes silently for three timeouts while node 0's rank 0 waits for it in
    # all_reduce: node 0 alone looks hung, the job does not.
    nodes = [
        job.start(n, *job.flags(nproc=1), "--hang-timeout", "2", JW, "compute", "1", "7")
        for n in (0, 1)
    ]
    results = [finish(node) for node in nodes]
    for code, out, err in results:
        assert code == 0, err
        assert "HUNG" not in err
        assert "done " in out
    assert processes_with_run_id(job.run_id) == []


def test_a_torchrun_node_is_named_as_such_and_the_job_goes_on(job: Job, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    # A job that mixes launchers keeps the view on the rendezvous store (docs/rendezvous.md:
    # a torchrun node that gets group rank 0 hosts no diagnostics store of numarun's).
    ours = job.start(0, *job.flags(), "--diagnostics-store", "rendezvous", JW, "flag", str(flag))
    theirs = job.start(1, *job.flags(), JW, "flag", str(flag), launcher=TORCHRUN)
    try:
        read_ready([ours, theirs], 4)
        text = stacks_until(job.runtime(0), "not a numarun node")
        assert text.splitlines()[0].startswith(
            f"numarun stacks: job {job.run_id} (2 ranks on 1 of 2 nodes)"
        )
        assert "in parked_until_the_flag (" in text
        assert "not a numarun node (torchrun?): its ranks not shown" in text
    finally:
        flag.touch()
    for node in (ours, theirs):
        code, out, err = finish(node)
        assert code == 0, err
        assert out.count("done ") == 2
    assert processes_with_run_id(job.run_id) == []


# --- failures across nodes -----------------------------------------------------------------------


def test_another_nodes_failure_shows_where_every_rank_of_the_job_was(job: Job) -> None:
    # Rank 3 (node 1) raises while the others wait for a key it never sets. Node 1 has no
    # restart left and ends with its summary; node 0 learns of it through the store and shows
    # where every rank was: its own and node 1's other rank.
    nodes = [job.start(n, *job.flags(), ST, "--raise-at", "3") for n in (0, 1)]
    pids = read_ready(nodes, 4)
    code1, _, err1 = finish(nodes[1])
    code0, _, err0 = finish(nodes[0])
    assert code1 == 1, err1
    assert "Root cause: rank 3 (local_rank 1" in err1
    assert code0 == 1, err0
    block = err0[err0.index("numarun: where every rank of the job was:") :]
    assert "ranks 0-2 (3): in wait_for_the_failing_rank (" in block
    assert "on node 0 (" in block and "node 1 (" in block
    last = numarun_lines(err0)[-1]
    # Closed by node 1, or, when node 1 hosted the store and ended first, gone with it.
    assert "was closed by another node" in last or "went away after another node ended" in last
    assert "(node 1 (" in last and "rank 3 (local_rank 1) failed" in last, last
    assert gone(list(pids.values()))


def test_a_frozen_store_does_not_freeze_the_other_nodes_launcher(job: Job) -> None:
    # Node 0 hosts the store and is stopped (SIGSTOP): node 1's store calls block. Its
    # launcher must still act on Ctrl-C at once (exit 130), its worker torn down. On main
    # the look ran in the supervisor's loop and SIGINT waited for the store's timeout.
    flags = job.flags(nproc=1)
    conf = ["--monitor-interval", "0.5"]
    host = job.start(0, *flags, *conf, "--rdzv-conf", "is_host=1", ELASTIC, "shrink",
                     str(job.tmp), "2")  # fmt: skip
    other = job.start(1, *flags, *conf, "--rdzv-conf", "is_host=0", ELASTIC, "shrink",
                      str(job.tmp), "2")  # fmt: skip
    full = [job.tmp / f"full.{rank}" for rank in range(2)]
    deadline = time.monotonic() + LIMIT
    while not all(path.exists() for path in full):
        assert time.monotonic() < deadline and host.poll() is None and other.poll() is None
        time.sleep(0.05)
    workers = [int(path.read_text().split()[0]) for path in full]
    os.kill(host.pid, signal.SIGSTOP)
    time.sleep(2.0)  # several looks: node 1's store thread is blocked in the frozen store
    sent = time.monotonic()
    other.send_signal(signal.SIGINT)
    code, _, err = finish(other, 60)
    took = time.monotonic() - sent
    assert code == 130, err
    assert took < 10.0, took  # the target is 3 s (README); on main: the store's 60 s timeout
    assert "numarun stopped the run on SIGINT" in err
    with_signal(host, signal.SIGCONT)
    host.kill()
    finish(host)
    assert gone(workers)


# --- rendezvous waits say so ---------------------------------------------------------------------


def test_waiting_in_the_rendezvous_says_who_is_there_every_ten_seconds(job: Job) -> None:
    node = job.start(0, *job.flags(nproc=1), "--rdzv-conf", "is_host=1", JW, "flag", "/none")
    import select

    assert node.stderr is not None
    fd = node.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + 90
    while b"more awaited" not in seen and time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 1.0)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            seen += chunk
    node.send_signal(signal.SIGINT)
    code, _, err = finish(node, 30)
    lines = numarun_lines(seen.decode() + err)
    waiting = [line for line in lines if line.startswith("numarun: waiting ")]
    where = f"for the c10d rendezvous {job.run_id!r} at 127.0.0.1:{job.port}: "
    # Under load the node may still be importing torch's rendezvous (tens of seconds at load
    # 25), or joining, by the first line: that line says what it is doing (never "waiting for
    # 2 node(s)", which was wrong when both were there); once it joined, each line names who
    # is there: this node, its host and pid.
    here = re.escape(where) + r"1 of 2 node\(s\) there \((\S+) pid (\d+)\), 1 more awaited"
    there = [found for line in waiting if (found := re.search(here + "$", line))]
    assert there, waiting
    assert {int(found.group(2)) for found in there} == {node.pid}, waiting
    before = waiting[: len(waiting) - len(there)]
    doing = ("this node is importing torch's rendezvous", "this node is joining",
             "this node is creating torch's rendezvous handler (connecting to its store)")
    assert all(line.endswith(tuple(where + text for text in doing)) for line in before), waiting
    # Every ten seconds of a wait (never sooner; later on a loaded machine; joining the
    # rendezvous after creating torch's handler is a wait of its own).
    assert all(int(line.split()[2]) >= 9 for line in waiting), waiting
    assert code == 130
    assert lines[-1].startswith("numarun: stopped on SIGINT while waiting for the c10d")


def test_numarun_stacks_on_a_job_waiting_in_its_rendezvous_says_so(job: Job) -> None:
    # Issue 32, item 5: `numarun stacks RUN_ID` on a job waiting for its second node said "no
    # running numarun job": it runs, it has no ranks yet. It says where the job waits, since
    # when and for whom; once the launcher is gone (SIGKILL: no chance to tidy up) the job is
    # no longer found and its record is removed.
    node = job.start(0, *job.flags(nproc=1), "--rdzv-conf", "is_host=1", JW, "flag", "/none")
    where = f"c10d rendezvous {job.run_id!r} at 127.0.0.1:{job.port}"
    deadline = time.monotonic() + LIMIT
    said = ""
    while "1 of 2 node(s) there" not in said and time.monotonic() < deadline:
        assert node.poll() is None, node.communicate()
        done = stacks(job.runtime(0), job.run_id)
        if done.returncode == 0:  # before the launcher's first record: "no running job"
            said = done.stdout
            assert said.startswith(f"numarun stacks: job {job.run_id} (launcher pid {node.pid} "
                                   f"on "), said  # fmt: skip
            assert f"has no ranks yet: it waits in the {where} since " in said, said
        time.sleep(0.5)
    assert re.search(r"since \d\d:\d\d:\d\d \(\d+ s\): 1 of 2 node\(s\) there \(\S+ pid "
                     rf"{node.pid}\), 1 more awaited$", said.strip()), said  # fmt: skip
    listed = json.loads(stacks(job.runtime(0), str(node.pid), "--json").stdout)
    assert listed["ranks"] == [] and listed["waiting"]["awaited"] == 1, listed
    records = list(job.runtime(0).glob("*.wait"))
    assert len(records) == 1
    node.kill()
    finish(node)
    done = stacks(job.runtime(0), job.run_id)
    assert done.returncode == 1 and "no running numarun job" in done.stderr, done
    assert not records[0].exists()


# --- torch's private names -----------------------------------------------------------------------


def _launch_without(
    names: list[str], argv: list[str], runtime: Path
) -> subprocess.CompletedProcess[str]:
    """numarun's command line in a process where torch lacks ``names`` ("module:Class.attr"
    or "module:attr"), as an older or newer torch would."""
    code = (
        "import importlib, sys\n"
        "import torch.distributed\n"
        f"for spec in {names!r}:\n"
        "    module, _, path = spec.partition(':')\n"
        "    owner = importlib.import_module(module)\n"
        "    *outer, last = path.split('.')\n"
        "    for part in outer:\n"
        "        owner = getattr(owner, part)\n"
        "    if hasattr(owner, last):  # an older torch may not have it at all\n"
        "        delattr(owner, last)\n"
        "from numarun.cli import main\n"
        f"raise SystemExit(main({argv!r}))\n"
    )
    return subprocess.run(
        [TORCH_PYTHON, "-c", code], env=env(runtime), capture_output=True, text=True,
        timeout=LIMIT,
    )  # fmt: skip


OPTIONAL = ["torch._C._distributed_c10d:Store.list_keys", "torch._C._distributed_c10d:Store.clone"]


def test_without_torchs_optional_names_restarts_still_work(job: Job, tmp_path: Path) -> None:
    # Store.list_keys came with torch 2.10: without it the node hosting the workers' store
    # raised AttributeError in the rendezvous at its first restart and the job ended.
    out = tmp_path / "out"
    out.mkdir()
    argv = [
        "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
        "--rdzv-id", job.run_id, "--max-restarts", "1", ELASTIC, "flaky-gloo", str(out),
    ]  # fmt: skip
    done = _launch_without(OPTIONAL, argv, job.runtime(0))
    assert done.returncode == 0, done.stderr
    assert "restarting (restart 1 of 1)" in done.stderr
    assert not [line for line in numarun_lines(done.stderr) if "error" in line]
    assert processes_with_run_id(job.run_id) == []


def test_without_torchs_rank_assignment_the_launch_is_refused_in_one_line(
    job: Job, tmp_path: Path
) -> None:
    argv = [
        "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
        "--rdzv-id", job.run_id, ELASTIC, "flaky", str(tmp_path),
    ]  # fmt: skip
    done = _launch_without(
        ["torch.distributed.elastic.agent.server.api:SimpleElasticAgent._assign_worker_ranks"],
        argv, job.runtime(0),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = numarun_lines(done.stderr)
    assert lines == [
        "numarun: error: numarun's torch rendezvous needs SimpleElasticAgent._assign_worker_ranks, "
        f"which torch {TORCH_VERSION} does not have; use torch 2.4 or later (or "
        "--rdzv-backend static)"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.glob("env.*")) == []  # nothing started


def test_a_torch_older_than_2_4_is_refused_in_one_line_naming_it(job: Job, tmp_path: Path) -> None:
    argv = [
        "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
        "--rdzv-id", job.run_id, ELASTIC, "flaky", str(tmp_path),
    ]  # fmt: skip
    code = (
        "import torch\n"
        "torch.__version__ = '2.3.1+cpu'\n"
        "from numarun.cli import main\n"
        f"raise SystemExit(main({argv!r}))\n"
    )
    done = subprocess.run(
        [TORCH_PYTHON, "-c", code], env=env(job.runtime(0)), capture_output=True, text=True,
        timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert numarun_lines(done.stderr) == [
        "numarun: error: numarun's torch rendezvous drives torch 2.4 or later; this is torch "
        "2.3.1+cpu: upgrade torch (or use --rdzv-backend static)"
    ], done.stderr
    assert list(tmp_path.glob("env.*")) == []  # nothing started


# --- what a node posts ---------------------------------------------------------------------------


def _deep_dump(threads: int, frames: int) -> str:
    blocks = []
    for index in range(threads):
        kind = "Current thread" if index == threads - 1 else "Thread"
        lines = [f"{kind} 0x{index + 1:016x} (most recent call first):"]
        lines += [
            f'  File "/job/module_{n}.py", line {n + 1} in function_{n}' for n in range(frames)
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def test_a_class_posts_its_frames_bounded_only_stacks_and_reads_back_checked() -> None:
    from numarun.stacks import digest as codec
    from numarun.stacks import parse
    from numarun.stacks.dumps import Raw

    dumps = [Raw(rank, rank, 1000 + rank, _deep_dump(40, 100), None) for rank in range(64)]
    digest, posts = codec.node_digest(dumps, node=1, host="host-b", pid=77, state="answer",
                                       known=codec.Classes())  # fmt: skip
    assert len(posts) == 1  # 64 ranks, one class
    ((ident, post),) = posts.items()
    assert len(post) <= codec.FRAMES_LIMIT
    threads, _ = codec.read_frames(post, ident)
    # The main thread's innermost frames survive the cut.
    assert threads[-1].frames[0].function == "function_0"
    document = json.loads(post)
    assert set(document) == {"v", "threads", "more"}
    assert set(document["threads"][0]) == {"id", "frames", "cut"}
    back = codec.read_digest(digest.encode())
    assert (back.node, back.host, back.pid) == (1, "host-b", 77)
    assert back.classes[0][1] == list(range(64))
    assert len(parse.group_ranks([parse.rank_stacks(0, 0, 1, _deep_dump(2, 3), None)])) == 1
    assert codec.printable("rank\x1b[2J\u202eok") == "rank\\x1b[2J\\u202eok"


# --- at scale: the uneven-data hang, four nodes, what the store holds is untrusted ---------------

UNEVEN = str(PROGRAMS / "uneven_data_hang.py")


def test_the_uneven_data_hang_is_declared_on_every_node_naming_the_culprit(job: Job) -> None:
    # Issue 23: node 1's ranks ran out of data and ended (their node waits in the exit barrier)
    # while rank 0 waits forever: the job was never declared hung (node 1 was never "still");
    # both launchers ran until the exit barrier's 300 s timeout, without stacks or 124.
    nodes = [
        job.start(n, *job.flags(), "--hang-timeout", "4", "--monitor-interval", "1", UNEVEN,
                  "uneven")
        for n in (0, 1)
    ]  # fmt: skip
    pids = read_ready(nodes, 4)
    results = [finish(node) for node in nodes]
    for code, _, err in results:
        assert code == 124, [r[2] for r in results]
        assert "HUNG on" in err and "no rank on any of the 2 nodes made progress" in err, err
        assert "Likely culprit (still running while the other ranks had ended):" in err, err
        assert "  rank 0 (on node 0 (" in err and f"pid {pids[0]}): in " \
               "wait_for_data_that_never_comes (" in err, err  # fmt: skip
        assert "Traceback" not in err
    # One node's ranks all ended (it waited in the exit barrier); the other's rank 0 was torn
    # down after the verdict.
    counts = sorted(err.split("HUNG on", 1)[1].split(")", 1)[0] for _, _, err in results)
    assert any("2 succeeded" in line for line in counts), counts
    assert gone(list(pids.values()))
    assert processes_with_run_id(job.run_id) == []


def test_four_nodes_stacks_are_classes_with_rank_and_node_ranges(job: Job) -> None:
    nodes = [job.start(n, *job.flags("4"), UNEVEN, "parked", "5") for n in range(4)]
    pids = read_ready(nodes, 8)
    host = os.uname().nodename
    text = stacks_until(job.runtime(2), "ranks 0-4,6-7 (7): in parked_until_killed")
    lines = text.splitlines()
    # Every node answered within the collect limit (2 s): none named as missing.
    assert lines[0].startswith(f"numarun stacks: job {job.run_id} (8 ranks on 4 of 4 nodes)")
    assert f"rank 5 (pid {pids[5]}): in somewhere_else (" in text
    assert f"    on nodes 0-3 (4) ({host})" in lines
    assert text.index("rank 5 (pid") < text.index("ranks 0-4,6-7 (7)")
    assert "did not answer" not in text
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    for node in nodes:
        code, _, err = finish(node)
        assert code == 128 + signal.SIGTERM, err
    assert gone(list(pids.values()))


def test_every_forgery_of_the_stores_content_is_named_and_survived(job: Job) -> None:
    # Issue 23 item 5: a deeply nested post (a RecursionError traceback, exit 1 on both
    # nodes), a non-numeric counter ("lost the c10d rendezvous"), control characters reaching
    # the terminal raw, a counter moved by 10^12 (every later event lost).
    flags = [*job.flags(), "--monitor-interval", "0.5"]
    nodes = [job.start(n, *flags, UNEVEN, "parked", "3") for n in (0, 1)]
    pids = read_ready(nodes, 4)
    store = view_store(job)  # the view's own store (anyone who reaches its port can write)
    view = (b'{"v": 2, "kind": "hang", "by": "evil", "size": 2, "answered": [[0, 2, 1]],'
            b' "missing": [], "notes": [], "idle": 1, "classes": []}')  # fmt: skip
    count = store.add("numarun/events", 1)
    store.set(f"numarun/event/{count}", b"hang 1\n" + view)  # a forged verdict
    store.set("numarun/events", "not a number \x1b[31m")
    text = stacks_until(job.runtime(1), "rank 3 (pid")  # the poster repaired the counter
    assert "4 ranks on 2 of 2 nodes" in text.splitlines()[0]
    store.add("numarun/events", 10**12)
    text = stacks_until(job.runtime(0), "4 ranks on 2 of 2 nodes", "rank 3 (pid")
    assert all(node.poll() is None for node in nodes)  # nothing forged ended anything
    count = store.add("numarun/events", 1)
    nested = b"[" * 100_000 + b"]" * 100_000
    store.set(f"numarun/event/{count}", b"stop 1\nnode 1: \x1b]0;pwned\x07gone\n" + nested)
    # The forged notice stops the attempt: its workers end (the group re-forms and starts
    # others, so the run's processes are never all gone at once).
    assert gone(list(pids.values()), LIMIT)
    time.sleep(3)
    for node in nodes:
        with_signal(node, signal.SIGTERM)
    errs = [finish(node)[2] for node in nodes]
    both = "\n".join(errs)
    assert "Traceback" not in both and "RecursionError" not in both
    assert "\x1b" not in both and "\x07" not in both
    assert "lost the" not in both
    assert "numarun/events holds 'not a number \\x1b[31m', not a number" in both
    assert "a hang verdict posted by node 1 reached this node, whose ranks are moving: not " \
           "acted on, and denied" in both  # fmt: skip
    assert "numarun/events moved from" in both
    assert "stopped: node 1: \\x1b]0;pwned\\x07gone" in both
    assert "the notice of node 1: a digest: " in both and "its ranks not shown" in both
    assert gone(list(pids.values()))
