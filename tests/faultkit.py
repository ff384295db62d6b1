"""Helpers for the I/O fault-injection tests (tests/test_io_faults.py).

The faults are injected below the code under test, never inside it:

* ``strace -e inject=...`` makes the kernel-facing ``fsync``/``fdatasync``
  of the real ``scopefs`` process return EIO;
* a tiny tmpfs makes real writes fail with ENOSPC;
* an apsw VFS that inherits the default one fails SQLite's ``xWrite`` or
  ``xSync`` at the Nth call.

Everything else here only observes: it parses strace output, classifies the
synced paths, and queries the catalog for leftovers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import apsw

from scopefs.catalog.db import connect, scalar
from tests.conftest import ACCOUNT, ALICE_FACT, CHANNEL, MIKE1_SENDER, SCOPEFS, Cli, Result, build_scenario

STRACE = shutil.which("strace") or "/usr/bin/strace"


# -- a prepared home, cloned per run -------------------------------------------

@dataclass(frozen=True)
class Target:
    """One note to overwrite (or create) under fault."""

    name: str  # "replace" or "first"
    session: str
    path: str
    old: bytes | None  # the active content before the write; None for a first write


@dataclass(frozen=True)
class Prepared:
    """A home with the seed scenario built once; tests copy it per run."""

    template: Path
    agent: str
    replace: Target  # Alice's existing note: a new revision of it
    first: Target  # Mike's first note: lazy store, new resource, revision 1

    def target(self, name: str) -> Target:
        return {"replace": self.replace, "first": self.first}[name]

    def clone(self, dest: Path) -> Path:
        """A private copy of the template home at ``dest`` (must not exist)."""
        shutil.copytree(self.template, dest, symlinks=True)
        return dest


def prepare(root: Path) -> Prepared:
    """Build the scenario via the real CLI, plus a DM session that has never written."""
    cli = Cli(root)
    cli("init", check=True)
    scenario = build_scenario(cli)
    mike = cli.j("session", "open", "--agent", scenario.agent, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                 "--sender", MIKE1_SENDER)["session_id"]
    return Prepared(
        template=root,
        agent=scenario.agent,
        replace=Target("replace", scenario.alice_session, "private/notes/allergy.md", ALICE_FACT),
        first=Target("first", mike, "private/notes/first.md", None),
    )


# -- what a run left behind -------------------------------------------------------

def staging_entries(home: Path, agent: str) -> list[str]:
    return sorted(os.listdir(home / "agents" / agent / "staging"))


def catalog_leftovers(home: Path, agent: str) -> dict[str, int]:
    """Rows that a settled catalog must not hold: anything still pending."""
    conn = connect(home / "agents" / agent / "catalog.sqlite")
    try:
        return {
            "pending revisions": scalar(conn, "SELECT count(*) FROM revisions WHERE state = 'pending'"),
            "pending intents": scalar(conn, "SELECT count(*) FROM write_intents WHERE state = 'pending'"),
            "pending outbox rows": conn.execute(
                "SELECT count(*) FROM audit_outbox WHERE state = 'pending'").fetchall()[0][0],
        }
    finally:
        conn.close()


def one_line_error(result: Result) -> str | None:
    """None if ``result`` is a clean CLI failure (exit 1, one stderr line), else why not."""
    if result.code != 1:
        return f"exit code {result.code}, want 1"
    lines = result.err.splitlines()
    if len(lines) != 1 or not result.err.endswith("\n") or not lines[0].startswith("scopefs: "):
        return f"stderr is not one 'scopefs: ...' line: {result.err!r}"
    if "Traceback" in result.err:
        return f"stderr carries a traceback: {result.err!r}"
    return None


# -- strace ---------------------------------------------------------------------------

_PID = r"(?:\d+\s+)?"
# The staged file is created O_TMPFILE and linked later, so strace -y shows
# its fd as "staging/#<inode>" with a "(deleted)" mark, before and after the
# rename: one descriptor, one path, for the staged file and the artifact.
_SYNC = re.compile(_PID + r"(fsync|fdatasync)\((\d+)<(.*?)>(?:\(deleted\))?\)\s+=\s+(-?\d+)(.*)$")
_OPENAT = re.compile(_PID + r"openat\(.*?\"((?:[^\"\\]|\\.)*)\".*\)\s+=\s+(-?\d+)")


@dataclass(frozen=True)
class SyncCall:
    """One fsync/fdatasync as strace saw it (``-y`` resolves the fd to a path)."""

    index: int  # position among all sync calls of the run
    syscall: str
    path: str
    ok: bool
    injected: bool


@dataclass
class Trace:
    syncs: list[SyncCall] = field(default_factory=list)
    # first openat of each SQLite WAL file: index of the next sync call at that time
    wal_opened_before_sync: dict[str, int] = field(default_factory=dict)

    def injected(self) -> list[SyncCall]:
        return [c for c in self.syncs if c.injected]

    def count(self, syscall: str) -> int:
        return sum(1 for c in self.syncs if c.syscall == syscall)


def parse_trace(text: str) -> Trace:
    trace = Trace()
    for line in text.splitlines():
        if "resumed>" in line or "<unfinished" in line:
            raise AssertionError(f"interleaved strace output; the CLI is expected to be single-threaded: {line}")
        m = _SYNC.match(line)
        if m:
            syscall, _fd, path, ret, rest = m.groups()
            trace.syncs.append(SyncCall(len(trace.syncs), syscall, path, int(ret) == 0, "(INJECTED)" in rest))
            continue
        m = _OPENAT.match(line)
        if m and m.group(1).endswith("-wal") and int(m.group(2)) >= 0:
            trace.wal_opened_before_sync.setdefault(m.group(1), len(trace.syncs))
    return trace


def strace_cli(home: Path, args: list[str], *, stdin: bytes, trace_file: Path,
               inject: tuple[str, int] | None = None, timeout: float = 60) -> tuple[Result, Trace]:
    """Run the installed CLI under strace; ``inject=(syscall, n)`` fails the nth call with EIO.

    strace writes to ``trace_file`` only, so the CLI's stdout and stderr are
    exactly its own, and strace exits with the CLI's exit code.
    """
    cmd = [STRACE, "-f", "-qq", "-y", "-o", str(trace_file), "-e", "trace=fsync,fdatasync,openat"]
    if inject is not None:
        syscall, n = inject
        cmd += ["-e", f"inject={syscall}:error=EIO:when={n}"]
    env = {**os.environ, "SCOPEFS_HOME": str(home)}
    proc = subprocess.run([*cmd, SCOPEFS, *args], input=stdin, capture_output=True, env=env, timeout=timeout)
    result = Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", errors="replace"))
    text = trace_file.read_text()
    if "openat(" not in text:  # strace itself failed: the CLI never ran under it
        raise AssertionError(f"strace did not trace the CLI (exit {result.code}): {result.err!r}")
    return result, parse_trace(text)


def classify(home: Path, agent: str, path: str) -> str:
    """A stable name for a synced path (the random tokens differ per run)."""
    try:
        rel = Path(path).relative_to(home)
    except ValueError:
        return f"outside:{path}"
    parts = rel.parts
    agent_parts = ("agents", agent)
    if parts == ():
        return "home-dir"
    if parts == ("state.sqlite",):
        return "state-db"
    if parts == ("state.sqlite-wal",):
        return "state-wal"
    if parts == agent_parts:
        return "agent-dir"
    if parts[:2] == agent_parts:
        tail = parts[2:]
        if tail == ("catalog.sqlite",):
            return "catalog-db"
        if tail == ("catalog.sqlite-wal",):
            return "catalog-wal"
        if tail == ("staging",):
            return "staging-dir"
        if len(tail) == 2 and tail[0] == "staging":
            return "staging-file"
        if tail == ("memory-scopes", "v1"):
            return "scopes-dir"
        if tail[:2] == ("memory-scopes", "v1") and len(tail) == 3:
            return "store-dir"
        if tail[:2] == ("memory-scopes", "v1") and len(tail) == 4:
            return "artifact"
        if tail and tail[0] == "quarantine":
            return "quarantine"
    return f"other:{rel}"


CONTENT_FILES = frozenset({"staging-file", "artifact"})
SQLITE_DIRS = frozenset({"agent-dir", "home-dir"})


# -- tmpfs --------------------------------------------------------------------------------

@contextlib.contextmanager
def tmpfs(mountpoint: Path, options: str) -> Iterator[Path]:
    """A real tmpfs at ``mountpoint`` (root only), always unmounted afterwards."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def grow_tmpfs(mountpoint: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mountpoint)], check=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# -- an apsw VFS that fails at the Nth xWrite / xSync -------------------------------------

COMMIT = "commit"  # a kind of ``FaultPlan``: the failure comes after the commit reached the log whole
_WAL_FRAME_HEADER = 24  # bytes; a commit's last frame says the database's size in pages at [4:8], others 0


class FaultPlan:
    """Counts xWrite and xSync across every file of the VFS, and commits to a write-ahead log; fails one
    kind at call ``n``.

    ``sticky`` keeps failing every later call of that kind (a dead disk);
    otherwise only the nth call fails (a transient error). ``armed`` bounds
    the window: calls outside it are neither counted nor failed.

    ``COMMIT`` fails the xWrite of a commit's last page *after* writing it:
    SQLite reports the commit as failed and never indexes it, yet its frames
    sit whole at the end of the log, and a connection that opens the
    database after this process dies replays them. That is the commit a
    writer cannot trust either way (``writer.transaction._failed``).
    """

    def __init__(self, kind: str | None = None, n: int = 0, *, sticky: bool = False) -> None:
        self.kind, self.n, self.sticky = kind, n, sticky
        self.counts = {"xWrite": 0, "xSync": 0, COMMIT: 0}
        self.armed = False
        self.fired: list[tuple[str, str]] = []  # (kind, file) of each injected failure
        self.on_fire: Callable[[], None] | None = None  # called once, at the first failure

    def hit(self, kind: str, filename: str) -> None:
        if not self.armed:
            return
        self.counts[kind] += 1
        if kind != self.kind:
            return
        count = self.counts[kind]
        if count == self.n or (self.sticky and count > self.n):
            if not self.fired and self.on_fire is not None:
                self.on_fire()
            self.fired.append((kind, filename))
            raise apsw.IOError(f"injected {kind} failure #{count}")


class _FaultyFile(apsw.VFSFile):
    def __init__(self, plan: FaultPlan, base: str, name: str | apsw.URIFilename | None, flags: list[int]) -> None:
        self._plan = plan
        self._name = name.filename() if isinstance(name, apsw.URIFilename) else str(name)
        self._log = self._name.endswith("-wal")
        self._commit_page_next = False  # the last xWrite was a commit frame's header: its page follows
        super().__init__(base, name, flags)

    def xWrite(self, data: bytes, offset: int) -> None:
        self._plan.hit("xWrite", self._name)
        super().xWrite(data, offset)
        if not self._log:
            return
        if self._commit_page_next:  # SQLite writes a frame's header, then its page, apart
            self._commit_page_next = False
            self._plan.hit(COMMIT, self._name)
        elif len(data) == _WAL_FRAME_HEADER and int.from_bytes(data[4:8], "big"):
            self._commit_page_next = True

    def xSync(self, flags: int) -> None:
        self._plan.hit("xSync", self._name)
        super().xSync(flags)


class FaultyVFS(apsw.VFS):
    """Inherits the default VFS; only xWrite/xSync of opened files are intercepted."""

    _names = itertools.count()

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.vfs_name = f"scopefs-faulty-{os.getpid()}-{next(self._names)}"
        self._base = ""
        super().__init__(self.vfs_name, self._base)

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> _FaultyFile:
        return _FaultyFile(self.plan, self._base, name, flags)


@contextlib.contextmanager
def faulty_vfs(plan: FaultPlan) -> Iterator[str]:
    """Register a FaultyVFS for the block; yields its name for ``Home.open(vfs=...)``."""
    vfs = FaultyVFS(plan)
    try:
        yield vfs.vfs_name
    finally:
        vfs.unregister()
