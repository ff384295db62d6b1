"""A mounted view follows the catalog while it is mounted (DESIGN.md §5, invariant 7).

Changes made by other sessions or by the writer (a new revision, a
tombstone, a revoked binding, an expired membership) are visible in a
mounted view at once: the server invalidates the kernel's entry, attribute
and page caches for what changed, and a revoked view stops serving reads
even to processes that hold the file open.

The mount gives the kernel entry and attribute timeouts of 30 s
(``vfs.fs.CACHE_TIMEOUT_S``). Every test first makes the kernel cache the
old state (a ``stat`` and a read through the mount), then changes the
catalog from outside the mount and waits at most 10 s: anything seen
within that bound can only have come from an invalidation.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import mmap
import os
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.vfs.abort import abort
from tests.conftest import ALICE_FACT, CHANNEL_FACT, Scenario
from tests.mountkit import (  # noqa: F401
    Mounts,
    errno_of,
    getdents64,
    getdents_into,
    mounts,
    patched_server,
    second_group_session,
    wait_until,
)

BOUND_S = 10.0  # a functional bound, far below the kernel's 30 s cache timeouts
OFFSITE = "channel/offsite.md"
ALLERGY = "private/notes/allergy.md"


def _stat_errno(path: Path) -> int | os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        return exc.errno or -1


def _reads(path: Path, data: bytes) -> bool:
    return _open_errno(path) == data


def _lists(folder: Path, names: list[str]) -> bool:
    return sorted(os.listdir(folder)) == names


def _mtime_moved(path: Path, was: int) -> int:
    """The note's mtime once it shows one other than ``was`` (0: none yet)."""
    now = _mtime_ns(path)
    return now if now not in (0, was) else 0


def _gone(path: Path) -> bool:
    return _stat_errno(path) == errno.ENOENT


def _pread_result(fd: int, size: int = 4096, offset: int = 0) -> int | bytes:
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        return exc.errno or -1


def _cat(path: Path) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, check=True, timeout=20).stdout


def _open_errno(path: Path) -> int | bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return exc.errno or -1


class Pinned:
    """A note held open with its pages mapped, as a long-running reader would.

    Besides being the process that must be refused later, the pin keeps the
    kernel's cached state of the note (its name, its inode and attributes,
    its pages) in memory even if something on the machine drops caches
    (``echo 3 > /proc/sys/vm/drop_caches``): only the server's invalidation
    can then remove it, which is what these tests are about. The mapping is
    never touched after the change (a refused page fault would be SIGBUS).
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.map = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ)
        self.first = bytes(self.map[:])  # faults every page in

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


@contextlib.contextmanager
def _pinned(path: Path) -> Iterator[Pinned]:
    pin = Pinned(path)
    try:
        yield pin
    finally:
        pin.close()


@contextlib.contextmanager
def _pinned_dir(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


# -- a new revision ----------------------------------------------------------------

def test_cli_write_shows_in_mounted_group_view(scenario: Scenario, mounts: Mounts) -> None:
    """``scopefs write`` of a note the mount has cached: new size, mtime and bytes."""
    view = mounts.mount(scenario.group_session)
    note = view / OFFSITE
    before = os.stat(note)
    assert before.st_size == len(CHANNEL_FACT)
    assert _cat(note) == CHANNEL_FACT
    assert note.read_bytes() == CHANNEL_FACT
    with _pinned(note) as pin:
        assert pin.first == CHANNEL_FACT
        assert os.fstat(pin.fd).st_size == len(CHANNEL_FACT)

        longer = CHANNEL_FACT + b"Update: the offsite moved to Porto, the hotel is booked (canary C4an-2)\n"
        scenario.cli.j("write", scenario.group_session, OFFSITE, stdin=longer)
        # The inode's cached attributes are invalidated, not only its name.
        wait_until(lambda: os.fstat(pin.fd).st_size == len(longer), timeout=BOUND_S)
        after = os.stat(note)
        assert after.st_size == len(longer)
        assert after.st_ino == before.st_ino  # the same note, a new revision
        assert after.st_mtime_ns != before.st_mtime_ns
        assert _cat(note) == longer
        assert note.read_bytes() == longer

        # Same size, different bytes: only the mtime and the content tell.
        same_size = longer.replace(b"Porto", b"Braga")
        assert len(same_size) == len(longer)
        scenario.cli.j("write", scenario.group_session, OFFSITE, stdin=same_size)
        wait_until(lambda: os.fstat(pin.fd).st_mtime_ns != after.st_mtime_ns, timeout=BOUND_S)
        assert os.stat(note).st_mtime_ns != after.st_mtime_ns
        assert _cat(note) == same_size
        assert note.read_bytes() == same_size


def test_other_mount_sees_new_revision_new_note_and_rename(scenario: Scenario, mounts: Mounts) -> None:
    """Two group sessions of one conversation, each mounted: what one writes,
    the other sees, although its kernel cached the old state."""
    watcher = mounts.mount(scenario.group_session, "watcher")
    writer = mounts.mount(second_group_session(scenario), "writer")
    note = watcher / OFFSITE
    old = os.stat(note)
    assert _cat(note) == CHANNEL_FACT
    agenda = watcher / "channel" / "agenda.md"
    assert _gone(agenda)
    assert sorted(os.listdir(watcher / "channel")) == ["offsite.md"]

    # A new revision, written through the other mount (open, write, close).
    newer = b"Channel fact: the offsite is in Lisbon, 12-14 May, bring a laptop (canary C4an-3)\n"
    with _pinned(note) as pin:
        (writer / OFFSITE).write_bytes(newer)
        wait_until(lambda: os.fstat(pin.fd).st_size == len(newer), timeout=BOUND_S)
    assert os.stat(note).st_size == len(newer)
    assert os.stat(note).st_ino == old.st_ino
    assert _cat(note) == newer

    # A note created by the other session appears, with its content.
    agenda_text = b"Agenda: day one planning, day two hiking\n"
    (writer / "channel" / "agenda.md").write_bytes(agenda_text)
    (writer / "channel" / "plans").mkdir()
    (writer / "channel" / "plans" / "q3.md").write_bytes(b"Q3 plan\n")
    wait_until(lambda: sorted(os.listdir(watcher / "channel")) == ["agenda.md", "offsite.md", "plans"],
               timeout=BOUND_S)
    assert agenda.read_bytes() == agenda_text
    assert os.stat(agenda).st_size == len(agenda_text)
    assert (watcher / "channel" / "plans" / "q3.md").read_bytes() == b"Q3 plan\n"

    # A rename in the other mount: the old name goes (its cached entry too,
    # although a reader holds it open), the new one comes.
    with _pinned(agenda) as pin:
        assert pin.first == agenda_text
        os.rename(writer / "channel" / "agenda.md", writer / "channel" / "agenda-final.md")
        wait_until(lambda: _gone(agenda), timeout=BOUND_S)
    assert (watcher / "channel" / "agenda-final.md").read_bytes() == agenda_text
    assert sorted(os.listdir(watcher / "channel")) == ["agenda-final.md", "offsite.md", "plans"]


SAVES = 60  # the lost race showed in one save in 36 to 60 here: about two runs of the old code in three fail


def test_readers_polling_another_mount_end_on_every_new_revision(scenario: Scenario, mounts: Mounts) -> None:
    """Two readers re-read the note in a second mount of the session without pause while saves land
    in the first: after each save, the second mount serves its bytes, not the last revision's.

    A ``READ`` the kernel sent just after it dropped the old pages, and that
    the mount answered before it learned they were dropped, was answered
    from the old revision and stayed cached, cut to the new size, with no
    invalidation left to drop it (``vfs.inodes.Node.invalidating``). The
    readers keep a ``READ`` in flight most of the time, so a save may meet
    one; ``test_vfs_integrity.py`` makes that meeting certain, in one process.
    """
    editor = mounts.mount(scenario.alice_session, "editor")
    twin = mounts.mount(scenario.alice_session, "twin")
    note = twin / ALLERGY
    assert note.read_bytes() == ALICE_FACT
    stop = False

    def poll() -> None:
        while not stop:
            _open_errno(note)

    with concurrent.futures.ThreadPoolExecutor(2) as readers:
        polling = [readers.submit(poll) for _ in range(2)]
        try:
            for save in range(SAVES):
                data = f"revision {save} ".encode() + b"x" * (save % 7) + b"\n"  # sizes go up and down
                scratch = editor / "private" / "notes" / ".allergy.md.tmp"
                scratch.write_bytes(data)
                os.replace(scratch, editor / ALLERGY)
                try:
                    wait_until(functools.partial(_reads, note, data), timeout=BOUND_S, interval=0.005)
                except AssertionError as late:
                    raise AssertionError(f"save {save}: the second mount still reads {_open_errno(note)!r}") from late
        finally:
            stop = True
            concurrent.futures.wait(polling)
    for reader in polling:
        reader.result()  # a reader that failed (after the saves' own verdict, which it must not hide)


# -- a tombstone -------------------------------------------------------------------

def test_tombstone_from_other_mount_removes_note(scenario: Scenario, mounts: Mounts) -> None:
    watcher = mounts.mount(scenario.group_session, "watcher")
    remover = mounts.mount(second_group_session(scenario), "remover")
    note = watcher / OFFSITE
    assert os.stat(note).st_size == len(CHANNEL_FACT)
    assert _cat(note) == CHANNEL_FACT
    with _pinned(note) as held:
        assert held.first == CHANNEL_FACT
        assert os.pread(held.fd, 4096, 0) == CHANNEL_FACT

        os.unlink(remover / OFFSITE)
        assert _gone(remover / OFFSITE)  # hidden at once where it was removed
        # After the removal grace period (scopefs.vfs.layers.REMOVAL_GRACE_S) the
        # tombstone is committed, and the other mount forgets the note.
        wait_until(lambda: _gone(note), timeout=BOUND_S)
        assert "offsite.md" not in os.listdir(watcher / "channel")
        assert _open_errno(note) == errno.ENOENT
        # The process that held it open is refused too: neither the pages
        # the kernel cached before the tombstone nor an empty file.
        got = _pread_result(held.fd)
        assert got in (errno.EACCES, errno.EIO), f"held descriptor after a tombstone returned {got!r}"
        assert _pread_result(held.fd, 16, 9) in (errno.EACCES, errno.EIO)

    result = scenario.cli("read", scenario.group_session, OFFSITE)
    assert result.code == 3, (result.code, result.err)
    assert result.out == b""


# -- a revoked binding -------------------------------------------------------------

def test_revoked_binding_empties_view_and_stops_held_reads(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    note = view / ALLERGY
    assert os.stat(note).st_size == len(ALICE_FACT)
    assert sorted(os.listdir(view)) == ["agent-shared", "postbox", "private", "projections"]
    with _pinned(note) as held:
        assert held.first == ALICE_FACT
        assert os.pread(held.fd, 4096, 0) == ALICE_FACT

        scenario.cli("binding", "revoke", scenario.alice_binding, check=True)
        wait_until(lambda: os.listdir(view) == [], timeout=BOUND_S)
        # The server sends its invalidations from a worker, the note's first
        # (inode, then name), its folders after: once the kernel has let go
        # of the cached name, it has dropped the note's pages as well.
        wait_until(lambda: _gone(note), timeout=BOUND_S)

        got = _pread_result(held.fd, 4096, 0)
        assert got in (errno.EACCES, errno.EIO), f"held descriptor after revocation returned {got!r}"
        assert _pread_result(held.fd, 16, 11) in (errno.EACCES, errno.EIO)
        # Cached entries are gone too: new opens and stats find nothing.
        assert _open_errno(note) == errno.ENOENT
        wait_until(lambda: _gone(view / "private" / "notes"), timeout=BOUND_S)
        assert _gone(view / "private")
        proc = subprocess.run(["cat", str(note)], check=False, capture_output=True, timeout=20)
        assert proc.returncode != 0 and proc.stdout == b""

    result = scenario.cli("read", scenario.alice_session, ALLERGY)
    assert result.code == 3, (result.code, result.err)
    assert result.out == b""


# -- an expired membership -------------------------------------------------------

def test_expired_role_membership_removes_role_folder(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    assert "roles" not in os.listdir(view)

    role_id = scenario.cli.j("role", "add", "ops")["role_id"]
    scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", "15s")  # for the checks that follow
    # Fresh evidence: the role's folder appears without a remount...
    wait_until(lambda: "roles" in os.listdir(view), timeout=BOUND_S)
    assert os.listdir(view / "roles") == ["ops"]
    assert os.path.isdir(view / "roles" / "ops")  # the kernel now caches these entries
    assert os.listdir(view / "roles" / "ops") == []
    assert (view / ALLERGY).read_bytes() == ALICE_FACT

    # ...and goes when the evidence expires, cached entries included (even
    # while a process has the folder open).
    with _pinned_dir(view / "roles" / "ops"):
        wait_until(lambda: "roles" not in os.listdir(view), timeout=15.0 + BOUND_S)
        # The kernel's cached entries follow (invalidated from the server's worker).
        wait_until(lambda: _gone(view / "roles" / "ops"), timeout=BOUND_S)
        assert _gone(view / "roles")
    assert sorted(os.listdir(view)) == ["agent-shared", "postbox", "private", "projections"]
    assert (view / ALLERGY).read_bytes() == ALICE_FACT  # the rest of the view is untouched


@pytest.mark.parametrize("earlier", ["none", "longer"])
def test_an_expiry_reaches_an_idle_mount(scenario: Scenario, mounts: Mounts, earlier: str) -> None:
    """Nothing is written when a membership runs out, so no inotify event wakes the mount: it wakes at
    the expiry its view names (``Access.evidence_until``; ``test_vfs_follow`` shows the loop waking at
    it with its net out of reach), also when the membership only replaced a longer one (the view itself
    did not change then, only when it ends)."""
    role_id = scenario.cli.j("role", "add", "ops")["role_id"]
    if earlier == "longer":
        scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", "1h")
    view = mounts.mount(scenario.alice_session)
    before = now_us()
    lasts_us = 10_000_000  # long enough for the mount to show the role first, on a loaded machine too
    scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", f"{lasts_us // 1_000_000}s")
    after = now_us()
    home = Home.open(scenario.cli.home)
    try:
        until = build(home, scenario.alice_session).access.evidence_until
    finally:
        home.close()
    assert until is not None and before + lasts_us <= until <= after + lasts_us, (before, until, after)
    wait_until(lambda: "roles" in os.listdir(view), timeout=BOUND_S)
    wait_until(lambda: "roles" not in os.listdir(view), timeout=BOUND_S + lasts_us / 1e6)


@pytest.mark.parametrize("how", ["remove", "refresh-expired"])
def test_role_membership_change_applies_without_remount(scenario: Scenario, mounts: Mounts, how: str) -> None:
    """Membership removed, or refreshed with a bound that soon runs out, while
    the view is mounted: the role's folder follows the evidence."""
    role_id = scenario.cli.j("role", "add", "ops")["role_id"]
    scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", "7d")
    view = mounts.mount(scenario.alice_session)
    assert os.path.isdir(view / "roles" / "ops")
    with _pinned_dir(view / "roles" / "ops"):
        if how == "remove":
            scenario.cli.j("member", "remove", role_id, scenario.alice)
        else:  # the latest evidence replaces the old: a 1 s bound that soon runs out
            scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", "1s")
        wait_until(lambda: _gone(view / "roles" / "ops"), timeout=BOUND_S)
        assert "roles" not in os.listdir(view)


# -- a folder's cached listing ---------------------------------------------------

def _entries_from(folder: Path, offset: int) -> list[tuple[str, int]]:
    """(name, offset of the next entry) of each entry a listing of ``folder`` gives from ``offset`` on."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        buffer = ctypes.create_string_buffer(1 << 16)
        found: list[tuple[str, int]] = []
        while (got := getdents64(fd, ctypes.addressof(buffer), len(buffer))) > 0:
            at = 0
            while at < got:  # struct linux_dirent64: ino, off, reclen, type, name
                _, following, length = struct.unpack_from("<QqH", buffer.raw, at)
                name = buffer.raw[at + 19: at + length].split(b"\0", 1)[0].decode()
                found.append((name, following))
                at += length
        return found
    finally:
        os.close(fd)


def test_a_listing_continued_from_an_offset_shows_no_name_the_view_lost(scenario: Scenario, mounts: Mounts) -> None:
    """The kernel checks a cached listing against the folder's mtime only when a listing starts from the
    beginning; one that seeks to an offset is served from the cached pages. Those go as well, so a
    removed note's name does not stay listable that way (``vfs.pages.list_again``)."""
    scenario.cli("write", scenario.alice_session, "private/notes/gone.md", stdin=b"soon gone\n", check=True)
    view = mounts.mount(scenario.alice_session)
    notes = view / "private" / "notes"
    cached = _entries_from(notes, 0)  # the kernel now holds this listing, and these offsets are its own
    assert "gone.md" in [name for name, _ in cached]
    scenario.cli("rm", scenario.alice_session, "private/notes/gone.md", check=True)
    after_first = cached[0][1]  # never listed from the start again here: that would refill the cache
    wait_until(lambda: "gone.md" not in [name for name, _ in _entries_from(notes, after_first)], timeout=BOUND_S)
    assert sorted(os.listdir(notes)) == ["allergy.md"]


def _refusing(operation: str, error: str) -> str:
    """Server source that makes ``catalog_ops.<operation>`` raise ``error`` for the name ``refused.md``
    (a tombstone, a save the catalog refuses), and only for it."""
    return f"""
from scopefs.catalog.errors import {error}
from scopefs.vfs import catalog_ops
kept = catalog_ops.{operation}
def refusing(home, session_id, parts, *args, **kwargs):
    if parts[-1] == "refused.md":
        raise {error}("injected: refused for this name")
    return kept(home, session_id, parts, *args, **kwargs)
catalog_ops.{operation} = refusing
"""


def test_a_note_whose_removal_was_refused_is_listed_again(scenario: Scenario, tmp_path: Path) -> None:
    """``rm`` succeeds at once; the tombstone commits a moment later, and may be refused: the note
    then shows again. A listing the kernel cached while it was hidden must not go on lacking it,
    though no view change moves the folder's mtime (``MountState.shown_again``)."""
    scenario.cli("write", scenario.alice_session, "private/notes/refused.md", stdin=b"stays\n", check=True)
    where = tmp_path / "mnt"
    where.mkdir()
    with patched_server(scenario.cli.home, scenario.alice_session, where, _refusing("remove", "StorageError")):
        notes = where / "private" / "notes"
        assert "refused.md" in os.listdir(notes)
        os.unlink(notes / "refused.md")
        assert "refused.md" not in os.listdir(notes)  # the kernel holds this listing now
        wait_until(lambda: (notes / "refused.md").exists(), timeout=BOUND_S)  # refused: it is back
        assert sorted(os.listdir(notes)) == ["allergy.md", "refused.md"]
        assert (notes / "refused.md").read_bytes() == b"stays\n"


def test_a_new_note_whose_first_save_was_refused_is_neither_listed_nor_found(scenario: Scenario,
                                                                             tmp_path: Path) -> None:
    """The file a tool created is listed and found while it writes; its close is refused (EACCES) and
    the note never existed: the kernel must forget its name and the listing it cached with it, though
    the view never changed (``MountState.never_was``)."""
    where = tmp_path / "mnt"
    where.mkdir()
    with patched_server(scenario.cli.home, scenario.alice_session, where, _refusing("commit", "Denied")):
        notes = where / "private" / "notes"
        fd = os.open(notes / "refused.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            assert os.write(fd, b"never kept\n") == 11
            assert sorted(os.listdir(notes)) == ["allergy.md", "refused.md"]  # the kernel holds this listing
            assert os.stat(notes / "refused.md").st_size == 11  # and this entry
        finally:
            assert errno_of(lambda: os.close(fd)) == errno.EACCES
        assert sorted(os.listdir(notes)) == ["allergy.md"]
        wait_until(lambda: errno_of(lambda: os.stat(notes / "refused.md")) == errno.ENOENT, timeout=BOUND_S)
    assert scenario.cli("read", scenario.alice_session, "private/notes/refused.md").code == 3


def _mtime_ns(path: Path) -> int:
    """The note's mtime as the mount shows it, 0 while it shows none."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def test_a_view_change_while_a_listing_is_copied_into_a_note_of_the_mount_does_not_hang_it(
        scenario: Scenario, mounts: Mounts) -> None:
    """A process lists a cached folder into a mapping of a large unread note of the same mount, and the
    folder changes while that note's first ``READ`` is verified (on a worker, about 0.1 s here): a save
    through a second mount of the session, as one through this folder would wait for the listing.

    The listing's page is locked until the ``READ`` is answered; a view change
    that dropped the folder's pages on the loop that answers ``READ``s would
    wait for that lock for good, and the mount would hang
    (``MountState._apply``). The listing must come back and the change show.
    A round counts only if the save ended while the listing still waited;
    each round gives the note a new revision, which is verified again.
    """
    view, other = mounts.mount(scenario.alice_session), mounts.mount(scenario.alice_session)
    # To end a hung mount by, without asking it anything (even a path's realpath would).
    connections = [str(os.minor(os.stat(where).st_dev)) for where in (view, other)]
    notes = view / "private" / "notes"
    names, overlapped, shown = ["allergy.md", "large.md"], False, 0
    for round_ in range(5):
        large = os.urandom(1 << 20) * 128  # hashed whole before its first page is served
        scenario.cli("write", scenario.alice_session, "private/notes/large.md", stdin=large, check=True)
        shown = wait_until(functools.partial(_mtime_moved, notes / "large.md", shown), timeout=BOUND_S)
        assert sorted(os.listdir(notes)) == names  # the kernel now holds this listing
        new = f"new-{round_}.md"
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            try:
                listing = pool.submit(getdents_into, notes, notes / "large.md")
                time.sleep(0.02)  # its READ is being verified by now, most likely
                pool.submit((other / "private" / "notes" / new).write_bytes, b"saved\n").result(timeout=30)
                # This mount has applied the change once it shows the note's history, and the old drop
                # would have hung its loop by then, this lookup with it. Not the name itself: the kernel
                # keeps its absence from a lookup made before the change, and the entry's invalidation
                # waits for the folder's listing to end.
                history = view / ".history" / "private" / "notes" / new
                pool.submit(wait_until, history.exists, timeout=BOUND_S).result(timeout=30)
                overlapped = not listing.done()
                assert listing.result(timeout=30) > 0
            except BaseException:
                for connection in connections:
                    abort(connection)  # lets the threads and the clean-up end
                raise
        names = sorted([*names, new])
        wait_until(functools.partial(_lists, notes, names), timeout=BOUND_S)
        wait_until((notes / new).exists, timeout=BOUND_S)
        with open(notes / "large.md", "rb") as note:
            assert note.read(1 << 16) == large[: 1 << 16]
        if overlapped:
            break
    assert overlapped, "no save ended while the listing waited for its READ"
