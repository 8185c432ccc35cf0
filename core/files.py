"""Reading a file a user names, and writing one, so that neither can be turned against the process (often root):
`read_bounded` refuses a FIFO, a device or anything too large before waiting on it, and `write_atomic` never
follows a link another user planted. The rules: docs/design.md, "Files a user names". Messages name the path
and the limit, never a byte of the file.
"""

import contextlib
import errno
import os
import stat

from gpupin.core.errors import UsageError, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


class FileRefused(UsageError):
    """A file that is not read or written (exit 64). `reason` is the message without the path, for callers that
    name the file their own way."""

    def __init__(self, path: str, reason: str, hint: "str | None" = None) -> None:
        super().__init__(f"{printable(path)}: {reason}", hint)
        self.path = path
        self.reason = reason
        self.errno: int | None = None  # the OSError's, when opening or reading failed


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def kind(mode: int) -> str:
    """What a file is, in words ("a FIFO", "a directory"...)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _limit(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 and size % (1 << 20) == 0 else f"{size >> 10} KiB"


def _cannot(path: str, err: OSError, verb: str = "read") -> FileRefused:
    hint = {
        errno.ENOENT: "check the path",
        errno.EACCES: f"run as a user who may {verb} it, or give another file",
        errno.EPERM: f"run as a user who may {verb} it, or give another file",
        errno.ELOOP: "name the file itself, not a symbolic link to it",
    }.get(err.errno or 0, "give the path of a readable file" if verb == "read" else "write elsewhere")
    refused = FileRefused(path, f"cannot {verb} it: {err.strerror or err}", hint)
    refused.errno = err.errno
    return refused


def read_bounded(path: str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; FileRefused (64) for anything else, a file longer than `limit`,
    or one that cannot be opened."""
    if "\0" in path:
        raise FileRefused(path, "the path holds a NUL character", "give the path of a file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise _cannot(path, err) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(path, f"it is {kind(mode)}, not a regular file", "give the path of a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise _cannot(path, err) from None
    finally:
        os.close(fd)
    if size > limit:
        raise FileRefused(path, f"it is larger than {_limit(limit)}, the limit for this file", "check the path")
    return b"".join(chunks)


def read_text(path: str, limit: int) -> str:
    """read_bounded, as UTF-8 (bytes that are not UTF-8 kept as surrogate escapes, never echoed)."""
    return read_bounded(path, limit).decode("utf-8", "surrogateescape")


def same_file(st: os.stat_result, others: "Iterable[str]") -> "str | None":
    """The first of `others` that is the file `st` describes (device and inode), or None."""
    for other in others:
        try:
            o = os.stat(other)
        except (OSError, ValueError):
            continue
        if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
            return other
    return None


def write_atomic(path: str, data: bytes, protected: "Iterable[str]" = (), private: bool = False) -> None:
    """Write `data` to `path` all at once (see the module's text); FileRefused (64) when the target is a link, a
    file of `protected` (the files the project reads), or cannot be written. `private`: readable by its owner
    alone, whatever the mode of the file it replaces (it holds a secret)."""
    directory, name = os.path.split(path)
    if not name or name in (".", ".."):
        raise FileRefused(path, "names no file", "give a file name")
    try:
        dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(directory):
            raise FileRefused(
                path,
                f"its directory {printable(directory)} is a symbolic link, which is not followed for an output",
                "name the directory the link points to",
            ) from None
        raise _cannot(path, err, "write") from None
    try:
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise FileRefused(
                    path,
                    "it is a symbolic link, which is not followed for an output (another user may have planted it)",
                    "name the file the link points to",
                )
            read = same_file(st, protected)
            if read is not None:
                raise FileRefused(
                    path,
                    f"it is {printable(read)}, a file this project reads",
                    "write elsewhere, e.g. NAME.pinned.yml",
                )
            if stat.S_ISCHR(st.st_mode):  # /dev/null: written in place, as `>` does
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dfd)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                return
            if not stat.S_ISREG(st.st_mode):
                raise FileRefused(path, f"it is {kind(st.st_mode)}", "write to a regular file, or to stdout")
            mode = st.st_mode & 0o7777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        if private:
            mode &= 0o700
        tmp = f".{name[:200]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        with contextlib.suppress(OSError):  # some file systems do not sync a directory; the rename is done
            os.fsync(dfd)
    except OSError as err:
        raise _cannot(path, err, "write") from None
    finally:
        os.close(dfd)
