"""The state directory: where everything lives, and who may open it.

Layout (DESIGN.md §3)::

    $SCOPEFS_HOME/                 0700
      state.sqlite                 principals, bindings, memberships, audit
      hmac.key                     0600; keys the provider-id lookups
      agents/<agent>/catalog.sqlite
      agents/<agent>/memory-scopes/v1/<opaque>/   artifact area
      agents/<agent>/staging/      staged files before rename
      agents/<agent>/quarantine/   orphans moved aside by doctor --fix
      agents/<agent>/writer.lock   shared by writers, exclusive for recovery
      pools/<pool>/...             a shared pool: a cell of its own, laid out like an agent's

A *cell* is one catalog file with its artifact area: every agent is one,
and so is every shared pool (cell id ``pool:<name>``). Code that works on
"an agent's" catalog, staging or lock works on any cell by its id.

A home with loose permissions is refused rather than used: the key and the
artifacts are only as private as the directory that holds them.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

import apsw

from scopefs.catalog.boot import page_cache_of
from scopefs.catalog.db import connect, one
from scopefs.catalog.errors import BadInput, StorageError
from scopefs.catalog.fsafe import fsync_dir
from scopefs.catalog.schema import ensure_schema
from scopefs.catalog.schema.agent import AGENT_SCHEMA
from scopefs.catalog.schema.state import STATE_SCHEMA

HMAC_KEY_BYTES = 32
API_KEY_BYTES = 32
_AGENT_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
DEFAULT_HOME = ".scopefs"
POOL_CELL_PREFIX = "pool:"


def pool_cell(pool_name: str) -> str:
    """The cell id of a shared pool."""
    return POOL_CELL_PREFIX + validate_pool_name(pool_name)


def validate_pool_name(name: str) -> str:
    if not isinstance(name, str) or _AGENT_NAME.fullmatch(name) is None or name in ("own", "none"):
        raise BadInput("invalid pool name: use 1-32 characters a-z, 0-9 and '-', starting with a letter"
                       " (not 'own' or 'none')")
    return name


def resolve_home(arg: str | None) -> Path:
    """``--home``, else ``$SCOPEFS_HOME``, else ``./.scopefs``."""
    value = arg or os.environ.get("SCOPEFS_HOME") or DEFAULT_HOME
    return Path(value).absolute()


def validate_agent_name(name: str) -> str:
    if not isinstance(name, str) or _AGENT_NAME.fullmatch(name) is None:
        raise BadInput("invalid agent name: use 1-32 characters a-z, 0-9 and '-', starting with a letter")
    return name


def _check_private(path: Path, *, want_dir: bool, mode: int) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StorageError(f"missing {path.name} in the scopefs home") from None
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        raise StorageError(f"{path.name} in the scopefs home is not a {'directory' if want_dir else 'regular file'}")
    if st.st_uid != os.geteuid():
        raise StorageError(f"{path.name} in the scopefs home is owned by another user; refusing to use it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise StorageError(f"{path.name} in the scopefs home is accessible to others"
                           f" (mode {stat.S_IMODE(st.st_mode):o}, want {mode:o})")


def make_secret(path: Path, nbytes: int) -> bool:
    """Create ``path`` exclusively (0600) with ``nbytes`` random bytes, synced with its folder.

    False if it exists already (it is then left as it is; ``read_secret`` checks it).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, os.urandom(nbytes))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    return True


def read_secret(path: Path, nbytes: int) -> bytes:
    """A key file's bytes: refused if others may read it, it is a link, or its length is wrong."""
    _check_private(path, want_dir=False, mode=0o600)
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
        key = fh.read(nbytes + 1)
    if len(key) != nbytes:
        raise StorageError(f"{path.name} has the wrong length; refusing to use it")
    return key


AGENT_DIRS_KEPT = 256  # cell folders remembered per Home


class Home:
    """An opened, validated state directory and its database connections.

    Connections are opened lazily and kept for the life of the object (one
    process, one thread). ``vfs`` routes every catalog connection through a
    named SQLite VFS; the fault-injection tests use it.
    """

    def __init__(self, root: Path, *, vfs: str | None = None) -> None:
        self.root = root
        self.vfs = vfs
        self._state: apsw.Connection | None = None
        self._catalogs: dict[str, apsw.Connection] = {}
        self._key: bytes | None = None
        self._page_cache: str | None = None
        self._checkpoint_pages: int | None = None  # see ``checkpoint_later``
        self._agent_dirs: dict[str, Path] = {}  # a cell's folder, its name checked once (every write builds it)

    def page_cache(self) -> str:
        """The page cache this home's files live in now (``catalog.boot``); fixed for this process."""
        if self._page_cache is None:
            self._page_cache = page_cache_of(self.root)
        return self._page_cache

    # -- layout ---------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.root / "state.sqlite"

    @property
    def key_path(self) -> Path:
        return self.root / "hmac.key"

    def agent_dir(self, agent_id: str) -> Path:
        """The directory of a cell: an agent's, or a shared pool's (``pool:<name>``)."""
        found = self._agent_dirs.get(agent_id)
        if found is None:
            if agent_id.startswith(POOL_CELL_PREFIX):
                found = self.root / "pools" / validate_pool_name(agent_id[len(POOL_CELL_PREFIX):])
            else:
                found = self.root / "agents" / validate_agent_name(agent_id)
            if len(self._agent_dirs) >= AGENT_DIRS_KEPT:  # names may come from input: bounded
                self._agent_dirs.clear()
            self._agent_dirs[agent_id] = found
        return found

    def catalog_path(self, agent_id: str) -> Path:
        return self.agent_dir(agent_id) / "catalog.sqlite"

    def scopes_dir(self, agent_id: str) -> Path:
        return self.agent_dir(agent_id) / "memory-scopes" / "v1"

    def staging_dir(self, agent_id: str) -> Path:
        return self.agent_dir(agent_id) / "staging"

    def quarantine_dir(self, agent_id: str) -> Path:
        return self.agent_dir(agent_id) / "quarantine"

    def lock_path(self, agent_id: str) -> Path:
        return self.agent_dir(agent_id) / "writer.lock"

    # -- lifecycle ------------------------------------------------------
    @classmethod
    def init(cls, root: Path) -> tuple[Home, bool]:
        """Create the home if needed; returns (home, created).

        Idempotent: an existing, valid home is opened unchanged.
        """
        created = False
        try:
            root.mkdir(mode=0o700, parents=True)
            created = True
            fsync_dir(root.parent)
        except FileExistsError:
            pass
        _check_private(root, want_dir=True, mode=0o700)
        (root / "agents").mkdir(mode=0o700, exist_ok=True)
        fsync_dir(root)
        if make_secret(root / "hmac.key", HMAC_KEY_BYTES):
            created = True
        home = cls(root)
        conn = connect(home.state_path, create=True)
        ensure_schema(conn, STATE_SCHEMA)
        home._state = conn
        home.hmac_key()  # validates mode and length
        return home, created

    @classmethod
    def open(cls, root: Path, *, vfs: str | None = None) -> Home:
        """Open an existing home; BadInput if there is none."""
        if not (root / "state.sqlite").exists():
            raise BadInput(f"no scopefs home at {root}; run 'scopefs init' first")
        _check_private(root, want_dir=True, mode=0o700)
        return cls(root, vfs=vfs)

    def release_memory(self) -> None:
        """Give back the page caches of the open databases (``sqlite3_db_release_memory``).

        Each connection keeps up to its cache size (2 MiB by default) of
        pages it once read, and reads them all again after another process
        commits anyway; a mount that went quiet after serving holds them for
        nothing (``vfs.lean.Thrift``). Call it where the connections are
        used: a mount's catalog thread.
        """
        for conn in [self._state, *self._catalogs.values()]:
            if conn is not None:
                conn.release_memory()

    def checkpoint_later(self, pages: int) -> None:
        """Commits on this home's connections copy their write-ahead log into the database only once it
        holds ``pages`` pages (SQLite's default: 1,000): the caller checkpoints them sooner, on another
        thread (``catalog.db.checkpoint`` of ``database_paths``). Applies to connections open now and later."""
        self._checkpoint_pages = int(pages)
        for conn in [self._state, *self._catalogs.values()]:
            if conn is not None:
                conn.execute(f"PRAGMA wal_autocheckpoint={self._checkpoint_pages}")

    def database_paths(self) -> list[Path]:
        """The databases this home has opened so far."""
        return ([self.state_path] if self._state is not None else []) + [
            self.catalog_path(agent_id) for agent_id in list(self._catalogs)]

    def changes(self) -> int:
        """Rows changed through this home's connections so far: it moved, they have a commit to check-
        point. Call it on the thread that uses them. A connection closed meanwhile counts nothing."""
        total = 0
        for conn in [self._state, *self._catalogs.values()]:
            if conn is not None:
                with contextlib.suppress(apsw.Error):
                    total += conn.total_changes()
        return total

    def _configured(self, conn: apsw.Connection) -> apsw.Connection:
        if self._checkpoint_pages is not None:
            conn.execute(f"PRAGMA wal_autocheckpoint={self._checkpoint_pages}")
        return conn

    def close(self) -> None:
        for conn in [self._state, *self._catalogs.values()]:
            if conn is not None:
                # A failed checkpoint on close loses nothing: committed frames
                # stay in the WAL and the next open replays them.
                with contextlib.suppress(apsw.Error):
                    conn.close()
        self._state = None
        self._catalogs.clear()

    # -- resources ------------------------------------------------------
    def hmac_key(self) -> bytes:
        if self._key is None:
            self._key = read_secret(self.key_path, HMAC_KEY_BYTES)
        return self._key

    def api_key(self) -> bytes:
        """The key that seals the gateway API's capabilities (``api.key``, made on first use).

        A file of its own, not derived from ``hmac.key``: deleting it revokes
        every capability at once and touches no binding.
        """
        path = self.root / "api.key"
        make_secret(path, API_KEY_BYTES)
        return read_secret(path, API_KEY_BYTES)

    def state(self) -> apsw.Connection:
        if self._state is None:
            conn = connect(self.state_path, vfs=self.vfs)
            ensure_schema(conn, STATE_SCHEMA)
            self._state = self._configured(conn)
        return self._state

    def agent_exists(self, agent_id: str) -> bool:
        """Whether the cell is registered: an agent added, or a pool made by ``pools apply``."""
        if agent_id.startswith(POOL_CELL_PREFIX):
            name = validate_pool_name(agent_id[len(POOL_CELL_PREFIX):])
            return one(self.state(), "SELECT 1 FROM pools WHERE pool_name = ?", (name,)) is not None
        validate_agent_name(agent_id)
        return one(self.state(), "SELECT 1 FROM agents WHERE agent_id = ?", (agent_id,)) is not None

    def catalog(self, agent_id: str) -> apsw.Connection:
        """The agent's catalog; BadInput for an agent that was never added."""
        conn = self._catalogs.get(agent_id)
        if conn is not None:
            return conn
        if not self.agent_exists(agent_id):
            raise BadInput(f"unknown agent: {agent_id}")
        path = self.catalog_path(agent_id)
        if not path.exists():
            raise StorageError(f"catalog of agent {agent_id} is missing; run 'scopefs doctor'")
        conn = connect(path, vfs=self.vfs)
        ensure_schema(conn, AGENT_SCHEMA)
        cell = one(conn, "SELECT agent_id FROM agent_cell")
        if cell is None or cell[0] != agent_id:
            raise StorageError(f"catalog of agent {agent_id} belongs to another agent cell; refusing to use it")
        self._catalogs[agent_id] = self._configured(conn)
        return conn

    def open_catalogs(self) -> dict[str, apsw.Connection]:
        """The catalogs this process has opened so far, by cell (``catalog.marks`` compares them)."""
        return dict(self._catalogs)

    def agents(self) -> list[str]:
        return [row[0] for row in self.state().execute("SELECT agent_id FROM agents ORDER BY agent_id")]

    def cells(self) -> list[str]:
        """Every cell to check and recover: the agents, then the shared pools."""
        pools = [pool_cell(row[0]) for row in self.state().execute("SELECT pool_name FROM pools ORDER BY pool_name")]
        return [*self.agents(), *pools]
