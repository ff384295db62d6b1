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
"""

from __future__ import annotations

import importlib
import sys
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

for _name in DEFERRED:
    if _name not in sys.modules:
        sys.modules[_name] = _Deferred(_name)
