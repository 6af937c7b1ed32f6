"""The whole-job view failing in every path it has (its code raising) on node stand-ins running
the launcher's own classes against a real torch TCPStore (``tests/standin_job.py``): each failure
is one line, the training goes on, and only the rendezvous's own notices stop a node. The same
through real launchers: ``tests/e2e/test_jobwide_faults.py``."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
dist = pytest.importorskip("torch.distributed")

from numarun.jobwide import hangverdict, protocol  # noqa: E402
from standin_job import INTERVAL, Job  # noqa: E402

CODECS = {
    protocol: ("node_digest", "merge", "read_digest"),
    hangverdict: ("node_digest", "merge", "encode_view", "read_view", "read_digest"),
}


def test_each_path_of_the_whole_job_view_raising_is_one_line_and_the_training_goes_on(
    make_job: Callable[..., Job],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = make_job(3)
    for module, names in CODECS.items():
        for name in names:

            def injected(*args: object, name: str = name, **kwargs: object) -> object:
                raise RuntimeError(f"injected fault in {name}")

            monkeypatch.setattr(module, name, injected)
    asker = job.nodes[0]
    asker.ask()  # every node's answer raises, and the asking node's merge
    job.until(lambda: bool(asker.replies))
    assert asker.replies[0]["error"].startswith("the whole job's stacks are unavailable: ")
    for node in job.nodes:
        node.go_still()  # the marks raise
    job.run_for(INTERVAL * 6)
    assert not any(node.supervisor.stopped for node in job.nodes)
    job.nodes[2].fail()  # its notice goes without its ranks; the others read its line
    job.until(lambda: all(node.supervisor.stopped for node in job.nodes[:2]))
    for node in job.nodes[:2]:
        assert node.stop_reason() == "rendezvous: node 2 (node0002): rank 16 (local_rank 0) " \
                                     "failed with exit code 1"  # fmt: skip
    err = capfd.readouterr().err
    assert "injected fault in node_digest" in err and "the training goes on" in err
    assert "Traceback" not in err
