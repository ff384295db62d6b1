"""A copy interrupted at any step of its write leaves nothing of itself behind.

Projections, deposits and approvals are copies written by the staged-rename
transaction with rows of their own (a projection's allows and record, a
postbox item, an item's decision). Those rows are written with the copy's
activation, so a process that dies between the steps leaves, after
recovery, no allow, projection or item without an active copy, and the
same operation can simply be done again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import apsw
import pytest

from scopefs.writer.steps import Step
from tests.conftest import ACCOUNT, ALICE_FACT, ALICE_SENDER, CHANNEL, Scenario, db_copy
from tests.crashkit import REPO, catalog_path

_CHILD = r"""
import os, sys
from scopefs.writer import steps
from scopefs.cli.main import main

target = sys.argv[1]

def die_here(step):
    if step.value == target:
        os._exit(70)  # as a crash: no cleanup, no rollback, locks released by the kernel

steps.set_hook(die_here)
sys.exit(main(sys.argv[2:]))
"""
CRASH_STEPS = (Step.PENDING, Step.RENAMED, Step.FINALIZED)
SOURCE = "private/notes/allergy.md"
COPY = "projections/channel/notes/allergy.md"


def _crash_at(s: Scenario, step: Step, *argv: str, stdin: bytes = b"") -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD, step.value, *argv], input=stdin, capture_output=True,
                          cwd=REPO, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO),
                                                     "SCOPEFS_HOME": str(s.cli.home)})
    assert proc.returncode == 70, (proc.returncode, proc.stderr.decode(errors="replace")[-2000:])


def _rows(s: Scenario, sql: str) -> list[tuple[Any, ...]]:
    with db_copy(catalog_path(s.cli.home)) as conn:
        return conn.execute(sql).fetchall()


def _recover(s: Scenario) -> None:
    s.cli("doctor", "--fix", check=True)


@pytest.mark.parametrize("step", CRASH_STEPS, ids=lambda st: st.value)
def test_a_projection_killed_midway_leaves_no_allow_and_no_record(scenario: Scenario, step: Step) -> None:
    s = scenario
    project = ("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}", "--purpose", "p",
               "--no-expiry", "--yes")
    _crash_at(s, step, *project)
    _recover(s)
    assert _rows(s, "SELECT count(*) FROM projections") == [(0,)]
    assert _rows(s, "SELECT count(*) FROM lineage_edges") == [(0,)]
    assert _rows(s, "SELECT count(*) FROM policy_entries WHERE revoked_at IS NULL") == [(0,)]
    assert s.cli("read", s.group_session, COPY).code == 3
    s.cli.j(*project)  # the name is free: the same projection simply works now
    assert s.cli("read", s.group_session, COPY, check=True).out == ALICE_FACT


@pytest.mark.parametrize("step", CRASH_STEPS, ids=lambda st: st.value)
def test_a_replacing_projection_killed_midway_leaves_the_old_one_as_it_was(scenario: Scenario, step: Step) -> None:
    s = scenario
    first = s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}", "--purpose", "p",
                    "--expires", "1d", "--yes")["projection_id"]
    s.cli.j("write", s.alice_session, SOURCE, stdin=b"revised\n")
    _crash_at(s, step, "project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}",
              "--purpose", "p", "--no-expiry", "--yes")
    _recover(s)
    states = {p["projection_id"]: p["state"] for p in s.cli.j("projection", "list", "--agent", s.agent)["projections"]}
    assert states == {first: "live"}
    assert _rows(s, "SELECT count(*) FROM policy_entries WHERE revoked_at IS NULL AND expires_at IS NULL") == [(0,)]
    assert s.cli("read", s.group_session, COPY, check=True).out == ALICE_FACT
    assert s.cli.j("projection", "revoke", first)["revoked"] is True
    assert s.cli("read", s.group_session, COPY).code == 3


@pytest.mark.parametrize("step", CRASH_STEPS, ids=lambda st: st.value)
def test_a_deposit_killed_midway_leaves_no_item_and_spends_its_handle(scenario: Scenario, step: Step) -> None:
    s = scenario
    s.cli.j("postbox", "enable", s.alice)

    def handle() -> str:
        return str(s.cli.j("message", "add", s.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                           "--sender", ALICE_SENDER)["message_handle"])

    spent = handle()
    _crash_at(s, step, "deposit", s.group_session, spent, stdin=b"an observation\n")
    _recover(s)
    assert _rows(s, "SELECT count(*) FROM postbox_items") == [(0,)]
    assert _rows(s, "SELECT count(*) FROM postbox_sources") == [(0,)]
    assert s.cli.j("postbox", "list", s.alice_session) == {"pending": [], "notices": []}
    assert s.cli("deposit", s.group_session, spent, stdin=b"again\n").code == 3  # fails closed
    assert s.cli("deposit", s.group_session, handle(), stdin=b"an observation\n").code == 0
    listed = s.cli.j("postbox", "list", s.alice_session)
    assert len(listed["pending"]) == 1 and len(listed["notices"]) == 1  # the notice was not used up


@pytest.mark.parametrize("step", CRASH_STEPS, ids=lambda st: st.value)
def test_an_approval_killed_midway_leaves_the_item_pending(scenario: Scenario, step: Step) -> None:
    s = scenario
    s.cli.j("postbox", "enable", s.alice)
    handle = s.cli.j("message", "add", s.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", ALICE_SENDER)["message_handle"]
    assert s.cli("deposit", s.group_session, handle, stdin=b"an observation\n").code == 0
    item = s.cli.j("postbox", "list", s.alice_session)["pending"][0]["item_id"]
    _crash_at(s, step, "postbox", "approve", s.alice_session, item, "--to", "private/kept.md")
    _recover(s)
    assert [p["item_id"] for p in s.cli.j("postbox", "list", s.alice_session)["pending"]] == [item]
    assert s.cli("read", s.alice_session, "private/kept.md").code == 3
    s.cli.j("postbox", "approve", s.alice_session, item, "--to", "private/kept.md")
    assert s.cli("read", s.alice_session, "private/kept.md", check=True).out == b"an observation\n"
    assert s.cli.j("postbox", "list", s.alice_session)["pending"] == []
    with pytest.raises(apsw.Error):  # decided once: the schema refuses a second decision
        with apsw.Connection(str(catalog_path(s.cli.home))) as conn:
            conn.execute("UPDATE postbox_items SET state = 'rejected', decided_at = 1 WHERE item_id = ?", (item,))
