"""The index follows the commit: a mount's save activates without search rows (issue 14, schema V8).

A close through a mount queues its revision in ``index_backlog`` instead
of cutting and embedding it on the save's path, and superseding an indexed
revision queues its rows to go. What must still hold, on real homes and
real mounts:

* a search right after a save finds the new text and never the replaced
  text, whichever process searches (it catches the stores it reads up
  first), and a search of one view never takes another view's queue (it
  neither waits for nor times another scope's saves);
* a mount left idle empties the queue by itself, and unmounting leaves
  none;
* a queue left by a mount killed with SIGKILL is caught up by the next
  search; doctor does not call the queued revisions stale;
* a queued revision that was tombstoned or held gets no rows, and one
  whose artifact no longer verifies gets none either (never rows cut from
  unverified bytes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from scopefs.catalog.home import Home
from scopefs.catalog.index import backlog_count, catch_up
from scopefs.catalog.paths import split_virtual_path
from scopefs.writer.tombstone import delete_note
from scopefs.writer.transaction import write_parts
from tests.conftest import SCOPEFS, Scenario, artifact_path, sqlite_int
from tests.crashkit import REPO
from tests.mountkit import Mounts, catalog, is_mounted, mounts, wait_until  # noqa: F401

NOTE = "private/notes/backlog.md"
OLD = b"The cellar key hangs behind the blue door (canary Q1d5)\n"
NEW = b"The cellar key moved under the red mat (canary N3w7)\n"


def _queued(home: Path) -> set[str]:
    with catalog(home) as conn:
        return {row[0] for row in conn.execute("SELECT revision_id FROM index_backlog")}


def _indexed(home: Path) -> set[str]:
    with catalog(home) as conn:
        return {row[0] for row in conn.execute("SELECT DISTINCT revision_id FROM search_chunks")}


def _deferred_write(scenario: Scenario, session: str, path: str, data: bytes) -> str:
    """A save as a mount makes it (``defer_index``), without a mount that would index it when idle."""
    home = Home.open(scenario.cli.home)
    try:
        return write_parts(home, session, split_virtual_path(path), data, durable=False,
                           defer_index=True).revision_id
    finally:
        home.close()


def _search(scenario: Scenario, session: str, query: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = scenario.cli.j("search", session, query)["results"]
    return results


def test_a_mount_save_is_queued_and_a_search_right_after_finds_it(scenario: Scenario, mounts: Mounts) -> None:
    cli = scenario.cli
    first = cli.j("write", scenario.alice_session, NOTE, stdin=OLD)["revision_id"]
    assert first in _indexed(cli.home)  # a command's write indexes at once, as before
    root = mounts.mount(scenario.alice_session)
    (root / NOTE).write_bytes(NEW)
    with catalog(cli.home) as conn:
        second = conn.execute("SELECT revision_id FROM revisions WHERE state = 'active' AND resource_id ="
                              " (SELECT resource_id FROM revisions WHERE revision_id = ?)", (first,)).fetchall()[0][0]
    hits = _search(scenario, scenario.alice_session, "cellar key red mat")
    assert [h["path"] for h in hits if "N3w7" in h["snippet"]] == [NOTE]
    assert not any("Q1d5" in h["snippet"] for h in _search(scenario, scenario.alice_session, "cellar key blue door"))
    indexed = _indexed(cli.home)
    assert second in indexed and first not in indexed  # the replaced revision's rows went with the catch-up
    assert not _queued(cli.home) & {first, second}


def test_an_idle_mount_empties_the_queue_and_an_unmount_leaves_none(scenario: Scenario, mounts: Mounts) -> None:
    cli = scenario.cli
    root = mounts.mount(scenario.alice_session)
    folder = root / "private" / "burst"
    folder.mkdir()
    for i in range(20):
        (folder / f"n{i:02d}.md").write_bytes(f"burst note {i} about lanterns\n".encode())
    wait_until(lambda: not _queued(cli.home), timeout=30)  # nobody searched: the mount did it, once idle
    for i in range(5):
        (folder / f"m{i:02d}.md").write_bytes(f"second burst {i} about kettles\n".encode())
    mounts.umount(root)
    assert not _queued(cli.home)
    assert backlog_count(Home.open(cli.home).catalog("main"), "main") == 0


def test_a_search_takes_only_the_queue_of_the_stores_it_reads(scenario: Scenario) -> None:
    cli = scenario.cli
    alice_revision = _deferred_write(scenario, scenario.alice_session, "private/notes/queued.md",
                                     b"Alice keeps the spare lantern oil in the shed (canary L4nt)\n")
    assert alice_revision in _queued(cli.home)
    assert not _search(scenario, scenario.bob_session, "spare lantern oil shed")
    assert alice_revision in _queued(cli.home)  # Bob's search did not do (nor wait for) Alice's work
    hits = _search(scenario, scenario.alice_session, "spare lantern oil shed")
    assert any("L4nt" in h["snippet"] for h in hits)
    assert alice_revision not in _queued(cli.home)


def test_a_queue_left_by_a_killed_mount_is_caught_up_by_the_next_search(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    where = tmp_path / "killed"
    where.mkdir()
    server = subprocess.Popen([SCOPEFS, "mount", scenario.alice_session, str(where), "--foreground"],
                              env={**os.environ, "SCOPEFS_HOME": str(cli.home)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (where / "private").is_dir(), timeout=30)
        (where / "private" / "killed.md").write_bytes(b"Written just before the server died (canary K1ll)\n")
        queued = _queued(cli.home)
        assert queued  # committed at close, not indexed yet
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
        subprocess.run(["fusermount3", "-uz", str(where)], capture_output=True)
    doctor = cli("doctor")  # the killed server's audit rows wait in the outbox: that is reported
    assert doctor.out == b"main: undrained-audit\n", doctor.out  # a queued revision is not a stale index
    hits = _search(scenario, scenario.alice_session, "written just before the server died")
    assert any("K1ll" in h["snippet"] for h in hits)
    assert not _queued(cli.home)


def test_doctor_fix_catches_the_queue_up(scenario: Scenario) -> None:
    cli = scenario.cli
    revision = _deferred_write(scenario, scenario.bob_session, "private/notes/fix.md", b"doctor fixes this\n")
    assert revision in _queued(cli.home)
    cli("doctor", "--fix")
    assert revision not in _queued(cli.home) and revision in _indexed(cli.home)


def test_queued_revisions_that_were_tombstoned_or_tampered_get_no_rows(scenario: Scenario) -> None:
    cli = scenario.cli
    gone = _deferred_write(scenario, scenario.alice_session, "private/notes/gone.md", b"soon removed (canary G0n3)\n")
    home = Home.open(cli.home)
    try:
        delete_note(home, scenario.alice_session, "private/notes/gone.md")
    finally:
        home.close()
    tampered = _deferred_write(scenario, scenario.alice_session, "private/notes/tampered.md",
                               b"the real text (canary R3al)\n")
    artifact = artifact_path(cli.home, scenario.alice, "notes/tampered.md")
    os.chmod(artifact, 0o600)
    artifact.write_bytes(b"forged words never indexed (canary F0rg)\n")
    home = Home.open(cli.home)
    try:
        assert catch_up(home, "main") >= 2
    finally:
        home.close()
    assert not {gone, tampered} & _indexed(cli.home)
    assert not {gone, tampered} & _queued(cli.home)
    assert not _search(scenario, scenario.alice_session, "forged words never indexed")


def test_an_idle_mount_works_only_the_queue_of_the_stores_it_saved_to(scenario: Scenario, mounts: Mounts) -> None:
    cli = scenario.cli
    alice_revision = _deferred_write(scenario, scenario.alice_session, "private/notes/hers.md",
                                     b"Alice's queued words (canary A11c)\n")
    root = mounts.mount(scenario.bob_session)
    (root / "private" / "his.md").write_bytes(b"Bob saves one note (canary B0bs)\n")
    with catalog(cli.home) as conn:
        bob_revision = conn.execute("SELECT v.revision_id FROM revisions v JOIN resources r USING (resource_id)"
                                    " WHERE r.path = 'his.md' AND v.state = 'active'").fetchall()[0][0]
    wait_until(lambda: bob_revision in _indexed(cli.home), timeout=30)
    assert alice_revision in _queued(cli.home)  # Bob's mount neither did nor waited for Alice's work


def test_a_search_catches_up_only_what_was_queued_before_it_began(scenario: Scenario) -> None:
    earlier = _deferred_write(scenario, scenario.alice_session, "private/notes/early.md", b"early words\n")
    with catalog(scenario.cli.home) as conn:
        queued_at = sqlite_int(conn.execute("SELECT queued_at FROM index_backlog WHERE revision_id = ?",
                                            (earlier,)).fetchall()[0][0])
    later = _deferred_write(scenario, scenario.alice_session, "private/notes/late.md", b"late words\n")
    home = Home.open(scenario.cli.home)
    try:
        assert catch_up(home, "main", queued_by=queued_at) == 1
    finally:
        home.close()
    assert earlier not in _queued(scenario.cli.home) and later in _queued(scenario.cli.home)


def test_a_write_result_names_the_store_it_committed_to(scenario: Scenario) -> None:
    """A mount queues its index catch-up by the store the commit names, not by what its view shows."""
    home = Home.open(scenario.cli.home)
    try:
        result = write_parts(home, scenario.alice_session, split_virtual_path("private/notes/where.md"),
                             b"which store (canary St0r)\n", durable=False, defer_index=True)
    finally:
        home.close()
    with catalog(scenario.cli.home) as conn:
        assert conn.execute("SELECT store_id FROM resources WHERE resource_id = ?",
                            (result.resource_id,)).fetchall() == [(result.store_id,)]
        assert conn.execute("SELECT store_id FROM index_backlog WHERE revision_id = ?",
                            (result.revision_id,)).fetchall() == [(result.store_id,)]


# A foreground mount whose view refresh right after its first save fails once (the save itself commits).
_FLAKY_REFRESH = r"""
import sys, threading
from scopefs.vfs import catalog_ops, mount
from scopefs.cli.main import main

real_commit, real_refresh = catalog_ops.commit, mount.refresh
state = threading.local()
failed = []

def commit(*args, **kwargs):
    result = real_commit(*args, **kwargs)
    state.committed = True
    return result

def refresh(home, view):
    if getattr(state, "committed", False) and not failed:
        state.committed = False
        failed.append(True)
        raise OSError("injected: the view refresh after a save failed")
    return real_refresh(home, view)

catalog_ops.commit, mount.refresh = commit, refresh
sys.exit(main(sys.argv[1:]))
"""


def test_a_save_whose_view_refresh_failed_is_still_indexed_when_idle(scenario: Scenario, tmp_path: Path) -> None:
    """The new note is not in the view when the refresh after its commit failed: the mount still queues its
    store (named by the commit) and indexes the revision once idle."""
    where = tmp_path / "mnt"
    where.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _FLAKY_REFRESH, "mount", scenario.bob_session, str(where),
                             "--foreground"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO), "SCOPEFS_HOME": str(scenario.cli.home)})
    try:
        wait_until(lambda: is_mounted(where), timeout=30)
        (where / "private" / "fresh.md").write_bytes(b"Saved while the view lagged (canary L4g5)\n")
        with catalog(scenario.cli.home) as conn:
            revision = conn.execute("SELECT v.revision_id FROM revisions v JOIN resources r USING (resource_id)"
                                    " WHERE r.path = 'fresh.md' AND v.state = 'active'").fetchall()[0][0]
        # The catch-up makes the rows, then takes the revision off the queue in its next transaction.
        wait_until(lambda: revision in _indexed(scenario.cli.home) and revision not in _queued(scenario.cli.home),
                   timeout=20)
    finally:
        if is_mounted(where):
            scenario.cli("umount", str(where))
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert b"the view was not refreshed after a save" in err  # the injected failure did happen


def test_a_forget_leaves_no_copy_of_an_older_revisions_text_in_the_catalog_file(scenario: Scenario,
                                                                                mounts: Mounts) -> None:
    """The rows of a superseded revision left the index long before the forget (at the next save, or at the
    catch-up for a mount's save): every connection deletes with secure_delete, so none of its bytes remain."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, NOTE, stdin=b"first words of the cellar plan (canary Fv1x)\n" * 20)
    cli.j("write", scenario.alice_session, NOTE, stdin=b"second words, nothing of the first (canary Sv2y)\n" * 20)
    root = mounts.mount(scenario.alice_session)
    (root / NOTE).write_bytes(b"third words through the mount (canary Tv3z)\n" * 20)
    _search(scenario, scenario.alice_session, "third words through the mount")  # catches the queue up
    mounts.umount(root)
    cli.j("forget", scenario.alice_session, NOTE)
    for path in (cli.home / "agents" / "main").glob("catalog.sqlite*"):
        data = path.read_bytes()
        for canary in (b"Fv1x", b"Sv2y", b"Tv3z"):
            assert canary not in data, (path.name, canary)
