"""The policy revision a capability is bound to: a fingerprint of what decides the session's view.

A capability names the revision it was issued under; a request made
under another one is refused (``plan-expired``) and the gateway opens the
session again, so nothing authorized under old rules outlives a change of
them. The fingerprint covers the session's subject, the actor, the view's
roots and what their placement grants (a role that expired removes a
root), and every policy entry of the agent (count, newest revision, how
many revoked, how many expired by now): any change of any of them, an
entry reaching its expiry included, is a new revision. Coarse on
purpose: a change elsewhere in the agent costs a client one re-open,
never a stale grant.
"""

from __future__ import annotations

import hashlib
import json

from scopefs.catalog.access import Access
from scopefs.catalog.db import one


def policy_revision(access: Access) -> str:
    catalog = access.home.catalog(access.agent_id)
    entries = one(catalog, "SELECT count(*), coalesce(max(policy_revision), 0), count(revoked_at),"
                           " count(CASE WHEN expires_at <= ? THEN 1 END)"
                           " FROM policy_entries WHERE agent_id = ?", (access.now, access.agent_id))
    subject = access.session.subject
    facts = {
        "subject": [subject.kind.value, subject.principal_id],
        "actor": access.actor_id,
        "roots": sorted([m.root, m.scope_kind, m.audience_id, sorted(op.value for op in m.placement),
                         sorted(op.value for op in m.ceiling)] for m in access.view.mounts),
        "entries": list(entries) if entries is not None else None,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]
