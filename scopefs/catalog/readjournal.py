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

A lock is named only once it is locked (made unnamed, locked, then
linked), so a replay never finds a live mount's lock free. A replay takes
a dead mount's lock, lists its files again (final now), records and
removes them, the lock last; replays wait for each other. A batch the mount gave up on (its
last flush failed, or an unexpected error) keeps its files and its lock
name for the replay after the mount ends.

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
from typing import Any

from scopefs.catalog import ids
from scopefs.catalog.audit import AuditEvent
from scopefs.catalog.exposures import Exposed, record_batch
from scopefs.catalog.fsafe import lock_held, open_dir
from scopefs.catalog.home import Home

log = logging.getLogger("scopefs.readjournal")
FOLDER = "read-journals"
RUN_ID = "mount"  # the exposures' run: a mount's reads have no gateway run
MAX_LINE = 2048  # bytes of one journal line read back (ours are well under 1 KiB); longer ones are skipped
REPLAY_BATCH = 5000  # lines recorded per transaction: a long journal is read and recorded in bounded pieces
REPLAYING = ".replaying"  # the replays' own lock (a name no journal or mount lock can have)
MAX_AT = 1 << 62  # µs: a time a line may hold (SQLite's integers are 64-bit)
_NAME = re.compile(r"([a-z0-9]{1,64})(?:-([0-9]{1,12})\.jsonl|\.lock)")
_ID = re.compile(r"[A-Za-z0-9_:.-]{1,200}")
_EVENT_FIELDS = ("agent_id", "session_id", "subject_kind", "actor_id", "store_id", "revision_id")
# One encoder for every line: ``json.dumps`` with separators builds a new one per call, which was half of
# a line's cost, and a first read (every note of a cold ``grep -r``) writes a line.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _folder(home: Home) -> int:
    """The journals' folder, made if missing (0700), as a descriptor."""
    path = home.root / FOLDER
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    return open_dir(path)


class ReadJournal:
    """One live mount's journal: ``append`` as reads are served, ``take`` with each batch, then ``done``
    (committed) or ``given_up`` (dropped); ``close`` at the end.

    Used from the mount's trio thread only (reads and flushes run there), so
    it needs no lock of its own.
    """

    def __init__(self, home: Home) -> None:
        self._dir = _folder(home)
        try:
            self.token = ids.random_token()
            # Locked before it has a name: a replay can never take the lock of a mount that is starting.
            self._lock = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=self._dir)
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX)  # held for the life of the mount
                os.link(f"/proc/self/fd/{self._lock}", f"{self.token}.lock", dst_dir_fd=self._dir,
                        follow_symlinks=True)
            except BaseException:
                os.close(self._lock)
                raise
        except BaseException:
            os.close(self._dir)
            raise
        self._number = 0
        self._current: int | None = None
        self._written: list[str] = []  # files with lines whose batch is not known to be committed
        self._kept = False  # a batch was given up: its files wait for a replay after the mount

    def _name(self, number: int) -> str:
        return f"{self.token}-{number}.jsonl"

    def append(self, event: AuditEvent, exposed: Exposed) -> None:
        """One first read, on disk before its READ replies (one ``write``, no sync). OSError if the line
        is not all on disk (a full disk): a write that failed wrote nothing, and the next line goes to the
        same file; a short one closes the file, so nothing is appended to the torn line."""
        if self._current is None:
            self._number += 1
            name = self._name(self._number)
            self._current = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                                    0o600, dir_fd=self._dir)
            self._written.append(name)
        line = {k: getattr(event, k) for k in _EVENT_FIELDS}
        line["at"] = event.at
        line["resource_id"] = exposed.resource_id
        data = (_ENCODE(line) + "\n").encode()
        written = os.write(self._current, data)  # an error wrote nothing: the file stays the one to append to
        if written != len(data):  # a torn line: the replay skips it, and nothing is appended to it
            self._end_file()
            raise OSError(errno.ENOSPC, "the read journal's line was cut short")

    def _end_file(self) -> None:
        if self._current is not None:
            os.close(self._current)
            self._current = None

    def take(self) -> list[str]:
        """Every file written and not yet done: what the batch just taken from memory covers (with what an
        earlier batch put back). The next read starts a new file."""
        self._end_file()
        return list(self._written)

    def done(self, names: list[str]) -> None:
        """The batch covering ``names`` is committed: they go."""
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self._dir)
        gone = set(names)
        self._written = [n for n in self._written if n not in gone]

    def given_up(self, names: list[str]) -> None:
        """The batch covering ``names`` was dropped unrecorded: they stay for the replay after this mount,
        and no later batch removes them."""
        gone = set(names)
        self._written = [n for n in self._written if n not in gone]
        self._kept = self._kept or bool(names)

    def close(self) -> None:
        """The mount ends. With nothing left unrecorded the lock goes too; otherwise the files stay for
        ``replay`` (which this unlock allows)."""
        self._end_file()
        if not self._written and not self._kept:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.token}.lock", dir_fd=self._dir)
        os.close(self._lock)
        os.close(self._dir)


def _lines(dir_fd: int, name: str) -> Iterator[list[dict[str, Any]]]:
    """The well-formed lines of one journal file, in pieces of ``REPLAY_BATCH``; nothing if it went."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return  # another replay finished it
    with os.fdopen(fd, "rb") as stream:
        piece: list[dict[str, Any]] = []
        while raw := stream.readline(MAX_LINE + 1):
            if not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # over MAX_LINE (not ours), or torn at the end
                    raw = stream.readline(MAX_LINE + 1)
                continue
            line = _parsed(raw)
            if line is not None:
                piece.append(line)
            if len(piece) >= REPLAY_BATCH:
                yield piece
                piece = []
        if piece:
            yield piece


def _parsed(raw: bytes) -> dict[str, Any] | None:
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError):  # a line of nested brackets is not ours either
        return None
    if (isinstance(line, dict) and type(line.get("at")) is int and 0 <= line["at"] < MAX_AT
            and all(isinstance(line.get(k), str) and _ID.fullmatch(line[k])
                    for k in ("agent_id", "session_id", "revision_id", "resource_id"))
            and all(line.get(k) is None or (isinstance(line[k], str) and _ID.fullmatch(line[k]))
                    for k in ("subject_kind", "actor_id", "store_id"))):
        return line
    return None


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


def _journals(dir_fd: int) -> dict[str, list[str]]:
    """Token -> its journal files, in the order they were written (a token with only its lock: [])."""
    found: dict[str, list[tuple[int, str]]] = {}
    for name in os.listdir(dir_fd):
        match = _NAME.fullmatch(name)
        if match is not None:
            files = found.setdefault(match.group(1), [])
            if match.group(2) is not None:
                files.append((int(match.group(2)), name))
    return {token: [name for _number, name in sorted(files)] for token, files in found.items()}


def replay(home: Home) -> int:
    """Record the journals of mounts no longer running, and remove them; how many reads were recorded.

    Replays wait for each other (``REPLAYING``, which no mount takes), so one that returns has recorded
    every journal of a mount that had ended when it began: an audit answer is never short of them
    because another replay was still at work.
    """
    try:
        dir_fd = open_dir(home.root / FOLDER)
    except FileNotFoundError:
        return 0
    try:
        one_at_a_time = os.open(REPLAYING, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                dir_fd=dir_fd)
        try:
            fcntl.flock(one_at_a_time, fcntl.LOCK_EX)
            return sum(_replay_one(home, dir_fd, token) for token in _journals(dir_fd))
        finally:
            os.close(one_at_a_time)
    finally:
        os.close(dir_fd)


def waiting(home: Home) -> int:
    """How many journal files of mounts no longer running wait for a replay (``scopefs doctor``); changes
    nothing. A live mount's files, and a lock with no file, are not counted."""
    try:
        dir_fd = open_dir(home.root / FOLDER)
    except FileNotFoundError:
        return 0
    try:
        count = 0
        for token, files in _journals(dir_fd).items():
            if files and _free(dir_fd, f"{token}.lock"):
                count += len(files)
        return count
    finally:
        os.close(dir_fd)


def _free(dir_fd: int, lock_name: str) -> bool:
    """Whether the lock is there and nobody holds it (its mount ended)."""
    try:
        os.stat(lock_name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return not lock_held(lock_name, dir_fd=dir_fd)


def _replay_one(home: Home, dir_fd: int, token: str) -> int:
    """One mount's journal, if its lock is still there and nobody holds it."""
    lock_name = f"{token}.lock"
    try:
        lock = os.open(lock_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0  # a mount names its lock before any journal and removes it last: these are going now
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # a live mount's
        try:
            named = os.stat(lock_name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return 0  # finished while we opened it
        if (named.st_dev, named.st_ino) != (os.fstat(lock).st_dev, os.fstat(lock).st_ino):
            return 0
        # Listed again under the lock: the mount is gone, so this list is final (a file it wrote after the
        # first look is here too, and never left without its lock).
        files = _journals(dir_fd).get(token, [])
        recorded = sum(_record(home, piece) for name in files for piece in _lines(dir_fd, name))
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_name, dir_fd=dir_fd)
        if recorded:
            log.info("recorded %d read(s) a stopped mount had not recorded", recorded)
        return recorded
    finally:
        os.close(lock)
