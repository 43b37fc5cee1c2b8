"""Where pprobe writes files: relative to a directory opened once, never through a symlink.

An output folder may be shared (``PPROBE_OUTPUT=/tmp/...``), and a path is looked up again at
every ``open()``: another local user who can write somewhere along it could swap a folder for
a symlink, or plant one at a file's name, and make this user overwrite their own files. So,
as SQLite and OpenSSH do for their files:

- a run folder is opened once (:meth:`RunDir.open`, ``O_DIRECTORY | O_NOFOLLOW``) and every
  file and sub-folder of the run is made relative to that descriptor (``openat``): a folder
  renamed or replaced by a symlink mid-run does not redirect anything;
- a new file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (:meth:`RunDir.create`): a name
  that exists already, a planted symlink included, is refused, never followed or truncated;
- a file that is rewritten (meta.json, the ``LATEST`` pointer) is written whole under a fresh
  temporary name, then renamed over the old one (:meth:`RunDir.replace_atomic`): a reader sees
  the old or the new file, and a symlink at the name is replaced, not followed;
- a base folder that another user owns and others can write is refused
  (:func:`check_base`), with one clear line;
- folders are made 0700 and files 0600 unless ``PPROBE_PERMISSIONS`` widens them
  (:data:`PERMISSIONS`): dumps hold the user's data.

Descriptors are close-on-exec (Python's default), and a forked child inherits them: it writes
into the same folder as its parent.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Callable
from typing import TypeVar

#: PPROBE_PERMISSIONS -> (folder mode, file mode); the process umask may narrow them further.
PERMISSIONS = {
    "private": (0o700, 0o600),
    "group": (0o750, 0o640),
    "public": (0o755, 0o644),
}

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
T = TypeVar("T")
_HAVE_DIR_FD = os.open in os.supports_dir_fd and os.mkdir in os.supports_dir_fd


class UnsafeFolder(OSError):
    """A folder pprobe will not write in; ``strerror`` says why in one line."""


class RunDir:
    """A folder held open by its descriptor; names are relative to it, never followed.

    ``create(name)`` makes a new file exclusively, ``replace_atomic(name, data)`` rewrites one
    atomically, ``subdir(name)`` opens (making it if needed) a sub-folder as another RunDir.
    Where the platform has no ``dir_fd`` support, the same calls fall back to paths.
    """

    def __init__(self, path: str, fd: int | None, permissions: str = "private") -> None:
        self.path = path
        self.fd = fd
        self.permissions = permissions
        self.dir_mode, self.file_mode = PERMISSIONS[permissions]

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str, permissions: str = "private") -> RunDir:
        """Open the run folder ``path``: its last component must not be a symlink, and it
        must belong to this user (pprobe made it)."""
        fd = _open_dir(path, None, os.path.basename(path) or path)
        try:
            _check_owner(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, permissions)

    @classmethod
    def make(cls, parent: RunDir, name: str) -> RunDir:
        """Create the new folder ``name`` in ``parent`` (FileExistsError if it exists)."""
        _check_name(name)
        if _HAVE_DIR_FD and parent.fd is not None:
            os.mkdir(name, parent.dir_mode, dir_fd=parent.fd)
        else:
            os.mkdir(parent._path(name), parent.dir_mode)
        return parent._open_sub(name)

    def subdir(self, name: str) -> RunDir:
        """The sub-folder ``name``, made if missing (a child process may make it first)."""
        _check_name(name)
        try:
            if _HAVE_DIR_FD and self.fd is not None:
                os.mkdir(name, self.dir_mode, dir_fd=self.fd)
            else:
                os.mkdir(self._path(name), self.dir_mode)
        except FileExistsError:
            pass
        return self._open_sub(name)

    def _open_sub(self, name: str) -> RunDir:
        fd = _open_dir(self._path(name), self.fd, name)
        _check_owner(fd, self._path(name))
        return RunDir(self._path(name), fd, self.permissions)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------------ files
    def create(self, name: str) -> int:
        """A new file ``name`` opened for writing: O_CREAT|O_EXCL|O_NOFOLLOW, the file mode.

        Raises FileExistsError when anything (a symlink included) has that name."""
        _check_name(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        if _HAVE_DIR_FD and self.fd is not None:
            return os.open(name, flags, self.file_mode, dir_fd=self.fd)
        return os.open(self._path(name), flags, self.file_mode)

    def create_for(self, name: str, opener: Callable[[str], T]) -> T:
        """Create ``name`` as :meth:`create` does and hand ``opener`` a path that names that
        very file, for libraries that take paths only (``pyarrow.OSFile(path, "ab")``):
        /proc/self/fd/N, which reaches the file whatever happens to its folder's path since
        (the folder's own path where there is no /proc)."""
        fd = self.create(name)
        try:
            proc = f"/proc/self/fd/{fd}"
            return opener(proc if os.path.exists(proc) else self._path(name))
        finally:
            os.close(fd)

    def replace_atomic(self, name: str, data: bytes) -> None:
        """Write ``data`` to a new temporary file, then rename it to ``name``.

        The temporary name is fresh and created exclusively; on any failure it is removed and
        ``name`` keeps its old content. An ENOSPC short write is raised as ENOSPC."""
        tmp = f".{name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
        fd = self.create(tmp)
        try:
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            self.rename(tmp, name)
        except BaseException:
            self.unlink(tmp)
            raise

    def symlink_atomic(self, target: str, name: str) -> None:
        """Point the symlink ``name`` at ``target`` (made under a temporary name, renamed)."""
        tmp = f".{name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
        if _HAVE_DIR_FD and self.fd is not None and os.symlink in os.supports_dir_fd:
            os.symlink(target, tmp, dir_fd=self.fd)
        else:
            os.symlink(target, self._path(tmp))
        try:
            self.rename(tmp, name)
        except BaseException:
            self.unlink(tmp)
            raise

    def rename(self, src: str, dst: str) -> None:
        if _HAVE_DIR_FD and self.fd is not None and os.rename in os.supports_dir_fd:
            os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        else:
            os.replace(self._path(src), self._path(dst))

    def unlink(self, name: str) -> bool:
        """Remove the file ``name``; whether it was there."""
        try:
            if _HAVE_DIR_FD and self.fd is not None and os.unlink in os.supports_dir_fd:
                os.unlink(name, dir_fd=self.fd)
            else:
                os.unlink(self._path(name))
            return True
        except OSError:
            return False

    def rmdir(self, name: str) -> bool:
        """Remove the empty sub-folder ``name``; whether it could be."""
        try:
            if _HAVE_DIR_FD and self.fd is not None and os.rmdir in os.supports_dir_fd:
                os.rmdir(name, dir_fd=self.fd)
            else:
                os.rmdir(self._path(name))
            return True
        except OSError:
            return False

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            if _HAVE_DIR_FD and self.fd is not None and os.stat in os.supports_dir_fd:
                return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return os.lstat(self._path(name))
        except OSError:
            return None

    def _path(self, name: str) -> str:
        return os.path.join(self.path, name)

    def __repr__(self) -> str:
        return f"RunDir({self.path!r}, fd={self.fd})"


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until everything is written (a short write on a full disk raises ENOSPC)."""
    write_all_v(fd, [data])


#: The most buffers one writev takes (Linux's IOV_MAX).
IOV_MAX = 1024


def write_all_v(fd: int, pieces: list) -> None:
    """:func:`write_all` of the concatenation of ``pieces`` (bytes-like objects), with
    ``os.writev``: no joined copy is made."""
    views = [v for v in (memoryview(p).cast("B") for p in pieces) if v.nbytes]
    while views:
        n = os.writev(fd, views[:IOV_MAX])
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        i = 0
        while i < len(views) and n >= views[i].nbytes:
            n -= views[i].nbytes
            i += 1
        views = views[i:]
        if n:
            views[0] = views[0][n:]


def open_base(path: str, permissions: str = "private") -> RunDir:
    """The output folder (made if missing, symlinks along the user's own path followed),
    checked by :func:`check_base`."""
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        check_base(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return RunDir(path, fd, permissions)


def check_base(st: os.stat_result, path: str) -> None:
    """Refuse an output folder another user owns and others (group or world) can write.

    Such a user, or anyone who can write the folder, could rename pprobe's run folders and
    pointers away and put their own in place. A folder whose sticky bit is set and that root
    owns (``/tmp``) is fine: there only the owner of a name may rename or remove it.
    """
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is None or st.st_uid == uid:
        return
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
        raise UnsafeFolder(
            errno.EPERM,
            f"{path} is owned by another user (uid {st.st_uid}) and writable by others, who "
            "could replace or read what pprobe writes there; choose a folder of your own",
        )


def _open_dir(path: str, parent_fd: int | None, name: str) -> int:
    flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
    try:
        if _HAVE_DIR_FD and parent_fd is not None:
            return os.open(name, flags, dir_fd=parent_fd)
        return os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFolder(
                e.errno, f"{path} is not a folder (a symlink or a file is in its place)"
            ) from None
        raise


def _check_owner(fd: int, path: str) -> None:
    if not hasattr(os, "getuid"):
        return
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UnsafeFolder(errno.EPERM, f"{path} is not a folder of this user")


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or (os.sep != "/" and os.sep in name):
        raise ValueError(f"not a plain file name: {name!r}")
