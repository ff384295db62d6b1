"""Queries a mount runs per revision look the revisions up by id, never walk the catalog.

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


def test_one_active_revision_is_looked_up_by_id(scenario: Scenario) -> None:
    agent = scenario.agent
    step = revisions_step(plan(scenario, ACTIVE_WITH_STORE + " AND v.revision_id = ?", (agent, agent, agent, "r")))
    assert step.startswith("SEARCH v") and "(revision_id=?)" in step, step
