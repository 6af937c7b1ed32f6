"""One node's stacks as posted for the other nodes of a job, and read back. Pure: no effects.

Under a torch rendezvous (c10d, etcd) the launchers of a job share torch's store; a node posts
its ranks' stacks there when the whole job's stacks are asked for (``numarun stacks`` on any
node), when ``--hang-timeout`` judges the whole job, and with the notice of a failure. The store
is unauthenticated, so a post holds nothing but stacks and is bounded:

    {"v": 1, "node": <group rank>, "host": "<host name>", "pid": <launcher pid>,
     "ranks": [{"rank": 3, "local_rank": 1, "pid": 4242, "problem": null, "text": "..."}]}

``text`` is the rank's dump re-written in faulthandler's own format from its parsed threads
(thread ids, then ``File "...", line N in function`` lines; nothing else of the rank), cut so
that the whole post stays within :data:`POST_LIMIT` bytes: each rank gets an equal share (at
least :data:`MIN_RANK_SHARE`), its main thread first (innermost frames kept), then as many other
threads as fit. Every node reads every post, its own included, the same way, so ranks with the
same stacks group together across nodes. What is read is checked field by field (a post that
is not one gives :class:`ValueError`) and shown through :func:`printable`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from numarun.stacks.parse import RankStacks, Thread, rank_stacks

POST_LIMIT = 256 * 1024  # bytes per node and post
MIN_RANK_SHARE = 2048
_FORMAT = 1


def node_label(group_rank: int, host: str) -> str:
    """How a rank's node is named: ``node 1 (host-b)``."""
    return f"node {group_rank} ({printable(host)})"


def printable(text: str) -> str:
    """``text`` with control characters (tab excepted) shown as escapes: what another node
    posted reaches this user's terminal."""
    return "".join(
        char if char == "\t" or (char.isprintable() and char not in "\u2028\u2029") else
        (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        for char in text
    )  # fmt: skip


def _thread_text(thread: Thread, frames: int | None = None) -> list[str]:
    kind = "Current thread" if thread.current else "Thread"
    ident = thread.ident or "0x0"
    lines = [f"{kind} {ident} (most recent call first):"]
    shown = thread.frames if frames is None else thread.frames[:frames]
    for frame in shown:
        number = "???" if frame.line is None else frame.line
        lines.append(f'  File "{frame.file}", line {number} in {frame.function}')
    if thread.truncated or len(shown) < len(thread.frames):
        lines.append("  ...")
    return lines


def compact_text(stacks: RankStacks, share: int) -> str:
    """``stacks`` as faulthandler text of at most about ``share`` bytes (module docstring)."""
    if not stacks.threads:
        return ""
    main, others = stacks.threads[-1], stacks.threads[:-1]
    frames = len(main.frames)
    body = _thread_text(main)
    while frames > 1 and len("\n".join(body).encode()) > share:
        frames //= 2
        body = _thread_text(main, frames)
    used = len("\n".join(body).encode())
    kept: list[list[str]] = []
    for thread in others:
        lines = _thread_text(thread)
        size = len("\n".join(lines).encode()) + 2
        if used + size > share:
            break
        kept.append(lines)
        used += size
    blocks = [*kept, body]
    text = "\n\n".join("\n".join(block) for block in blocks) + "\n"
    if stacks.more_threads or len(kept) < len(others):
        text += "...\n"
    return text


def encode_post(
    stacks: Sequence[RankStacks], *, group_rank: int, host: str, pid: int,
    limit: int = POST_LIMIT,
) -> bytes:  # fmt: skip
    """One node's post (module docstring), at most ``limit`` bytes."""
    share = max(MIN_RANK_SHARE, (limit - 256) // max(1, len(stacks)) - 128)
    ranks = []
    for item in stacks:
        ranks.append(
            {
                "rank": item.rank,
                "local_rank": item.local_rank,
                "pid": item.pid,
                "problem": item.problem[:300] if item.problem else None,
                "text": compact_text(item, share),
            }
        )
    post = {"v": _FORMAT, "node": group_rank, "host": host[:255], "pid": pid, "ranks": ranks}
    data = json.dumps(post, separators=(",", ":")).encode()
    while len(data) > limit and share > 64:  # many ranks: shares shrink until it fits
        share //= 2
        for entry, item in zip(ranks, stacks, strict=True):
            entry["text"] = compact_text(item, share)
        data = json.dumps(post, separators=(",", ":")).encode()
    return data


def _int(value: object, name: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} is not a whole number")
    return value


def _str(value: object, name: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{name} is not a string of at most {limit} characters")
    return value


def decode_post(data: bytes) -> tuple[int, str, int, list[RankStacks]]:
    """(group rank, host, launcher pid, the ranks' stacks with their node set) from a post;
    ValueError when ``data`` is not one (another numarun version, or not numarun's)."""
    if len(data) > POST_LIMIT:
        raise ValueError("the post is larger than numarun posts")
    try:
        post = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a numarun post: {error}") from None
    if not isinstance(post, dict) or post.get("v") != _FORMAT:
        raise ValueError("not a numarun post of this version")
    group_rank = _int(post.get("node"), "node")
    host = _str(post.get("host"), "host", 255)
    pid = _int(post.get("pid"), "pid")
    entries = post.get("ranks")
    if not isinstance(entries, list):
        raise ValueError("ranks is not a list")
    label = node_label(group_rank, host)
    ranks = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError("a rank is not an object")
        rank_pid = entry.get("pid")
        problem = entry.get("problem")
        ranks.append(
            rank_stacks(
                _int(entry.get("rank"), "rank"),
                _int(entry.get("local_rank"), "local_rank"),
                None if rank_pid is None else _int(rank_pid, "pid"),
                _str(entry.get("text", ""), "text", POST_LIMIT),
                None if problem is None else _str(problem, "problem", 300),
                node=label,
            )
        )
    return group_rank, host, pid, ranks
