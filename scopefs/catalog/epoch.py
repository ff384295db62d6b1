"""The policy revision of a session's access: one fingerprint of everything that decides its view.

A gateway capability is bound to the revision it was issued under; a
request made under another one is refused (``plan-expired``) and the
gateway opens the session again, so nothing authorized under old rules
outlives a change of them. The fingerprint covers the subject, the
actor, every root of the view with its placement, ceiling and cell (a
role that expired, a pools file that removed a reader), and, per cell the
view reaches, the policy epoch (moved by triggers on every policy change)
and how many entries have passed their expiry by now. Coarse on purpose:
a change anywhere in a cell costs a client one re-open, never a stale
grant; and cheap: one row and one index range count per cell.
"""

from __future__ import annotations

import hashlib
import json

from scopefs.catalog.access import Access
from scopefs.catalog.db import scalar


def policy_revision(access: Access) -> str:
    cells = {}
    for cell in access.cells():
        conn = access.home.catalog(access.in_cell(cell).agent_id)
        cells[cell] = [scalar(conn, "SELECT epoch FROM policy_epoch WHERE singleton = 1"),
                       scalar(conn, "SELECT count(*) FROM policy_entries WHERE expires_at IS NOT NULL"
                                    " AND expires_at <= ?", (access.now,))]
    subject = access.session.subject
    facts: dict[str, object] = {
        "subject": [subject.kind.value, subject.principal_id],
        "actor": access.actor_id,
        "roots": sorted([m.root, m.scope_kind, m.audience_id, sorted(op.value for op in m.placement),
                         sorted(op.value for op in m.ceiling), m.cell] for m in access.view.mounts),
        "cells": cells,
    }
    if access.view.caps is not None:  # a delegated session: its caps, as its parent's view narrows them now
        facts["caps"] = sorted("/".join(cap) for cap in access.view.caps)
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]
