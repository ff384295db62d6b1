"""Shared memory pools (``scopefs pools apply``): N:M capture and recall, readers and writers, fail closed.

amem's two modes, both declared in one file here:

* Mode A (shared pool plus private): ``main`` and ``dev`` keep their own
  stores and both recall the pool ``team``; only ``main`` writes it, and
  only from a service session (its DM and group sessions hold private
  roots, so they read the pool and never write it).
* Mode B (dedicated, nothing shared): ``sandbox`` keeps to its own cell.

``social`` is agent-privacy-pools' social agent: it captures into ``team``
and recalls nothing else. ``lurker`` is registered but not declared: it
gets nothing at all.
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog.errors import Denied
from scopefs.catalog.home import Home
from scopefs.catalog.reasons import Reason
from scopefs.writer.rename import rename_note
from scopefs.writer.tombstone import delete_parts
from scopefs.writer.transaction import write_parts
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    CHANNEL,
    Cli,
    Scenario,
    db_copy,
    diff_snapshots,
    snapshot,
)
from tests.mountkit import Mounts, errno_of, mounts, wait_until  # noqa: F401

MODES = """
[agents.main]
capture = "own"
recall = ["own", "team"]

[agents.dev]
capture = "own"
recall = ["own", "team"]

[agents.sandbox]
capture = "own"
recall = ["own"]

[agents.social]
capture = "team"
recall = ["team"]

[pools.team]
owner = "main"
readers = ["main", "dev", "social"]
writers = ["main", "social"]
"""
POOL_FACT = b"Pool fact: the release train leaves on Thursdays (canary P00l)\n"


def _apply(cli: Cli, tmp: Path, text: str, name: str = "pools.toml") -> dict[str, Any]:
    path = tmp / name
    path.write_text(text)
    return cli.j("pools", "apply", str(path))


def _dm(cli: Cli, agent: str) -> str:
    return str(cli.j("session", "open", "--agent", agent, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", ALICE_SENDER)["session_id"])


@pytest.fixture
def pooled(scenario: Scenario, tmp_path: Path) -> dict[str, str]:
    """Agents of both modes with Alice's DM session in each, main's curator (a service session), the
    file applied, one note in the pool."""
    cli = scenario.cli
    for agent in ("dev", "sandbox", "social", "lurker"):
        cli.j("agent", "add", agent)
    _apply(cli, tmp_path, MODES)
    sessions = {"main": scenario.alice_session, **{a: _dm(cli, a) for a in ("dev", "sandbox", "social", "lurker")}}
    sessions["curator"] = _curator(cli)
    cli.j("write", sessions["curator"], "pools/team/release.md", stdin=POOL_FACT)
    return sessions


def _curator(cli: Cli, agent: str = "main") -> str:
    """A service session of ``agent``: where a writer that keeps private stores writes its pools from."""
    principal = cli.j("principal", "add", "curator", "--kind", "service")["principal_id"]
    return str(cli.j("session", "open", "--agent", agent, "--service", principal)["session_id"])


def _ls(cli: Cli, session: str, path: str = "") -> list[str]:
    return [e["name"] for e in cli.j("ls", session, *([path] if path else []))["entries"]]


def _search_paths(cli: Cli, session: str, query: str) -> set[str]:
    return {r["path"] for r in cli.j("search", session, query)["results"]}


def test_mode_a_shares_the_pool_and_keeps_private_stores(scenario: Scenario, pooled: dict[str, str]) -> None:
    cli = scenario.cli
    assert _ls(cli, pooled["main"]) == ["agent-shared", "pools", "postbox", "private", "projections"]
    assert _ls(cli, pooled["main"], "pools") == ["team"]
    assert cli("read", pooled["dev"], "pools/team/release.md", check=True).out == POOL_FACT
    assert _search_paths(cli, pooled["dev"], "release train") == {"pools/team/release.md"}
    # main's own private note and the pool note come back from one search, merged by score.
    assert _search_paths(cli, pooled["main"], "allergic hazelnuts release train") >= {
        "private/notes/allergy.md", "pools/team/release.md"}
    # dev's private store is its own cell's: main never sees it, nor dev main's.
    cli.j("write", pooled["dev"], "private/dev-only.md", stdin=b"dev private canary D3v0\n")
    assert cli("read", pooled["main"], "private/dev-only.md").code == 3
    assert cli("read", pooled["dev"], "private/notes/allergy.md").code == 3
    assert "private/dev-only.md" not in _search_paths(cli, pooled["main"], "dev private canary D3v0")
    assert "private/dev-only.md" in _search_paths(cli, pooled["dev"], "dev private canary D3v0")


def test_mode_b_sees_no_pool(scenario: Scenario, pooled: dict[str, str]) -> None:
    cli = scenario.cli
    assert "pools" not in _ls(cli, pooled["sandbox"])
    for path in ("pools/team/release.md", "pools/team"):
        result = cli("read", pooled["sandbox"], path)
        assert result.code == 3 and "not available in this view" in result.err
    assert _search_paths(cli, pooled["sandbox"], "release train") == set()
    assert cli("write", pooled["sandbox"], "pools/team/x.md", stdin=b"x\n").code == 3


def test_writers_are_enforced_on_write_rename_and_delete(scenario: Scenario, pooled: dict[str, str],
                                                         mounts: Mounts) -> None:
    cli, dev = scenario.cli, pooled["dev"]
    before = snapshot(cli.home, skip_tables=("audit",))
    assert cli("write", dev, "pools/team/release.md", stdin=b"overwritten\n").code == 3
    assert cli("write", dev, "pools/team/new.md", stdin=b"new\n").code == 3
    home = Home.open(cli.home)
    try:
        calls: tuple[Callable[[], object], ...] = (
            lambda: rename_note(home, dev, "pools/team/release.md", "pools/team/moved.md"),
            lambda: delete_parts(home, dev, ("pools", "team", "release.md")))
        for call in calls:
            with pytest.raises(Denied):
                call()
    finally:
        home.close()
    view = mounts.mount(dev)
    team = view / "pools" / "team"
    assert errno_of(lambda: os.rename(team / "release.md", team / "moved.md")) == errno.EROFS
    assert errno_of(lambda: os.unlink(team / "release.md")) == errno.EROFS
    assert errno_of(lambda: (team / "release.md").write_bytes(b"x")) == errno.EROFS
    changed = diff_snapshots(before, snapshot(cli.home, skip_tables=("audit",)))
    assert [c for c in changed if not c.startswith("mounts")] == []  # the mount's registry only
    assert (team / "release.md").read_bytes() == POOL_FACT
    # The writers may: social captures there, main's curator (a service session) curates.
    cli.j("write", pooled["social"], "pools/team/from-social.md", stdin=b"social capture\n")
    home = Home.open(cli.home)
    try:
        rename_note(home, pooled["curator"], "pools/team/from-social.md", "pools/team/kept.md")
        delete_parts(home, pooled["social"], ("pools", "team", "kept.md"))
    finally:
        home.close()
    assert _ls(cli, dev, "pools/team") == ["release.md"]


def test_a_session_holding_private_roots_never_writes_a_pool(scenario: Scenario, pooled: dict[str, str],
                                                             mounts: Mounts) -> None:
    """main is a writer of team, but Alice's DM session with main also holds private/: a copy from
    there into the pool would publish her note to every reader with no publish step."""
    cli, main = scenario.cli, pooled["main"]
    assert cli("write", main, "pools/team/copied.md", stdin=ALICE_FACT).code == 3
    view = mounts.mount(main)
    assert errno_of(lambda: (view / "pools" / "team" / "copied.md").write_bytes(ALICE_FACT)) == errno.EROFS
    assert (view / "pools" / "team" / "release.md").read_bytes() == POOL_FACT
    group = cli("write", scenario.group_session, "pools/team/copied.md", stdin=b"group\n")
    assert group.code == 3
    assert "copied.md" not in _ls(cli, pooled["dev"], "pools/team")
    assert cli.j("pools", "show")["effective"]["main"]["pools"] == {"team": "rw"}  # the agent's grant; the
    # session's subject narrows it


def test_social_captures_into_the_pool_and_recalls_nothing_else(scenario: Scenario,
                                                                pooled: dict[str, str]) -> None:
    cli, social = scenario.cli, pooled["social"]
    assert _ls(cli, social) == ["pools"]
    assert cli("write", social, "private/mine.md", stdin=b"x\n").code == 3
    assert cli("read", social, "private/notes/allergy.md").code == 3
    assert _search_paths(cli, social, "allergic hazelnuts") == set()


def test_an_undeclared_agent_gets_nothing(scenario: Scenario, pooled: dict[str, str]) -> None:
    cli, lurker = scenario.cli, pooled["lurker"]
    assert _ls(cli, lurker) == []
    for path in ("private/x.md", "pools/team/x.md", "agent-shared/x.md"):
        assert cli("write", lurker, path, stdin=b"x\n").code == 3
    assert cli("read", lurker, "pools/team/release.md").code == 3
    assert _search_paths(cli, lurker, "release train") == set()
    shown = cli.j("pools", "show")
    assert shown["effective"]["lurker"] == {"own": False, "own_writable": False, "pools": {}}


def test_a_pool_is_a_cell_with_its_own_catalog(scenario: Scenario, pooled: dict[str, str]) -> None:
    home = scenario.cli.home
    pool_db = home / "pools" / "team" / "catalog.sqlite"
    assert pool_db.is_file()
    with db_copy(pool_db) as conn:
        assert conn.execute("SELECT agent_id FROM agent_cell").fetchall() == [("pool:team",)]
        assert conn.execute("SELECT path FROM resources WHERE state = 'live'").fetchall() == [("release.md",)]
    for agent in ("main", "dev", "social"):
        with db_copy(home / "agents" / agent / "catalog.sqlite") as conn:
            assert ("release.md",) not in conn.execute("SELECT path FROM resources").fetchall()
    raw = b"".join(p.read_bytes() for p in (home / "agents").rglob("*") if p.is_file())
    assert POOL_FACT not in raw  # the pool's content lives only in the pool's artifact area
    assert scenario.cli("doctor").code == 0  # doctor checks the pool cell too


def test_apply_is_idempotent_and_atomic(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    cli.j("agent", "add", "dev")
    text = "[agents.main]\ncapture = \"own\"\nrecall = [\"own\", \"team\"]\n[pools.team]\nowner = \"main\"\n"
    one = _apply(cli, tmp_path, text)
    assert one["changed"] and one["revision"] == 1 and one["created_pools"] == ["team"]
    again = _apply(cli, tmp_path, text)
    assert not again["changed"] and again["revision"] == 1 and again["created_pools"] == []
    state = cli.home / "state.sqlite"
    with db_copy(state) as conn:
        config_before = conn.execute("SELECT * FROM pool_config").fetchall()
    bad_files = {
        "unknown key": text + "colour = \"blue\"\n",
        "unknown agent": text + "[agents.ghost]\ncapture = \"own\"\n",
        "capture without writing": text + "[agents.dev]\ncapture = \"team\"\nrecall = [\"team\"]\n",
        "recall without reading": text.replace('owner = "main"', 'owner = "main"\nreaders = ["main"]')
        + "[agents.dev]\nrecall = [\"team\"]\n",
        "undeclared pool": "[agents.main]\nrecall = [\"elsewhere\"]\n",
        "not toml": "[agents.main\n",
        "not a list": "[agents.main]\nrecall = \"own\"\n",
        "bad pool name": "[agents.main]\nrecall = []\n[pools.Team]\nowner = \"main\"\n",
        "nested too deeply": "a = " + "[" * 3000 + "\n",  # tomllib recursion (bench/fuzz_inputs.py found it)
        "owner undeclared": "[agents.main]\nrecall = []\n[pools.x]\nowner = \"dev\"\n",
        "capture into a pool while recalling own": text.replace('capture = "own"', 'capture = "team"'),
    }
    for why, bad in bad_files.items():
        path = tmp_path / "bad.toml"
        path.write_text(bad)
        result = cli("pools", "apply", str(path))
        assert result.code == 2 and result.err.strip(), why
        assert "\n" not in result.err.strip(), why  # one line
    with db_copy(state) as conn:
        assert conn.execute("SELECT * FROM pool_config").fetchall() == config_before
    changed = _apply(cli, tmp_path, text.replace('recall = ["own", "team"]', 'recall = ["own"]'))
    assert changed["changed"] and changed["revision"] == 2
    assert cli("pools", "apply", str(tmp_path / "missing.toml")).code == 2


def test_readers_star_means_every_declared_agent(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    cli.j("agent", "add", "dev")
    _apply(cli, tmp_path, "[agents.main]\ncapture = \"own\"\nrecall = [\"own\", \"kb\"]\n"
                          "[agents.dev]\nrecall = [\"kb\"]\n"
                          "[pools.kb]\nowner = \"main\"\nreaders = [\"*\"]\n")
    cli.j("write", _curator(cli), "pools/kb/faq.md", stdin=b"faq\n")
    dev = _dm(cli, "dev")
    assert cli("read", dev, "pools/kb/faq.md", check=True).out == b"faq\n"
    assert cli("write", dev, "pools/kb/faq.md", stdin=b"no\n").code == 3
    assert json.loads(cli("--json", "pools", "show").out)["effective"]["dev"]["pools"] == {"kb": "ro"}


def test_no_file_applied_keeps_every_agent_in_its_own_cell(scenario: Scenario) -> None:
    cli = scenario.cli
    shown = cli.j("pools", "show")
    assert shown["applied"] is False and shown["effective"]["main"]["own_writable"] is True
    assert _ls(cli, scenario.alice_session) == ["agent-shared", "postbox", "private", "projections"]
    assert cli("read", scenario.alice_session, "private/notes/allergy.md", check=True).out == ALICE_FACT


def test_removing_a_reader_empties_live_mounts(scenario: Scenario, pooled: dict[str, str], mounts: Mounts,
                                               tmp_path: Path) -> None:
    cli = scenario.cli
    view = mounts.mount(pooled["dev"])
    note = view / "pools" / "team" / "release.md"
    assert note.read_bytes() == POOL_FACT
    held = os.open(note, os.O_RDONLY)
    try:
        assert os.read(held, 5) == POOL_FACT[:5]
        _apply(cli, tmp_path, MODES.replace('readers = ["main", "dev", "social"]', 'readers = ["main", "social"]')
               .replace('[agents.dev]\ncapture = "own"\nrecall = ["own", "team"]',
                        '[agents.dev]\ncapture = "own"\nrecall = ["own"]'), "fewer.toml")
        wait_until(lambda: not (view / "pools").exists())
        assert errno_of(lambda: note.read_bytes()) == errno.ENOENT
        assert errno_of(lambda: os.pread(held, 5, 0)) in (errno.EACCES, errno.EIO)
        assert sorted(os.listdir(view)) == ["agent-shared", "postbox", "private", "projections"]
    finally:
        os.close(held)


def test_a_pool_note_written_elsewhere_shows_in_a_live_mount(scenario: Scenario, pooled: dict[str, str],
                                                             mounts: Mounts) -> None:
    cli = scenario.cli
    view = mounts.mount(pooled["dev"])
    assert sorted(os.listdir(view / "pools" / "team")) == ["release.md"]
    cli.j("write", pooled["social"], "pools/team/later.md", stdin=b"later\n")
    wait_until(lambda: (view / "pools" / "team" / "later.md").exists())
    assert (view / "pools" / "team" / "later.md").read_bytes() == b"later\n"
    assert errno_of(lambda: (view / "pools" / "team" / "mine.md").write_bytes(b"x")) in (errno.EROFS, errno.EACCES)
    curator_view = mounts.mount(pooled["curator"], "curator")
    (curator_view / "pools" / "team" / "from-mount.md").write_bytes(b"written through a mount\n")
    wait_until(lambda: (view / "pools" / "team" / "from-mount.md").exists())
    assert errno_of(lambda: os.rename(curator_view / "pools" / "team" / "from-mount.md",
                                      curator_view / "agent" / "moved.md")) == errno.EXDEV


class _SlowSource(io.BytesIO):
    """Note bytes that run ``meanwhile`` the first time they are read: a write still staging."""

    def __init__(self, data: bytes, meanwhile: Callable[[], object]) -> None:
        super().__init__(data)
        self._meanwhile: Callable[[], object] | None = meanwhile

    def read(self, size: int | None = -1) -> bytes:
        if self._meanwhile is not None:
            run = self._meanwhile
            self._meanwhile = None
            run()
        return super().read(size)

    def readinto(self, buffer: Any) -> int:
        self.read(0)
        return super().readinto(buffer)


def test_a_write_staging_while_its_pool_is_taken_away_commits_nothing(scenario: Scenario, pooled: dict[str, str],
                                                                      tmp_path: Path) -> None:
    cli = scenario.cli
    fewer = MODES.replace('writers = ["main", "social"]', 'writers = ["main"]').replace(
        '[agents.social]\ncapture = "team"\nrecall = ["team"]', '[agents.social]\ncapture = "none"\nrecall = ["team"]')
    home = Home.open(cli.home)
    try:
        source = _SlowSource(b"written while the writers changed\n", lambda: _apply(cli, tmp_path, fewer, "f.toml"))
        with pytest.raises(Denied) as refused:
            write_parts(home, pooled["social"], ("pools", "team", "late.md"), source)
        reason = refused.value.reason  # typed str; a Reason (a StrEnum) in fact
        assert isinstance(reason, Reason) and reason.value == "plan-expired"
    finally:
        home.close()
    assert _ls(cli, pooled["dev"], "pools/team") == ["release.md"]
