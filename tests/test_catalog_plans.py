"""Queries given a list of revisions look them up by id, never walk the catalog.

A catalog holds one agent, so ``agent_id = ?`` matches every row, but SQLite
has no statistics here and assumes an equality on an indexed column narrows a
lot. For ``revision_id IN (...)`` it then walked every revision by the
``(agent_id, locator)`` index: 0.23 s per 500 ids on the benchmark's catalog
of 200,000 revisions, on the catalog thread of a mount whose saves waited
behind it (``bench/RESULTS.md``, issue 14 seventh step). The plan does not
depend on how many rows there are (there are no statistics), so the
scenario's small catalog shows the same plan as a large one.
"""

from __future__ import annotations

import re

from scopefs.catalog.index import unindexed_among
from scopefs.catalog.stores import ACTIVE_WITH_STORE
from scopefs.writer.forget import OWN_STORE_REVISIONS
from scopefs.writer.unsynced import SELECT_REVISIONS
from tests.conftest import Scenario, db_copy


def plan(scenario: Scenario, sql: str, params: tuple[object, ...]) -> list[str]:
    with db_copy(scenario.cli.home / "agents" / scenario.agent / "catalog.sqlite") as conn:
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def revisions_step(steps: list[str]) -> str:
    found = [step for step in steps if re.match(r"(SEARCH|SCAN) v\b", step)]
    assert len(found) == 1, steps
    return found[0]


def test_the_verified_revisions_are_looked_up_by_id(scenario: Scenario) -> None:
    agent = scenario.agent
    ids = tuple(f"rev_{i}" for i in range(50))
    step = revisions_step(plan(scenario, unindexed_among(len(ids)), (agent, agent, agent, *ids)))
    assert step.startswith("SEARCH v") and "(revision_id=?)" in step, step


def test_unsynced_revisions_are_looked_up_by_id(scenario: Scenario) -> None:
    """A mount's write-back (every 30 s after saves) settles its unsynced revisions with this query:
    1.7 s for 300 ids on the benchmark's catalog, caches cold, when it walked them all; 0.1 s now."""
    step = revisions_step(plan(scenario, SELECT_REVISIONS, (scenario.agent, '["r1", "r2"]')))
    assert step.startswith("SEARCH v") and "(revision_id=?)" in step, step


def test_a_forget_finds_the_own_notes_among_its_revisions_by_id(scenario: Scenario) -> None:
    step = revisions_step(plan(scenario, OWN_STORE_REVISIONS, (scenario.agent, "someone", '["r1", "r2"]')))
    assert step.startswith("SEARCH v") and "(revision_id=?)" in step, step


def test_one_active_revision_is_looked_up_by_id(scenario: Scenario) -> None:
    """A guard: the planner already took the primary key for one id before the unary ``+``; it must
    still, now that the agent id can use no index."""
    agent = scenario.agent
    step = revisions_step(plan(scenario, ACTIVE_WITH_STORE + " AND v.revision_id = ?", (agent, agent, agent, "r")))
    assert step.startswith("SEARCH v") and "(revision_id=?)" in step, step
