"""The kernel CPU-list syntax: parse, format, and their round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numarun.errors import UsageError
from numarun.machine import cpulist
from numarun.machine.cpulist import format_cpulist, parse_cpulist

cpu_sets = st.sets(st.integers(0, 4095), max_size=64)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8", (0, 1, 2, 3, 8)),
        ("", ()),
        ("\n", ()),
        ("5\n", (5,)),
        ("0-55,112-167", tuple(range(56)) + tuple(range(112, 168))),
        (" 3 , 1 ", (1, 3)),
        ("1-2,2-3", (1, 2, 3)),
        ("0-15:4", (0, 4, 8, 12)),
        ("0-7:2,1", (0, 1, 2, 4, 6)),
        ("4-4", (4,)),
    ],
)
def test_parse(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1-", "'' is not a CPU number"),
        ("a", "'a' is not a CPU number"),
        ("3-1", "range 3-1 runs backwards"),
        (",,", "empty item"),
        ("0,", "empty item"),
        ("0-3:0", "stride must be >= 1"),
        ("-1", "'' is not a CPU number"),
        ("1.5", "'1.5' is not a CPU number"),
        ("²", "'²' is not a CPU number"),
        ("0-4000000000", "CPU 4000000000 is above 65535"),
        ("70000", "CPU 70000 is above 65535"),
    ],
)
def test_bad_input(text: str, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_cpulist(text)
    message = str(info.value)
    assert fragment in message and repr(text.strip()) in message and "\n" not in message


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([], ""),
        ([4, 5], "4-5"),
        ([7], "7"),
        ([9, 1, 3, 2, 9], "1-3,9"),
        (range(0, 64, 2), ",".join(str(c) for c in range(0, 64, 2))),
    ],
)
def test_format(cpus: list[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@given(cpu_sets)
def test_round_trip_from_sets(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == tuple(sorted(cpus))
    assert format_cpulist(parse_cpulist(text)) == text
    assert " " not in text and ",," not in text


@given(cpu_sets, st.sampled_from(["", " ", "\n"]))
def test_whitespace_and_order_do_not_matter(cpus: set[int], pad: str) -> None:
    items = [str(c) for c in sorted(cpus, reverse=True)]
    text = pad + (pad + "," + pad).join(items) + pad
    assert parse_cpulist(text) == tuple(sorted(cpus))


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=8))
def test_ranges_parse_to_their_union(ranges: list[tuple[int, int]]) -> None:
    text = ",".join(f"{lo}-{lo + width}" for lo, width in ranges)
    expected = sorted({c for lo, width in ranges for c in range(lo, lo + width + 1)})
    assert parse_cpulist(text) == tuple(expected)


@given(st.text(alphabet="0123456789-,: \n", max_size=12))
def test_anything_parses_or_raises_usage_error(text: str) -> None:
    try:
        cpus = parse_cpulist(text)
    except UsageError:
        return
    assert list(cpus) == sorted(set(cpus)) and all(c >= 0 for c in cpus)
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@given(st.text(alphabet="0123456789-,", max_size=14))
def test_fast_path_agrees_with_full_parser(text: str) -> None:
    fast = cpulist._parse_plain(text)
    if fast is None:
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpulist, "_parse_plain", lambda _text: None)
        assert parse_cpulist(text) == fast
