"""Adding an agent: its cell directory, artifact area and catalog.

The directories and the catalog are made first and the agent is registered
in ``state.sqlite`` last, so an interrupted ``agent add`` leaves nothing that
any session can use, and running it again completes it.
"""

from __future__ import annotations

from scopefs.catalog.clock import now_us
from scopefs.catalog.db import connect, immediate, one
from scopefs.catalog.fsafe import fsync_dir
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.schema import ensure_schema
from scopefs.catalog.schema.agent import AGENT_SCHEMA


def make_cell(home: Home, agent_id: str) -> None:
    """A cell's directories and catalog (an agent's or a pool's), made idempotently.

    Not registered here: the caller registers the cell last, so that an
    interrupted creation leaves nothing any session can use.
    """
    cell = home.agent_dir(agent_id)
    for path in (cell.parent, cell, home.scopes_dir(agent_id).parent, home.scopes_dir(agent_id),
                 home.staging_dir(agent_id), home.quarantine_dir(agent_id)):
        path.mkdir(mode=0o700, exist_ok=True)
        fsync_dir(path.parent)  # the new name is durable before anything relies on it
    conn = connect(home.catalog_path(agent_id), create=True)
    try:
        ensure_schema(conn, AGENT_SCHEMA)
        with immediate(conn):
            if one(conn, "SELECT 1 FROM agent_cell") is None:
                conn.execute("INSERT INTO agent_cell (agent_id, created_at) VALUES (?, ?)", (agent_id, now_us()))
    finally:
        conn.close()
    fsync_dir(home.agent_dir(agent_id))


def add_agent(home: Home, agent_id: str) -> bool:
    """Create the agent; returns False if it already existed (no change)."""
    validate_agent_name(agent_id)
    make_cell(home, agent_id)
    state = home.state()
    with immediate(state):
        if one(state, "SELECT 1 FROM agents WHERE agent_id = ?", (agent_id,)) is not None:
            return False
        state.execute("INSERT INTO agents (agent_id, created_at) VALUES (?, ?)", (agent_id, now_us()))
    return True
