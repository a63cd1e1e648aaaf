"""The deploy agent's error and its careful file operations (stdlib only, Python 3.8+).

Every write of the agent goes through these: created private (0600, O_EXCL), written
whole and fsync'd, replaced by one rename; a failure names the file the user knows (never
our temporary copy, marked with ``TMP_TAG`` so a later run can sweep it).
"""

import errno
import json
import os

TMP_TAG = ".ddtree-tmp-"  # marks our temporary files, so a rerun can sweep leftovers
FS_IOC_GETFLAGS = 0x80086601  # linux/fs.h, _IOR('f', 1, long) on 64-bit
FS_IMMUTABLE_FL = 0x00000010
FS_APPEND_FL = 0x00000020


class AgentError(Exception):
    """A refused or failed request; ``code`` is a stable slug the client maps
    (``bad-state-dir`` is bad input: exit 2 on the client)."""

    def __init__(self, code, message, **extra):
        Exception.__init__(self, message)
        self.code = code
        self.message = message
        self.extra = extra


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def write_private(path, data):
    """Create ``path`` (must not exist) as 0600 and write ``data`` durably.

    O_EXCL + mode 0600 means nobody else can read or pre-create it, whatever the umask.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_quietly(path)  # a partial file (ENOSPC, EFBIG) never stays behind
        raise
    os.close(fd)


def remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_json_atomic(path, document):
    """Replace ``path`` with ``document``: a reader sees the old or the new JSON, never half.
    An OSError names ``path`` (not the temporary copy)."""
    tmp = "%s%s%d" % (path, TMP_TAG, os.getpid())
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        write_private(tmp, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode())
        try:
            os.replace(tmp, path)
        except BaseException:
            remove_quietly(tmp)
            raise
        fsync_dir(os.path.dirname(path))
    except OSError as exc:
        raise located(exc, path)


def makedirs_private(path):
    os.makedirs(path, mode=0o700, exist_ok=True)


def inode_flags(path):
    """The inode's attribute flags (``lsattr``), or None where the file system has none.

    Opened O_NOFOLLOW|O_NONBLOCK so a symlink or a FIFO never makes this block or look
    elsewhere.
    """
    try:
        import fcntl
        import struct
    except ImportError:  # pragma: no cover - not Linux
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buf = fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("l", 0))
        return struct.unpack("l", buf)[0]
    except (OSError, struct.error):
        return None  # ENOTTY: this file system keeps no such flags (nothing can be immutable)
    finally:
        os.close(fd)


def frozen(path):
    """'immutable' or 'append-only' when chattr made ``path`` unreplaceable, else None."""
    flags = inode_flags(path)
    if flags is None:
        return None
    if flags & FS_IMMUTABLE_FL:
        return "immutable"
    if flags & FS_APPEND_FL:
        return "append-only"
    return None


def errno_name(exc):
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def describe_os_error(exc, where=None):
    """``<file>: <strerror> (errno ENOSPC)``, for a failure the user must act on; ``where`` (a
    path) names the file when the error does not. Never a step's name: the message that
    embeds this one names the step (else it would say it twice: ``lock: lock: ...``)."""
    where = exc.filename or where
    what = "%s (errno %s)" % (exc.strerror or exc, errno_name(exc))
    return "%s: %s" % (where, what) if where else what


def located(exc, path):
    """``exc`` (an OSError) naming ``path``, the file the user knows, when it names no file or
    only our temporary copy of it (TMP_TAG); returned for ``raise``."""
    if exc.filename is None or TMP_TAG in os.path.basename(str(exc.filename)):
        exc.filename = path
    return exc
