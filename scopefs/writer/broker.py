"""The broker's own session, for operator work that writes as nobody in particular.

A command an operator runs on the host (a migration, a review of the
quarantine) has no person's session to act through, yet every write goes
through a session's access: its audit rows need a session, and the write
transaction decides against a view. The broker opens a shared-main
(ambiguous) session for the run, whose own view holds nothing but
``agent-shared/``, and closes it when the run ends, so it can never be
reused by a gateway or a mount. What the run may write is decided by the
run's own authority (``Provenance.authority``), inside both commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from scopefs.catalog.access import Access, current_access
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Op
from scopefs.catalog.sessions import SharedMain, close_session, open_session


@contextlib.contextmanager
def broker_access(home: Home, agent_id: str, operation: Op) -> Iterator[Access]:
    """A fresh broker session's access for the block; the session is closed after it, whatever happens."""
    session = open_session(home, agent_id, SharedMain())
    try:
        access, problem = current_access(home, session.session_id)
        if problem is not None:
            raise access.refuse(operation, problem)
        yield access
    finally:
        close_session(home, session.session_id)
