"""An immutable mapping whose edited copies share its bulk.

A mounted view is a picture of every note it shows (``catalog.visible``),
and each save through the mount makes the next picture from the last one
with one entry changed. Copying two dicts of ten thousand entries for that
took a millisecond per save and grew with the view, so a ``cp -r`` of a
tree into a mount cost time quadratic in its size. ``LayeredMap`` keeps a
large base dict that is never changed once built and a small top layer of
what changed since; an edit copies only the top, and once the top holds
more than the square root of the base's size the next picture is
flattened into a new base: about twice that root is copied per edit
(200 entries for a view of 10,000 notes, not 20,000).

Pictures are read on one thread while the next is made on another, so
nothing here is ever changed in place once ``MapEdit.done`` returned it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar, cast, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

_ABSENT: Any = object()  # not in the top layer: look in the base
_GONE: Any = object()  # removed from the base by the top layer

FLATTEN_MIN = 64  # a top layer of at most this many entries is never flattened (nor one of at most
# the square root of the base's size)


class _Layers(Generic[K, V]):
    """A base dict and a top layer of changes over it: how both a picture and an edit are read."""

    __slots__ = ()
    _base: dict[K, V]
    _top: dict[K, Any]

    def __getitem__(self, key: K) -> V:
        found = self._top.get(key, _ABSENT)
        if found is _ABSENT:
            return self._base[key]
        if found is _GONE:
            raise KeyError(key)
        return cast(V, found)

    def __contains__(self, key: object) -> bool:
        found = self._top.get(key, _ABSENT)  # type: ignore[arg-type]
        if found is _ABSENT:
            return key in self._base
        return found is not _GONE


class LayeredMap(_Layers[K, V], Mapping[K, V]):
    """A read-only mapping: a base dict shared between pictures, and this picture's own changes."""

    __slots__ = ("_base", "_top", "_len")

    def __init__(self, data: Mapping[K, V] | None = None) -> None:
        self._base: dict[K, V] = dict(data) if data is not None else {}
        self._top: dict[K, Any] = {}
        self._len = len(self._base)

    @classmethod
    def _of(cls, base: dict[K, V], top: dict[K, Any], length: int) -> LayeredMap[K, V]:
        made = cls.__new__(cls)
        made._base, made._top, made._len = base, top, length
        return made

    @overload
    def get(self, key: K, default: None = None) -> V | None: ...

    @overload
    def get(self, key: K, default: V | D) -> V | D: ...

    def get(self, key: K, default: Any = None) -> Any:
        found = self._top.get(key, _ABSENT)
        if found is _ABSENT:
            return self._base.get(key, default)
        return default if found is _GONE else found

    def __iter__(self) -> Iterator[K]:
        top = self._top
        if not top:
            yield from self._base
            return
        for key in self._base:
            if key not in top:
                yield key
        for key, value in top.items():
            if value is not _GONE:
                yield key

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"LayeredMap({dict(self.items())!r})"

    def edit(self) -> MapEdit[K, V]:
        """Changes to make the next picture from this one; this one stays as it is."""
        return MapEdit(self)


class MapEdit(_Layers[K, V], MutableMapping[K, V]):
    """The changes that turn one ``LayeredMap`` into the next (copies only the source's top layer)."""

    def __init__(self, source: LayeredMap[K, V]) -> None:
        self._base = source._base
        self._top: dict[K, Any] = dict(source._top)
        self._len = source._len

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self:
            self._len += 1
        self._top[key] = value

    def __delitem__(self, key: K) -> None:
        if key not in self:
            raise KeyError(key)
        self._len -= 1
        if key in self._base:
            self._top[key] = _GONE
        else:
            del self._top[key]

    def __iter__(self) -> Iterator[K]:
        return iter(LayeredMap._of(self._base, self._top, self._len))

    def __len__(self) -> int:
        return self._len

    def done(self) -> LayeredMap[K, V]:
        """The next picture: this edit's changes over the shared base, or a new base once they are many.

        The edit is used up: its changes now belong to the picture.
        """
        top, self._top = self._top, {}
        self._base, base = {}, self._base
        made = LayeredMap._of(base, top, self._len)
        self._len = 0
        if len(top) <= max(FLATTEN_MIN, math.isqrt(len(base))):
            return made
        return LayeredMap._of(dict(made.items()), {}, made._len)


def editing(source: Mapping[K, V]) -> MapEdit[K, V]:
    """An edit of ``source``, made a ``LayeredMap`` first if it is a plain mapping."""
    return (source if isinstance(source, LayeredMap) else LayeredMap(source)).edit()
