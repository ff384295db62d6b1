"""Helpers for the crash and power-loss tests.

* ``writer_stopped_at``: a real writer process (the production
  ``write_note``) that stops at one ``writer.steps.Step`` checkpoint and
  waits there, so the parent can SIGKILL it or cut the power under it.
* ``LoopExt4``: a small loop-mounted ext4 whose power can be cut with
  ``FS_IOC_SHUTDOWN`` (NOLOGFLUSH: nothing that was not already committed to
  the journal survives), then remounted the way a reboot would.
* ``snapshot`` / ``diff_snapshots`` (from conftest): a logical picture of
  a home to prove that ``doctor`` without ``--fix`` changes nothing.
* ``verify_recovered``: the "old or new, never pending or staged, nothing
  committed lost" checks every interrupted write must pass after repair.

Nothing is mocked: the child runs the installed code on real SQLite files,
and the checks read the catalog from byte copies so they never disturb the
home they inspect.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from scopefs.writer.steps import WRITE_STEPS, Step
from tests.conftest import ACCOUNT, CHANNEL, MIKE1_SENDER, Cli, build_scenario, db_copy, sqlite_int

REPO = Path(__file__).resolve().parents[1]
AGENT = "main"
STEPS: tuple[Step, ...] = WRITE_STEPS  # in the order the transaction passes them
STORE_STEPS = frozenset({Step.STORE_DIR_MADE, Step.STORE_ROW})
# A durable write records a pending revision (two transactions); a close through a mount leaves a marker
# and commits once (``writer.transaction._commit_once``). Each passes only its own of the two.
ONLY_DURABLE, ONLY_CLOSE = Step.PENDING, Step.MARKED

ALICE_V2 = b"Alice's private fact, revised: allergic to hazelnuts and kiwi (canary A1c3)\n"
AFTER = b"written after recovery, by a normal writer\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_bytes(step: Step) -> bytes:
    """The content of the interrupted write; distinct per step to rule out mix-ups."""
    return f"new revision from a writer interrupted at {step.value}\n".encode()


def locator_like_name() -> str:
    """A name shaped like a real locator ([a-z2-7]{26}), the hardest orphan to spot."""
    return base64.b32encode(os.urandom(20)).decode().lower()[:26]


# -- the base home ----------------------------------------------------------

@dataclass(frozen=True)
class Base:
    """A finished home: the seed's scenario plus a second revision and an unused DM.

    Alice's ``private/notes/allergy.md`` has two committed revisions (one
    superseded, one active), Bob and the group each have one, and Mike's DM
    session has no store yet, so his first write creates one lazily.
    """

    home: Path
    alice: str
    bob: str
    alice_session: str
    bob_session: str
    group_session: str
    mike_session: str


def build_base(home: Path) -> Base:
    cli = Cli(home)
    cli("init", check=True)
    sc = build_scenario(cli, AGENT)
    cli.j("write", sc.alice_session, "private/notes/allergy.md", stdin=ALICE_V2)
    mike_session = cli.j("session", "open", "--agent", AGENT, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                         "--sender", MIKE1_SENDER)["session_id"]
    with db_copy(home / "agents" / AGENT / "catalog.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM stores WHERE audience_id = ?", (sc.mike1,)).fetchall()[0][0] == 0, \
            "precondition: Mike has no store before his first write"
        states = sorted(r[0] for r in conn.execute("SELECT state FROM revisions"))
    assert states == ["active", "active", "active", "superseded"], states
    return Base(home, sc.alice, sc.bob, sc.alice_session, sc.bob_session, sc.group_session, mike_session)


def copy_home(base: Base, dest: Path) -> Path:
    """A private copy of the base home (modes kept: the home must stay 0700)."""
    shutil.copytree(base.home, dest, symlinks=True)
    return dest


@dataclass(frozen=True)
class WriteCase:
    """One kind of write to interrupt."""

    name: str
    session: str  # attribute of Base
    path: str
    old: bytes | None  # the bytes a reader saw before; None for a new note

    def steps(self, *, durable: bool = True) -> tuple[Step, ...]:
        """The checkpoints this write passes (only a first store write makes a store)."""
        skipped = {ONLY_CLOSE if durable else ONLY_DURABLE} | (set() if self.name == "new-store" else STORE_STEPS)
        return tuple(s for s in STEPS if s not in skipped)

    def session_id(self, base: Base) -> str:
        return str(getattr(base, self.session))


NEW_STORE = WriteCase("new-store", "mike_session", "private/notes/first.md", None)
NEW_NOTE = WriteCase("new-note", "alice_session", "private/notes/second.md", None)
OVERWRITE = WriteCase("overwrite", "alice_session", "private/notes/allergy.md", ALICE_V2)


def case_steps(*cases: WriteCase, durable: bool = True) -> list[Any]:
    """pytest params (case, step) for every checkpoint each case passes (a close's, unless ``durable``)."""
    return [pytest.param(case, step, id=f"{case.name}-{step.value}")
            for case in cases for step in case.steps(durable=durable)]


def case_durable_steps(*cases: WriteCase) -> list[Any]:
    """pytest params (case, step, durable): every checkpoint of a durable write, then of a close."""
    return [pytest.param(case, step, durable, id=f"{'durable' if durable else 'unsynced'}-{case.name}-{step.value}")
            for durable in (True, False) for case in cases for step in case.steps(durable=durable)]


def allowed_outcomes(case: WriteCase, step: Step, *, durable: bool = True) -> set[str]:
    """What a reader may see after an interruption at ``step``.

    Until ACTIVATED nothing was acknowledged and recovery rolls the write
    back (it cannot prove a dead writer's fsync succeeded); once ACTIVATED
    was reached the write was acknowledged and must be visible, unless it
    was not ``durable`` and the interruption was a power loss: then it
    may be lost, never more.
    """
    before = "absent" if case.old is None else "old"
    if STEPS.index(step) < STEPS.index(Step.ACTIVATED):
        return {before}
    return {"new"} if durable else {"new", before}


# -- the interrupted writer ------------------------------------------------

_CHILD = r"""
import os, sys
from pathlib import Path
os.umask(0o077)  # as the CLI does
from scopefs.catalog.home import Home
from scopefs.writer import steps
from scopefs.writer.transaction import write_note

home_dir, session_id, path, target = sys.argv[1:5]
data = bytes.fromhex(sys.argv[5])
durable = sys.argv[6] == "durable"

def stop_here(step):
    if step.value == target:
        os.write(1, step.value.encode() + b"\n")
        os.read(0, 1)  # wait here for SIGKILL
        os._exit(70)  # the parent vanished without killing us: never run the rest

steps.set_hook(stop_here)
write_note(Home.open(Path(home_dir)), session_id, path, data, durable=durable)
os.write(1, b"finished without stopping\n")
"""


class StoppedWriter:
    """A writer process parked at a checkpoint, waiting to be killed."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def kill(self) -> None:
        """SIGKILL, and prove it was the kill (not an exit) that ended it."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode


@contextlib.contextmanager
def writer_stopped_at(home: Path, session_id: str, path: str, data: bytes, step: Step, *,
                      durable: bool = True) -> Iterator[StoppedWriter]:
    """Run the real ``write_note`` in a child and hold it at ``step`` (a close through a mount's
    write, synced nothing, unless ``durable``)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(home), session_id, path, step.value, data.hex(),
         "durable" if durable else "unsynced"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line != step.value.encode() + b"\n":
            os.kill(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            raise AssertionError(f"the writer did not stop at {step.value}: stdout {line!r}, "
                                 f"stderr {err.decode(errors='replace')[-2000:]}")
        yield StoppedWriter(proc)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()


# -- reading the catalog without touching the home --------------------------

def catalog_path(home: Path, agent: str = AGENT) -> Path:
    return home / "agents" / agent / "catalog.sqlite"


@dataclass(frozen=True)
class Rev:
    revision_id: str
    resource_id: str
    store_id: str
    path_key: str
    locator: str
    state: str
    sha256: str
    size: int


def revisions(home: Path, agent: str = AGENT) -> list[Rev]:
    with db_copy(catalog_path(home, agent)) as conn:
        rows = conn.execute(
            "SELECT v.revision_id, v.resource_id, s.store_id, r.path_key, v.locator, v.state, v.content_sha256, v.size"
            " FROM revisions v JOIN resources x ON x.resource_id = v.resource_id"
            " JOIN stores s ON s.store_id = x.store_id JOIN storage_roots r ON r.storage_root_id = s.storage_root_id"
            " ORDER BY v.created_at").fetchall()
    return [Rev(*cast(tuple[Any, ...], row)) for row in rows]


def committed(home: Path, agent: str = AGENT) -> list[Rev]:
    return [r for r in revisions(home, agent) if r.state in ("active", "superseded")]


def the_revision(home: Path, content: bytes, state: str = "active") -> Rev:
    """The one revision in ``state`` holding ``content``."""
    found = [r for r in revisions(home) if r.sha256 == sha256(content) and r.state == state]
    assert len(found) == 1, found
    return found[0]


def artifact_path(home: Path, rev: Rev, agent: str = AGENT) -> Path:
    return home / "agents" / agent / "memory-scopes" / "v1" / rev.path_key / rev.locator


# -- the CLI's views of the home ---------------------------------------------

@dataclass(frozen=True)
class DoctorReport:
    code: int
    findings: list[dict[str, Any]]

    @property
    def kinds(self) -> Counter[str]:
        return Counter(f["kind"] for f in self.findings)


def doctor(cli: Cli, *, fix: bool = False) -> DoctorReport:
    result = cli("--json", "doctor", *(["--fix"] if fix else []))
    body = result.json()
    assert body["exit_code"] == result.code, (body, result.err)
    return DoctorReport(result.code, body["findings"])


def unsynced_rows(home: Path, agent: str = AGENT) -> int:
    """Revisions committed without a disk sync that nothing has synced or settled yet."""
    with db_copy(catalog_path(home, agent)) as conn:
        return sqlite_int(conn.execute("SELECT count(*) FROM unsynced_revisions").fetchall()[0][0])


def read_outcome(cli: Cli, session_id: str, path: str, old: bytes | None, new: bytes) -> str:
    """'old', 'new' or 'absent' (exit 3, no bytes, for a note that never existed).

    Anything else (other bytes, a partial note, an integrity error, a crash)
    fails the test here.
    """
    result = cli("read", session_id, path)
    if result.code == 0 and result.out == new:
        return "new"
    if old is not None and result.code == 0 and result.out == old:
        return "old"
    if old is None and result.code == 3 and result.out == b"":
        return "absent"
    raise AssertionError(f"read gave neither the old nor the new note: exit {result.code}, "
                         f"{len(result.out)} bytes {result.out[:80]!r}, stderr {result.err!r}")


def assert_consistent(home: Path, before: list[Rev], agent: str = AGENT) -> None:
    """Nothing pending or staged, nothing unreferenced, nothing committed lost."""
    revs = revisions(home, agent)
    assert [r.revision_id for r in revs if r.state == "pending"] == [], "a revision is still pending"
    with db_copy(catalog_path(home, agent)) as conn:
        pending_intents = conn.execute("SELECT intent_id FROM write_intents WHERE state = 'pending'").fetchall()
        path_keys = {r[0] for r in conn.execute("SELECT path_key FROM storage_roots")}
    assert pending_intents == [], "a write intent is still pending"
    agent_dir = home / "agents" / agent
    assert sorted(os.listdir(agent_dir / "staging")) == [], "the staging directory is not empty"
    scopes = agent_dir / "memory-scopes" / "v1"
    assert set(os.listdir(scopes)) == path_keys, "store directories and storage roots disagree"
    for path_key in path_keys:
        referenced = {r.locator for r in revs if r.path_key == path_key
                      and r.state in ("active", "superseded", "corrupt")}  # corrupt: kept as found
        for name in os.listdir(scopes / path_key):
            st = os.lstat(scopes / path_key / name)
            assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, f"unsafe entry in a store directory: {name}"
            assert name in referenced, "a store directory holds a file no committed revision names"
    now = {r.revision_id: r for r in revs}
    for old in before:
        assert now[old.revision_id].state in ("active", "superseded"), f"committed revision lost: {old}"
        data = artifact_path(home, old, agent).read_bytes()
        assert (sha256(data), len(data)) == (old.sha256, old.size), f"committed artifact changed: {old}"
    for rev in revs:
        if rev.state in ("active", "superseded"):
            data = artifact_path(home, rev, agent).read_bytes()
            assert sha256(data) == rev.sha256, f"artifact does not match its revision: {rev}"


def audited(home: Path, revision_id: str) -> list[tuple[str, str]]:
    """(decision, reason) of the shared audit rows for one revision's write."""
    with db_copy(home / "state.sqlite") as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT decision, reason FROM audit WHERE revision_id = ? AND event_id IS NOT NULL", (revision_id,))]


def verify_recovered(cli: Cli, case: WriteCase, base: Base, step: Step, before: list[Rev], *,
                     durable: bool = True) -> str:
    """Every property an interrupted write must have after ``doctor --fix``.

    Returns the outcome ('old', 'new' or 'absent').
    """
    session, new = case.session_id(base), new_bytes(step)
    outcome = read_outcome(cli, session, case.path, case.old, new)
    assert outcome in allowed_outcomes(case, step, durable=durable), (outcome, step)
    assert_consistent(cli.home, before)
    if outcome == "new":  # a completed write is in the shared audit, drained exactly once
        rev = the_revision(cli.home, new)
        assert audited(cli.home, rev.revision_id) == [("allow", "allowed")]
    again = doctor(cli)
    assert (again.code, again.findings) == (0, []), again
    assert cli("write", session, case.path, stdin=AFTER).code == 0
    assert cli("read", session, case.path, check=True).out == AFTER
    return outcome


# -- power loss ---------------------------------------------------------------

FS_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
FS_GOING_FLAGS_NOLOGFLUSH = 2  # drop the journal's uncommitted transaction: a power cut
_libc = ctypes.CDLL(None, use_errno=True)


def _run(*args: str | Path) -> None:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert proc.returncode == 0, f"{args}: {proc.returncode} {proc.stderr.strip()}"


class LoopExt4:
    """A small ext4 image, loop-mounted, whose power can be cut.

    Mounted with ``commit=300`` so the journal never commits on its own
    timer during a test: only an fsync (or sync) makes anything durable,
    which is exactly what a power cut at an arbitrary moment checks.
    """

    OPTIONS = "loop,commit=300"

    def __init__(self, base: Path, size_mib: int = 64) -> None:
        self.image = base / "disk.img"
        self.mnt = base / "mnt"
        self.size_mib = size_mib
        self.mounted = False

    def create(self) -> None:
        _run("truncate", "-s", f"{self.size_mib}M", self.image)
        _run("mkfs.ext4", "-q", "-F", self.image)
        self.mnt.mkdir()
        self.mount()

    def mount(self) -> None:
        _run("mount", "-o", self.OPTIONS, self.image, self.mnt)
        self.mounted = True

    def umount(self) -> None:
        _run("umount", self.mnt)  # -o loop set autoclear: the loop device detaches here
        self.mounted = False

    def sync(self) -> None:
        """Make everything written so far durable (the setup, not the step under test)."""
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _libc.syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)

    def power_cut(self) -> None:
        """FS_IOC_SHUTDOWN without flushing the log, then prove the fs is down."""
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, FS_IOC_SHUTDOWN, struct.pack("I", FS_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)
        try:
            os.mkdir(self.mnt / "probe-after-power-cut")
        except OSError:
            pass
        else:
            raise AssertionError("the filesystem still accepts writes after FS_IOC_SHUTDOWN")

    def reboot(self) -> None:
        """Unmount the dead filesystem and mount it again (the journal is replayed)."""
        self.umount()
        self.mount()


@contextlib.contextmanager
def loop_ext4(base: Path, size_mib: int = 64) -> Iterator[LoopExt4]:
    """A fresh loop-mounted ext4 under ``base``; always unmounted and removed."""
    fs = LoopExt4(base, size_mib)
    try:
        fs.create()
        yield fs
    finally:
        if fs.mounted:
            proc = subprocess.run(["umount", str(fs.mnt)], capture_output=True)
            if proc.returncode != 0:  # something still holds it: detach lazily, autoclear frees the loop device
                subprocess.run(["umount", "-l", str(fs.mnt)], capture_output=True)
        with contextlib.suppress(FileNotFoundError):
            fs.image.unlink()

