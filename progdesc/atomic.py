"""Writing a file or a directory whole or not at all, and cleaning up after killed writers.

A file is written to a hidden temporary beside it (``.NAME.<pid>-<hex>.tmp``), flushed
and fsynced, renamed over the target with `os.replace`, and the directory is fsynced. A
directory (an inference model) is written whole as such a temporary sibling and swapped
in with one atomic exchange (Linux ``renameat2(RENAME_EXCHANGE)``), so a failure or a
crash at any point leaves the old directory or the new one, never a mix. Where the OS or
the filesystem cannot exchange, two renames do it: a crash between them leaves the old
directory as ``.NAME.<pid>-<hex>.old`` beside the target, never removed by a later save
(a failure moves it back). A directory that also holds other files (not the ones
written, nor their temporaries) is not swapped: its files are all written as temporaries
first and then renamed in, so a failure (disk full) still leaves the old ones, but a crash
between the renames can mix them.

Each save first removes the temporaries of the same target whose writer process is gone
(the pid in the name is not alive, on this machine), or, for temporaries named before
pids were, that are over an hour old. Every failure to write raises `SaveError` naming
the path.
"""
import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import sys
import time

from lowering.errors import SaveError

_LEGACY_AGE_S = 3600   # temporaries named without a pid: removed once this old


class Pieces(tuple):
    """File contents given as a sequence of buffers (bytes, NumPy arrays...), written one
    after the other without first joining them into one copy. `len` is the byte count and
    `bytes()` joins them, as for bytes."""

    def __len__(self):
        return sum(memoryview(p).nbytes for p in self)

    def __bytes__(self):
        return b"".join(memoryview(p).cast("B") for p in self)


def _write_all(f, data):
    """Write `data` (bytes-like, or Pieces) to the open file `f` in pieces of at most 1 MiB
    (a seam for crash tests)."""
    for piece in (data if isinstance(data, Pieces) else (data,)):
        view = memoryview(piece).cast("B")
        for start in range(0, len(view), 1 << 20):
            f.write(view[start:start + (1 << 20)])


def fsync_dir(directory):
    """fsync a directory (its entries), where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temp_name(base):
    return f".{base}.{os.getpid()}-{secrets.token_hex(6)}.tmp"


def _is_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # PermissionError: someone else's live process
        return True
    return True


def _temporary_of(entry, base):
    """'pid', 'legacy' or None: whether `entry` is a temporary of target `base`."""
    prefix = f".{base}."
    if not entry.startswith(prefix):
        return None
    rest = entry[len(prefix):]
    if re.fullmatch(r"\d+-[0-9a-f]{12}\.tmp", rest):
        return "pid"
    return "legacy" if re.fullmatch(r"[0-9a-f]{12}\.tmp", rest) else None


def remove_stale_temporaries(directory, base):
    """Remove the temporaries of target `base` in `directory` whose writer is gone (see the
    module docstring); returns their names. Errors removing one are ignored."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        kind = _temporary_of(entry, base)
        if kind is None:
            continue
        path = os.path.join(directory, entry)
        try:
            if kind == "pid":
                if _is_alive(int(entry[len(base) + 2:].split("-", 1)[0])):
                    continue
            elif time.time() - os.lstat(path).st_mtime < _LEGACY_AGE_S:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(entry)
        except OSError:
            continue
    return removed


def makedirs(path):
    """`os.makedirs(path, exist_ok=True)`, with SaveError naming the path if it fails."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise _save_error(e, path) from e


def _save_error(err, path):
    """SaveError naming `path` for the OSError `err`."""
    if isinstance(err, SaveError):
        return err
    reason = err.strerror or str(err)
    return SaveError(f"cannot save '{os.fspath(path)}': {reason}", path=os.fspath(path),
                     errno=err.errno, strerror=err.strerror)


def _write_file(path, data, mode_from=None):
    """Create `path` (it must not exist) holding `data`, fsynced; permissions of `mode_from`
    (an existing file) when given."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        if mode_from is not None:
            with contextlib.suppress(FileNotFoundError):   # a replaced file keeps its mode
                os.fchmod(f.fileno(), os.stat(mode_from).st_mode & 0o7777)
        _write_all(f, data)
        f.flush()
        os.fsync(f.fileno())


def _as_bytes(data):
    return data.encode("utf-8") if isinstance(data, str) else data


def atomic_write(path, data):
    """Replace the file `path` by `data` (bytes, str or Pieces) atomically; SaveError naming the
    path if it cannot be written (the previous file is then left as it was)."""
    path = os.fspath(path)
    data = _as_bytes(data)
    directory, base = os.path.split(os.path.abspath(path))
    remove_stale_temporaries(directory, base)
    tmp = os.path.join(directory, _temp_name(base))
    try:
        try:
            _write_file(tmp, data, mode_from=path)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise _save_error(e, path) from e
    fsync_dir(directory)


def write_directory(path, files):
    """Make the directory `path` hold `files` ({name: bytes or str}) whole or not at all:
    see the module docstring. SaveError naming the path if it cannot be written."""
    path = os.fspath(path)
    try:
        _write_directory(os.path.realpath(path), {n: _as_bytes(d) for n, d in files.items()})
    except OSError as e:
        raise _save_error(e, path) from e


def _write_directory(target, files):
    parent, base = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temporaries(parent, base)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise SaveError(f"cannot save '{target}': it exists and is not a directory",
                        path=target, errno=errno.ENOTDIR)
    existing = os.listdir(target) if os.path.isdir(target) else None
    if existing and any(e not in files and not any(_temporary_of(e, n) for n in files)
                        for e in existing):
        return _write_files_in_place(target, files)
    tmp = os.path.join(parent, _temp_name(base))
    os.mkdir(tmp)
    try:
        if existing is not None:
            with contextlib.suppress(OSError):
                os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        for name, data in files.items():
            _write_file(os.path.join(tmp, name), data)
        fsync_dir(tmp)
        if existing is None:
            os.rename(tmp, target)
        else:
            _exchange(tmp, target)   # tmp now holds the old directory
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(parent)


def _write_files_in_place(target, files):
    """Write `files` into `target`, which holds other files too: every temporary first."""
    temps = {}
    try:
        for name, data in files.items():
            path = os.path.join(target, name)
            remove_stale_temporaries(target, name)
            temps[name] = os.path.join(target, _temp_name(name))
            _write_file(temps[name], data, mode_from=path)
        for name, tmp in temps.items():
            os.replace(tmp, os.path.join(target, name))
    finally:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    fsync_dir(target)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2():
    """libc's renameat2 (Linux, glibc 2.28+), or None."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def _exchange(a, b):
    """Swap the directories `a` and `b` atomically where the OS can, else by two renames
    (the old `b` is moved to `a` first, and moved back if the second rename fails)."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), b)
    aside = os.path.join(os.path.dirname(b), _temp_name(os.path.basename(b))[:-4] + ".old")
    os.rename(b, aside)
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(aside, b)
        raise
    os.rename(aside, a)
