"""An editor's atomic save, in the standard library alone.

One copy of the code that every save benchmark times: ``fuse_bench.py``
imports it, and ``sandbox_writes.py`` sends this file's text to the
system's ``python3`` inside a sandbox, where nothing of this repository is
visible.

``plain``: no sync at all (nano, most tools); ``fsync``: the temp file is
fsynced before the rename (vim, atomic-write libraries); ``durable``: that,
and the folder is fsynced after the rename, so the save survives power
loss once it returns (what a database would do).
"""

from __future__ import annotations

import os

MODES = ("plain", "fsync", "durable")


def temp_of(path: str) -> str:
    """The temp file a save of ``path`` writes first, in the same folder."""
    directory, name = os.path.split(path)
    return os.path.join(directory, "." + name + ".tmp")


def save(path: str, data: bytes, mode: str) -> None:
    """Write ``data`` to a new temp file beside ``path`` and rename it over ``path``."""
    tmp = temp_of(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if mode != "plain":
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if mode == "durable":
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
