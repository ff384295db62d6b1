"""Schema of one agent's ``catalog.sqlite``: stores, revisions, policy, sessions.

The agent id is a hard cell boundary: the database holds exactly one
``agent_cell`` row, every store-, resource- and session-bearing row carries
``agent_id`` with a foreign key to it, and every query also constrains it.
Revisions are immutable apart from their lifecycle state, which may only
move forward; session subjects are write-once. Both rules are enforced by
triggers, so no code path, including a buggy one, can break them.
"""

from __future__ import annotations

from scopefs.catalog.schema import SchemaKind

V1 = """
CREATE TABLE agent_cell (
    agent_id   TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
) STRICT;
CREATE TRIGGER agent_cell_single BEFORE INSERT ON agent_cell
WHEN (SELECT count(*) FROM agent_cell) > 0
BEGIN SELECT RAISE(ABORT, 'a catalog belongs to exactly one agent'); END;
CREATE TRIGGER agent_cell_fixed BEFORE UPDATE ON agent_cell
BEGIN SELECT RAISE(ABORT, 'the agent cell is fixed'); END;

-- Physical namespaces. path_key is the opaque directory name; it is distinct
-- from store_id so that a path key can be rotated without changing identity.
CREATE TABLE storage_roots (
    storage_root_id  TEXT PRIMARY KEY,
    agent_id         TEXT NOT NULL REFERENCES agent_cell (agent_id),
    backend_kind     TEXT NOT NULL CHECK (backend_kind = 'fs'),
    path_key         TEXT NOT NULL,
    path_key_version INTEGER NOT NULL DEFAULT 1,
    authority_kind   TEXT NOT NULL,
    authority_owner  TEXT,
    state            TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'retired')),
    created_at       INTEGER NOT NULL,
    UNIQUE (agent_id, path_key)
) STRICT;

CREATE TABLE stores (
    store_id        TEXT PRIMARY KEY,
    agent_id        TEXT NOT NULL REFERENCES agent_cell (agent_id),
    storage_root_id TEXT NOT NULL UNIQUE REFERENCES storage_roots (storage_root_id),
    scope_kind      TEXT NOT NULL CHECK (scope_kind IN
                        ('user', 'channel', 'role', 'agent-shared', 'agent', 'projection', 'quarantine')),
    audience_id     TEXT NOT NULL,           -- principal id; '' for agent-shared
    state           TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'retired')),
    created_at      INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX stores_one_per_audience ON stores (agent_id, scope_kind, audience_id) WHERE state = 'active';
-- INSERT OR REPLACE deletes conflicting rows without firing delete triggers
-- (unless recursive_triggers is on), so every table with write-once rows
-- refuses an insert that would replace one.
CREATE TRIGGER stores_no_replace BEFORE INSERT ON stores
WHEN EXISTS (SELECT 1 FROM stores WHERE store_id = NEW.store_id OR storage_root_id = NEW.storage_root_id
             OR (agent_id = NEW.agent_id AND scope_kind = NEW.scope_kind AND audience_id = NEW.audience_id
                 AND state = 'active' AND NEW.state = 'active'))
BEGIN SELECT RAISE(ABORT, 'stores are never replaced'); END;
CREATE TRIGGER stores_identity_fixed
BEFORE UPDATE OF store_id, agent_id, storage_root_id, scope_kind, audience_id, created_at ON stores
BEGIN SELECT RAISE(ABORT, 'a store keeps its scope and audience'); END;

-- Stable resource identity; the logical path may change (rename), the id not.
CREATE TABLE resources (
    resource_id TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    store_id    TEXT NOT NULL REFERENCES stores (store_id),
    path        TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'tombstoned')),
    created_at  INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX resources_live_path ON resources (agent_id, store_id, path) WHERE state = 'live';
CREATE TRIGGER resources_no_replace BEFORE INSERT ON resources
WHEN EXISTS (SELECT 1 FROM resources WHERE resource_id = NEW.resource_id
             OR (agent_id = NEW.agent_id AND store_id = NEW.store_id AND path = NEW.path AND state = 'live'
                 AND NEW.state = 'live'))
BEGIN SELECT RAISE(ABORT, 'resources are never replaced'); END;
CREATE TRIGGER resources_identity_fixed
BEFORE UPDATE OF resource_id, agent_id, store_id, created_at ON resources
BEGIN SELECT RAISE(ABORT, 'a resource keeps its identity and store'); END;

-- Immutable revisions. At most one is active per resource; readers resolve
-- only active ones. locator is the broker-generated artifact file name.
CREATE TABLE revisions (
    revision_id      TEXT PRIMARY KEY,
    agent_id         TEXT NOT NULL REFERENCES agent_cell (agent_id),
    resource_id      TEXT NOT NULL REFERENCES resources (resource_id),
    revision_no      INTEGER NOT NULL,
    base_revision_id TEXT REFERENCES revisions (revision_id),
    content_sha256   TEXT NOT NULL CHECK (length(content_sha256) = 64),
    size             INTEGER NOT NULL CHECK (size >= 0),
    locator          TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN
                         ('pending', 'active', 'superseded', 'rolled-back', 'tombstoned', 'corrupt')),
    session_id       TEXT,
    actor_id         TEXT,                   -- NULL when unattributed
    trust_origin     TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    activated_at     INTEGER,
    UNIQUE (resource_id, revision_no),
    UNIQUE (agent_id, locator)
) STRICT;
CREATE UNIQUE INDEX revisions_one_active ON revisions (resource_id) WHERE state = 'active';
CREATE INDEX revisions_by_state ON revisions (state) WHERE state IN ('pending', 'active');
CREATE TRIGGER revisions_born_pending BEFORE INSERT ON revisions
WHEN NEW.state != 'pending' OR NEW.activated_at IS NOT NULL
  OR EXISTS (SELECT 1 FROM revisions WHERE revision_id = NEW.revision_id
             OR (resource_id = NEW.resource_id AND revision_no = NEW.revision_no)
             OR (agent_id = NEW.agent_id AND locator = NEW.locator))
BEGIN SELECT RAISE(ABORT, 'a revision is born pending and never replaced'); END;
CREATE TRIGGER revisions_immutable
BEFORE UPDATE OF revision_id, agent_id, resource_id, revision_no, base_revision_id, content_sha256,
                 size, locator, session_id, actor_id, trust_origin, created_at ON revisions
BEGIN SELECT RAISE(ABORT, 'revisions are immutable'); END;
CREATE TRIGGER revisions_forward_only
BEFORE UPDATE OF state ON revisions
WHEN NOT ((OLD.state = 'pending' AND NEW.state IN ('active', 'rolled-back'))
       OR (OLD.state = 'active' AND NEW.state IN ('superseded', 'tombstoned', 'corrupt'))
       OR (OLD.state = 'superseded' AND NEW.state IN ('tombstoned', 'corrupt')))
BEGIN SELECT RAISE(ABORT, 'revision lifecycle only moves forward'); END;
CREATE TRIGGER revisions_activated_once
BEFORE UPDATE OF activated_at ON revisions WHEN OLD.activated_at IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'activation time is fixed'); END;
CREATE TRIGGER revisions_no_delete BEFORE DELETE ON revisions
BEGIN SELECT RAISE(ABORT, 'revisions are never deleted'); END;

-- Policy: stable ids, a revision counter, and immutable entries (deny rows,
-- exceptional allows, expiry). Placement in a store supplies the common allow.
CREATE TABLE policies (
    policy_id   TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    target_kind TEXT NOT NULL CHECK (target_kind IN ('store', 'resource')),
    target_id   TEXT NOT NULL,
    revision    INTEGER NOT NULL DEFAULT 1,
    state       TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'retired')),
    created_by  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    UNIQUE (agent_id, target_kind, target_id)
) STRICT;

CREATE TABLE policy_entries (
    entry_id        TEXT PRIMARY KEY,
    agent_id        TEXT NOT NULL REFERENCES agent_cell (agent_id),
    policy_id       TEXT NOT NULL REFERENCES policies (policy_id),
    policy_revision INTEGER NOT NULL,
    effect          TEXT NOT NULL CHECK (effect IN ('allow', 'deny')),
    capability      TEXT NOT NULL,
    audience_kind   TEXT NOT NULL CHECK (audience_kind IN ('any', 'principal', 'subject-kind')),
    audience_id     TEXT NOT NULL DEFAULT '',
    grantor         TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER,
    revoked_at      INTEGER
) STRICT;
CREATE INDEX policy_entries_by_policy ON policy_entries (policy_id) WHERE revoked_at IS NULL;
CREATE TRIGGER policy_entries_no_replace BEFORE INSERT ON policy_entries
WHEN EXISTS (SELECT 1 FROM policy_entries WHERE entry_id = NEW.entry_id)
BEGIN SELECT RAISE(ABORT, 'policy entries are never replaced'); END;
-- A deny of retrieve or read that matches the subject writing a store by
-- placement (its user, conversation or service) would hide names that its
-- own writes then collide with, revealing them: such a row cannot exist.
CREATE TRIGGER policy_entries_never_hide_from_writer BEFORE INSERT ON policy_entries
WHEN NEW.effect = 'deny' AND NEW.capability IN ('retrieve', 'read') AND EXISTS (
    SELECT 1 FROM policies p JOIN stores s
      ON s.store_id = CASE p.target_kind WHEN 'store' THEN p.target_id
                     ELSE (SELECT r.store_id FROM resources r WHERE r.resource_id = p.target_id) END
    WHERE p.policy_id = NEW.policy_id AND s.scope_kind IN ('user', 'channel', 'agent')
      AND (NEW.audience_kind = 'any'
           OR (NEW.audience_kind = 'principal' AND NEW.audience_id = s.audience_id)
           OR (NEW.audience_kind = 'subject-kind' AND NEW.audience_id =
               CASE s.scope_kind WHEN 'user' THEN 'user' WHEN 'channel' THEN 'conversation' ELSE 'service' END)))
BEGIN SELECT RAISE(ABORT, 'a deny cannot hide notes from the subject that writes their store'); END;
CREATE TRIGGER policy_entries_immutable
BEFORE UPDATE OF entry_id, agent_id, policy_id, policy_revision, effect, capability, audience_kind,
                 audience_id, grantor, created_at, expires_at ON policy_entries
BEGIN SELECT RAISE(ABORT, 'policy entries are immutable; revoke and add'); END;

-- Sessions: the subject is stamped once. Closing a session is the only change.
CREATE TABLE sessions (
    session_id           TEXT PRIMARY KEY,
    agent_id             TEXT NOT NULL REFERENCES agent_cell (agent_id),
    subject_kind         TEXT NOT NULL CHECK (subject_kind IN ('user', 'conversation', 'service', 'ambiguous')),
    subject_principal_id TEXT,
    subject_reason       TEXT CHECK (subject_reason IN ('shared-main', 'unbound')),
    binding_id           TEXT,               -- the evidence a user subject was opened through
    subject_revision     INTEGER NOT NULL DEFAULT 1,
    created_at           INTEGER NOT NULL,
    closed_at            INTEGER,
    CHECK ((subject_kind = 'ambiguous') = (subject_principal_id IS NULL)),
    CHECK ((subject_kind = 'ambiguous') = (subject_reason IS NOT NULL)),
    CHECK ((subject_kind = 'user') = (binding_id IS NOT NULL))
) STRICT;
CREATE TRIGGER sessions_no_replace BEFORE INSERT ON sessions
WHEN EXISTS (SELECT 1 FROM sessions WHERE session_id = NEW.session_id)
BEGIN SELECT RAISE(ABORT, 'session subject is write-once'); END;
CREATE TRIGGER sessions_subject_write_once
BEFORE UPDATE OF session_id, agent_id, subject_kind, subject_principal_id, subject_reason,
                 binding_id, subject_revision, created_at ON sessions
BEGIN SELECT RAISE(ABORT, 'session subject is write-once'); END;
CREATE TRIGGER sessions_close_once
BEFORE UPDATE OF closed_at ON sessions WHEN OLD.closed_at IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'session already closed'); END;
CREATE TRIGGER sessions_no_delete BEFORE DELETE ON sessions
BEGIN SELECT RAISE(ABORT, 'sessions are never deleted'); END;

-- Crash-recovery state machine for the staged-rename write transaction.
CREATE TABLE write_intents (
    intent_id       TEXT PRIMARY KEY,
    agent_id        TEXT NOT NULL REFERENCES agent_cell (agent_id),
    revision_id     TEXT NOT NULL UNIQUE REFERENCES revisions (revision_id),
    store_id        TEXT NOT NULL REFERENCES stores (store_id),
    staged_name     TEXT NOT NULL,
    final_locator   TEXT NOT NULL,
    expected_sha256 TEXT NOT NULL,
    event_id        TEXT,                    -- its audit outbox row
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'rolled-back')),
    created_at      INTEGER NOT NULL,
    finished_at     INTEGER
) STRICT;
CREATE INDEX write_intents_pending ON write_intents (state) WHERE state = 'pending';

-- Audit rows committed with catalog state, drained idempotently to state.sqlite.
CREATE TABLE audit_outbox (
    event_id   TEXT PRIMARY KEY,
    agent_id   TEXT NOT NULL REFERENCES agent_cell (agent_id),
    payload    TEXT NOT NULL,                -- JSON of ids, decision and reason only
    state      TEXT NOT NULL CHECK (state IN ('pending', 'ready', 'drained')),
    created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX audit_outbox_ready ON audit_outbox (state) WHERE state = 'ready';
"""

# V2: a change log the mounted views follow. Every change that can alter
# what a view shows (a revision's state, a resource's path or state, a
# policy entry or policy) appends one row naming its store and resource, so
# a mount updates exactly those notes and invalidates exactly their kernel
# caches instead of rescanning the catalog.
V2 = """
CREATE TABLE change_log (
    seq         INTEGER PRIMARY KEY,
    store_id    TEXT NOT NULL,
    resource_id TEXT                         -- NULL: the whole store (a store-level policy changed)
) STRICT;
CREATE TRIGGER change_log_revision AFTER UPDATE OF state ON revisions
BEGIN INSERT INTO change_log (store_id, resource_id)
      SELECT store_id, resource_id FROM resources WHERE resource_id = NEW.resource_id; END;
CREATE TRIGGER change_log_resource AFTER UPDATE OF path, state ON resources
BEGIN INSERT INTO change_log (store_id, resource_id) VALUES (NEW.store_id, NEW.resource_id); END;
CREATE TRIGGER change_log_entry_added AFTER INSERT ON policy_entries
BEGIN INSERT INTO change_log (store_id, resource_id)
      SELECT CASE p.target_kind WHEN 'store' THEN p.target_id
                  ELSE (SELECT r.store_id FROM resources r WHERE r.resource_id = p.target_id) END,
             CASE p.target_kind WHEN 'resource' THEN p.target_id END
      FROM policies p WHERE p.policy_id = NEW.policy_id; END;
CREATE TRIGGER change_log_entry_revoked AFTER UPDATE OF revoked_at ON policy_entries
BEGIN INSERT INTO change_log (store_id, resource_id)
      SELECT CASE p.target_kind WHEN 'store' THEN p.target_id
                  ELSE (SELECT r.store_id FROM resources r WHERE r.resource_id = p.target_id) END,
             CASE p.target_kind WHEN 'resource' THEN p.target_id END
      FROM policies p WHERE p.policy_id = NEW.policy_id; END;
CREATE TRIGGER change_log_policy AFTER UPDATE OF state ON policies
BEGIN INSERT INTO change_log (store_id, resource_id)
      SELECT CASE NEW.target_kind WHEN 'store' THEN NEW.target_id
                  ELSE (SELECT r.store_id FROM resources r WHERE r.resource_id = NEW.target_id) END,
             CASE NEW.target_kind WHEN 'resource' THEN NEW.target_id END; END;
"""

# V3: the scoped search index. Chunks are content-bearing derived
# state: each row names the immutable revision it was cut from, is written
# in the transaction that activates that revision, and is deleted by
# trigger the moment the revision stops being active (superseded,
# tombstoned, corrupt), so no lagging row outlives its revision. The FTS5
# table holds no copy of its own (external content); vectors sit in the
# chunk row, tagged with the model that made them, so a changed model can
# never be mixed with the old space. Subjects are verified principals a
# trusted caller attached to a resource; nothing infers them from text.
V3 = """
CREATE TABLE search_model (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    name      TEXT NOT NULL,
    dimension INTEGER NOT NULL CHECK (dimension > 0)
) STRICT;
INSERT INTO search_model (singleton, name, dimension) VALUES (1, 'scopefs-hashing-v2-256', 256);

CREATE TABLE search_chunks (
    chunk_id    INTEGER PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    revision_id TEXT NOT NULL REFERENCES revisions (revision_id),
    resource_id TEXT NOT NULL REFERENCES resources (resource_id),
    store_id    TEXT NOT NULL REFERENCES stores (store_id),
    ordinal     INTEGER NOT NULL CHECK (ordinal >= 0),
    start_line  INTEGER NOT NULL CHECK (start_line >= 1),
    end_line    INTEGER NOT NULL CHECK (end_line >= start_line),
    body        TEXT NOT NULL,
    embedding   BLOB,                        -- float32 vector; NULL when not embedded
    model       TEXT,                        -- the search_model name that made it
    CHECK ((embedding IS NULL) = (model IS NULL)),
    UNIQUE (revision_id, ordinal)
) STRICT;
CREATE INDEX search_chunks_by_store ON search_chunks (store_id, model);
CREATE INDEX search_chunks_by_resource ON search_chunks (resource_id);
CREATE TRIGGER search_chunks_of_active BEFORE INSERT ON search_chunks
WHEN NOT EXISTS (SELECT 1 FROM revisions v JOIN resources r ON r.resource_id = v.resource_id
                 WHERE v.revision_id = NEW.revision_id AND v.state = 'active' AND r.state = 'live'
                   AND v.agent_id = NEW.agent_id AND v.resource_id = NEW.resource_id
                   AND r.store_id = NEW.store_id)
BEGIN SELECT RAISE(ABORT, 'index rows are cut from an active revision of a live resource'); END;
CREATE TRIGGER search_chunks_immutable BEFORE UPDATE ON search_chunks
BEGIN SELECT RAISE(ABORT, 'index rows are replaced, never edited'); END;
-- store_id is indexed too, so a query can AND the view's stores into the
-- match itself and walk only their rows, never every match in the agent.
CREATE VIRTUAL TABLE search_fts USING fts5 (
    body, store_id, content = 'search_chunks', content_rowid = 'chunk_id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER search_chunks_fts_add AFTER INSERT ON search_chunks
BEGIN INSERT INTO search_fts (rowid, body, store_id) VALUES (NEW.chunk_id, NEW.body, NEW.store_id); END;
CREATE TRIGGER search_chunks_fts_drop AFTER DELETE ON search_chunks
BEGIN INSERT INTO search_fts (search_fts, rowid, body, store_id)
      VALUES ('delete', OLD.chunk_id, OLD.body, OLD.store_id); END;
-- One row per indexed revision, even one with no text (no chunks): what
-- tells "indexed, nothing to find" from "never indexed" (a revision
-- activated before V3, or while a model switch was under way), which
-- doctor reports and reindex completes.
CREATE TABLE search_indexed (
    revision_id TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    model       TEXT,                        -- the model of its vectors; NULL when not embedded
    chunks      INTEGER NOT NULL CHECK (chunks >= 0)
) STRICT;
CREATE TRIGGER search_indexed_of_active BEFORE INSERT ON search_indexed
WHEN NOT EXISTS (SELECT 1 FROM revisions WHERE revision_id = NEW.revision_id AND state = 'active'
                 AND agent_id = NEW.agent_id)
BEGIN SELECT RAISE(ABORT, 'only an active revision is indexed'); END;
CREATE TRIGGER search_chunks_retire AFTER UPDATE OF state ON revisions WHEN NEW.state != 'active'
BEGIN DELETE FROM search_chunks WHERE revision_id = NEW.revision_id;
      DELETE FROM search_indexed WHERE revision_id = NEW.revision_id; END;

CREATE TABLE resource_subjects (
    resource_id  TEXT NOT NULL REFERENCES resources (resource_id),
    principal_id TEXT NOT NULL,
    agent_id     TEXT NOT NULL REFERENCES agent_cell (agent_id),
    session_id   TEXT NOT NULL,               -- the session the trusted caller attached it through
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (resource_id, principal_id)
) STRICT;
CREATE INDEX resource_subjects_by_principal ON resource_subjects (principal_id);
"""

# A gateway's session key (OpenClaw's ``sessionKey``) names a logical
# session that outlives one window; it maps to the session opened for it.
# The key can carry provider ids, so only its keyed HMAC is stored. When
# the facts behind a key give another subject, the key is bound to a new
# session and the old binding is closed: the old session is then refused
# (``session-rebound``), never followed to its replacement.
V4 = """
CREATE TABLE session_keys (
    key_binding_id TEXT PRIMARY KEY,
    agent_id       TEXT NOT NULL REFERENCES agent_cell (agent_id),
    key_mac        BLOB NOT NULL,
    session_id     TEXT NOT NULL REFERENCES sessions (session_id),
    bound_at       INTEGER NOT NULL,
    unbound_at     INTEGER
) STRICT;
CREATE UNIQUE INDEX session_keys_live ON session_keys (agent_id, key_mac) WHERE unbound_at IS NULL;
CREATE INDEX session_keys_by_session ON session_keys (session_id);
CREATE TRIGGER session_keys_fixed
BEFORE UPDATE OF key_binding_id, agent_id, key_mac, session_id, bound_at ON session_keys
BEGIN SELECT RAISE(ABORT, 'a session key binding is fixed; close it and bind again'); END;
CREATE TRIGGER session_keys_close_once BEFORE UPDATE OF unbound_at ON session_keys
WHEN OLD.unbound_at IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'session key binding already closed'); END;
CREATE TRIGGER session_keys_no_delete BEFORE DELETE ON session_keys
BEGIN SELECT RAISE(ABORT, 'session key bindings are never deleted'); END;

-- The policy epoch: any change to a policy or an entry moves it, so a
-- capability bound to a policy revision can be checked with one row read
-- instead of a scan of every entry. Expiry needs no trigger: the entries
-- already past their expiry are counted through the index below.
CREATE TABLE policy_epoch (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    epoch     INTEGER NOT NULL
) STRICT;
INSERT INTO policy_epoch (singleton, epoch) VALUES (1, 0);
CREATE TRIGGER policies_epoch_add AFTER INSERT ON policies BEGIN UPDATE policy_epoch SET epoch = epoch + 1; END;
CREATE TRIGGER policies_epoch_change AFTER UPDATE ON policies BEGIN UPDATE policy_epoch SET epoch = epoch + 1; END;
CREATE TRIGGER policies_epoch_drop AFTER DELETE ON policies BEGIN UPDATE policy_epoch SET epoch = epoch + 1; END;
CREATE TRIGGER policy_entries_epoch_add AFTER INSERT ON policy_entries
BEGIN UPDATE policy_epoch SET epoch = epoch + 1; END;
CREATE TRIGGER policy_entries_epoch_change AFTER UPDATE ON policy_entries
BEGIN UPDATE policy_epoch SET epoch = epoch + 1; END;
CREATE TRIGGER policy_entries_epoch_drop AFTER DELETE ON policy_entries
BEGIN UPDATE policy_epoch SET epoch = epoch + 1; END;
CREATE INDEX policy_entries_by_expiry ON policy_entries (expires_at) WHERE expires_at IS NOT NULL;
"""

# V5: saves that cost what POSIX asks (DESIGN.md §6). A revision committed
# without a disk sync (a close through a mount) is listed here with the page
# cache it was written into (``catalog.boot``) until its artifact and the
# catalog are synced. If that page cache is gone (a power loss, a reboot),
# recovery verifies the artifact; one that does not verify is marked
# corrupt and its resource returns to the revision before it: the one case
# where a superseded revision becomes active again.
V5 = """
CREATE TABLE unsynced_revisions (
    revision_id TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    resource_id TEXT NOT NULL REFERENCES resources (resource_id),
    page_cache  TEXT NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX unsynced_revisions_by_resource ON unsynced_revisions (resource_id);
CREATE INDEX unsynced_revisions_by_page_cache ON unsynced_revisions (agent_id, page_cache);
DROP TRIGGER revisions_forward_only;
CREATE TRIGGER revisions_forward_only
BEFORE UPDATE OF state ON revisions
WHEN NOT ((OLD.state = 'pending' AND NEW.state IN ('active', 'rolled-back'))
       OR (OLD.state = 'active' AND NEW.state IN ('superseded', 'tombstoned', 'corrupt'))
       OR (OLD.state = 'superseded' AND NEW.state IN ('tombstoned', 'corrupt'))
       OR (OLD.state = 'superseded' AND NEW.state = 'active'
           AND EXISTS (SELECT 1 FROM revisions v WHERE v.base_revision_id = OLD.revision_id
                       AND v.state = 'corrupt')
           AND NOT EXISTS (SELECT 1 FROM revisions v WHERE v.resource_id = OLD.resource_id
                           AND v.state = 'active')))
BEGIN SELECT RAISE(ABORT, 'revision lifecycle only moves forward'); END;
"""

# V6: sharing on purpose. ``lineage_edges`` ties a revision
# made from another (a published copy, a projection copy) to its parent;
# rows reference immutable revisions only and are never changed. A
# projection is a reviewed copy addressed to one audience: its row names
# the source revision, the publisher, the purpose and the expiry (or the
# recorded choice of none), and the copy it made. What the audience may do
# with the copy is not here but in the copy's own policy entries (allows
# that expire with the projection), so the evaluator, the views and the
# search decide it with the rules they already follow; revocation revokes
# those entries and tombstones the copy. The postbox tables follow.
V6 = """
CREATE TABLE lineage_edges (
    child_revision_id  TEXT NOT NULL REFERENCES revisions (revision_id),
    parent_revision_id TEXT NOT NULL REFERENCES revisions (revision_id),
    agent_id           TEXT NOT NULL REFERENCES agent_cell (agent_id),
    relation           TEXT NOT NULL CHECK (relation IN ('publish', 'project', 'postbox', 'derive')),
    created_at         INTEGER NOT NULL,
    PRIMARY KEY (child_revision_id, parent_revision_id),
    CHECK (child_revision_id != parent_revision_id)
) STRICT;
CREATE INDEX lineage_edges_by_parent ON lineage_edges (parent_revision_id);
CREATE TRIGGER lineage_edges_fixed BEFORE UPDATE ON lineage_edges
BEGIN SELECT RAISE(ABORT, 'lineage is never edited'); END;
CREATE TRIGGER lineage_edges_no_delete BEFORE DELETE ON lineage_edges
BEGIN SELECT RAISE(ABORT, 'lineage is never deleted'); END;

CREATE TABLE projections (
    projection_id      TEXT PRIMARY KEY,
    agent_id           TEXT NOT NULL REFERENCES agent_cell (agent_id),
    source_revision_id TEXT NOT NULL REFERENCES revisions (revision_id),
    source_session_id  TEXT NOT NULL,
    publisher_id       TEXT NOT NULL,        -- the verified subject that projected
    target_kind        TEXT NOT NULL CHECK (target_kind IN ('conversation', 'role', 'agent-shared')),
    target_id          TEXT NOT NULL,        -- conversation or role principal; '' for agent-shared
    purpose            TEXT NOT NULL CHECK (length(purpose) BETWEEN 1 AND 500),
    expires_at         INTEGER,
    no_expiry          INTEGER NOT NULL CHECK (no_expiry IN (0, 1)),
    copy_resource_id   TEXT NOT NULL REFERENCES resources (resource_id),
    copy_revision_id   TEXT NOT NULL UNIQUE REFERENCES revisions (revision_id),
    created_at         INTEGER NOT NULL,
    revoked_at         INTEGER,
    CHECK ((expires_at IS NULL) = (no_expiry = 1)),
    CHECK ((target_kind = 'agent-shared') = (target_id = ''))
) STRICT;
CREATE INDEX projections_by_source ON projections (source_session_id);
CREATE INDEX projections_by_copy ON projections (copy_resource_id);
CREATE TRIGGER projections_no_replace BEFORE INSERT ON projections
WHEN EXISTS (SELECT 1 FROM projections WHERE projection_id = NEW.projection_id
             OR copy_revision_id = NEW.copy_revision_id)
BEGIN SELECT RAISE(ABORT, 'projections are never replaced'); END;
CREATE TRIGGER projections_fixed
BEFORE UPDATE OF projection_id, agent_id, source_revision_id, source_session_id, publisher_id, target_kind,
                 target_id, purpose, expires_at, no_expiry, copy_resource_id, copy_revision_id, created_at
ON projections
BEGIN SELECT RAISE(ABORT, 'a projection is fixed; revoke it and project again'); END;
CREATE TRIGGER projections_revoke_once BEFORE UPDATE OF revoked_at ON projections
WHEN OLD.revoked_at IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'projection already revoked'); END;
CREATE TRIGGER projections_no_delete BEFORE DELETE ON projections
BEGIN SELECT RAISE(ABORT, 'projections are never deleted'); END;

-- The postbox (catalog.postbox). A message handle is a single-use token
-- bound to one group session, its conversation and the message's verified
-- sender; only its SHA-256 is kept. A deposit is a pending item whose
-- revision sits in the sender's quarantine store until its owner decides.
CREATE TABLE message_handles (
    handle_sha256   TEXT PRIMARY KEY CHECK (length(handle_sha256) = 64),
    agent_id        TEXT NOT NULL REFERENCES agent_cell (agent_id),
    session_id      TEXT NOT NULL REFERENCES sessions (session_id),
    conversation_id TEXT NOT NULL,
    sender_id       TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    used_at         INTEGER
) STRICT;
CREATE TRIGGER message_handles_fixed
BEFORE UPDATE OF handle_sha256, agent_id, session_id, conversation_id, sender_id, created_at, expires_at
ON message_handles
BEGIN SELECT RAISE(ABORT, 'a message handle is fixed'); END;
CREATE TRIGGER message_handles_used_once BEFORE UPDATE OF used_at ON message_handles
WHEN OLD.used_at IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'a message handle is used once'); END;

CREATE TABLE postbox_items (
    item_id              TEXT PRIMARY KEY,
    agent_id             TEXT NOT NULL REFERENCES agent_cell (agent_id),
    owner_id             TEXT NOT NULL,      -- whose quarantine holds it: the message's verified sender
    conversation_id      TEXT NOT NULL,
    source_session_id    TEXT NOT NULL,
    actor_id             TEXT,
    handle_sha256        TEXT NOT NULL UNIQUE REFERENCES message_handles (handle_sha256),
    resource_id          TEXT NOT NULL REFERENCES resources (resource_id),
    revision_id          TEXT NOT NULL UNIQUE REFERENCES revisions (revision_id),
    created_at           INTEGER NOT NULL,
    expires_at           INTEGER NOT NULL,
    state                TEXT NOT NULL DEFAULT 'pending'
                             CHECK (state IN ('pending', 'approved', 'rejected', 'purged', 'expired')),
    decided_at           INTEGER,
    approved_revision_id TEXT REFERENCES revisions (revision_id),
    CHECK ((state = 'pending') = (decided_at IS NULL)),
    CHECK ((state = 'approved') = (approved_revision_id IS NOT NULL))
) STRICT;
CREATE INDEX postbox_items_by_owner ON postbox_items (owner_id, state);
CREATE TRIGGER postbox_items_fixed
BEFORE UPDATE OF item_id, agent_id, owner_id, conversation_id, source_session_id, actor_id, handle_sha256,
                 resource_id, revision_id, created_at, expires_at ON postbox_items
BEGIN SELECT RAISE(ABORT, 'a postbox item is fixed; only its review changes'); END;
CREATE TRIGGER postbox_items_decided_once BEFORE UPDATE OF state ON postbox_items
WHEN OLD.state != 'pending'
BEGIN SELECT RAISE(ABORT, 'a postbox item is decided once'); END;
CREATE TRIGGER postbox_items_no_delete BEFORE DELETE ON postbox_items
BEGIN SELECT RAISE(ABORT, 'postbox items are never deleted'); END;

-- Accepted deposits per (source conversation, owner) in the current window.
CREATE TABLE postbox_rates (
    agent_id        TEXT NOT NULL REFERENCES agent_cell (agent_id),
    conversation_id TEXT NOT NULL,
    owner_id        TEXT NOT NULL,
    window_start    INTEGER NOT NULL,
    accepted        INTEGER NOT NULL CHECK (accepted >= 0),
    PRIMARY KEY (agent_id, conversation_id, owner_id)
) STRICT;

-- The conversations each owner has received from: the first one queues a notice.
CREATE TABLE postbox_sources (
    agent_id        TEXT NOT NULL REFERENCES agent_cell (agent_id),
    owner_id        TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    first_item_id   TEXT NOT NULL,
    first_at        INTEGER NOT NULL,
    PRIMARY KEY (agent_id, owner_id, conversation_id)
) STRICT;
"""

# V7: the lifecycle of derived memory (issue 16).
# ``lineage_holds``: a revision denied because an ancestor it was derived
# from (through ``lineage_edges``) was tombstoned, forgotten or revoked.
# Holds are written in the transaction that retires the ancestor, for every
# descendant at once (no lineage walk at read time), and are never lifted:
# ``lineage release`` writes a new, reviewed revision with fresh policy and
# records it in ``lineage_releases``, so the held revision stays denied and
# the lineage and audit trail stay whole. A held revision leaves the search
# index in the same transaction (trigger), and the change log names its
# resource so every mounted view drops it and its kernel cache at once.
# ``derivations`` labels a derived revision with its kind.
# ``forgets``, ``forgotten_revisions`` and ``rejected_claims``: an explicit
# forget and what it removed; a rejected claim is a keyed hash (never the
# text) of a normalised claim, refused on every later write of this cell.
# ``revision_validity``: the time after which a revision is denied (its
# ``valid-until``, or its activation for a ``superseded-by``), written with
# the revision and never changed.
V7 = """
CREATE TABLE lineage_holds (
    revision_id       TEXT NOT NULL REFERENCES revisions (revision_id),
    cause_revision_id TEXT NOT NULL REFERENCES revisions (revision_id),
    agent_id          TEXT NOT NULL REFERENCES agent_cell (agent_id),
    cause             TEXT NOT NULL CHECK (cause IN ('tombstone', 'forget', 'revoke')),
    held_at           INTEGER NOT NULL,
    PRIMARY KEY (revision_id, cause_revision_id)
) STRICT;
CREATE TRIGGER lineage_holds_fixed BEFORE UPDATE ON lineage_holds
BEGIN SELECT RAISE(ABORT, 'a lineage hold is never edited'); END;
CREATE TRIGGER lineage_holds_no_delete BEFORE DELETE ON lineage_holds
BEGIN SELECT RAISE(ABORT, 'a lineage hold is never lifted; release writes a new revision'); END;
CREATE TRIGGER lineage_holds_apply AFTER INSERT ON lineage_holds
BEGIN DELETE FROM search_chunks WHERE revision_id = NEW.revision_id;
      DELETE FROM search_indexed WHERE revision_id = NEW.revision_id;
      INSERT INTO change_log (store_id, resource_id)
      SELECT r.store_id, r.resource_id FROM revisions v JOIN resources r ON r.resource_id = v.resource_id
      WHERE v.revision_id = NEW.revision_id; END;
DROP TRIGGER search_indexed_of_active;
CREATE TRIGGER search_indexed_of_active BEFORE INSERT ON search_indexed
WHEN NOT EXISTS (SELECT 1 FROM revisions WHERE revision_id = NEW.revision_id AND state = 'active'
                 AND agent_id = NEW.agent_id)
  OR EXISTS (SELECT 1 FROM lineage_holds WHERE revision_id = NEW.revision_id)
BEGIN SELECT RAISE(ABORT, 'only an active revision without a lineage hold is indexed'); END;

CREATE TABLE lineage_releases (
    revision_id      TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    held_revision_id TEXT NOT NULL REFERENCES revisions (revision_id),
    agent_id         TEXT NOT NULL REFERENCES agent_cell (agent_id),
    session_id       TEXT NOT NULL,
    actor_id         TEXT,
    released_at      INTEGER NOT NULL
) STRICT;
CREATE TRIGGER lineage_releases_fixed BEFORE UPDATE ON lineage_releases
BEGIN SELECT RAISE(ABORT, 'a release is never edited'); END;
CREATE TRIGGER lineage_releases_no_delete BEFORE DELETE ON lineage_releases
BEGIN SELECT RAISE(ABORT, 'a release is never deleted'); END;

CREATE TABLE derivations (
    revision_id TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    kind        TEXT NOT NULL CHECK (kind IN ('summary', 'compaction', 'digest')),
    state       TEXT NOT NULL CHECK (state IN ('written', 'quarantined')),
    created_at  INTEGER NOT NULL
) STRICT;
CREATE TRIGGER derivations_fixed BEFORE UPDATE ON derivations
BEGIN SELECT RAISE(ABORT, 'a derivation is never edited'); END;

CREATE TABLE forgets (
    forget_id  TEXT PRIMARY KEY,
    agent_id   TEXT NOT NULL REFERENCES agent_cell (agent_id),
    session_id TEXT NOT NULL,
    actor_id   TEXT,
    notes      INTEGER NOT NULL CHECK (notes >= 0),
    claims     INTEGER NOT NULL CHECK (claims >= 0),
    created_at INTEGER NOT NULL,
    scrubbed   INTEGER NOT NULL DEFAULT 0 CHECK (scrubbed IN (0, 1))  -- index and log rewritten without the text
) STRICT;
CREATE TABLE forgotten_revisions (
    revision_id  TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    agent_id     TEXT NOT NULL REFERENCES agent_cell (agent_id),
    forget_id    TEXT NOT NULL REFERENCES forgets (forget_id),
    forgotten_at INTEGER NOT NULL
) STRICT;
CREATE TRIGGER forgotten_revisions_fixed BEFORE UPDATE ON forgotten_revisions
BEGIN SELECT RAISE(ABORT, 'forgetting is never undone'); END;
CREATE TRIGGER forgotten_revisions_no_delete BEFORE DELETE ON forgotten_revisions
BEGIN SELECT RAISE(ABORT, 'forgetting is never undone'); END;
CREATE TABLE rejected_claims (
    agent_id   TEXT NOT NULL REFERENCES agent_cell (agent_id),
    claim_key  TEXT NOT NULL CHECK (length(claim_key) = 64),
    forget_id  TEXT NOT NULL REFERENCES forgets (forget_id),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (agent_id, claim_key)
) STRICT, WITHOUT ROWID;

CREATE TABLE revision_validity (
    revision_id   TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    agent_id      TEXT NOT NULL REFERENCES agent_cell (agent_id),
    valid_until   INTEGER NOT NULL,
    superseded_by TEXT
) STRICT;
CREATE INDEX revision_validity_by_time ON revision_validity (valid_until);
CREATE TRIGGER revision_validity_fixed BEFORE UPDATE ON revision_validity
BEGIN SELECT RAISE(ABORT, 'a revision keeps its validity'); END;

-- Delegation (issue 16): a child session opened under a parent session of
-- the same cell with capability patterns (virtual folders, a JSON list of
-- text). Written once with the child, never edited or deleted. The child
-- carries its parent's subject unchanged (checked here), and a session that
-- already has children never becomes a child, so no chain is a cycle.
CREATE TABLE session_delegations (
    session_id        TEXT PRIMARY KEY REFERENCES sessions (session_id),
    agent_id          TEXT NOT NULL REFERENCES agent_cell (agent_id),
    parent_session_id TEXT NOT NULL REFERENCES sessions (session_id),
    caps              TEXT NOT NULL CHECK (json_valid(caps) AND json_type(caps) = 'array'
                                           AND json_array_length(caps) BETWEEN 1 AND 32),
    created_at        INTEGER NOT NULL,
    CHECK (parent_session_id != session_id)
) STRICT;
CREATE INDEX session_delegations_by_parent ON session_delegations (parent_session_id);
CREATE TRIGGER session_delegations_checked BEFORE INSERT ON session_delegations
WHEN EXISTS (SELECT 1 FROM session_delegations WHERE session_id = NEW.session_id
             OR parent_session_id = NEW.session_id)
  OR NOT EXISTS (SELECT 1 FROM sessions c JOIN sessions p ON p.session_id = NEW.parent_session_id
                 WHERE c.session_id = NEW.session_id AND c.agent_id = NEW.agent_id AND p.agent_id = NEW.agent_id
                   AND c.subject_kind = p.subject_kind AND c.subject_principal_id IS p.subject_principal_id
                   AND c.subject_reason IS p.subject_reason AND c.binding_id IS p.binding_id
                   AND c.closed_at IS NULL)
BEGIN SELECT RAISE(ABORT, 'a delegation is written once, for a new child carrying its parent''s subject'); END;
CREATE TRIGGER session_delegations_fixed BEFORE UPDATE ON session_delegations
BEGIN SELECT RAISE(ABORT, 'a delegation is never edited'); END;
CREATE TRIGGER session_delegations_no_delete BEFORE DELETE ON session_delegations
BEGIN SELECT RAISE(ABORT, 'a delegation is never deleted'); END;
"""

# V8: the index follows the commit (issue 14). Cutting and embedding a
# note's text, and deleting the rows of the revision it replaces, were a
# third of a save. A mount's save now activates its revision without search
# rows and queues it in ``index_backlog``, in the activation transaction;
# superseding a revision that has rows queues it too, for its rows to go.
# ``catalog.index.catch_up`` does the queued work: a mount when it is idle,
# and every search for the stores it reads before it reads the index, so no
# search misses a committed revision or meets a replaced one (and none
# waits for another scope's saves). Rows are cut from the artifact verified
# again, never from what a writer handed over. Every other way out of
# ``active`` (tombstoned, forgotten, corrupt, rolled back) still deletes the
# rows in its own transaction.
V8 = """
CREATE TABLE index_backlog (
    revision_id TEXT PRIMARY KEY REFERENCES revisions (revision_id),
    agent_id    TEXT NOT NULL REFERENCES agent_cell (agent_id),
    store_id    TEXT NOT NULL REFERENCES stores (store_id),
    queued_at   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX index_backlog_by_store ON index_backlog (store_id, queued_at);
DROP TRIGGER search_chunks_retire;
CREATE TRIGGER search_chunks_retire AFTER UPDATE OF state ON revisions
WHEN NEW.state NOT IN ('active', 'superseded')
BEGIN DELETE FROM search_chunks WHERE revision_id = NEW.revision_id;
      DELETE FROM search_indexed WHERE revision_id = NEW.revision_id; END;
CREATE TRIGGER search_chunks_superseded AFTER UPDATE OF state ON revisions
WHEN NEW.state = 'superseded' AND EXISTS (SELECT 1 FROM search_indexed WHERE revision_id = NEW.revision_id)
BEGIN INSERT OR IGNORE INTO index_backlog (revision_id, agent_id, store_id, queued_at)
      SELECT NEW.revision_id, NEW.agent_id, r.store_id, CAST(unixepoch('subsec') * 1000000 AS INTEGER)
      FROM resources r WHERE r.resource_id = NEW.resource_id; END;
"""

# V9: human sessions (issue 17): a person browsing their own memory at the
# console (``scopefs browse``). The session row is an ordinary user subject
# (the same view as that person's verified DM), stamped with an evidence id
# from this table instead of a chat binding; this row is what the evidence
# is: the operator opened it for that human principal, served to one local
# Unix uid. Written once with its session, never edited or deleted.
V9 = """
CREATE TABLE human_sessions (
    session_id   TEXT PRIMARY KEY REFERENCES sessions (session_id),
    agent_id     TEXT NOT NULL REFERENCES agent_cell (agent_id),
    principal_id TEXT NOT NULL,
    evidence_id  TEXT NOT NULL UNIQUE,
    unix_uid     INTEGER NOT NULL CHECK (unix_uid > 0),
    opened_at    INTEGER NOT NULL
) STRICT;
CREATE TRIGGER human_sessions_checked BEFORE INSERT ON human_sessions
WHEN EXISTS (SELECT 1 FROM human_sessions WHERE session_id = NEW.session_id OR evidence_id = NEW.evidence_id)
  OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = NEW.session_id AND s.agent_id = NEW.agent_id
                   AND s.subject_kind = 'user' AND s.subject_principal_id = NEW.principal_id
                   AND s.binding_id = NEW.evidence_id AND s.closed_at IS NULL)
  OR EXISTS (SELECT 1 FROM session_delegations d WHERE d.session_id = NEW.session_id)
BEGIN SELECT RAISE(ABORT, 'a human session is written once, for a new user session stamped with its evidence'); END;
CREATE TRIGGER human_sessions_fixed BEFORE UPDATE ON human_sessions
BEGIN SELECT RAISE(ABORT, 'a human session is never edited'); END;
CREATE TRIGGER human_sessions_no_delete BEFORE DELETE ON human_sessions
BEGIN SELECT RAISE(ABORT, 'a human session is never deleted'); END;
"""


# V10 (issue 17): migration from the OpenClaw layout. A run is keyed by the
# digest of the plan its owner reviewed; its cutover is set once, in one
# transaction, after every copy verified and the denial matrix passed. An
# item is one copied source part, keyed by a keyed digest of its relative
# path (never the path) and the SHA-256 of the bytes written, and names the
# revision that holds it: written in the transaction that activates that
# revision, so an item exists exactly when its copy does, and a second run
# finds it and copies nothing again. Never edited or deleted.
V10 = """
CREATE TABLE migration_runs (
    plan_digest        TEXT NOT NULL,
    agent_id           TEXT NOT NULL REFERENCES agent_cell (agent_id),
    owner_principal_id TEXT,
    started_at         INTEGER NOT NULL,
    cutover_at         INTEGER,
    PRIMARY KEY (agent_id, plan_digest)
) STRICT;
CREATE TRIGGER migration_runs_cutover_once BEFORE UPDATE ON migration_runs
WHEN OLD.cutover_at IS NOT NULL OR NEW.plan_digest IS NOT OLD.plan_digest OR NEW.agent_id IS NOT OLD.agent_id
  OR NEW.owner_principal_id IS NOT OLD.owner_principal_id OR NEW.started_at IS NOT OLD.started_at
BEGIN SELECT RAISE(ABORT, 'a migration run only gains its cutover, once'); END;
CREATE TRIGGER migration_runs_no_delete BEFORE DELETE ON migration_runs
BEGIN SELECT RAISE(ABORT, 'a migration run is never deleted'); END;

CREATE TABLE migration_items (
    agent_id      TEXT NOT NULL REFERENCES agent_cell (agent_id),
    source_key    TEXT NOT NULL,
    sha256        TEXT NOT NULL,
    source_sha256 TEXT NOT NULL,
    plan_digest   TEXT NOT NULL,
    class         TEXT NOT NULL,
    revision_id   TEXT NOT NULL UNIQUE REFERENCES revisions (revision_id),
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (agent_id, source_key, sha256)
) STRICT;
CREATE TRIGGER migration_items_fixed BEFORE UPDATE ON migration_items
BEGIN SELECT RAISE(ABORT, 'a migration item is never edited'); END;
CREATE TRIGGER migration_items_no_delete BEFORE DELETE ON migration_items
BEGIN SELECT RAISE(ABORT, 'a migration item is never deleted'); END;
"""


# V11: the broker's own sessions. An operator's command on the host (a
# migration, a quarantine review, an unpublish) writes through a shared-main
# session it opens for the run and closes after it (``writer.broker``). This
# row marks such a session from its first commit: no mount, sandbox or other
# command may use it, the audit rows it names can be traced to the command
# and the operator's local uid (and login uid, which ``sudo`` keeps), and
# ``doctor`` closes one whose run is gone (``run_mark``: the boot, pid and
# start time of the process that opened it). Written once with its session,
# in the same transaction, never edited or deleted.
V11 = """
CREATE TABLE broker_sessions (
    session_id TEXT PRIMARY KEY REFERENCES sessions (session_id),
    agent_id   TEXT NOT NULL REFERENCES agent_cell (agent_id),
    command    TEXT NOT NULL,
    unix_uid   INTEGER NOT NULL CHECK (unix_uid >= 0),
    login_uid  INTEGER CHECK (login_uid >= 0),
    run_mark   TEXT NOT NULL,
    opened_at  INTEGER NOT NULL
) STRICT;
CREATE TRIGGER broker_sessions_checked BEFORE INSERT ON broker_sessions
WHEN EXISTS (SELECT 1 FROM broker_sessions WHERE session_id = NEW.session_id)
  OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = NEW.session_id AND s.agent_id = NEW.agent_id
                   AND s.subject_kind = 'ambiguous' AND s.subject_reason = 'shared-main' AND s.closed_at IS NULL
                   AND s.created_at = NEW.opened_at)
  OR EXISTS (SELECT 1 FROM session_keys k WHERE k.session_id = NEW.session_id)
  OR EXISTS (SELECT 1 FROM session_delegations d WHERE d.session_id = NEW.session_id)
BEGIN SELECT RAISE(ABORT, 'a broker session is written once, for a new open shared-main session'); END;
CREATE TRIGGER broker_sessions_fixed BEFORE UPDATE ON broker_sessions
BEGIN SELECT RAISE(ABORT, 'a broker session is never edited'); END;
CREATE TRIGGER broker_sessions_no_delete BEFORE DELETE ON broker_sessions
BEGIN SELECT RAISE(ABORT, 'a broker session is never deleted'); END;
"""

AGENT_SCHEMA = SchemaKind(name="agent catalog", application_id=0x53434147,
                          steps=(V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11))  # 'SCAG'
