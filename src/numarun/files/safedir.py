"""Directories the launcher writes into, reached so that no other user can redirect a write.

A launcher running as root writes log files and makes directories for its workers; whoever can
rename an entry on the way to them (a directory of theirs, or one writable by others without
the sticky bit) or owns a symbolic link on the way could swap a directory for a link between
numarun's ``mkdir`` and its ``open`` and have root write into any file. Two rules close that:

* :func:`open_directory` walks a path one component at a time from ``/`` (or the current
  directory, for a relative path) with ``O_PATH | O_NOFOLLOW`` opens relative to the directory
  reached so far, following symbolic links itself, and refuses (:class:`UsageError`, one line)
  a path that passes through a directory or a symbolic link that another user could change: a
  directory owned by anyone but the caller's effective uid or root, or writable by others
  (group or other write bit) without the sticky bit -- the group bit is ignored for the
  caller's own private group (a group named after the user, with no other listed member: the
  ``umask 002`` of user-private-group systems) -- or a symbolic link owned by anyone but the
  caller or root. Every directory and link met is checked, the link targets' too, in the order
  the kernel would meet them, so a path the workers resolve later (``TORCHELASTIC_ERROR_FILE``)
  resolves the same way: no one but root and the caller can change what it reaches.
* Below that directory, numarun makes and opens everything relative to directory descriptors
  (:class:`Directory`): ``mkdirat`` then ``openat(O_DIRECTORY | O_NOFOLLOW)``, files with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a name swapped for a link anyway is never followed and a
  file planted in advance is never truncated.

Files named on the command line (``numarun topo --svg FILE``, ``plan --svg``, ``snapshot OUT``)
follow the same rules through :func:`replace_file`: their directory reached by
:func:`open_directory`, another user's link at the name refused, and the content written to a new
file beside it and renamed into place, so that a write that fails never truncates what was there.

The private per-user runtime directory of ``numarun stacks``
(:func:`numarun.stacks.dumps.runtime_dir`) follows the same ownership rule, stricter: it must
be the caller's own, mode 0700, not a link.
"""

from __future__ import annotations

import os
import stat

from numarun.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import BinaryIO

_OPEN_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = _OPEN_PATH | os.O_DIRECTORY
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup (ELOOP)
DIR_MODE = 0o755  # never writable by group or others, whatever the umask


class Directory:
    """An open directory: ``fd`` (``O_PATH``, never a link followed) and ``path``, the path it
    was reached by (what messages, workers and the summary are given).

    :meth:`make` and :meth:`open` reach a directory inside, :meth:`create` a new file;
    everything relative to ``fd``, nothing by path. ``close`` closes ``fd`` (twice is
    harmless); a ``with`` block closes it at its end.
    """

    __slots__ = ("fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    def make(self, name: str, mode: int = DIR_MODE) -> Directory:
        """Create the directory ``name`` inside this one and return it opened.

        Raises ``FileExistsError`` when ``name`` exists (nothing is reused) and
        :class:`UsageError` when what is there right after the ``mkdir`` is not the directory
        made (swapped for a link or another directory of someone else's)."""
        os.mkdir(name, mode, dir_fd=self.fd)
        return self.open(name)

    def open(self, name: str) -> Directory:
        """The directory ``name`` inside this one, which must be a real directory of the
        caller's (:class:`UsageError` otherwise: a link, a file, another user's)."""
        shown = os.path.join(self.path, name)
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=self.fd)
        except OSError as error:
            if error.filename is None:
                error.filename = shown
            raise _replaced(shown, error) from None
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            os.close(fd)
            raise UsageError(
                f"{shown} was replaced by a directory of uid {info.st_uid} while numarun was "
                "making it; nothing was written there"
            )
        return Directory(shown, fd)

    def create(self, name: str, mode: int = 0o644) -> int:
        """A new file ``name`` inside this one, open for writing (close-on-exec); its fd.

        ``O_EXCL | O_NOFOLLOW``: ``FileExistsError`` when anything (a link included) is there."""
        return os.open(name, _NEW_FILE, mode, dir_fd=self.fd)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _replaced(shown: str, error: OSError) -> UsageError | OSError:
    import errno

    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        return UsageError(
            f"{shown} was replaced by a symbolic link or a file while numarun was making it; "
            "nothing was written there"
        )
    return error


def open_directory(
    path: str, *, what: str, create: bool = False, for_file: str | None = None
) -> Directory:
    """Reach the directory ``path`` safely (see the module's rules); return it opened.

    ``what`` names ``path`` in the one-line :class:`UsageError` (``"--log-dir"``,
    ``"TMPDIR"``); with ``for_file``, the messages name that file (in ``path``) instead.
    With ``create``, missing directories on the way are made (mode 0755 less the umask) and
    removed again when the walk is refused further on; without it a missing one is an error.
    Raises :class:`UsageError` for an empty path, a component that is not a directory, more
    than 40 symbolic links, a directory or link another user could change, and a directory
    that cannot be made or opened (its ``strerror``).
    """
    if not path:
        raise UsageError(f"{what} is empty: name a directory")
    euid = os.geteuid()
    named = path if for_file is None else for_file
    itself = for_file is None  # the last directory is what is named, not the file's parent
    absolute = path.startswith("/")
    made: list[tuple[int, str]] = []  # (parent fd, name) of directories made here, in order
    current = -1
    shown = "/" if absolute else "."
    try:
        current = os.open("/" if absolute else ".", _OPEN_DIR)
        pending = [part for part in path.split("/") if part not in ("", ".")]
        _check_directory(os.fstat(current), shown, named, what, euid, last=itself and not pending)
        links = 0
        while pending:
            name = pending.pop(0)
            here = name if shown == "." else os.path.join(shown, name)
            try:
                fd = os.open(name, _OPEN_PATH, dir_fd=current)
            except FileNotFoundError:
                if not create:
                    raise UsageError(f"{what} {named!r}: {here} does not exist") from None
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=current)
                    made.append((os.dup(current), name))
                except FileExistsError:
                    pass  # made meanwhile (another launcher): checked below like any other
                fd = os.open(name, _OPEN_PATH, dir_fd=current)
            info = os.fstat(fd)
            if stat.S_ISLNK(info.st_mode):
                os.close(fd)
                if info.st_uid not in (0, euid):
                    raise UsageError(
                        f"{what} {named!r} is reached through the symbolic link {here} of "
                        f"another user (uid {info.st_uid}), who could point it anywhere; "
                        f"{_remedy(what)}"
                    )
                links += 1
                if links > _MAX_LINKS:
                    raise UsageError(f"{what} {named!r}: too many symbolic links (a loop?)")
                target = os.readlink(name, dir_fd=current)
                if target.startswith("/"):
                    os.close(current)
                    current = -1
                    current = os.open("/", _OPEN_DIR)
                    shown = "/"
                pending[:0] = [part for part in target.split("/") if part not in ("", ".")]
                if target.startswith("/"):
                    _check_directory(
                        os.fstat(current), shown, named, what, euid, last=itself and not pending
                    )
                continue
            if not stat.S_ISDIR(info.st_mode):
                os.close(fd)
                raise UsageError(
                    f"{'cannot create ' if create else ''}{what} {named!r}: {here} exists and is "
                    "not a directory"
                )
            if name == "..":
                here = os.path.normpath(os.path.join(shown, ".."))
            try:
                _check_directory(info, here, named, what, euid, last=itself and not pending)
            except UsageError:
                os.close(fd)
                raise
            os.close(current)
            current, shown = fd, here
        directory = Directory(path, current)
        current = -1
        return directory
    except UsageError:
        _remove_made(made)
        raise
    except OSError as error:
        _remove_made(made)
        raise UsageError(
            f"cannot create {what} {named!r}: {error.strerror or error}"
            if create
            else f"cannot open {what} {named!r}: {error.strerror or error}"
        ) from None
    finally:
        if current >= 0:
            os.close(current)
        for parent, _ in made:
            os.close(parent)


def replace_file(path: str, write: Callable[[BinaryIO], object], *, what: str) -> None:
    """Write a file named on the command line (``numarun topo --svg FILE``, ``numarun
    snapshot OUT``) so that no other user can redirect the write and a failing write leaves
    any existing ``path`` untouched.

    The directory holding ``path`` is reached by :func:`open_directory`'s rules (not made). A
    symbolic link at ``path`` is followed, by the same rules, when it is the caller's or
    root's, and refused when it is another user's (who could point it anywhere); a directory
    there is refused. ``write`` gets a new file made beside the target (``.NAME.<random>``,
    ``O_EXCL | O_NOFOLLOW``, mode 0666 less the umask, or an existing target's mode), which is
    then renamed over the target: a rename replaces a link planted meanwhile instead of
    following it. Raises :class:`UsageError` (one line) for each refusal and for an ``OSError``
    or ``UnicodeError`` of the write, after removing the new file; anything else ``write``
    raises propagates, the new file removed."""
    if not path:
        raise UsageError(f"{what} is empty: name a file")
    euid = os.geteuid()
    shown = path
    for _ in range(_MAX_LINKS):
        parent, name = os.path.split(path)
        if name in ("", ".", ".."):
            raise UsageError(f"{what} {shown!r} names a directory, not a file")
        directory = open_directory(parent or ".", what=what, for_file=shown)
        try:
            info = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        except OSError as error:
            directory.close()
            raise UsageError(f"cannot write {what} {shown!r}: {error.strerror}") from None
        if info is not None and stat.S_ISLNK(info.st_mode):
            target = os.readlink(name, dir_fd=directory.fd)
            directory.close()
            if info.st_uid not in (0, euid):
                raise UsageError(
                    f"{what} {shown!r} is reached through the symbolic link {path} of another "
                    f"user (uid {info.st_uid}), who could point it anywhere; {_remedy(what)}"
                )
            path = os.path.join(parent, target)
            continue
        with directory:
            if info is not None and not stat.S_ISREG(info.st_mode):
                raise UsageError(f"{what} {shown!r} exists and is not a regular file")
            keep = None if info is None or info.st_uid != euid else stat.S_IMODE(info.st_mode)
            _write_beside(directory, name, write, keep, f"{what} {shown!r}")
        return
    raise UsageError(f"{what} {shown!r}: too many symbolic links (a loop?)")


def _write_beside(
    directory: Directory,
    name: str,
    write: Callable[[BinaryIO], object],
    mode: int | None,
    shown: str,
) -> None:
    """``write`` into a new file beside ``name`` in ``directory``, renamed over ``name``."""
    for _ in range(100):
        temporary = f".{name[:200]}.{os.urandom(4).hex()}"
        try:
            fd = directory.create(temporary, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as error:
            raise UsageError(f"cannot write {shown}: {error.strerror}") from None
    else:
        raise UsageError(f"cannot write {shown}: no free temporary name beside it")
    try:
        with os.fdopen(fd, "wb") as out:
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            write(out)
        os.rename(temporary, name, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
    except BaseException as error:
        import contextlib

        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory.fd)
        if isinstance(error, OSError):
            raise UsageError(f"cannot write {shown}: {error.strerror or error}") from None
        if isinstance(error, UnicodeError):
            raise UsageError(f"cannot write {shown}: {error}") from None
        raise


def _remove_made(made: list[tuple[int, str]]) -> None:
    """Remove what a refused walk made, deepest first (it is empty: nothing was written)."""
    import contextlib

    for parent, name in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)


def _check_directory(
    info: os.stat_result, shown: str, path: str, what: str, euid: int, *, last: bool
) -> None:
    """Refuse a directory on the way to ``path`` (``last``: ``path`` itself) that another user
    could change."""
    subject = f"{what} {path!r}" if last else f"{what} {path!r} lies inside {shown}, which"
    if info.st_uid not in (0, euid):
        raise UsageError(
            f"{subject} belongs to another user (uid {info.st_uid}), who could swap "
            "directories for links and redirect numarun's writes; numarun writes only into "
            f"directories of yours or root's: {_remedy(what)}"
        )
    mode = info.st_mode
    if mode & stat.S_ISVTX:
        return  # others may add entries, never rename or remove ours
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not _private_group(info.st_gid)):
        raise UsageError(
            f"{subject} is writable by other users (mode {stat.S_IMODE(mode):o}) without the "
            "sticky bit: they could swap numarun's directories for links and redirect its "
            f"writes; {_remedy(what)}"
        )


def _remedy(what: str) -> str:
    if what == "TMPDIR":
        return "set TMPDIR to a directory of yours, or give --log-dir"
    return f"choose another {what}"


def _private_group(gid: int) -> bool:
    """True when ``gid`` is the caller's own private group: its effective gid, named after the
    user, listing no other member (user-private-group systems run with ``umask 002``)."""
    if gid != os.getegid():
        return False
    try:
        import grp
        import pwd

        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError, OSError):
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def remove_tree(path: str) -> None:
    """Remove the directory ``path`` and everything in it, never following a symbolic link;
    errors are ignored (what cannot be removed stays). :func:`shutil.rmtree` first; what it
    leaves (it holds two descriptors per level, so a launcher out of descriptors gets nowhere)
    is walked again holding one descriptor at a time."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _remove_one_at_a_time(path)


def _remove_one_at_a_time(path: str) -> None:
    try:
        with os.scandir(path) as listing:
            entries = [(entry.path, entry.is_dir(follow_symlinks=False)) for entry in listing]
    except OSError:
        return
    for entry, is_dir in entries:
        try:
            if is_dir:
                _remove_one_at_a_time(entry)
            else:
                os.unlink(entry)
        except OSError:
            pass
    import contextlib

    with contextlib.suppress(OSError):
        os.rmdir(path)
