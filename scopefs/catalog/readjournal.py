"""A mount's reads on disk until their audit is committed, so a killed mount loses none of them.

A mount records the exposures and audit rows of its reads in batches, a
second or a few after the reads (``vfs.follow``: a commit per read would
take the disk and a CPU from the reads it records). Held only in memory, a
batch died with a mount server that was killed meanwhile (SIGKILL, the OOM
killer, a crash), and ``audit impact`` then missed a session that had been
shown a revision. So each first read of a revision is also appended to the
mount's journal before the READ replies: one ``write`` of one line of ids,
without a sync (a killed process loses nothing the kernel holds, as for a
save under Decision 2; a power loss may lose the last lines). A journal
file goes once the batch that covers it is committed.

A live mount holds an exclusive ``flock`` on its lock file. A journal
whose lock nobody holds belonged to a mount that died: ``replay``, run by
every mount at its start and by ``scopefs audit`` before it answers,
records it into ``state.sqlite`` and removes it. A line whose exposure row
is already there (its batch was committed, the removal did not happen) is
skipped, so a replay never counts a read twice.

Layout: ``$SCOPEFS_HOME/read-journals/`` (0700) holds ``<token>.lock`` and
``<token>-<n>.jsonl`` (0600) per mount. A line holds ids and a time only:
the session, its agent, subject kind and actor, the store, the revision,
the resource, and when. No content, no path, no provider id.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from scopefs.catalog import ids
from scopefs.catalog.audit import AuditEvent
from scopefs.catalog.exposures import Exposed, record_batch
from scopefs.catalog.fsafe import open_dir
from scopefs.catalog.home import Home

log = logging.getLogger("scopefs.readjournal")
FOLDER = "read-journals"
RUN_ID = "mount"  # the exposures' run: a mount's reads have no gateway run
MAX_LINE = 2048  # bytes of one journal line read back (ours are well under 1 KiB)
MAX_FILE = 64 << 20  # bytes of one journal read back: a mount rotates every flush, so far fewer
_TOKEN = re.compile(r"[a-z0-9]{1,64}")
_NAME = re.compile(r"([a-z0-9]{1,64})(?:-([0-9]{1,12})\.jsonl|\.lock)")
_ID = re.compile(r"[A-Za-z0-9_:.-]{1,200}")
_EVENT_FIELDS = ("agent_id", "session_id", "subject_kind", "actor_id", "store_id", "revision_id")


def _folder(home: Home) -> int:
    """The journals' folder, made if missing (0700), as a descriptor."""
    path = home.root / FOLDER
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    return open_dir(path)


class ReadJournal:
    """One live mount's journal: ``append`` as reads are served, ``take`` with each batch, ``done`` after it.

    Used from the mount's trio thread only (reads and flushes run there), so
    it needs no lock of its own.
    """

    def __init__(self, home: Home) -> None:
        self._dir = _folder(home)
        self.token = ids.random_token()
        self._lock = os.open(f"{self.token}.lock", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                             dir_fd=self._dir)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # held for the life of the mount: nobody replays a live journal
        self._number = 0
        self._current: int | None = None
        self._written: list[str] = []  # files with lines whose batch is not known to be committed

    def _name(self, number: int) -> str:
        return f"{self.token}-{number}.jsonl"

    def append(self, event: AuditEvent, exposed: Exposed) -> None:
        """One first read, on disk before its READ replies (one ``write``, no sync)."""
        if self._current is None:
            self._number += 1
            name = self._name(self._number)
            self._current = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                                    0o600, dir_fd=self._dir)
            self._written.append(name)
        line = {**{k: v for k, v in asdict(event).items() if k in _EVENT_FIELDS}, "at": event.at,
                "resource_id": exposed.resource_id}
        os.write(self._current, (json.dumps(line, separators=(",", ":")) + "\n").encode())

    def take(self) -> list[str]:
        """Every file written and not yet done: what the batch just taken from memory covers (with what an
        earlier batch put back). The next read starts a new file."""
        if self._current is not None:
            os.close(self._current)
            self._current = None
        return list(self._written)

    def done(self, names: list[str]) -> None:
        """The batch covering ``names`` is committed: they go."""
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self._dir)
        self._written = [n for n in self._written if n not in names]

    def close(self) -> None:
        """The mount ends. With nothing left unrecorded the lock goes too; otherwise the files stay for
        ``replay`` (which this unlock allows)."""
        self.take()
        if not self._written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.token}.lock", dir_fd=self._dir)
        os.close(self._lock)
        os.close(self._dir)


def _lines(data: bytes) -> Iterator[dict[str, Any]]:
    for raw in data.split(b"\n"):
        if not raw or len(raw) > MAX_LINE:
            continue  # a torn last line, or not ours
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if (isinstance(line, dict) and isinstance(line.get("at"), int)
                and all(isinstance(line.get(k), str) and _ID.fullmatch(line[k])
                        for k in ("agent_id", "session_id", "revision_id", "resource_id"))
                and all(line.get(k) is None or (isinstance(line[k], str) and _ID.fullmatch(line[k]))
                        for k in ("subject_kind", "actor_id", "store_id"))):
            yield line


def _record(home: Home, lines: list[dict[str, Any]]) -> int:
    """The lines not recorded yet, as the mount would have recorded them; how many."""
    state = home.state()
    fresh = [line for line in lines if not state.execute(
        "SELECT 1 FROM exposures WHERE revision_id = ? AND session_id = ? AND at = ? AND run_id = ? LIMIT 1",
        (line["revision_id"], line["session_id"], line["at"], RUN_ID)).fetchall()]
    by_session: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in fresh:
        by_session.setdefault((line["session_id"], line["agent_id"]), []).append(line)
    for (session_id, agent_id), group in by_session.items():
        record_batch(state, session_id=session_id, agent_id=agent_id, run_id=RUN_ID, operation="read",
                     exposed=[Exposed(g["revision_id"], g["resource_id"]) for g in group],
                     at=[g["at"] for g in group],
                     audit=[AuditEvent("read", "allow", "allowed", at=g["at"],
                                       **{k: g.get(k) for k in _EVENT_FIELDS}) for g in group])
    return len(fresh)


def _read_file(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, MAX_FILE)
    finally:
        os.close(fd)


def replay(home: Home) -> int:
    """Record the journals of mounts no longer running, and remove them; how many reads were recorded."""
    try:
        dir_fd = open_dir(home.root / FOLDER)
    except FileNotFoundError:
        return 0
    recorded = 0
    try:
        tokens: dict[str, list[tuple[int, str]]] = {}
        for name in os.listdir(dir_fd):
            match = _NAME.fullmatch(name)
            if match is not None:
                files = tokens.setdefault(match.group(1), [])
                if match.group(2) is not None:
                    files.append((int(match.group(2)), name))
        for token, files in tokens.items():
            recorded += _replay_one(home, dir_fd, token, sorted(files))
    finally:
        os.close(dir_fd)
    return recorded


def _replay_one(home: Home, dir_fd: int, token: str, files: list[tuple[int, str]]) -> int:
    """One mount's journal, if no live mount holds its lock."""
    try:
        lock = os.open(f"{token}.lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        lock = None  # removed last by its mount or a replay: what is left was being removed
    try:
        if lock is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return 0  # a live mount's
                raise
        lines = [line for _number, name in files for line in _lines(_read_file(dir_fd, name))]
        recorded = _record(home, lines) if lines else 0
        for _number, name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
        if lock is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{token}.lock", dir_fd=dir_fd)
        if recorded:
            log.info("recorded %d read(s) a stopped mount had not recorded", recorded)
        return recorded
    finally:
        if lock is not None:
            os.close(lock)
