"""numarun.stacks.digest: what a node posts to the store and reads back: rank sets (small
whatever the job size), and every post read as untrusted (deep nesting refused before decoding,
any bytes or JSON a view or one line; the merged view read back the same way)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.stacks import digest as codec
from numarun.stacks import merge

# --- rank sets -----------------------------------------------------------------------------------


@given(st.sets(st.integers(min_value=0, max_value=5000), max_size=300))
@settings(max_examples=200, deadline=None)
def test_rank_sets_round_trip(ranks: set[int]) -> None:
    ordered = sorted(ranks)
    assert codec.decode_ranks(json.loads(json.dumps(codec.encode_ranks(ordered))), "r") == ordered


def test_periodic_rank_sets_stay_small_whatever_the_job_size() -> None:
    local_zero = list(range(0, 8192, 8))
    assert codec.encode_ranks(local_zero) == [[0, 1, 1], [7, 1, 1023]]
    others = [rank for rank in range(8192) if rank % 8]
    assert codec.encode_ranks(others) == [[1, 7, 1024]]
    assert codec.encode_ranks(list(range(8192))) == [[0, 8192, 1]]


@pytest.mark.parametrize(
    "bad",
    [
        "nope", [[0, 1]], [[-1, 1, 1]], [[0, 0, 1]], [[0, 1, True]], [[0.5, 1, 1]],
        [[0, 1 << 30, 1]], [[0, 2, 1 << 22]], [[10**100, 1, 1]],
    ],
)  # fmt: skip
def test_a_rank_set_that_is_not_one_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(codec.PostError) as caught:
        codec.decode_ranks(bad, "ranks", below=1 << 22)
    assert "\n" not in str(caught.value)


# --- untrusted decoding --------------------------------------------------------------------------


def test_deep_nesting_is_refused_before_decoding() -> None:
    deep = b"[" * 5_000 + b"]" * 5_000  # within every size limit
    for read in (codec.read_digest, lambda d: merge.read_view(d),
                 lambda d: codec.read_frames(d, "0" * 16)):  # fmt: skip
        with pytest.raises(codec.PostError, match="nested deeper"):
            read(deep)
    # Brackets inside strings do not count; escapes inside strings are followed.
    assert codec.nesting(b'{"a": "[[[[[[[[[[\\"[[["}') == 1
    assert codec.nesting(b"[[[]]]") == 3


@pytest.mark.parametrize(
    "post",
    [
        b"not json", b"\xff\xfe", b'{"v": 2}', b"[1, 2]", b"1e999999",
        b'{"v": 2, "node": "0", "host": "h", "pid": 1, "state": "x", "classes": [],'
        b' "problems": []}',
        b'{"v": 2, "node": 0, "host": "h", "pid": 1, "state": "x", "classes": [{"id": "zz"}],'
        b' "problems": []}',
        b'{"v": 2, "node": 0, "host": "h", "pid": 1, "state": "x", "classes": [],'
        b' "problems": [{"problem": 7, "ranks": []}]}',
        b'{"v": 2, "node": 10000000000000, "host": "h", "pid": 1, "state": "x", "classes": [],'
        b' "problems": []}',
        b'{"v": 2, "node": 0, "host": "' + b"h" * 300 + b'", "pid": 1, "state": "x",'
        b' "classes": [], "problems": []}',
        b'{"v": 2, "node": 0, "host": "h", "pid": 1, "state": "x", "classes": [{"id":'
        b' "0123456789abcdef", "ranks": [[0, 1, 1]], "pids": [1e3]}], "problems": []}',
        b" " * (codec.DIGEST_LIMIT + 1),
    ],
)  # fmt: skip
def test_a_digest_that_is_not_one_is_named_in_one_line(post: bytes) -> None:
    with pytest.raises(codec.PostError) as caught:
        codec.read_digest(post)
    assert "\n" not in str(caught.value) and str(caught.value)


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_bytes_read_back_give_a_view_or_one_line(data: bytes) -> None:
    for read in (codec.read_digest, merge.read_view, lambda d: codec.read_frames(d, "a" * 16)):
        try:
            read(data)
        except codec.PostError as error:
            assert "\n" not in str(error)


@pytest.mark.slow
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.sampled_from(["v", "node", "host", "pid", "state",
                                                       "classes", "problems", "ranks", "id",
                                                       "kind", "by", "size", "answered"]),
                                      children, max_size=6),
                    max_leaves=30))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_any_json_read_back_gives_a_view_or_one_line(document: object) -> None:
    data = json.dumps(document).encode()
    for read in (codec.read_digest, merge.read_view):
        try:
            read(data)
        except codec.PostError as error:
            assert "\n" not in str(error)


# --- what decoding a post may cost ---------------------------------------------------------------


def test_a_digest_naming_more_ranks_than_the_job_is_refused_before_it_is_expanded() -> None:
    # 1,000 classes of every rank of a job of 4 million: 4 billion ranks in 50 KB, refused
    # before any is built (this test would need a hundred GB otherwise).
    world = 1 << 22
    classes = [{"id": f"{n:016x}", "ranks": [[0, world, 1]]} for n in range(1000)]
    post = json.dumps({"v": 2, "node": 0, "host": "h", "pid": 1, "state": "still",
                       "classes": classes, "problems": []}).encode()  # fmt: skip
    assert len(post) <= codec.DIGEST_LIMIT
    with pytest.raises(codec.PostError, match="more ranks than the job has"):
        codec.read_digest(post, below=world)
    one = json.dumps({"v": 2, "node": 0, "host": "h", "pid": 1, "state": "still",
                      "classes": classes[:1], "problems": []}).encode()  # fmt: skip
    assert codec.read_digest(one, below=world).rank_count == world
    with pytest.raises(codec.PostError, match="more ranks than the job has"):
        codec.read_digest(one, below=world, most=world - 1)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("count", 17, "count is not a whole number from 1 to 16"),
        ("node_count", 3, "node_count is not a whole number from 1 to 2"),
        ("nodes", [[0, 5, 1]], "nodes is not a whole number from 1 to 2"),
    ],
)
def test_a_view_is_read_within_the_jobs_ranks_and_the_rounds_nodes(
    field: str, value: object, why: str
) -> None:
    item = {"ranks": [[0, 1, 1]], "nodes": [[0, 1, 1]], "hosts": "h", "problem": "p", field: value}
    view = json.dumps({"v": 2, "kind": "hang", "by": "x", "size": 2, "answered": [[0, 2, 1]],
                       "missing": [], "notes": [], "idle": 1, "classes": [item]}).encode()
    with pytest.raises(codec.PostError, match=why):
        merge.read_view(view, world=16, nodes=2)
    classes = [{"ranks": [[0, 16, 1]], "nodes": [[0, 2, 1]], "hosts": "h", "problem": "p"}] * 2
    twice = json.dumps({"v": 2, "kind": "hang", "by": "x", "size": 2, "answered": [[0, 2, 1]],
                        "missing": [], "notes": [], "idle": 1, "classes": classes}).encode()
    with pytest.raises(codec.PostError, match="more ranks than the job has"):
        merge.read_view(twice, world=16, nodes=2)
