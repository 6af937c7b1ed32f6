"""numarun.check.memory: where a buffer's pages are (numa_maps), placing them on a node, and
the copy bandwidth."""

from __future__ import annotations

import pytest

from numarun.check import memory

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
