"""What the mount server does not load: modules its libraries import but it never uses.

A session's mount is one process, and a gateway runs a hundred of them at
once, so every mebibyte a server holds idle counts a hundred times. trio
imports the standard ``ssl`` module (and with it libssl) for its TLS
streams; a mount server speaks FUSE and never opens a TLS stream, and
``ssl`` costs each server 2.2 MiB of resident memory. Importing this
module (``vfs.server`` does, before trio) puts a placeholder in its place:
the first attribute anyone reads from it imports the real module, so code
that does use TLS in the same process still works, only later. Once
something imported ``ssl`` for real, importing this changes nothing.

OpenSSL's hashes (``_hashlib``, and with it libcrypto: 3.5 MiB of every
server's resident memory) are set aside the same way, for a different
reason: ``hashlib`` and ``hmac`` fall back to Python's own SHA-256 when
``_hashlib`` cannot be imported, which hashes a note of a few KiB in a
few microseconds. That is all an idle mount, or one that reads and saves
notes, ever hashes. ``catalog.digests`` imports OpenSSL's on the first
large content (``sha256_for``), where its speed pays for loading it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
import time
import types
from typing import Any


class _Deferred(types.ModuleType):
    """A module that imports itself on the first attribute read from it."""

    def __getattr__(self, name: str) -> Any:
        real_name = self.__name__
        if sys.modules.get(real_name) is self:
            del sys.modules[real_name]
        real = importlib.import_module(real_name)
        self.__dict__.update({k: v for k, v in real.__dict__.items() if k not in ("__name__", "__spec__")})
        return getattr(real, name)


DEFERRED = ("ssl", "idna")  # trio's TLS streams; its host name encoding (a mount resolves no names)

SET_ASIDE = ("_hashlib",)  # OpenSSL's hashes: hashlib and hmac use their own (see above)

for _name in DEFERRED:
    if _name not in sys.modules:
        sys.modules[_name] = _Deferred(_name)
_NOT_IMPORTABLE: Any = None  # what an entry of None in sys.modules means to the import system
for _name in SET_ASIDE:
    sys.modules.setdefault(_name, _NOT_IMPORTABLE)


def give_back() -> None:
    """Return to the system the heap that starting up left free.

    Building the first view, recovery and the drain allocate and free a
    few MiB; glibc keeps freed heap for reuse, so without this an idle
    mount holds it for as long as it lives (about 0.4 MiB here). Called
    once the mount is announced; ctypes is already loaded (trio uses it).
    """
    gc.collect()
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to give back this way
        ctypes.CDLL(None).malloc_trim(0)


GROWN_BYTES = 512 << 10  # resident growth since the last give-back that is worth a collection
QUIET_CPU_S = 0.005  # CPU time over one look that still counts as idle


def resident_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGESIZE")


class Thrift:
    """Gives the heap back once a mount that grew while serving has gone quiet again.

    A woken mount grows by a few MiB (its worker threads' heaps, the
    catalog's pages, the request buffers) and glibc keeps all of it after
    the burst. ``due`` is asked about once a second: when this process
    used almost no CPU since the last look and its resident memory grew by
    half a MiB or more since the last give-back, it gives back. A busy mount is
    never interrupted by a collection, an idle one pays for one once.
    A mount first empties SQLite's page caches (``Home.release_memory``, on
    its catalog thread): up to 2 MiB per connection, which no ``malloc_trim``
    can return while SQLite holds them.
    """

    def __init__(self) -> None:
        self._baseline = 1 << 62  # lowered by every look (no /proc: ``look`` measures nothing)
        with contextlib.suppress(OSError, ValueError):
            self._baseline = resident_bytes()
        self._cpu = time.process_time()

    def due(self) -> bool:
        """Whether to give back now: quiet since the last look, and grown since the last give-back."""
        cpu, self._cpu = self._cpu, time.process_time()
        try:
            now = resident_bytes()
        except (OSError, ValueError):  # no /proc: nothing measured, nothing given back
            return False
        self._baseline = min(self._baseline, now)  # the low-water mark: startup's give-back lowered it
        return self._cpu - cpu <= QUIET_CPU_S and now - self._baseline >= GROWN_BYTES

    def give_back(self) -> None:
        """``give_back()``, and measure from what is left."""
        give_back()
        with contextlib.suppress(OSError, ValueError):
            self._baseline = resident_bytes()
        self._cpu = time.process_time()

    def look(self) -> None:
        """``give_back`` if ``due``."""
        if self.due():
            self.give_back()
