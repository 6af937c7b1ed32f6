"""numarun.cmdline.stdspec (torchrun's ``--redirects``/``--tee`` specs and
``--local-ranks-filter``) and numarun.launch.output (the line prefixes, and the sinks each rank's
streams get: ``sinks_for``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from numarun.cmdline.stdspec import Std, parse_ranks_filter, parse_std_spec, ranks_filter_warning
from numarun.errors import UsageError
from numarun.launch.output import PREFIX_TEMPLATE_ENV, make_prefix, sinks_for
from numarun.process.sinks import FileSink, NullSink, TeeSink

# ---------------------------------------------------------------- --redirects / --tee specs


@pytest.mark.parametrize(
    ("text", "nprocs", "expected"),
    [
        ("0", 2, {0: 0, 1: 0}),
        ("1", 3, {0: 1, 1: 1, 2: 1}),
        ("2", 1, {0: 2}),
        (" 3 ", 2, {0: 3, 1: 3}),
        ("0:3,1:0", 2, {0: 3, 1: 0}),
        ("1:2", 4, {0: 0, 1: 2, 2: 0, 3: 0}),
        ("3:1, 0:2", 4, {0: 2, 1: 0, 2: 0, 3: 1}),
        ("10:3", 11, {**dict.fromkeys(range(10), 0), 10: 3}),
    ],
)
def test_parse_std_spec_accepts_torchrun_forms(text: str, nprocs: int, expected: dict) -> None:
    assert parse_std_spec(text, nprocs) == expected


@pytest.mark.parametrize(
    "text",
    ["4", "a", "0:", "5:1", "0:1,0:2", "", "-1", "0:4", ":1", "0:1,", "01", "0:1;1:2", "1:a", "٣"],
)
def test_parse_std_spec_rejects_malformed_values_in_one_line(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_std_spec(text, 2, flag="--tee")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--tee {text!r} is not valid")
    assert "0:3,1:0" in message and "3 (both)" in message


def test_parse_std_spec_names_the_missing_rank() -> None:
    with pytest.raises(UsageError, match="local rank 5 does not exist with 2 processes"):
        parse_std_spec("5:1", 2)


def test_std_values_are_torchruns() -> None:
    assert (Std.NONE, Std.OUT, Std.ERR, Std.ALL) == (0, 1, 2, 3)
    assert Std.ALL == Std.OUT | Std.ERR


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0,2", {0, 2}), ("", {0, 1, 2, 3}), ("  ", {0, 1, 2, 3}), (" 3 , 1,1", {1, 3})],
)
def test_parse_ranks_filter(text: str, expected: set[int]) -> None:
    assert parse_ranks_filter(text, 4) == expected


@pytest.mark.parametrize("text", ["a", "0,,1", "-1", "1.5", "0;1", ","])
def test_parse_ranks_filter_rejects_bad_values(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_ranks_filter(text, 4)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"--local-ranks-filter {text!r}")
    with pytest.raises(UsageError):
        ranks_filter_warning(text, 4)


@pytest.mark.parametrize(
    ("text", "shown", "warning"),
    [
        # torchchat-style scripts pass 0,1,2,3 whatever the machine: torchrun accepts it.
        ("0,1,2,3", {0, 1}, "names local ranks 2, 3, which do not exist with 2 processes per "
         "node: only local ranks 0, 1 will be shown"),
        ("1,7", {1}, "names local rank 7, which does not exist with 2 processes per node: "
         "only local rank 1 will be shown"),
        ("5", set(), "no rank's output will be shown on the console"),
        ("0,1", {0, 1}, None),
        ("", {0, 1}, None),
    ],
)  # fmt: skip
def test_a_ranks_filter_naming_ranks_that_do_not_exist_is_accepted_with_a_warning(
    text: str, shown: set[int], warning: str | None
) -> None:
    assert parse_ranks_filter(text, 2) == shown
    said = ranks_filter_warning(text, 2)
    if warning is None:
        assert said is None
    else:
        assert said is not None and warning in said and "\n" not in said


# ---------------------------------------------------------------- prefixes


def test_default_prefix_is_torchruns_role_and_local_rank() -> None:
    assert make_prefix(3, 1, environ={}) == b"[default1]:"
    assert make_prefix(3, 1, role_name="trainer", environ={}) == b"[trainer1]:"


def test_prefix_template_like_torchrun() -> None:
    template = "[${role_name}${local_rank}|${rank}]:"
    assert make_prefix(9, 1, role_name="trainer", template=template) == b"[trainer1|9]:"
    env = {PREFIX_TEMPLATE_ENV: "${rank} $unknown ${local_rank}> "}
    assert make_prefix(4, 0, environ=env) == b"4 $unknown 0> "
    assert make_prefix(4, 0, environ={PREFIX_TEMPLATE_ENV: ""}) == b"[default0]:"


def test_prefix_template_flag_over_the_environment_and_hostname_macro() -> None:
    # torchrun 2.14: --log-line-prefix-template wins over the variable; ${hostname} is the
    # short host name (socket.gethostname()); an empty flag leaves the variable in charge.
    import socket

    env = {PREFIX_TEMPLATE_ENV: "env ${rank}: "}
    assert make_prefix(4, 0, template="${hostname}:${rank}: ", environ=env) == (
        f"{socket.gethostname()}:4: ".encode()
    )
    assert make_prefix(4, 0, template="", environ=env) == b"env 4: "
    assert make_prefix(4, 0, template="", environ={}) == b"[default0]:"
    host_from_env = {PREFIX_TEMPLATE_ENV: "${hostname}|"}
    assert make_prefix(1, 1, environ=host_from_env) == f"{socket.gethostname()}|".encode()


def test_prefix_template_comes_from_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFIX_TEMPLATE_ENV, "<${local_rank}>")
    assert make_prefix(5, 2) == b"<2>"


# ---------------------------------------------------------------- sinks_for


def _console(tmp_path: Path, name: str = "console") -> tuple[int, Path]:
    path = tmp_path / name
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND), path


def test_sinks_for_inherits_when_nothing_is_asked(tmp_path: Path) -> None:
    assert sinks_for(0, 0, 0, 0, tmp_path, True) == (None, None)
    assert list(tmp_path.iterdir()) == []


def test_sinks_for_redirects_both_streams_to_files(tmp_path: Path) -> None:
    out, err = sinks_for(1, 5, int(Std.ALL), 0, tmp_path, True)
    assert isinstance(out, FileSink) and isinstance(err, FileSink)
    out.feed(b"to stdout")
    err.feed(b"to stderr")
    out.close()
    err.close()
    assert (tmp_path / "stdout.log").read_bytes() == b"to stdout"
    assert (tmp_path / "stderr.log").read_bytes() == b"to stderr"


def test_sinks_for_tees_stdout_and_redirects_stderr(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path, "console_out")
    out, err = sinks_for(2, 6, int(Std.ERR), int(Std.OUT), tmp_path, True, console_out=console)
    assert isinstance(out, TeeSink) and isinstance(err, FileSink)
    out.feed(b"shown\n")
    err.feed(b"only in the file\n")
    out.close()
    err.close()
    os.close(console)
    assert console_path.read_bytes() == b"[default2]:shown\n"
    assert (tmp_path / "stdout.log").read_bytes() == b"shown\n"
    assert (tmp_path / "stderr.log").read_bytes() == b"only in the file\n"


def test_sinks_for_stderr_tee_uses_the_stderr_console_and_given_prefix(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path, "console_err")
    out, err = sinks_for(0, 0, 0, int(Std.ERR), None, True, console_err=console, prefix=b"E> ")
    assert out is None and isinstance(err, TeeSink)
    err.feed(b"oops\n")
    err.close()
    os.close(console)
    assert console_path.read_bytes() == b"E> oops\n"


def test_sinks_for_hidden_rank_drops_unredirected_streams(tmp_path: Path) -> None:
    out, err = sinks_for(3, 3, int(Std.OUT), 0, tmp_path, False)
    assert isinstance(out, FileSink) and isinstance(err, NullSink)
    out.close()
    err.feed(b"dropped")
    err.close()
    (tmp_path / "again").mkdir()  # files are only ever new (O_EXCL): another rank's directory
    hidden_tee, _ = sinks_for(3, 3, 0, int(Std.OUT), tmp_path / "again", False)
    assert isinstance(hidden_tee, TeeSink)
    hidden_tee.close()
    with pytest.raises(FileExistsError):  # a file (or a planted link) there is never reused
        sinks_for(3, 3, int(Std.OUT), 0, tmp_path, False)


def test_sinks_for_redirect_without_a_log_dir_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no log directory"):
        sinks_for(0, 0, int(Std.OUT), 0, None, True)
