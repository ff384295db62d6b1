"""The authoritative decision on each search candidate.

The prefilter only narrows; this is the boundary. Every candidate a search
arm returns is decided here by the same pure evaluator that decides a read
(``catalog.policy.evaluate`` with ``read``), with the policy rows and the
revision's state as the catalog holds them now, before the candidate may
count towards a rank, a limit, a score or a snippet. Decisions are cached
per resource for the life of one search only.
"""

from __future__ import annotations

import apsw

from scopefs.catalog.policy import Op, ResourceState, evaluate
from scopefs.catalog.prefilter import Scope
from scopefs.catalog.stores import policy_entries, revision_lifecycle


class Postfilter:
    def __init__(self, conn: apsw.Connection, scope: Scope) -> None:
        self._conn = conn
        self._scope = scope
        self._decided: dict[tuple[str, str, bool, str, str], bool] = {}
        self._about: frozenset[str] | None = None
        self.denied = 0  # candidate rows refused: the prefilter admitted them, the evaluator did not (a metric)
        if scope.about is not None:
            self._about = frozenset(row[0] for row in conn.execute(
                "SELECT resource_id FROM resource_subjects WHERE agent_id = ? AND principal_id = ?",
                (scope.agent_id, scope.about)))

    def allows(self, resource_id: str, store_id: str, live: bool, revision_state: str, revision_id: str) -> bool:
        """Whether the session may read this resource's revision now (and it carries the asked-about subject)."""
        key = (resource_id, store_id, live, revision_state, revision_id)
        found = self._decided.get(key)
        if found is None:
            found = self._decide(resource_id, store_id, live, revision_state, revision_id)
            self._decided[key] = found
        if not found:
            self.denied += 1
        return found

    def _decide(self, resource_id: str, store_id: str, live: bool, revision_state: str, revision_id: str) -> bool:
        if self._about is not None and resource_id not in self._about:
            return False
        if self._scope.caps is not None:
            path = self._path(resource_id)
            if path is None or not self._scope.permits(store_id, path):
                return False  # outside a delegated session's caps: never a candidate, whatever its policy
        store = self._scope.store(store_id)
        entries = policy_entries(self._conn, self._scope.agent_id, store_id, resource_id)
        held, valid_until = revision_lifecycle(self._conn, revision_id)
        decision = evaluate(Op.READ, self._scope.subject, store.mount if store else None,
                            ResourceState(live, revision_state, held, valid_until), entries, self._scope.now)
        return decision.allowed

    def _path(self, resource_id: str) -> str | None:
        """The resource's path in its store now (None for an unknown resource)."""
        row = self._conn.execute("SELECT path FROM resources WHERE resource_id = ? AND agent_id = ?",
                                 (resource_id, self._scope.agent_id)).fetchall()
        return str(row[0][0]) if row else None
