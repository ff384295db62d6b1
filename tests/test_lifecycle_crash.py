"""Derive, forget and descendant invalidation survive a crash at every step.

A derivation is a write with rows of its own (lineage edges, its label);
a forget is one transaction followed by the removal of bytes. A process
killed between any two steps leaves, after recovery, either the whole
operation or none of it: never a derivation without its lineage, never a
descendant readable after its forgotten source, never half a forget. A
power loss is covered by the write transaction's own suite: every step
here is that transaction or one catalog commit.
"""

from __future__ import annotations

import pytest

from scopefs.writer.steps import Step
from tests.conftest import ALICE_FACT, Scenario
from tests.test_sharing_crash import CRASH_STEPS, _crash_at, _recover, _rows

SOURCE = "private/notes/allergy.md"
DIGEST = b"Digest: lunches without hazelnut desserts for the team\n"


@pytest.mark.parametrize("step", CRASH_STEPS, ids=lambda st: st.value)
def test_a_derivation_killed_midway_leaves_no_lineage_and_no_note(scenario: Scenario, step: Step) -> None:
    s = scenario
    derive = ("derive", s.alice_session, "--from", SOURCE, "--to", "private/d.md")
    _crash_at(s, step, *derive, stdin=DIGEST)
    _recover(s)
    assert _rows(s, "SELECT count(*) FROM lineage_edges") == [(0,)]
    assert _rows(s, "SELECT count(*) FROM derivations") == [(0,)]
    assert s.cli("read", s.alice_session, "private/d.md").code == 3
    s.cli.j(*derive, stdin=DIGEST)  # done again, it simply works
    assert s.cli("read", s.alice_session, "private/d.md", check=True).out == DIGEST


@pytest.mark.parametrize("step", CRASH_STEPS, ids=lambda st: st.value)
def test_a_derivation_killed_midway_then_its_source_forgotten_never_lands(scenario: Scenario, step: Step) -> None:
    """The derivation's pending revision is rolled back by recovery; had it activated, it would be held."""
    s = scenario
    _crash_at(s, step, "derive", s.alice_session, "--from", SOURCE, "--to", "private/d.md", stdin=DIGEST)
    s.cli.j("forget", s.alice_session, SOURCE)
    _recover(s)
    assert s.cli("read", s.alice_session, "private/d.md").code == 3
    assert s.cli("read", s.alice_session, SOURCE).code == 3


def test_a_forget_killed_inside_its_transaction_changes_nothing(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("derive", s.alice_session, "--from", SOURCE, "--to", "private/d.md", stdin=DIGEST)
    _crash_at(s, Step.FORGETTING, "forget", s.alice_session, SOURCE)
    _recover(s)
    assert s.cli("read", s.alice_session, SOURCE, check=True).out == ALICE_FACT
    assert s.cli("read", s.alice_session, "private/d.md", check=True).out == DIGEST
    assert _rows(s, "SELECT count(*) FROM forgets") == [(0,)]
    assert _rows(s, "SELECT count(*) FROM rejected_claims") == [(0,)]
    assert _rows(s, "SELECT count(*) FROM lineage_holds") == [(0,)]
    assert s.cli("write", s.alice_session, "private/again.md", stdin=ALICE_FACT).code == 0


def test_a_forget_killed_after_its_commit_is_whole_and_doctor_removes_the_bytes(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("derive", s.alice_session, "--from", SOURCE, "--to", "private/d.md", stdin=DIGEST)
    _crash_at(s, Step.FORGOTTEN, "forget", s.alice_session, SOURCE)
    for path in (SOURCE, "private/d.md"):
        assert s.cli("read", s.alice_session, path).code == 3
    assert s.cli("write", s.alice_session, "private/again.md", stdin=ALICE_FACT).code == 3
    found = s.cli("--json", "doctor").json()["findings"]
    assert sum(f["kind"] == "forgotten-artifact" for f in found) == 2
    assert sum(f["kind"] == "unscrubbed-forget" for f in found) == 1
    _recover(s)
    catalog_files = b"".join(p.read_bytes() for p in (s.cli.home / "agents").rglob("catalog.sqlite*"))
    assert b"A1c3" not in catalog_files and b"hazelnut desserts" not in catalog_files
    again = s.cli("--json", "doctor")
    assert again.code == 0 and not [f for f in again.json()["findings"] if f["kind"] == "forgotten-artifact"]
    artifacts = b"".join(p.read_bytes() for p in (s.cli.home / "agents").rglob("*") if p.is_file()
                         and "memory-scopes" in str(p))
    assert b"A1c3" not in artifacts and b"hazelnut desserts" not in artifacts
