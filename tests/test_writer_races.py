"""A mount acts on the note it looked up, never on whatever note has the path by the time the writer runs.

The mount calls the writer with path components and the resource id it
holds for that path (``scopefs.vfs.catalog_ops``); the writer checks that id
inside its own transaction. Each test lands another session's renames
exactly in the gap that used to exist: after the mount's call has begun
(its check, or its staging) and before the writer's transaction, by running
them when the writer takes its lock. On the code before the check moved
into the transaction, the removal tombstoned the note that had just been
renamed onto the path (test failed: ``Denied`` reading ``Y`` back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from scopefs.catalog.access import authorize_session, refuse_unseen
from scopefs.catalog.errors import Conflict, Denied
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Op
from scopefs.catalog.reader import read_note
from scopefs.catalog.reasons import Reason
from scopefs.vfs import catalog_ops
from scopefs.vfs.drafts import Draft
from scopefs.writer import lock
from scopefs.writer.rename import rename_note
from scopefs.writer.transaction import write_note
from tests.conftest import Scenario, table_dump

A, B, MOVED = "private/race/a.md", "private/race/b.md", "private/race/moved.md"


def _parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


@pytest.fixture
def raced(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Home, str, str]]:
    """Alice's notes X at ``A`` and Y at ``B``; the next writer lock taken first moves X away and Y onto ``A``.

    Yields the home, Alice's session and X's resource id. The renames are
    the writer's own, by the same session (another mount of it, say).
    """
    home = Home.open(scenario.cli.home)
    session = scenario.alice_session
    x = write_note(home, session, A, b"X\n").resource_id
    write_note(home, session, B, b"Y\n")
    real = lock.shared
    pending = [True]

    @contextlib.contextmanager
    def shared(path: Path) -> Iterator[None]:
        if pending:
            pending.clear()
            rename_note(home, session, A, MOVED)
            rename_note(home, session, B, A)
        with real(path):
            yield

    monkeypatch.setattr(lock, "shared", shared)
    yield home, session, x
    assert not pending, "the race never ran: the writer took no lock"


def test_a_removal_spares_the_note_renamed_onto_the_path(raced: tuple[Home, str, str]) -> None:
    home, session, x = raced
    assert catalog_ops.remove(home, session, _parts(A), x) is False
    assert read_note(home, session, A) == b"Y\n"  # never unlinked by anyone
    assert read_note(home, session, MOVED) == b"X\n"  # moved, not removed: not this removal's business


def test_a_rename_moves_only_the_note_it_meant(raced: tuple[Home, str, str]) -> None:
    home, session, x = raced
    with pytest.raises(Conflict):
        catalog_ops.rename(home, session, _parts(A), _parts("private/race/c.md"), x, None)
    assert read_note(home, session, A) == b"Y\n"
    assert read_note(home, session, MOVED) == b"X\n"
    with pytest.raises(Denied):
        read_note(home, session, "private/race/c.md")


def test_a_save_never_becomes_a_revision_of_another_note(raced: tuple[Home, str, str]) -> None:
    home, session, x = raced
    draft = Draft(b"X, edited\n")
    try:
        with pytest.raises(Conflict):
            with draft.reader() as source:
                catalog_ops.commit(home, session, _parts(A), source, x)
    finally:
        draft.close()
    assert read_note(home, session, A) == b"Y\n"
    assert read_note(home, session, MOVED) == b"X\n"


def test_without_a_race_each_call_acts_on_its_note(scenario: Scenario) -> None:
    """The same calls, undisturbed: the expected id is the note there, so each goes through."""
    home, session = Home.open(scenario.cli.home), scenario.alice_session
    x = write_note(home, session, A, b"X\n").resource_id
    draft = Draft(b"X2\n")
    try:
        with draft.reader() as source:
            assert catalog_ops.commit(home, session, _parts(A), source, x).resource_id == x
    finally:
        draft.close()
    catalog_ops.rename(home, session, _parts(A), _parts(B), x, None)
    assert read_note(home, session, B) == b"X2\n"
    assert catalog_ops.remove(home, session, _parts(B), x) is True
    with pytest.raises(Denied):
        read_note(home, session, B)


def test_a_note_the_caller_meant_and_may_no_longer_see_looks_moved(scenario: Scenario) -> None:
    """Revoked and moved answer alike (Conflict) when the caller named the note; the audit keeps the truth.

    Without an expected id a note the subject may not read is refused like
    a missing one (``outside-view``); with it, a Denied there and a
    Conflict for a moved note would tell the caller which of the two befell
    a note it just lost. (Today a writable root always lets its writer read,
    so the writer meets this only through ``refuse_unseen`` itself.)
    """
    home = Home.open(scenario.cli.home)
    access = authorize_session(home, scenario.alice_session, Op.DELETE)
    audited = len(table_dump(scenario.cli.home / "state.sqlite")["audit"])
    named = refuse_unseen(access, Op.DELETE, Reason.EXPLICIT_DENY, store_id=None, revision_id=None,
                          expected="r_meant", hide=True)
    unnamed = refuse_unseen(access, Op.DELETE, Reason.EXPLICIT_DENY, store_id=None, revision_id=None,
                            expected=None, hide=True)
    assert isinstance(named, Conflict)
    assert isinstance(unnamed, Denied) and unnamed.reason == Reason.OUTSIDE_VIEW
    rows = table_dump(scenario.cli.home / "state.sqlite")["audit"][audited:]
    assert len(rows) == 2 and all("deny" in row and str(Reason.EXPLICIT_DENY) in row for row in rows)
