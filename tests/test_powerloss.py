"""Power loss, not only process death, at every step of the write transaction.

The home lives on a small loop-mounted ext4. A real writer is held at a
checkpoint, the filesystem is shut down with FS_IOC_SHUTDOWN and
NOLOGFLUSH (whatever the journal had not committed is gone, as after a power
cut), the writer is SIGKILLed, and the filesystem is unmounted and mounted
again. ``scopefs doctor --fix`` must then leave the old or the new note,
never a pending or staged one; an acknowledged (ACTIVATED) write must have
survived; no earlier committed revision may be lost.

The controls at the end prove the harness can fail: with the same cut, a
rename whose directory was not fsynced, a file that was never fsynced and a
WAL commit under ``synchronous=NORMAL`` are all lost, while their fsynced
twins (and a commit through ``catalog.db.connect``) survive.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from scopefs.writer.steps import Step
from tests.conftest import Cli, diff_snapshots, snapshot
from tests.crashkit import (
    ALICE_V2,
    NEW_STORE,
    OVERWRITE,
    REPO,
    Base,
    WriteCase,
    allowed_outcomes,
    assert_consistent,
    audited,
    build_base,
    case_durable_steps,
    case_steps,
    committed,
    copy_home,
    doctor,
    loop_ext4,
    new_bytes,
    read_outcome,
    revisions,
    unsynced_rows,
    verify_recovered,
    writer_stopped_at,
)

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return build_base(tmp_path_factory.mktemp("power-base") / "home")


def _cut_and_repair(base: Base, tmp_path: Path, case: WriteCase, step: Step, *, durable: bool,
                    synced_so_far: bool = False) -> None:
    """A real writer held at ``step``, the power cut, the filesystem mounted again: before any repair doctor
    changes nothing and readers see only committed bytes; after ``doctor --fix``, old or new, nothing
    committed lost. ``synced_so_far``: whatever the writer did up to ``step`` was made durable first (as
    another writer's sync would), so its partial states reach the disk; what it committed then must stay.
    """
    with loop_ext4(tmp_path) as fs:
        cli = Cli(copy_home(base, fs.mnt / "home"))
        fs.sync()  # the setup is durable; only the step under test may be cut
        before = committed(cli.home)
        with writer_stopped_at(cli.home, case.session_id(base), case.path, new_bytes(step), step,
                               durable=durable) as writer:
            if synced_so_far:
                fs.sync()
            fs.power_cut()
            writer.kill()
        fs.reboot()

        kept = durable or synced_so_far
        untouched = snapshot(cli.home)
        assert doctor(cli).code in (0, 1)  # leftovers, never an integrity failure
        assert diff_snapshots(untouched, snapshot(cli.home)) == []
        seen = read_outcome(cli, case.session_id(base), case.path, case.old, new_bytes(step))
        assert seen in allowed_outcomes(case, step, durable=kept)

        fixed = doctor(cli, fix=True)
        assert fixed.code == 0, fixed
        assert all(f["action"] is not None for f in fixed.findings), fixed.findings
        verify_recovered(cli, case, base, step, before, durable=kept)


@pytest.mark.parametrize("case, step, durable", case_durable_steps(NEW_STORE, OVERWRITE))
def test_power_loss_between_steps(base: Base, tmp_path: Path, case: WriteCase, step: Step, durable: bool) -> None:
    """Cut the power at ``step``: after reboot and repair, old or new, nothing committed lost.

    A durable write (the command line's, an fsync's) that reached ACTIVATED
    must be there; one that synced nothing (a close through a mount) may be
    lost, but is never partial.
    """
    _cut_and_repair(base, tmp_path, case, step, durable=durable)


@pytest.mark.parametrize("case, step", case_steps(NEW_STORE, OVERWRITE, durable=False))
def test_power_loss_of_a_close_synced_up_to_its_step(base: Base, tmp_path: Path, case: WriteCase, step: Step) -> None:
    """A close stopped at ``step``, everything it did so far made durable, then the power cut: each of its
    partial states on disk is repaired to old or new, never partial, and a committed close stays.

    Without the sync every close step simply vanishes with the cut; with it, the marker, the placed file
    and the one commit survive exactly as far as the close got, which is what its marker is for.
    """
    _cut_and_repair(base, tmp_path, case, step, durable=False, synced_so_far=True)


_UNSYNCED_CHILD = r"""
import os, sys
from pathlib import Path
os.umask(0o077)
from scopefs.catalog.home import Home
from scopefs.writer import unsynced
from scopefs.writer.transaction import write_note

home_dir, session_id, synced_too = sys.argv[1], sys.argv[2], sys.argv[3] == "sync"
home = Home.open(Path(home_dir))
# Two closes through a mount of the same note, and a new note: no disk sync at all.
write_note(home, session_id, "private/notes/allergy.md", b"closed once, never synced\n", durable=False)
last = write_note(home, session_id, "private/notes/allergy.md", b"closed twice, never synced\n", durable=False)
write_note(home, session_id, "private/notes/new.md", b"a new note, never synced\n", durable=False)
if synced_too:  # fsync of the note (and its folder) through the mount
    unsynced.sync(home, "main")
# A durable write of another note: its synchronous=FULL commit makes the whole catalog durable,
# and its directory fsync the unsynced artifacts' names, but not their bytes.
write_note(home, session_id, "private/notes/other.md", b"durable\n")
"""


_SYNC_CHILD = r"""
import sys
from pathlib import Path
from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.writer import unsynced
home = Home.open(Path(sys.argv[1]))
print(unsynced.sync(home, "main"), unsynced.forget_before(home, "main", now_us()))
"""


@pytest.mark.parametrize("synced", [False, True], ids=["closed-lost", "fsynced-kept"])
def test_power_loss_takes_unsynced_saves_only(base: Base, tmp_path: Path, synced: bool) -> None:
    """The catalog survives a power cut, the unsynced artifacts do not: recovery rolls each note back.

    Each note returns to its newest intact revision (two lost revisions of
    one note in a row walk back past both; a new note is tombstoned), the
    rollbacks are audited as ``revision-lost``, the restored revision is
    searchable again, and nothing else changes; saves that were synced
    first keep every byte.
    """
    with loop_ext4(tmp_path) as fs:
        cli = Cli(copy_home(base, fs.mnt / "home"))
        fs.sync()
        before = committed(cli.home)
        child = subprocess.run([sys.executable, "-c", _UNSYNCED_CHILD, str(cli.home), base.alice_session,
                                "sync" if synced else "no"], cwd=REPO, capture_output=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert child.returncode == 0, child.stderr.decode(errors="replace")[-2000:]
        fs.power_cut()
        fs.reboot()

        # An fsync and a mount's write-back after the reboot, before any recovery, bless nothing:
        # the revisions of the page cache that is gone stay listed for recovery to verify.
        blessing = subprocess.run([sys.executable, "-c", _SYNC_CHILD, str(cli.home)], cwd=REPO, capture_output=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
        assert blessing.returncode == 0, blessing.stderr.decode(errors="replace")[-2000:]
        assert blessing.stdout == b"0 0\n"

        found = doctor(cli)  # reports, changes nothing
        kinds = sorted(f["kind"] for f in found.findings if f["kind"] != "undrained-audit")
        assert kinds == ([] if synced else ["lost-revision"] * 3), found.findings
        assert found.code == (1 if found.findings else 0)

        other = cli("read", base.alice_session, "private/notes/other.md")
        assert (other.code, other.out) == (0, b"durable\n")
        allergy = cli("read", base.alice_session, "private/notes/allergy.md")
        new = cli("read", base.alice_session, "private/notes/new.md")
        if synced:
            assert (allergy.code, allergy.out) == (0, b"closed twice, never synced\n")
            assert (new.code, new.out) == (0, b"a new note, never synced\n")
        else:
            assert (allergy.code, allergy.out) == (0, ALICE_V2), allergy  # the revision before both
            assert (new.code, new.out) == (3, b""), new  # never existed, as far as anyone can tell
            lost = [r for r in revisions(cli.home) if r.state == "corrupt"]
            assert len(lost) == 3
            for rev in lost:  # the save's own row (drained from the outbox at recovery), then the loss
                assert sorted(audited(cli.home, rev.revision_id)) == [("allow", "allowed"),
                                                                      ("error", "revision-lost")]
            hits = cli.j("search", base.alice_session, "hazelnuts")
            assert [h["path"] for h in hits["results"]] == ["private/notes/allergy.md"], hits
        assert_consistent(cli.home, before)
        assert unsynced_rows(cli.home) == 0
        again = doctor(cli, fix=True)
        assert (again.code, [f for f in again.findings if f["kind"] != "undrained-audit"]) == (0, []), again


# -- controls: the harness really loses what was not made durable -------------

@pytest.mark.parametrize("fsync_dir", [False, True], ids=["rename-unsynced-lost", "rename-dir-fsynced-kept"])
def test_control_rename_needs_directory_fsync(tmp_path: Path, fsync_dir: bool) -> None:
    """A rename survives the cut only if its directory was fsynced."""
    with loop_ext4(tmp_path) as fs:
        old, new = fs.mnt / "staged", fs.mnt / "final"
        fd = os.open(old, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"payload\n")
        os.fsync(fd)
        os.close(fd)
        fs.sync()
        os.rename(old, new)
        if fsync_dir:
            dfd = os.open(fs.mnt, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
        fs.power_cut()
        fs.reboot()
        assert (old.exists(), new.exists()) == ((False, True) if fsync_dir else (True, False))
        assert (new if fsync_dir else old).read_bytes() == b"payload\n"


@pytest.mark.parametrize("fsync", [False, True], ids=["write-unsynced-lost", "write-fsynced-kept"])
def test_control_new_file_needs_fsync(tmp_path: Path, fsync: bool) -> None:
    """A new file's bytes survive the cut only after fsync of the file and its directory."""
    with loop_ext4(tmp_path) as fs:
        path = fs.mnt / "note"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"acknowledged?\n")
        if fsync:
            os.fsync(fd)
            dfd = os.open(fs.mnt, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
        os.close(fd)
        fs.power_cut()
        fs.reboot()
        survived = path.exists() and path.read_bytes() == b"acknowledged?\n"
        assert survived == fsync


_SQLITE_CHILD = r"""
import os, sys
from pathlib import Path
from scopefs.catalog.db import connect
path, synchronous = Path(sys.argv[1]), sys.argv[2]
conn = connect(path, create=True)  # the catalog's own settings: WAL, synchronous=FULL
if synchronous != "FULL":
    conn.execute(f"PRAGMA synchronous={synchronous}")
conn.execute("CREATE TABLE t (x INTEGER)")
conn.execute("INSERT INTO t VALUES (1)")
os.write(1, b"base\n")
os.read(0, 1)  # the parent syncs the filesystem
conn.execute("INSERT INTO t VALUES (2)")  # autocommit: acknowledged when this returns
os.write(1, b"acked\n")
os.read(0, 1)  # wait for SIGKILL
os._exit(70)
"""


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"], ids=["wal-normal-lost", "catalog-connect-kept"])
def test_control_acknowledged_sqlite_commit(tmp_path: Path, synchronous: str) -> None:
    """Under WAL, an acknowledged commit survives the cut with FULL (our setting), not with NORMAL."""
    with loop_ext4(tmp_path) as fs:
        db = fs.mnt / "db.sqlite"
        proc = subprocess.Popen([sys.executable, "-c", _SQLITE_CHILD, str(db), synchronous], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline() == b"base\n", "the sqlite child failed before its first commit"
            fs.sync()
            proc.stdin.write(b"g")
            proc.stdin.flush()
            assert proc.stdout.readline() == b"acked\n"
            fs.power_cut()
        finally:
            proc.kill()
            proc.communicate()
        fs.reboot()
        conn = apsw.Connection(str(db))
        try:
            rows = [r[0] for r in conn.execute("SELECT x FROM t ORDER BY x")]
        finally:
            conn.close()
        assert rows == ([1] if synchronous == "NORMAL" else [1, 2])
