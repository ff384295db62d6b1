"""Schema of the shared ``state.sqlite``: who is who, and what happened.

Principals, identity bindings, conversations, memberships and the redacted
audit. No raw provider identifier is ever stored: bindings and conversations
are found by a keyed HMAC of their provider tuple. Times are integer
microseconds since the epoch.
"""

from __future__ import annotations

from scopefs.catalog.schema import SchemaKind

V1 = """
CREATE TABLE agents (
    agent_id    TEXT PRIMARY KEY,            -- operator-chosen, validated name
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE principals (
    principal_id TEXT PRIMARY KEY,           -- opaque, random
    kind         TEXT NOT NULL CHECK (kind IN ('human', 'service', 'role', 'conversation')),
    label        TEXT,                       -- display label only, never identity
    state        TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'disabled')),
    created_at   INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX principals_role_label ON principals (label) WHERE kind = 'role';

CREATE TABLE identity_bindings (
    binding_id        TEXT PRIMARY KEY,
    lookup_key        BLOB NOT NULL,         -- HMAC-SHA256 of (channel, account, sender)
    principal_id      TEXT NOT NULL REFERENCES principals (principal_id),
    adapter           TEXT NOT NULL,
    assurance         TEXT NOT NULL,
    verification      TEXT NOT NULL,
    evidence_revision INTEGER NOT NULL DEFAULT 1,
    created_by        TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    revoked_at        INTEGER
) STRICT;
-- One live binding per provider tuple: rebinding needs a revocation first.
CREATE UNIQUE INDEX identity_bindings_live ON identity_bindings (lookup_key) WHERE revoked_at IS NULL;
-- INSERT OR REPLACE would silently delete the live binding it conflicts with.
CREATE TRIGGER identity_bindings_no_replace BEFORE INSERT ON identity_bindings
WHEN EXISTS (SELECT 1 FROM identity_bindings WHERE binding_id = NEW.binding_id
             OR (lookup_key = NEW.lookup_key AND revoked_at IS NULL AND NEW.revoked_at IS NULL))
BEGIN SELECT RAISE(ABORT, 'this sender is already bound; revoke that binding first'); END;
CREATE TRIGGER identity_bindings_immutable
BEFORE UPDATE OF binding_id, lookup_key, principal_id, adapter, assurance, verification,
                 evidence_revision, created_by, created_at ON identity_bindings
BEGIN SELECT RAISE(ABORT, 'identity bindings are immutable; revoke and bind again'); END;
CREATE TRIGGER identity_bindings_revoke_once
BEFORE UPDATE OF revoked_at ON identity_bindings WHEN OLD.revoked_at IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'binding already revoked'); END;
CREATE TRIGGER identity_bindings_no_delete BEFORE DELETE ON identity_bindings
BEGIN SELECT RAISE(ABORT, 'identity bindings are never deleted'); END;

CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY REFERENCES principals (principal_id),
    agent_id        TEXT NOT NULL REFERENCES agents (agent_id),
    lookup_key      BLOB NOT NULL,           -- HMAC of (channel, account, conversation)
    created_at      INTEGER NOT NULL,
    UNIQUE (agent_id, lookup_key)
) STRICT;

CREATE TABLE memberships (
    membership_id     TEXT PRIMARY KEY,
    group_id          TEXT NOT NULL REFERENCES principals (principal_id),  -- conversation or role
    principal_id      TEXT NOT NULL REFERENCES principals (principal_id),
    evidence_revision INTEGER NOT NULL DEFAULT 1,
    added_at          INTEGER NOT NULL,
    expires_at        INTEGER,               -- evidence freshness bound; NULL = until removed
    removed_at        INTEGER
) STRICT;
CREATE UNIQUE INDEX memberships_live ON memberships (group_id, principal_id) WHERE removed_at IS NULL;
CREATE INDEX memberships_by_member ON memberships (principal_id) WHERE removed_at IS NULL;

-- Which agent's catalog holds a session (the subject itself lives there).
CREATE TABLE session_index (
    session_id TEXT PRIMARY KEY,
    agent_id   TEXT NOT NULL REFERENCES agents (agent_id)
) STRICT;

-- Redacted decision history: ids, revisions, decisions and reason codes only.
CREATE TABLE audit (
    audit_id     INTEGER PRIMARY KEY,
    event_id     TEXT UNIQUE,                -- set when drained from an agent outbox
    at           INTEGER NOT NULL,
    agent_id     TEXT,
    session_id   TEXT,
    operation    TEXT NOT NULL,
    subject_kind TEXT,
    actor_id     TEXT,
    store_id     TEXT,
    revision_id  TEXT,
    decision     TEXT NOT NULL CHECK (decision IN ('allow', 'deny', 'error')),
    reason       TEXT NOT NULL
) STRICT;
CREATE INDEX audit_by_time ON audit (at);
"""

# Shared pools (``scopefs pools apply``). ``pools`` registers each pool's
# cell (its own catalog file under pools/<name>/), kept when a later file
# drops the pool so that nothing written there is lost; ``pool_config`` holds
# the one current declaration, replaced whole in one transaction so that a
# reader sees the old file or the new one, never a mix.
V2 = """
CREATE TABLE pools (
    pool_name  TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
) STRICT;
CREATE TABLE pool_config (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    revision   INTEGER NOT NULL,
    sha256     TEXT NOT NULL,             -- of the canonical declaration
    document   TEXT NOT NULL,             -- canonical JSON: agents, pools
    applied_at INTEGER NOT NULL
) STRICT;

-- Exposure records: which immutable revision reached which session and
-- run, by which operation, under which policy revision; ids only, never
-- content. A receipt groups the rows of one response.
CREATE TABLE exposures (
    exposure_id     INTEGER PRIMARY KEY,
    receipt_id      TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    agent_id        TEXT NOT NULL,           -- the session's agent
    run_id          TEXT NOT NULL,
    operation       TEXT NOT NULL,
    revision_id     TEXT NOT NULL,
    resource_id     TEXT NOT NULL,
    policy_revision TEXT,
    at              INTEGER NOT NULL
) STRICT;
CREATE INDEX exposures_by_revision ON exposures (revision_id);
CREATE INDEX exposures_by_run ON exposures (session_id, run_id);
CREATE INDEX exposures_by_receipt ON exposures (receipt_id);
CREATE TRIGGER exposures_immutable BEFORE UPDATE ON exposures
BEGIN SELECT RAISE(ABORT, 'exposure records are never edited'); END;
"""

# V3: whether a person's postbox takes deposits (``catalog.postbox``): off
# unless a live row says so; turning it off closes the row, keeping history.
V3 = """
CREATE TABLE postbox_settings (
    setting_id   TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL REFERENCES principals (principal_id),
    mode         TEXT NOT NULL CHECK (mode IN ('review')),
    enabled_at   INTEGER NOT NULL,
    disabled_at  INTEGER
) STRICT;
CREATE UNIQUE INDEX postbox_settings_live ON postbox_settings (principal_id) WHERE disabled_at IS NULL;
CREATE TRIGGER postbox_settings_fixed
BEFORE UPDATE OF setting_id, principal_id, mode, enabled_at ON postbox_settings
BEGIN SELECT RAISE(ABORT, 'a postbox setting is fixed; disable it and enable again'); END;
"""

# V4 (issue 17, one self-contained block): what ``scopefs stats`` needs that nothing else records: each search's
# latency and how many candidates the postfilter dropped after the prefilter
# admitted them. Numbers only (no query, session, principal or path), one row
# per search, written in the transaction that already audits the search, and
# bounded: that transaction keeps only the newest SEARCH_STATS_KEPT rows.
V4 = """
CREATE TABLE search_stats (
    stat_id    INTEGER PRIMARY KEY,
    at         INTEGER NOT NULL,
    latency_us INTEGER NOT NULL CHECK (latency_us >= 0),
    results    INTEGER NOT NULL CHECK (results >= 0),
    dropped    INTEGER NOT NULL CHECK (dropped >= 0)
) STRICT;

-- Retention (``scopefs audit prune``): each prune's cutoff and what it
-- removed, kept with the audit row that records it (its event_id is the
-- prune_id), so a shortened history says so itself.
CREATE TABLE audit_prunes (
    prune_id      TEXT PRIMARY KEY,
    at            INTEGER NOT NULL,
    cutoff        INTEGER NOT NULL,
    audit_rows    INTEGER NOT NULL CHECK (audit_rows >= 0),
    exposure_rows INTEGER NOT NULL CHECK (exposure_rows >= 0)
) STRICT;
CREATE TRIGGER audit_prunes_immutable BEFORE UPDATE ON audit_prunes
BEGIN SELECT RAISE(ABORT, 'prune records are never edited'); END;
CREATE TRIGGER audit_prunes_no_delete BEFORE DELETE ON audit_prunes
BEGIN SELECT RAISE(ABORT, 'prune records are never deleted'); END;
"""

# What a session's view is read from changes only with the tables above that
# are not the journal (audit, exposures, search_stats, audit_prunes). Every
# change to one of them counts up ``view_generation`` in its own transaction,
# by trigger, whoever writes it: a mount woken by a commit here tells a read
# being recorded from a revocation by one row (``catalog.marks``). A table
# added later gets the same three triggers (``tests/test_marks.py`` checks).
V5 = """
CREATE TABLE view_generation (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    generation INTEGER NOT NULL
) STRICT;
INSERT INTO view_generation (singleton, generation) VALUES (1, 0);
CREATE TRIGGER view_generation_no_delete BEFORE DELETE ON view_generation
BEGIN SELECT RAISE(ABORT, 'the view generation is never deleted'); END;
CREATE TRIGGER agents_moves_views_on_insert AFTER INSERT ON agents
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER agents_moves_views_on_update AFTER UPDATE ON agents
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER agents_moves_views_on_delete AFTER DELETE ON agents
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER principals_moves_views_on_insert AFTER INSERT ON principals
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER principals_moves_views_on_update AFTER UPDATE ON principals
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER principals_moves_views_on_delete AFTER DELETE ON principals
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER identity_bindings_moves_views_on_insert AFTER INSERT ON identity_bindings
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER identity_bindings_moves_views_on_update AFTER UPDATE ON identity_bindings
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER identity_bindings_moves_views_on_delete AFTER DELETE ON identity_bindings
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER conversations_moves_views_on_insert AFTER INSERT ON conversations
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER conversations_moves_views_on_update AFTER UPDATE ON conversations
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER conversations_moves_views_on_delete AFTER DELETE ON conversations
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER memberships_moves_views_on_insert AFTER INSERT ON memberships
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER memberships_moves_views_on_update AFTER UPDATE ON memberships
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER memberships_moves_views_on_delete AFTER DELETE ON memberships
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER session_index_moves_views_on_insert AFTER INSERT ON session_index
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER session_index_moves_views_on_update AFTER UPDATE ON session_index
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER session_index_moves_views_on_delete AFTER DELETE ON session_index
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER pools_moves_views_on_insert AFTER INSERT ON pools
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER pools_moves_views_on_update AFTER UPDATE ON pools
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER pools_moves_views_on_delete AFTER DELETE ON pools
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER pool_config_moves_views_on_insert AFTER INSERT ON pool_config
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER pool_config_moves_views_on_update AFTER UPDATE ON pool_config
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER pool_config_moves_views_on_delete AFTER DELETE ON pool_config
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER postbox_settings_moves_views_on_insert AFTER INSERT ON postbox_settings
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER postbox_settings_moves_views_on_update AFTER UPDATE ON postbox_settings
BEGIN UPDATE view_generation SET generation = generation + 1; END;
CREATE TRIGGER postbox_settings_moves_views_on_delete AFTER DELETE ON postbox_settings
BEGIN UPDATE view_generation SET generation = generation + 1; END;
"""

STATE_SCHEMA = SchemaKind(name="state", application_id=0x53435354, steps=(V1, V2, V3, V4, V5))  # 'SCST'
