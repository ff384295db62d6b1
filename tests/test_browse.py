"""A person's own mount: ``scopefs browse PRINCIPAL MOUNTPOINT --agent A --user UNIXUSER``.

Real Unix users (made with ``useradd --system --no-create-home`` for this
module and removed afterwards) run real ``ls``, ``cat``, ``vim``, ``nano``
and ``sed -i`` through ``runuser``. Shown: the owner sees their DM's view
(``private/`` rw, ``agent-shared/`` ro, their postbox review) and nothing of
anyone else's; another user and root get ``EACCES`` for everything; every
save is a revision with the principal as actor and origin ``human``; an
artifact changed behind the broker's back is refused (EIO through the
mount, exit 4 through ``scopefs read``), moved to quarantine by ``doctor
--fix`` and never re-hashed; bad input changes nothing; ``umount`` ends the
mount and the session.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import apsw
import pytest

from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.human import open_human_session
from scopefs.sandbox import external, mounts, sessions
from tests.conftest import ALICE_FACT, BOB_FACT, SCOPEFS, Scenario, artifact_path, diff_snapshots, snapshot
from tests.mountkit import is_mounted, wait_until
from tests.test_vfs_editors import nano_types_a_line

pytestmark = pytest.mark.slow

NOTE = "private/notes/allergy.md"
TOOL_TIMEOUT_S = 60
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


def _add_user() -> User:
    name = f"sfb{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    ids = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout.strip()
    gid = subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True).stdout.strip()
    return User(name, int(ids), int(gid))


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[User, User]]:
    """The owner's account and another local account; both removed at the end."""
    made: list[User] = []
    try:
        made.append(_add_user())
        made.append(_add_user())
        yield made[0], made[1]
    finally:
        for user in made:
            subprocess.run(["userdel", user.name], check=False, capture_output=True)


@dataclass
class Place:
    scenario: Scenario
    base: Path
    mountpoint: Path

    def browse(self, user: User, *extra: str) -> dict[str, object]:
        answer = self.scenario.cli.j("browse", self.scenario.alice, str(self.mountpoint), "--agent", "main",
                                     "--user", user.name, *extra)
        assert isinstance(answer["session_id"], str)
        return answer


@pytest.fixture
def place(scenario: Scenario) -> Iterator[Place]:
    # Not under pytest's tmp_path (/tmp/pytest-of-root is 0700): the owner must reach the mount point.
    base = Path(tempfile.mkdtemp(prefix="scopefs-browse-", dir="/tmp"))
    os.chmod(base, 0o711)
    (base / "memory").mkdir()
    found = Place(scenario, base, base / "memory")
    try:
        yield found
    finally:
        if is_mounted(found.mountpoint) and scenario.cli("umount", str(found.mountpoint)).code != 0:
            subprocess.run(["fusermount3", "-uz", str(found.mountpoint)], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "TERM": "xterm", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def user_argv(user: User, argv: tuple[str, ...], cwd: Path | None) -> list[str]:
    """``argv`` run as ``user`` (``runuser``), in ``cwd`` entered as that user: root may not enter the mount."""
    return [RUNUSER, "-u", user.name, "--", *(("env", "-C", str(cwd)) if cwd is not None else ()), *argv]


def as_user(user: User, *argv: str, cwd: Path | None = None, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(user_argv(user, argv, cwd), input=stdin, capture_output=True, cwd="/", env=ENV,
                          timeout=TOOL_TIMEOUT_S, check=False)


def catalog(home: Path) -> apsw.Connection:
    return apsw.Connection(str(home / "agents" / "main" / "catalog.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)


def revisions_of(home: Path, path: str) -> list[tuple[str, str, str]]:
    """(actor, trust origin, session) of every revision of the owner's private note at ``path``."""
    conn = catalog(home)
    try:
        return [tuple(r) for r in conn.execute(
            "SELECT v.actor_id, v.trust_origin, v.session_id FROM revisions v JOIN resources r USING (resource_id)"
            " JOIN stores s ON s.store_id = r.store_id WHERE s.scope_kind = 'user' AND r.path = ?"
            " ORDER BY v.revision_no", (path,))]
    finally:
        conn.close()


def test_the_owner_alone_sees_their_own_view(place: Place, people: tuple[User, User]) -> None:
    owner, other = people
    scenario = place.scenario
    answer = place.browse(owner)
    assert answer["for_uid"] == owner.uid and answer["mountpoint"] == str(place.mountpoint)
    where = place.mountpoint
    # Root (this test, not the server) gets nothing: every request it makes is refused. (Once the owner
    # has looked, the kernel may answer root's path walks from its own caches without asking: see README.)
    for call in (lambda: os.listdir(where), lambda: os.stat(where / "private"),
                 lambda: open(where / NOTE, "rb").read()):
        with pytest.raises(PermissionError):
            call()

    listed = as_user(owner, "ls", str(where))
    assert listed.returncode == 0, listed
    # The same roots as the owner's verified DM session.
    dm_roots = [name.rstrip("/") for name in scenario.cli("ls", scenario.alice_session).text.split()]
    assert sorted(listed.stdout.decode().split()) == sorted(dm_roots)
    assert "private" in dm_roots and "agent-shared" in dm_roots and "postbox" in dm_roots
    assert as_user(owner, "cat", str(where / NOTE)).stdout == ALICE_FACT
    assert BOB_FACT not in as_user(owner, "grep", "-r", "allergic", str(where)).stdout

    st = as_user(owner, "stat", "-c", "%u %g", str(where)).stdout.decode().split()
    assert [int(x) for x in st] == [owner.uid, owner.gid]  # the mount point is the owner's

    # agent-shared is read-only for the owner.
    denied = as_user(owner, "sh", "-c", f"echo x > {where}/agent-shared/new.md")
    assert denied.returncode != 0

    # Another local user gets nothing: no listing, no read, no attributes of anything in it (the mount
    # point's own attributes, owner and mode, are constant and say nothing about the view).
    for argv in (("ls", str(where)), ("cat", str(where / NOTE)), ("stat", str(where / NOTE)),
                 ("ls", str(where / "private"))):
        refused = as_user(other, *argv)
        assert refused.returncode != 0 and b"Permission denied" in refused.stderr, (argv, refused)
        assert ALICE_FACT not in refused.stdout


def _vim(owner: User, folder: Path, name: str, line: str) -> None:
    done = as_user(owner, "vim", "-Es", "-N", "-u", "DEFAULTS", "-i", "NONE", "-c", "set backupskip=",
                   "-c", f"normal Go{line}", "-c", "wq", name, cwd=folder)
    assert done.returncode == 0, done


def _nano(owner: User, folder: Path, name: str, line: str) -> None:
    nano_types_a_line(user_argv(owner, ("nano", name), folder), Path("/"), ENV, line)


def test_every_save_is_the_principals_with_origin_human(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    scenario = place.scenario
    session_id = place.browse(owner)["session_id"]
    folder = place.mountpoint / "private" / "notes"
    before = len(revisions_of(scenario.cli.home, "notes/allergy.md"))

    _vim(owner, folder, "allergy.md", "saved by vim")
    _nano(owner, folder, "allergy.md", "saved by nano")
    sed = as_user(owner, "sed", "-i", "s/allergic/ALLERGIC/; $a saved by sed", "allergy.md", cwd=folder)
    assert sed.returncode == 0, sed
    created = as_user(owner, "sh", "-c", "printf 'a new note\\n' > fresh.md", cwd=folder)
    assert created.returncode == 0, created

    expected = (b"saved by nano\n" + ALICE_FACT.replace(b"allergic", b"ALLERGIC", 1)
                + b"saved by vim\nsaved by sed\n")
    assert as_user(owner, "cat", "allergy.md", cwd=folder).stdout == expected
    assert scenario.cli("read", scenario.alice_session, NOTE, check=True).out == expected  # the same store as the DM

    made = revisions_of(scenario.cli.home, "notes/allergy.md")[before:]
    assert len(made) >= 3, made
    assert set(made) == {(scenario.alice, "human", session_id)}
    assert revisions_of(scenario.cli.home, "notes/fresh.md") == [(scenario.alice, "human", session_id)]
    # No editor scratch file became a note.
    conn = catalog(scenario.cli.home)
    try:
        paths = {r[0] for r in conn.execute("SELECT path FROM resources WHERE state = 'live'")}
    finally:
        conn.close()
    assert {p for p in paths if p.startswith("notes/")} == {"notes/allergy.md", "notes/fresh.md"}
    history = scenario.cli.j("history", str(session_id), NOTE)
    assert "human" in json.dumps(history)


def test_a_tamper_behind_the_brokers_back_is_refused_and_quarantined(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    scenario = place.scenario
    cli = scenario.cli
    session_id = str(place.browse(owner)["session_id"])
    where = place.mountpoint / NOTE
    assert as_user(owner, "cat", str(where)).stdout == ALICE_FACT  # verified once, its pages cached

    artifact = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    tampered = bytearray(ALICE_FACT)
    tampered[0] ^= 0x20  # same size: only the hash can tell
    artifact.write_bytes(bytes(tampered))

    def refused() -> subprocess.CompletedProcess[bytes]:
        return as_user(owner, "cat", str(where))

    def refusal() -> subprocess.CompletedProcess[bytes] | None:
        result = refused()
        return result if result.returncode != 0 else None

    seen = wait_until(refusal)
    assert seen is not None
    assert b"Input/output error" in seen.stderr and seen.stdout == b"", seen
    for session in (session_id, scenario.alice_session):
        result = cli("read", session, NOTE)
        assert (result.code, result.out) == (4, b""), result

    conn = catalog(cli.home)
    try:
        recorded = conn.execute("SELECT revision_id, content_sha256 FROM revisions WHERE state = 'active'"
                                " AND locator = ?", (artifact.name,)).fetchall()
    finally:
        conn.close()
    assert len(recorded) == 1

    fixed = cli("--json", "doctor", "--fix")
    assert fixed.code == 4, fixed
    found = {(f["kind"], f["ref_id"], f["action"]) for f in fixed.json()["findings"]}
    assert ("tampered-artifact", recorded[0][0], "quarantined, rolled back") in found
    assert not artifact.exists()
    quarantine = cli.home / "agents" / "main" / "quarantine"
    assert [(p.name, p.read_bytes()) for p in quarantine.iterdir()] == [(f"tampered-{recorded[0][0]}",
                                                                          bytes(tampered))]

    conn = catalog(cli.home)
    try:
        after = conn.execute("SELECT revision_id, content_sha256 FROM revisions WHERE revision_id = ?",
                             (recorded[0][0],)).fetchall()
    finally:
        conn.close()
    assert after == recorded  # never re-hashed into the catalog
    assert cli("read", session_id, NOTE).code != 0  # its only revision retired: the note is gone
    again = refused()
    assert again.returncode != 0 and again.stdout == b"", again
    still = cli("--json", "doctor")
    assert still.code == 0 and still.json()["findings"] == [], still.text


def test_umount_ends_the_mount_and_the_session(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    cli = place.scenario.cli
    answer = place.browse(owner)
    pid = answer["pid"]
    assert isinstance(pid, int) and mounts.server_alive(pid, external.MODULE)
    gone = cli.j("umount", str(place.mountpoint))
    assert gone["session_id"] == answer["session_id"]
    assert not is_mounted(place.mountpoint) and os.listdir(place.mountpoint) == []
    wait_until(lambda: not mounts.server_alive(pid, external.MODULE) or None)
    closed = cli("read", str(answer["session_id"]), NOTE)
    assert closed.code == 3 and closed.out == b"", closed
    # The place can be used again, with a new session.
    again = place.browse(owner)
    assert again["session_id"] != answer["session_id"]


def test_sudo_user_is_the_default_and_root_is_refused(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    cli = place.scenario.cli
    base = [SCOPEFS, "--json", "browse", place.scenario.alice, str(place.mountpoint), "--agent", "main"]
    env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
    env["SCOPEFS_HOME"] = str(cli.home)
    before = snapshot(cli.home)
    as_root = subprocess.run(base, env=env, capture_output=True, timeout=60, check=False)
    assert as_root.returncode == 2 and b"root" in as_root.stderr, as_root
    assert diff_snapshots(before, snapshot(cli.home)) == []
    done = subprocess.run(base, env={**env, "SUDO_USER": owner.name}, capture_output=True, timeout=60, check=True)
    assert json.loads(done.stdout)["for_uid"] == owner.uid


def test_foreground_browse_serves_until_unmounted(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    cli = place.scenario.cli
    proc = subprocess.Popen([SCOPEFS, "--json", "browse", place.scenario.alice, str(place.mountpoint), "--agent",
                             "main", "--user", owner.name, "--foreground"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "SCOPEFS_HOME": str(cli.home)})
    try:
        assert proc.stdout is not None
        shown = json.loads(proc.stdout.readline())
        assert as_user(owner, "cat", str(place.mountpoint / NOTE)).stdout == ALICE_FACT
        subprocess.run(["fusermount3", "-u", str(place.mountpoint)], check=True, capture_output=True)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert cli("read", str(shown["session_id"]), NOTE).code == 3  # it ended with its mount


def test_bad_input_changes_nothing(place: Place, people: tuple[User, User], tmp_path: Path) -> None:
    owner, _ = people
    scenario = place.scenario
    cli = scenario.cli
    service = cli.j("principal", "add", "Nightly", "--kind", "service")["principal_id"]
    a_file = place.base / "file"
    a_file.write_bytes(b"x")
    full = place.base / "full"
    full.mkdir()
    (full / "x").write_bytes(b"x")
    mp = str(place.mountpoint)
    cases = [
        ("p_" + "a" * 26, mp, "--user", owner.name),  # unknown principal
        ("Alice", mp, "--user", owner.name),  # a display name is not a principal
        (service, mp, "--user", owner.name),  # a service principal
        (scenario.alice, str(a_file), "--user", owner.name),  # not a directory
        (scenario.alice, str(place.base / "missing"), "--user", owner.name),
        (scenario.alice, str(full), "--user", owner.name),  # not empty
        (scenario.alice, str(tmp_path), "--user", owner.name),  # a folder others cannot reach safely (not root's path)
        (scenario.alice, mp, "--user", "no-such-user-here"),
        (scenario.alice, mp, "--user", "root"),
        (scenario.alice, mp, "--user", "nobody"),
    ]
    before = snapshot(cli.home)
    for args in cases:
        result = cli("browse", args[0], args[1], "--agent", "main", *args[2:])
        assert result.code == 2 and result.out == b"" and result.err.count("\n") == 1, (args, result)
    assert cli("browse", scenario.alice, mp, "--agent", "nope", "--user", owner.name).code == 2
    assert diff_snapshots(before, snapshot(cli.home)) == []

    place.browse(owner)
    mounted = snapshot(cli.home)
    twice = cli("browse", scenario.alice, mp, "--agent", "main", "--user", owner.name)
    assert twice.code == 2 and "already" in twice.err, twice
    assert diff_snapshots(mounted, snapshot(cli.home)) == []
    assert stat.S_ISDIR(os.stat(place.base).st_mode)


def test_a_human_session_is_written_once(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    cli = place.scenario.cli
    session_id = place.browse(owner)["session_id"]
    conn = apsw.Connection(str(cli.home / "agents" / "main" / "catalog.sqlite"))
    try:
        for sql in ("UPDATE human_sessions SET unix_uid = unix_uid + 1", "DELETE FROM human_sessions",
                    "UPDATE human_sessions SET principal_id = 'p_x'"):
            with pytest.raises(apsw.ConstraintError):
                conn.execute(sql)
    finally:
        conn.close()
    child = cli("session", "open", "--agent", "main", "--child-of", str(session_id), "--cap", "private/**")
    assert child.code == 2, child


def test_only_the_owner_uid_errno(place: Place, people: tuple[User, User]) -> None:
    """The refusal another user sees is EACCES, the same for a note that exists and one that does not."""
    owner, other = people
    place.browse(owner)
    probe = ("import os,sys\n"
             "for p in sys.argv[1:]:\n"
             "    try: os.stat(p); print(0)\n"
             "    except OSError as e: print(e.errno)\n")
    out = as_user(other, "python3", "-c", probe, str(place.mountpoint / NOTE),
                  str(place.mountpoint / "private/nope.md"))
    assert out.stdout.decode().split() == [str(errno.EACCES)] * 2, out


def test_a_browse_session_goes_to_its_own_user_alone(place: Place, people: tuple[User, User], tmp_path: Path) -> None:
    """Neither a plain mount, a mount for another uid, nor a sandbox serves a person's browse session."""
    owner, other = people
    cli = place.scenario.cli
    session_id = str(place.browse(owner)["session_id"])
    spare = place.base / "spare"
    spare.mkdir()
    before = snapshot(cli.home)
    for args in (("mount", session_id, str(spare)), ("mount", session_id, str(spare), "--for-uid", str(other.uid)),
                 # even for its own user: only browse serves it, owner-only (root refused even attributes)
                 ("mount", session_id, str(spare), "--for-uid", str(owner.uid)),
                 ("mount", session_id, str(spare), "--for-uid", str(owner.uid), "--foreground"),
                 ("run", session_id, "--", "true"), ("session", "up", session_id)):
        result = cli(*args)
        assert result.code == 2 and "browse" in result.err, (args, result)
        assert not is_mounted(spare)
    assert diff_snapshots(before, snapshot(cli.home)) == []


def test_no_sandbox_mount_starts_for_a_browse_session(scenario: Scenario, tmp_path: Path) -> None:
    """Below the CLI: the launcher's ``sessions.start`` (every run's and every kept mount's path) and the
    sandbox mount server itself refuse a person's session, so no writable sandbox view of it ever exists."""
    home = Home(scenario.cli.home)
    session_id = open_human_session(home, scenario.agent, scenario.alice, 12345).session_id
    for tied in (True, False):
        with pytest.raises(BadInput, match="browse"):
            sessions.start(home, session_id, tied=tied)
    with pytest.raises(BadInput, match="browse"):
        mounts.spawn_server(sessions.SERVER_MODULE, ["--home", str(home.root), session_id], tmp_path / "server.log")
    assert sessions.kept(home, session_id) is None  # (/run/scopefs/mounts is shared with other homes' tests)


def test_a_browse_session_writes_only_through_its_mount(place: Place, people: tuple[User, User]) -> None:
    """The operator cannot make a change through the command line that would be recorded as the person's own,
    with origin ``human``: write, rm, forget, derive and publish with a browse session are refused (exit 2)."""
    owner, _ = people
    cli = place.scenario.cli
    session_id = str(place.browse(owner)["session_id"])
    before = snapshot(cli.home)
    for args, stdin in ((("write", session_id, NOTE), b"the operator's words\n"),
                        (("write", session_id, "private/notes/new.md", "--valid-until", "7d"), b"x\n"),
                        (("rm", session_id, NOTE), None),
                        (("forget", session_id, NOTE), None),
                        (("derive", session_id, "--from", NOTE, "--to", "private/notes/d.md"), b"y\n"),
                        (("publish", session_id, NOTE, "--to", "agent-shared/x.md", "--yes"), None)):
        result = cli(*args, stdin=stdin)
        assert result.code == 2 and "a browse session writes only through its mount" in result.err, (args, result)
    assert diff_snapshots(before, snapshot(cli.home)) == []
    assert cli("read", session_id, NOTE).out == ALICE_FACT  # reading is still the person's view


def test_closing_the_session_ends_the_mount(place: Place, people: tuple[User, User]) -> None:
    owner, _ = people
    cli = place.scenario.cli
    answer = place.browse(owner)
    pid = answer["pid"]
    assert isinstance(pid, int)
    cli.j("session", "close", str(answer["session_id"]))
    wait_until(lambda: not mounts.server_alive(pid, external.MODULE) or None, timeout=30)
    assert not is_mounted(place.mountpoint) and os.listdir(place.mountpoint) == []
