"""Reading an OpenClaw agent's legacy layout, without following anything out of it.

What OpenClaw writes today (its docs, ``concepts/memory``, ``dreaming`` and
``session``): in the workspace ``USER.md``, ``MEMORY.md`` (or ``memory.md``),
``DREAMS.md`` (or ``dreams.md``) and everything under ``memory/`` (daily
notes, nested notes, ``memory/dreaming/<phase>/`` reports and the dreaming
machine state in ``memory/.dreams/``); in the state directory the session
index ``agents/<id>/sessions/sessions.json``, its transcripts
``<sessionId>.jsonl`` beside it, and the derived index databases
``agents/<id>/agent/openclaw-agent.sqlite`` and ``memory/<id>.sqlite``.

Only facts about files are gathered here (name, kind, size, SHA-256,
whether the bytes are UTF-8), plus one structural split: ``DREAMS.md``'s
machine-managed phase blocks, between ``<!-- openclaw:dreaming:<phase>:start -->``
and its ``:end -->``, are cut out as parts of their own (what the dreaming
sweep wrote from short-term recall and transcripts), by the markers alone.
Every folder is opened with ``O_NOFOLLOW`` below the root the operator
named, so a symlink is reported, never followed; a regular file with a
second name (a hard link, which may reach out of the tree) is reported,
not read for copying; files are opened with ``O_NOATIME`` where the
kernel allows it, so a dry run leaves even their access times alone;
every count, size and depth is bounded. Nothing here writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from scopefs.catalog.errors import BadInput
from scopefs.catalog.validity import read_validity

MAX_FILES = 20_000
MAX_DEPTH = 16
MAX_FILE_BYTES = 64 << 20  # a memory note or a transcript; larger ones are reported, not copied
MAX_INDEX_BYTES = 16 << 20  # sessions.json
MAX_KEY_BYTES = 512
CHUNK = 1 << 20

ROOT_NOTES = ("USER.md", "MEMORY.md", "memory.md", "DREAMS.md", "dreams.md")
DREAM_PHASES = ("diary", "light", "rem", "deep")
MACHINE_PHASES = ("light", "rem", "deep")  # cut out of DREAMS.md; the diary stays with the file
_MARKER = re.compile(rb"<!-- openclaw:dreaming:([a-z]{1,16}):(start|end) -->")
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Found:
    """One file (or one part of ``DREAMS.md``) of the legacy layout, by its facts only."""

    area: str  # "workspace" or "state"
    rel: str  # relative path, '/'-separated; a name that is not UTF-8 is shown with backslash escapes
    kind: str  # file | symlink | hard-link | other | unnamed | too-large
    size: int = 0
    sha256: str = ""  # of the bytes this entry would copy (the part, for a part)
    utf8: bool = True
    part: str = ""  # "" (the file), or a dreaming phase cut out of DREAMS.md
    source_sha256: str = ""  # of the whole file
    front_matter_ok: bool = True  # a malformed valid-until/superseded-by: no write would take it

    @property
    def source(self) -> str:
        return f"{self.area}/{self.rel}"

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.rel.split("/"))


@dataclass(frozen=True)
class SessionIndex:
    """``sessions.json``: which session keys name each session id (keys never leave this object)."""

    readable: bool
    keys_by_session: dict[str, tuple[str, ...]] = field(default_factory=dict)
    present: bool = True  # False: no state folder, or no ``sessions.json`` on the fixed path


@dataclass
class Layout:
    found: list[Found]
    sessions: SessionIndex
    sessions_dir: str  # relative to the state dir


def _display(name: bytes) -> tuple[str, bool]:
    try:
        return name.decode("utf-8"), True
    except UnicodeDecodeError:
        return name.decode("utf-8", "backslashreplace"), False


def _noatime_open(name: str | bytes, flags: int, dir_fd: int | None) -> int:
    """``os.open`` with ``O_NOATIME`` (a listing or read leaves the owner's access times alone), else without.

    ``O_NOATIME`` is only for the file's owner (or CAP_FOWNER): EPERM means
    we read as anyone may, and the kernel's own atime policy applies.
    """
    try:
        return os.open(name, flags | os.O_NOATIME, dir_fd=dir_fd)
    except PermissionError:
        return os.open(name, flags, dir_fd=dir_fd)


def open_dir_at(dir_fd: int | None, name: str | bytes) -> int:
    return _noatime_open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd)


def open_root(path: str) -> int:
    """The root the operator named (followed once, as they named it); BadInput if it is not a folder."""
    try:
        return _noatime_open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, None)
    except OSError:
        raise BadInput(f"not a readable folder: {path}") from None


@contextlib.contextmanager
def _opened_dir(dir_fd: int, name: str | bytes) -> Iterator[int | None]:
    try:
        fd = open_dir_at(dir_fd, name)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


class HardLinked(OSError):
    """A regular file with more than one name: the other may lie outside the tree the operator named."""


def read_file_at(root_fd: int, parts: tuple[str, ...], limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file below ``root_fd``, no component followed if it is a symlink."""
    fds: list[int] = []
    try:
        current = root_fd
        for name in parts[:-1]:
            current = open_dir_at(current, name)
            fds.append(current)
        fd = _noatime_open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, current)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError("not a regular file")
            if st.st_nlink > 1:
                raise HardLinked(parts[-1])
            chunks, size = [], 0
            while chunk := os.read(fd, CHUNK):
                size += len(chunk)
                if size > limit:
                    raise OSError("file grew past its limit")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


class _Walker:
    def __init__(self, area: str) -> None:
        self.area = area
        self.found: list[Found] = []

    def add(self, found: Found) -> None:
        if len(self.found) >= MAX_FILES:
            raise BadInput(f"the legacy layout holds more than {MAX_FILES} files; migrate it in parts")
        self.found.append(found)

    def entry(self, dir_fd: int, name: bytes, prefix: str, depth: int, root_fd: int) -> None:
        shown, ok = _display(name)
        rel = f"{prefix}{shown}"
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            self.add(Found(self.area, rel, "other"))
            return
        if not ok:
            self.add(Found(self.area, rel, "unnamed"))
        elif stat.S_ISLNK(st.st_mode):
            self.add(Found(self.area, rel, "symlink"))
        elif stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                self.add(Found(self.area, rel, "other"))
                return
            with _opened_dir(dir_fd, name) as sub:
                if sub is None:
                    self.add(Found(self.area, rel, "other"))
                    return
                self.walk(sub, f"{rel}/", depth + 1, root_fd)
        elif not stat.S_ISREG(st.st_mode):
            self.add(Found(self.area, rel, "other"))
        elif st.st_size > MAX_FILE_BYTES:
            self.add(Found(self.area, rel, "too-large", st.st_size))
        else:
            self.file(root_fd, rel)

    def walk(self, dir_fd: int, prefix: str, depth: int, root_fd: int) -> None:
        for name in sorted(os.listdir(dir_fd)):
            self.entry(dir_fd, os.fsencode(name), prefix, depth, root_fd)

    def file(self, root_fd: int, rel: str) -> None:
        try:
            data = read_file_at(root_fd, tuple(rel.split("/")))
        except HardLinked:
            self.add(Found(self.area, rel, "hard-link"))
            return
        except OSError:
            self.add(Found(self.area, rel, "other"))
            return
        whole = hashlib.sha256(data).hexdigest()
        utf8 = _is_utf8(data)
        for part, piece in parts_of(self.area, rel, data):
            self.add(Found(self.area, rel, "file", len(piece), hashlib.sha256(piece).hexdigest(), utf8, part, whole,
                           _front_matter_ok(piece)))


def _front_matter_ok(data: bytes) -> bool:
    """Whether the write path would take these bytes' front matter (``catalog.validity``: bounded, structural)."""
    try:
        read_validity(data)
    except BadInput:
        return False
    return True


def parts_of(area: str, rel: str, data: bytes) -> list[tuple[str, bytes]]:
    """What one file is copied as: itself, or (``DREAMS.md``) its parts cut at the dreaming markers."""
    if area == "workspace" and rel in ("DREAMS.md", "dreams.md") and _is_utf8(data):
        return split_dreams(data)
    return [("", data)]


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def split_dreams(data: bytes) -> list[tuple[str, bytes]]:
    """``DREAMS.md`` as ("", the file without its light/rem/deep blocks) and one (phase, blocks) per phase.

    By the markers alone. Damaged markers (an end without its start, a
    start without its end, nesting, an unknown phase) give the whole file as
    one part named ``damaged``: it is not cut where nobody can say what a
    block holds.
    """
    kept: list[bytes] = []
    cut: dict[str, list[bytes]] = {}
    pos, open_phase, open_at = 0, "", 0
    for match in _MARKER.finditer(data):
        phase, edge = match.group(1).decode("ascii"), match.group(2)
        if phase not in DREAM_PHASES:
            return [("damaged", data)]
        if edge == b"start":
            if open_phase:
                return [("damaged", data)]
            open_phase, open_at = phase, match.start()
            continue
        if phase != open_phase:
            return [("damaged", data)]
        if phase in MACHINE_PHASES:
            kept.append(data[pos:open_at])
            cut.setdefault(phase, []).append(data[open_at:match.end()] + b"\n")
            pos = match.end()
            if data[pos:pos + 1] == b"\n":
                pos += 1
        open_phase = ""
    if open_phase:
        return [("damaged", data)]
    kept.append(data[pos:])
    return [("", b"".join(kept)), *((phase, b"".join(cut[phase])) for phase in MACHINE_PHASES if phase in cut)]


def _read_index(state_fd: int, sessions_parts: tuple[str, ...]) -> SessionIndex:
    try:
        raw = read_file_at(state_fd, (*sessions_parts, "sessions.json"), MAX_INDEX_BYTES)
    except FileNotFoundError:
        return SessionIndex(True, present=False)
    except OSError:
        return SessionIndex(False)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return SessionIndex(False)
    if not isinstance(doc, dict):
        return SessionIndex(False)
    keys: dict[str, list[str]] = {}
    for key, entry in doc.items():
        if not isinstance(entry, dict) or len(key.encode("utf-8", "replace")) > MAX_KEY_BYTES:
            return SessionIndex(False)
        sid = entry.get("sessionId")
        if isinstance(sid, str) and _SESSION_ID.fullmatch(sid):
            keys.setdefault(sid, []).append(key)
    return SessionIndex(True, {sid: tuple(k) for sid, k in keys.items()})


def scan(workspace: str, state_dir: str | None, openclaw_agent: str, shared: tuple[str, ...]) -> Layout:
    """Every file of the legacy layout the migration knows, by its facts (module docstring)."""
    ws = _Walker("workspace")
    ws_fd = open_root(workspace)
    try:
        names = set(os.listdir(ws_fd))
        for name in ROOT_NOTES:
            if name in names:
                ws.entry(ws_fd, name.encode(), "", 0, ws_fd)
        if "memory" in names:
            ws.entry(ws_fd, b"memory", "", 0, ws_fd)
        listed = {f.rel for f in ws.found}
        for rel in shared:
            if rel not in listed and not rel.startswith("memory/"):
                parts = rel.split("/")
                with _fixed_path(None, ws_fd, parts[:-1]) as parent:
                    if parent is None:
                        raise BadInput(f"--shared names no file of the workspace: {rel}")
                    ws.entry(parent, parts[-1].encode(), "/".join(parts[:-1]) + "/" if len(parts) > 1 else "", 0,
                             ws_fd)
    finally:
        os.close(ws_fd)
    found = ws.found
    sessions_parts = ("agents", openclaw_agent, "sessions")
    index = SessionIndex(True, present=False)  # no state folder: nobody can say who talked to this agent
    if state_dir is not None and os.path.isdir(state_dir):
        st = _Walker("state")
        state_fd = open_root(state_dir)
        try:
            index = _read_index(state_fd, sessions_parts)
            for where in (list(sessions_parts), ["agents", openclaw_agent, "agent"], ["memory"]):
                with _fixed_path(st, state_fd, where) as folder:
                    if folder is None:
                        continue
                    if where == ["memory"]:
                        for name in sorted(os.listdir(folder)):
                            if name.startswith(f"{openclaw_agent}.sqlite"):
                                st.entry(folder, os.fsencode(name), "memory/", 0, state_fd)
                    else:
                        st.walk(folder, "/".join(where) + "/", 0, state_fd)
        finally:
            os.close(state_fd)
        found = found + st.found
    return Layout(found, index, "/".join(sessions_parts))


def _blocked(walker: _Walker | None, rel: str, kind: str) -> None:
    if walker is not None and not any(f.rel == rel for f in walker.found):  # ``agents`` blocks two paths: once
        walker.add(Found(walker.area, rel, kind))


@contextlib.contextmanager
def _fixed_path(walker: _Walker | None, root_fd: int, parts: list[str]) -> Iterator[int | None]:
    """A fixed folder of OpenClaw's state, each component a real folder; what stands in its way is listed
    (to ``walker``; None: nothing is listed, as for the folders of a ``--shared`` path, which must be real).

    A symlinked ``agents/<id>/sessions`` (or a FIFO where a folder belongs)
    is neither followed nor silently passed over: it becomes an item of its
    own (skipped, with its reason), and the session index behind it counts
    as unreadable (``_read_index`` opens the same path without following).
    """
    fds: list[int] = []
    try:
        current = root_fd
        for n, name in enumerate(parts):
            try:
                st = os.stat(name, dir_fd=current, follow_symlinks=False)
            except FileNotFoundError:
                yield None
                return
            except OSError:
                _blocked(walker, "/".join(parts[:n + 1]), "other")
                yield None
                return
            if not stat.S_ISDIR(st.st_mode):
                _blocked(walker, "/".join(parts[:n + 1]), "symlink" if stat.S_ISLNK(st.st_mode) else "other")
                yield None
                return
            try:
                current = open_dir_at(current, name)
            except OSError:
                _blocked(walker, "/".join(parts[:n + 1]), "other")
                yield None
                return
            fds.append(current)
        yield current
    finally:
        for fd in fds:
            os.close(fd)


