"""The broker's own session, for operator work that writes as nobody in particular.

A command an operator runs on the host (a migration, a review of the
quarantine) has no person's session to act through, yet every write goes
through a session's access: its audit rows need a session, and the write
transaction decides against a view. The broker opens a shared-main
(ambiguous) session for the run, whose own view holds nothing but
``agent-shared/``, marked as the broker's (``catalog.broker_sessions``:
never served, never written through from the command line, traced to the
operator's uid), and closes it when the run ends; ``doctor --fix`` closes
one a killed run left open. What the run may write is decided by the
run's own authority (``Provenance.authority``), inside both commits.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import apsw

from scopefs.catalog.access import Access, current_access
from scopefs.catalog.broker_sessions import open_broker_session
from scopefs.catalog.errors import ScopefsError
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Op
from scopefs.catalog.sessions import close_session

log = logging.getLogger("scopefs.broker")


@contextlib.contextmanager
def broker_access(home: Home, agent_id: str, operation: Op, command: str) -> Iterator[Access]:
    """A fresh broker session's access for the block, marked as ``command``'s run (``migrate``,
    ``quarantine-release``, ...); the session is closed after it, whatever happens.

    A close that fails (the state database locked past its timeout) is logged, never raised: it must not
    hide the block's own error, nor turn work the block committed into a failure the caller would retry.
    The session left open is the broker's own: nothing can use it, and ``doctor --fix`` closes it.
    """
    session = open_broker_session(home, agent_id, command)
    try:
        access, problem = current_access(home, session.session_id)
        if problem is not None:
            raise access.refuse(operation, problem)
        yield access
    finally:
        try:
            close_session(home, session.session_id)
        except (ScopefsError, apsw.Error, OSError) as exc:
            log.warning("the broker's session of this run stays open (%s)", type(exc).__name__)
