"""Shared fixtures: a real home on disk, the real CLI, the seed's scenario.

Nothing here mocks the catalog, the writer or the filesystem: tests run the
installed ``scopefs`` command (or the same library functions it calls) on
real SQLite files in a temporary directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest

SCOPEFS = str(Path(sys.executable).with_name("scopefs"))


@dataclass
class Result:
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8", errors="replace")

    def json(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.out)
        return found


@dataclass
class Cli:
    """Runs the installed ``scopefs`` against one home."""

    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, *args: str, stdin: bytes | None = None, check: bool = False,
                 timeout: float = 60) -> Result:
        env = {**os.environ, "SCOPEFS_HOME": str(self.home), **self.env}
        proc = subprocess.run([SCOPEFS, *args], input=stdin if stdin is not None else b"", capture_output=True,
                              env=env, timeout=timeout)
        result = Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", errors="replace"))
        if check and result.code != 0:
            raise AssertionError(f"scopefs {' '.join(args)} exited {result.code}: {result.err}")
        return result

    def j(self, *args: str, stdin: bytes | None = None) -> dict[str, Any]:
        """Run with --json, require success, return the object."""
        result = self("--json", *args, stdin=stdin, check=True)
        return result.json()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    home = tmp_path / "home"
    runner = Cli(home)
    runner("init", check=True)
    return runner


# Raw provider identifiers and labels used by the scenario. Tests search the
# whole home for these bytes, so they are distinctive on purpose.
ALICE_SENDER = "tg-sender-alice-8410023317"
BOB_SENDER = "tg-sender-bob-5529100442"
MIKE1_SENDER = "tg-sender-mike-1111907733"
MIKE2_SENDER = "tg-sender-mike-2222801166"
ACCOUNT = "tg-bot-account-77810"
CHANNEL = "telegram"
GROUP_CONVERSATION = "tg-chat-group-9917700123"
ALICE_FACT = b"First private fact: allergic to hazelnuts (canary A1c3)\n"
BOB_FACT = b"Second private fact: allergic to peanuts (canary B0b7)\n"
CHANNEL_FACT = b"Channel fact: the team offsite is in Lisbon (canary C4an)\n"


@dataclass
class Scenario:
    cli: Cli
    agent: str
    alice: str
    bob: str
    mike1: str
    mike2: str
    conversation: str
    alice_binding: str
    bob_binding: str
    alice_session: str
    bob_session: str
    group_session: str


def build_scenario(cli: Cli, agent: str = "main") -> Scenario:
    """The seed's end-to-end proof, up to the first reads, via the CLI."""
    cli.j("agent", "add", agent)
    alice = cli.j("principal", "add", "Alice", "--kind", "human")["principal_id"]
    bob = cli.j("principal", "add", "Bob", "--kind", "human")["principal_id"]
    mike1 = cli.j("principal", "add", "Mike", "--kind", "human")["principal_id"]
    mike2 = cli.j("principal", "add", "Mike", "--kind", "human")["principal_id"]
    alice_binding = cli.j("bind", alice, "--channel", CHANNEL, "--account", ACCOUNT,
                          "--sender", ALICE_SENDER)["binding_id"]
    bob_binding = cli.j("bind", bob, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", BOB_SENDER)["binding_id"]
    cli.j("bind", mike1, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", MIKE1_SENDER)
    cli.j("bind", mike2, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", MIKE2_SENDER)
    conversation = cli.j("conversation", "add", "--agent", agent, "--channel", CHANNEL, "--account", ACCOUNT,
                         "--conversation", GROUP_CONVERSATION)["conversation_id"]
    for member in (alice, bob):
        cli.j("member", "add", conversation, member, "--expires", "7d")

    def dm(sender: str) -> str:
        return str(cli.j("session", "open", "--agent", agent, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", sender)["session_id"])

    alice_session, bob_session = dm(ALICE_SENDER), dm(BOB_SENDER)
    group_session = cli.j("session", "open", "--agent", agent, "--group", "--conversation", conversation)["session_id"]
    cli.j("write", alice_session, "private/notes/allergy.md", stdin=ALICE_FACT)
    cli.j("write", bob_session, "private/notes/allergy.md", stdin=BOB_FACT)
    cli.j("write", group_session, "channel/offsite.md", stdin=CHANNEL_FACT)
    return Scenario(cli, agent, alice, bob, mike1, mike2, conversation, alice_binding, bob_binding,
                    alice_session, bob_session, group_session)


@pytest.fixture(scope="session")
def scenario_template(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """Built once per test run; tests get private copies of its home."""
    runner = Cli(tmp_path_factory.mktemp("scenario") / "home")
    runner("init", check=True)
    return build_scenario(runner)


@pytest.fixture
def scenario(scenario_template: Scenario, tmp_path: Path) -> Scenario:
    """A fresh copy of the scenario's home: a test may change anything in it.

    Every CLI process has exited, so each database is checkpointed and
    closed; copying the directory copies the whole state.
    """
    home = tmp_path / "home"
    shutil.copytree(scenario_template.cli.home, home, symlinks=True)
    return dataclasses.replace(scenario_template, cli=Cli(home))


@contextlib.contextmanager
def db_copy(db: Path) -> Iterator[apsw.Connection]:
    """A connection to a byte copy of ``db`` (and its WAL), so reading never
    checkpoints, creates a -shm or otherwise changes the home."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.sqlite"
        shutil.copyfile(db, copy)
        wal = db.with_name(db.name + "-wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        conn = apsw.Connection(str(copy))
        try:
            yield conn
        finally:
            conn.close()


def sqlite_int(value: object) -> int:
    """An integer SQLite gave back (apsw types every value as any SQLite value): a count, a size."""
    assert isinstance(value, int), value
    return value


def sqlite_str(value: object) -> str:
    """A text value SQLite gave back (apsw types every value as any SQLite value): an id, a path."""
    assert isinstance(value, str), value
    return value


def table_dump(db: Path, *, skip: tuple[str, ...] = ()) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (sorted), read from a copy of the database."""
    with db_copy(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'"
                                             " AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return {t: sorted((tuple(r) for r in conn.execute(f'SELECT * FROM "{t}"')), key=repr)
                for t in tables if t not in skip}


def sqlite_dump(db: Path, *, skip_tables: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every table's rows, the schema and the version pragmas."""
    with db_copy(db) as conn:
        dump: dict[str, Any] = {
            "user_version": conn.execute("PRAGMA user_version").fetchall(),
            "application_id": conn.execute("PRAGMA application_id").fetchall(),
            "schema": sorted(tuple(r) for r in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema")),
        }
    for table, rows in table_dump(db, skip=skip_tables).items():
        dump[f"table:{table}"] = rows
    return dump


_SKIP_SUFFIXES = ("-wal", "-shm")
_SKIP_NAMES = frozenset({"writer.lock"})
READ_JOURNALS = "read-journals"  # ``catalog.readjournal.FOLDER``: mounts' reads before their audit


def snapshot(home: Path, *, skip_tables: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every entry under ``home``: type, mode and content hash.

    SQLite files are compared by their logical content: opening a database
    may legitimately checkpoint its WAL into the main file, which changes
    bytes but not data. WAL/SHM files and the writer lock are left out;
    ``skip_tables`` leaves out tables a check expects to change (the audit).
    Skipping the audit skips the exposure records and the search timings
    too, and a mount's read journal (``catalog.readjournal``, its reads on
    their way to the exposures): all record what was done (a read, a
    refusal, a search), none is state a refusal may not change.
    """
    skipped_names = _SKIP_NAMES
    if "audit" in skip_tables:
        skip_tables = (*skip_tables, "exposures", "search_stats")
        skipped_names = skipped_names | {READ_JOURNALS}
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(home):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == home and d in skipped_names)]
        for name in sorted(dirnames + filenames):
            if name in skipped_names or name.endswith(_SKIP_SUFFIXES):
                continue
            path = Path(dirpath) / name
            rel = str(path.relative_to(home))
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(path))
            elif stat.S_ISREG(st.st_mode) and name.endswith(".sqlite"):
                out[rel] = ("sqlite", mode, sqlite_dump(path, skip_tables=skip_tables))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", mode, st.st_nlink, hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode), mode)
    return out


def diff_snapshots(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Readable differences (entry, and for databases the table) between two snapshots."""
    diffs: list[str] = []
    for rel in sorted(before.keys() | after.keys()):
        a, b = before.get(rel), after.get(rel)
        if a == b:
            continue
        if a is None or b is None:
            diffs.append(f"{rel}: {'added' if a is None else 'removed'}")
        elif a[0] == b[0] == "sqlite":
            for key in sorted(a[2].keys() | b[2].keys()):
                if a[2].get(key) != b[2].get(key):
                    diffs.append(f"{rel} {key}: changed")
            if a[1] != b[1]:
                diffs.append(f"{rel}: mode changed")
        else:
            diffs.append(f"{rel}: {a!r} -> {b!r}")
    return diffs


def artifact_path(home: Path, audience_id: str, path: str, agent: str = "main") -> Path:
    """Where the active revision of a note lives on disk (tests only)."""
    conn = apsw.Connection(str(home / "agents" / agent / "catalog.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT sr.path_key, v.locator FROM resources r JOIN stores s ON s.store_id = r.store_id"
            " JOIN storage_roots sr ON sr.storage_root_id = s.storage_root_id"
            " JOIN revisions v ON v.resource_id = r.resource_id AND v.state = 'active'"
            " WHERE s.audience_id = ? AND r.path = ? AND r.state = 'live'",
            (audience_id, path),
        ).fetchall()
    finally:
        conn.close()
    assert len(rows) == 1, rows
    path_key, locator = rows[0]
    return home / "agents" / agent / "memory-scopes" / "v1" / str(path_key) / str(locator)


def run_readme_example(heading: str, tmp_path: Path, *, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    """The first ``sh`` block after ``heading`` in README.md, run as it is printed (bash -euo pipefail), with the
    installed ``scopefs`` first on PATH and no ``SCOPEFS_HOME`` of ours; must exit 0."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index(heading):]
    script = section[section.index("```sh\n") + 6:]
    script = script[:script.index("```")]
    env = {**os.environ, "PATH": f"{Path(SCOPEFS).parent}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    env.pop("SCOPEFS_HOME", None)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc
