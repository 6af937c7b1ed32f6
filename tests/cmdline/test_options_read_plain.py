"""numarun.cmdline.options.read_options: the launcher's options read by hand, without argparse on
a launch's start-up path (issue 32 item 13), must be exactly what argparse's parser makes of
them; whatever the hand reading does not take goes to argparse, mistakes included."""

from __future__ import annotations

import argparse
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.cmdline import options
from numarun.cmdline.options import build_parser, read_options, split_argv
from numarun.errors import UsageError

ENV: dict[str, str] = {}


def by_argparse(own: list[str], environ: dict[str, str] | None = None) -> dict[str, object]:
    return vars(build_parser(ENV if environ is None else environ).parse_args(own))


PLAIN = [
    [],
    ["--nproc-per-node", "4"],
    ["--nproc_per_node=4", "--nnodes", "1:2"],
    ["-q", "--dry-run", "--max-restarts", "3", "--max_restarts", "5"],
    ["--rank-cpus", "0-1", "--rank-cpus", "2-3", "--rank_cpus=4"],
    ["--standalone", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"],
    ["--preload", "torch", "--preload", "numpy", "--hang-timeout", "30"],
    ["--master-addr", "10.0.0.1", "--master-port", "29500", "--redirects", "3", "--tee", "0:3"],
    ["--numa-binding=cpu", "--mem-binding", "local", "--binding-fallback"],
    ["--log-dir", "/tmp/a b", "--local-ranks-filter", "0,1", "--role", "trainer"],
]


@pytest.mark.parametrize("own", PLAIN, ids=[" ".join(own) or "none" for own in PLAIN])
def test_plain_options_are_read_by_hand_as_argparse_reads_them(own: list[str]) -> None:
    got = read_options(own, ENV)
    assert isinstance(got, options.Options)  # by hand: argparse not asked
    assert vars(got) == by_argparse(own)


def test_pet_defaults_are_the_parsers() -> None:
    environ = {"PET_NPROC_PER_NODE": "3", "PET_STANDALONE": "1", "PET_MAX_RESTARTS": "2"}
    for own in (["--max-restarts", "4"], []):
        got = read_options(own, environ)
        assert isinstance(got, options.Options)
        assert vars(got) == by_argparse(own, environ)


@pytest.mark.parametrize(
    ("environ", "line"),
    [
        ({"PET_STANDALONE": "yes"}, "PET_STANDALONE='yes' must be 0 or 1"),
        ({"PET_RANK_CPUS": "0"}, "PET_RANK_CPUS cannot give one value per local rank"),
    ],
)
def test_a_bad_pet_variable_is_the_same_line_either_way(
    environ: dict[str, str], line: str
) -> None:
    with pytest.raises(UsageError, match=line):
        read_options(["--nnodes", "1"], environ)
    with pytest.raises(UsageError, match=line):
        build_parser(environ)


@pytest.mark.parametrize(
    "own",
    [
        ["--nproc-per-node", "-1"],  # a value argparse could read as an option
        ["--nproc-per-node=-1"],
        ["--master-addr", ""],
        ["--dry-run=1"],  # a flag given a value: argparse refuses it
        ["--nproc-per-node"],  # no value
        ["--nprocs-per-node", "2"],  # unknown: argparse's did-you-mean
        ["-qq"],
    ],
)
def test_anything_else_goes_to_argparse(own: list[str]) -> None:
    try:
        expected: object = by_argparse(own)
    except UsageError as error:
        with pytest.raises(UsageError) as raised:
            read_options(own, ENV)
        assert str(raised.value) == str(error)
        return
    got = read_options(own, ENV)
    assert isinstance(got, argparse.Namespace)
    assert vars(got) == expected


def test_help_and_version_go_to_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    for own in (["--help"], ["-h"], ["--version"]):
        with pytest.raises(SystemExit) as ended:
            read_options(own, ENV)
        assert ended.value.code == 0
    assert "numarun" in capsys.readouterr().out


# Every option by each of its names, with a plain value or an odd one, in any order: the hand
# reading and argparse agree on every list either one accepts, and refuse the same lists.
_NAMES = [name for option in options._OPTIONS for name in option.names]
_VALUES = ["4", "x", "0:3", "", "-1", "-", "a=b", "--nnodes"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_NAMES), st.sampled_from(_VALUES), st.booleans()),
        max_size=6,
    )
)
def test_hand_and_argparse_agree(tokens: list[tuple[str, str, bool]]) -> None:
    own = list(
        itertools.chain.from_iterable(
            [f"{name}={value}"] if joined else [name, value] for name, value, joined in tokens
        )
    )
    try:
        expected: object = by_argparse(own)
    except (UsageError, SystemExit) as error:
        expected = type(error)
    try:
        got: object = vars(read_options(own, ENV))
    except (UsageError, SystemExit) as error:
        got = type(error)
    assert got == expected


def test_split_then_read_spells_out_prefixes_first() -> None:
    own, rest = split_argv(["--nproc", "2", "--nnode=1", "train.py", "--nnodes", "9"])
    got = read_options(own, ENV)
    assert isinstance(got, options.Options)
    assert (got.nproc_per_node, got.nnodes) == ("2", "1")
    assert rest == ["train.py", "--nnodes", "9"]
