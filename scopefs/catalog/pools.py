"""Shared memory pools: which agent captures where and recalls from what.

One deployment runs several agents. By default each keeps to its own cell
(its catalog, its per-person stores). A pools file (``scopefs pools apply
FILE.toml``) declares, N:M, where each agent's memories go (``capture``)
and which stores it recalls from (``recall``), and declares shared pools,
each with an owner, readers and writers::

    [agents.main]
    capture = "own"                 # "own", a pool, or "none"
    recall = ["own", "team"]        # "own" and pools; capture is always recalled

    [agents.social]
    capture = "team"
    recall = ["team"]

    [pools.team]
    owner = "main"
    readers = ["main", "social"]    # or ["*"]: every declared agent
    writers = ["main", "social"]    # default: the owner only

A pool is its own cell (``pools/<name>/catalog.sqlite``), never rows in an
agent's database, and shows in a session's view as ``pools/<name>/``:
absent unless the agent both recalls it and is one of its readers, and
read-only unless the agent is one of its writers *and* the view holds no
person's or conversation's own root (a DM or group session of an agent
that recalls ``own`` reads the pool, never writes it: ``cp private/x
pools/team/`` would publish without a publish step). Writers write from
service sessions, or as agents that recall no store of their own. Two declarations must
agree for any access, so neither a pool owner nor an agent's own entry can
grant it alone (amem declared ``writers`` and never checked it; here the
view's placement carries it, so every write, rename, delete and derive
meets it in the evaluator).

Fail closed: once a file is applied, an agent it does not declare has no
capture and no recall (an empty view). Before any file is applied every
agent keeps its own cell, as it always did.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from scopefs.catalog.agents import make_cell
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, pool_cell, validate_agent_name, validate_pool_name

OWN = "own"
NONE = "none"
EVERY_AGENT = "*"
MAX_FILE_BYTES = 1 << 20
MAX_AGENTS = 256
MAX_POOLS = 256


@dataclass(frozen=True)
class PoolGrant:
    """One pool in one agent's view."""

    name: str
    writable: bool

    @property
    def cell(self) -> str:
        return pool_cell(self.name)

    @property
    def root(self) -> str:
        return f"pools/{self.name}"


@dataclass(frozen=True)
class AgentMemory:
    """What an agent's sessions see under the applied pools file.

    ``own``: the agent's own cell (its per-person roots) is in the view;
    ``own_writable``: and it captures there. ``pools``: the shared pools
    it may read, each writable or not.
    """

    own: bool
    own_writable: bool
    pools: tuple[PoolGrant, ...]
    capture_pool: str | None = None  # the pool it captures into, if not its own store


NOTHING = AgentMemory(False, False, ())  # an agent the applied file does not declare


@dataclass(frozen=True)
class PoolConfig:
    """A validated declaration, in canonical form (sorted, defaults filled in)."""

    agents: dict[str, dict[str, Any]]  # agent -> {"capture": str, "recall": [str]}
    pools: dict[str, dict[str, Any]]  # pool -> {"owner": str, "readers": [str], "writers": [str]}

    def document(self) -> str:
        return json.dumps({"agents": self.agents, "pools": self.pools}, sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        return hashlib.sha256(self.document().encode()).hexdigest()

    def memory_of(self, agent_id: str) -> AgentMemory:
        decl = self.agents.get(agent_id)
        if decl is None:
            return NOTHING
        capture, recall = decl["capture"], decl["recall"]
        grants = []
        for name in recall:
            if name == OWN:
                continue
            pool = self.pools[name]
            if _names(pool["readers"], agent_id):
                grants.append(PoolGrant(name, _names(pool["writers"], agent_id)))
        return AgentMemory(OWN in recall, capture == OWN, tuple(grants),
                           capture if capture not in (OWN, NONE) else None)


def _names(members: list[str], agent_id: str) -> bool:
    return agent_id in members or EVERY_AGENT in members


def _strings(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInput(f"{what} must be a list of names")
    if len(set(value)) != len(value):
        raise BadInput(f"{what} names something twice")
    return list(value)


def _table(table: object, what: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise BadInput(f"{what} must be a table")
    return table


def _only_keys(table: object, allowed: set[str], what: str) -> dict[str, Any]:
    table = _table(table, what)
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise BadInput(f"{what}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")
    return table


def parse(text: bytes, registered: set[str]) -> PoolConfig:
    """The declaration in ``text``, validated against the registered agents; BadInput with the first problem."""
    if len(text) > MAX_FILE_BYTES:
        raise BadInput(f"the pools file is larger than {MAX_FILE_BYTES} bytes")
    import tomllib  # here, not at the top: only `pools apply` parses, and every mount server imports this module

    try:
        raw = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"the pools file is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested array or inline table (found by bench/fuzz_inputs.py)
        raise BadInput("the pools file nests arrays or tables too deeply") from None
    raw = _only_keys(raw, {"agents", "pools"}, "the pools file")
    agents_in = _table(raw.get("agents", {}), "[agents]")
    pools_in = _table(raw.get("pools", {}), "[pools]")
    if len(agents_in) > MAX_AGENTS or len(pools_in) > MAX_POOLS:
        raise BadInput(f"at most {MAX_AGENTS} agents and {MAX_POOLS} pools")
    for agent in agents_in:
        validate_agent_name(agent)
        if agent not in registered:
            raise BadInput(f"agent {agent!r} is not registered; run 'scopefs agent add {agent}' first")
    declared = set(agents_in)
    pools: dict[str, dict[str, Any]] = {}
    for name, table in sorted(pools_in.items()):
        validate_pool_name(name)
        table = _only_keys(table, {"owner", "readers", "writers"}, f"[pools.{name}]")
        owner = table.get("owner")
        if not isinstance(owner, str) or owner not in declared:
            raise BadInput(f"[pools.{name}]: owner must be an agent declared under [agents]")
        writers = _strings(table.get("writers", [owner]), f"[pools.{name}] writers")
        readers = _strings(table.get("readers", writers), f"[pools.{name}] readers")
        for who in (*readers, *writers):
            if who != EVERY_AGENT and who not in declared:
                raise BadInput(f"[pools.{name}]: {who!r} is not an agent declared under [agents]")
        # The owner administers the pool: it always reads and writes it.
        pools[name] = {"owner": owner, "readers": sorted({*readers, owner}), "writers": sorted({*writers, owner})}
    agents: dict[str, dict[str, Any]] = {}
    for agent, table in sorted(agents_in.items()):
        table = _only_keys(table, {"capture", "recall"}, f"[agents.{agent}]")
        capture = table.get("capture", NONE)
        recall = _strings(table.get("recall", []), f"[agents.{agent}] recall")
        if not isinstance(capture, str) or (capture not in (OWN, NONE) and capture not in pools):
            raise BadInput(f"[agents.{agent}]: capture must be 'own', 'none' or a pool declared under [pools]")
        for name in recall:
            if name != OWN and name not in pools:
                raise BadInput(f"[agents.{agent}]: recall names {name!r}, which is neither 'own' nor a declared pool")
            if name != OWN and not _names(pools[name]["readers"], agent):
                raise BadInput(f"[agents.{agent}]: recalls pool {name!r} but is not one of its readers")
        if capture in pools and not _names(pools[capture]["writers"], agent):
            raise BadInput(f"[agents.{agent}]: captures into pool {capture!r} but is not one of its writers")
        if capture in pools and OWN in recall:
            raise BadInput(f"[agents.{agent}]: captures into pool {capture!r} while recalling its own stores:"
                           " its sessions would copy private content into the pool (drop 'own' from recall)")
        if capture != NONE and capture not in recall:
            recall.append(capture)  # what an agent writes, it reads back
        agents[agent] = {"capture": capture, "recall": sorted(recall)}
    return PoolConfig(agents, pools)


@dataclass(frozen=True)
class Applied:
    revision: int
    sha256: str
    changed: bool
    created_pools: tuple[str, ...]


def apply(home: Home, text: bytes) -> Applied:
    """Make ``text`` the declaration: atomic (one transaction) and idempotent (same file, no change).

    Pool cells are made first, outside the transaction; one made for a
    declaration that then fails to apply is unused and is reused next time.
    A pool that a new file drops keeps its cell and notes; nobody sees them
    until a file declares it again.
    """
    config = parse(text, set(home.agents()))
    state = home.state()
    created = []
    for name in config.pools:
        if one(state, "SELECT 1 FROM pools WHERE pool_name = ?", (name,)) is None:
            make_cell(home, pool_cell(name))
            created.append(name)
    sha = config.sha256()
    with immediate(state):
        for name in created:
            state.execute("INSERT OR IGNORE INTO pools (pool_name, created_at) VALUES (?, ?)", (name, now_us()))
        row = one(state, "SELECT revision, sha256 FROM pool_config WHERE singleton = 1")
        if row is not None and row[1] == sha:
            return Applied(int(row[0]), sha, False, tuple(created))
        revision = 1 if row is None else int(row[0]) + 1
        state.execute("INSERT INTO pool_config (singleton, revision, sha256, document, applied_at)"
                      " VALUES (1, ?, ?, ?, ?) ON CONFLICT (singleton) DO UPDATE SET revision = excluded.revision,"
                      " sha256 = excluded.sha256, document = excluded.document, applied_at = excluded.applied_at",
                      (revision, sha, config.document(), now_us()))
    return Applied(revision, sha, True, tuple(created))


_cache: dict[str, PoolConfig] = {}  # sha256 -> parsed document: asked on every access check


def current(home: Home) -> tuple[int, str, int, PoolConfig] | None:
    """(revision, sha256, applied_at, config) of the applied file, or None if none was ever applied."""
    row = one(home.state(), "SELECT revision, sha256, applied_at, document FROM pool_config WHERE singleton = 1")
    if row is None:
        return None
    config = _cache.get(row[1])
    if config is None:
        doc = json.loads(row[3])
        config = PoolConfig(doc["agents"], doc["pools"])
        if len(_cache) > 16:
            _cache.clear()
        _cache[row[1]] = config
    return int(row[0]), str(row[1]), int(row[2]), config


def memory_for(home: Home, agent_id: str) -> tuple[int, AgentMemory | None]:
    """The applied file's revision and the agent's pools under it; (0, None) when no file was ever
    applied (every agent keeps its own cell)."""
    found = current(home)
    return (0, None) if found is None else (found[0], found[3].memory_of(agent_id))


def describe(home: Home) -> dict[str, Any]:
    """``pools show``: the applied declaration and what each declared agent gets from it."""
    found = current(home)
    if found is None:
        return {"applied": False, "revision": 0, "agents": {}, "pools": {},
                "effective": {a: {"own": True, "own_writable": True, "pools": {}} for a in home.agents()}}
    revision, sha, applied_at, config = found
    effective: dict[str, Any] = {}
    for agent in home.agents():
        memory = config.memory_of(agent)
        effective[agent] = {"own": memory.own, "own_writable": memory.own_writable,
                            "pools": {p.name: "rw" if p.writable else "ro" for p in memory.pools}}
    return {"applied": True, "revision": revision, "sha256": sha, "applied_at": applied_at,
            "agents": config.agents, "pools": config.pools, "effective": effective}
