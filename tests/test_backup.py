"""``scopefs backup`` and ``scopefs restore``: real homes, real SQLite files, a real FUSE mount writing meanwhile.

A backup is taken of a live home while a mounted session keeps saving; the
restored home must pass doctor, verify every artifact, and show every
session exactly what the old home showed. A backup that was tampered with
or lost an artifact is refused whole (exit 4, counts only), and nothing is
left at the new home; loosened permissions and a non-empty destination are
refused before anything is written (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw

from scopefs.writer.steps import Step
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    CHANNEL,
    Cli,
    Scenario,
    artifact_path,
    db_copy,
    run_readme_example,
    snapshot,
    sqlite_str,
)
from tests.mountkit import Mounts, mounts  # noqa: F401
from tests.test_pools import POOL_FACT, pooled  # noqa: F401


def _backup(cli: Cli, dest: Path) -> dict[str, Any]:
    return cli.j("backup", str(dest))


def _restore(cli: Cli, src: Path, new: Path) -> Cli:
    cli.j("restore", str(src), "--home", str(new))
    return Cli(new)


def _tree(cli: Cli, session: str, folder: str = "") -> dict[str, str]:
    """Every note a session's view lists (recursively), with its content; folders as markers."""
    out: dict[str, str] = {}
    listing = cli.j("ls", session, *([folder] if folder else []))["entries"]
    for entry in listing:
        path = f"{folder}/{entry['name']}" if folder else entry["name"]
        if entry["type"] == "folder":
            out[path + "/"] = "folder"
            out.update(_tree(cli, session, path))
        else:
            read = cli("read", session, path)
            assert read.code == 0, (path, read.err)
            out[path] = read.text
    return out


def _view(cli: Cli, session: str) -> dict[str, Any]:
    """What a session sees: its tree with contents, and what searches return."""
    searches = {q: cli.j("search", session, q) for q in ("allergic", "Lisbon offsite", "release train")}
    return {"tree": _tree(cli, session), "search": searches}


def _artifacts(backup: Path) -> list[Path]:
    return sorted(p for p in (backup / "agents").rglob("*") if p.is_file() and "memory-scopes" in p.parts)


def test_backup_layout_is_private_and_manifest_names_every_artifact(scenario: Scenario, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    report = _backup(scenario.cli, dest)
    for path in [dest, *dest.rglob("*")]:
        mode = os.lstat(path).st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    manifest = json.loads((dest / "manifest.json").read_bytes())
    assert manifest["format"] == "scopefs-backup" and manifest["format_version"] == 1
    assert report["artifacts"] == len(manifest["artifacts"]) == len(_artifacts(dest)) == 3
    assert report["manifest_sha256"] and report["cells"] == ["main"]
    for entry in manifest["artifacts"]:
        stored = dest / "agents/main/memory-scopes/v1" / entry["store"] / entry["locator"]
        assert stored.stat().st_size == entry["size"]
    names = {p.name for p in dest.rglob("*")}
    assert not names & {"staging", "quarantine", "writer.lock", "api.key", "mounts"}
    assert not [p for p in dest.rglob("*") if p.name.endswith(("-wal", "-shm", "-journal"))]


def test_restored_home_is_doctor_clean_and_every_session_sees_the_same(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    shared = cli.j("session", "open", "--agent", scenario.agent, "--shared-main")["session_id"]
    sessions = [scenario.alice_session, scenario.bob_session, scenario.group_session, shared]
    before = {s: _view(cli, s) for s in sessions}
    _backup(cli, tmp_path / "backup")
    restored = _restore(cli, tmp_path / "backup", tmp_path / "restored")
    assert os.stat(tmp_path / "restored").st_mode & 0o777 == 0o700
    doctor = restored("--json", "doctor")
    assert doctor.code == 0 and doctor.json()["findings"] == [], doctor.text
    assert {s: _view(restored, s) for s in sessions} == before
    assert before[scenario.alice_session]["tree"]["private/notes/allergy.md"] == ALICE_FACT.decode()
    assert not [p for p in (tmp_path).iterdir() if p.name.startswith(".restored.")]


def _audited(home: Path, operation: str) -> list[tuple[Any, ...]]:
    with db_copy(home / "state.sqlite") as conn:
        return conn.execute("SELECT decision, reason, session_id, revision_id FROM audit WHERE operation = ?",
                            (operation,)).fetchall()


def test_a_backup_and_a_restore_are_each_audited_once(scenario: Scenario, tmp_path: Path) -> None:
    """A backup is a whole copy of every note that a later forget cannot reach: the live home's audit says
    when one was made (and so does the backup's own copy of it); a restored home's audit says where its own
    life began. Ids and codes only."""
    cli = scenario.cli
    assert _audited(cli.home, "backup") == []
    _backup(cli, tmp_path / "backup")
    assert _audited(cli.home, "backup") == [("allow", "allowed", None, None)]
    restored = _restore(cli, tmp_path / "backup", tmp_path / "restored")
    assert _audited(restored.home, "restore") == [("allow", "allowed", None, None)]
    assert _audited(restored.home, "backup") == [("allow", "allowed", None, None)]  # before the snapshot
    assert _audited(cli.home, "restore") == []
    assert cli("backup", str(tmp_path / "backup")).code == 2  # refused (not empty): nothing audited
    assert len(_audited(cli.home, "backup")) == 1


def test_restored_home_takes_new_writes(scenario: Scenario, tmp_path: Path) -> None:
    _backup(scenario.cli, tmp_path / "backup")
    restored = _restore(scenario.cli, tmp_path / "backup", tmp_path / "restored")
    restored.j("write", scenario.alice_session, "private/notes/allergy.md", stdin=b"after the restore\n")
    restored.j("write", scenario.group_session, "channel/new.md", stdin=b"a new note\n")
    assert restored("read", scenario.alice_session, "private/notes/allergy.md").out == b"after the restore\n"
    assert restored("read", scenario.group_session, "channel/new.md").out == b"a new note\n"
    assert scenario.cli("read", scenario.alice_session, "private/notes/allergy.md").out == ALICE_FACT
    assert restored("doctor").code == 0


def test_hmac_key_is_restored_so_a_dm_opens_with_the_same_binding(scenario: Scenario, tmp_path: Path) -> None:
    _backup(scenario.cli, tmp_path / "backup")
    assert (tmp_path / "backup" / "hmac.key").read_bytes() == (scenario.cli.home / "hmac.key").read_bytes()
    restored = _restore(scenario.cli, tmp_path / "backup", tmp_path / "restored")
    opened = restored.j("session", "open", "--agent", scenario.agent, "--dm", "--channel", CHANNEL,
                        "--account", ACCOUNT, "--sender", ALICE_SENDER)
    assert opened["subject"] == "user" and opened["subject_principal_id"] == scenario.alice
    assert restored("read", opened["session_id"], "private/notes/allergy.md").out == ALICE_FACT


def _refused_restore(cli: Cli, backup: Path, new: Path, code: int) -> str:
    result = cli("restore", str(backup), "--home", str(new))
    assert result.code == code, (result.code, result.err)
    assert not new.exists()
    assert not [p for p in new.parent.iterdir() if p.name.startswith(f".{new.name}.")]
    return result.err


def test_tampered_artifact_refuses_the_restore_naming_only_counts(scenario: Scenario, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    _backup(scenario.cli, backup)
    victim = backup / artifact_path(scenario.cli.home, scenario.alice, "notes/allergy.md").relative_to(
        scenario.cli.home)
    data = bytearray(victim.read_bytes())
    data[0] ^= 0x01
    victim.write_bytes(bytes(data))
    err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
    assert "1 artifact does not verify, 0 are missing" in err
    assert victim.name not in err and victim.parent.name not in err and "allerg" not in err and "hazel" not in err


def test_missing_artifacts_refuse_the_restore(scenario: Scenario, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    _backup(scenario.cli, backup)
    artifacts = _artifacts(backup)
    artifacts[0].unlink()
    err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
    assert "0 artifacts do not verify, 1 is missing" in err
    data = bytearray(artifacts[1].read_bytes())
    data[-1] ^= 0x20
    artifacts[1].write_bytes(bytes(data))
    artifacts[2].unlink()
    err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
    assert "1 artifact does not verify, 2 are missing" in err
    assert artifacts[0].name not in err and artifacts[1].name not in err


def test_tampered_catalog_refuses_the_restore(scenario: Scenario, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    _backup(scenario.cli, backup)
    catalog = backup / "agents" / "main" / "catalog.sqlite"
    conn = apsw.Connection(str(catalog))
    conn.execute("UPDATE policy_epoch SET epoch = epoch + 1")  # a valid database, not the one the manifest names
    conn.close()
    err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
    assert "do not verify" in err


def test_loosened_permissions_are_refused(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    result = cli("backup", str(loose))
    assert result.code == 2 and "accessible to others" in result.err
    assert list(loose.iterdir()) == []
    backup = tmp_path / "backup"
    _backup(cli, backup)
    os.chmod(backup, 0o750)
    assert "accessible to others" in _refused_restore(cli, backup, tmp_path / "restored", 2)
    os.chmod(backup, 0o700)
    os.chmod(_artifacts(backup)[0], 0o644)
    assert "accessible to others" in _refused_restore(cli, backup, tmp_path / "restored", 2)
    os.chmod(_artifacts(backup)[0], 0o600)
    os.chmod(backup / "hmac.key", 0o640)
    _refused_restore(cli, backup, tmp_path / "restored", 2)
    os.chmod(backup / "hmac.key", 0o600)
    _restore(cli, backup, tmp_path / "restored")  # the same backup, tightened again, restores


def test_non_empty_destinations_are_refused_and_nothing_changes(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    (dest / "keep.txt").write_bytes(b"mine\n")
    home_before = snapshot(cli.home)
    dest_before = snapshot(dest)
    result = cli("backup", str(dest))
    assert result.code == 2 and "not empty" in result.err
    assert snapshot(dest) == dest_before and snapshot(cli.home) == home_before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest.")] == []
    backup = tmp_path / "backup"
    _backup(cli, backup)
    home_before = snapshot(cli.home)  # with the backup's own audit row
    result = cli("restore", str(backup), "--home", str(dest))
    assert result.code == 2 and "not empty" in result.err
    assert snapshot(dest) == dest_before
    result = cli("restore", str(backup), "--home", str(cli.home))  # the live home is never a target
    assert result.code == 2 and snapshot(cli.home) == home_before
    result = cli("--json", "backup", str(tmp_path / "no" / "such" / "place"))
    assert result.code == 2 and json.loads(result.out)["exit_code"] == 2


def test_empty_private_destination_is_used(scenario: Scenario, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir(mode=0o700)
    _backup(scenario.cli, dest)
    new = tmp_path / "new"
    new.mkdir(mode=0o700)
    restored = _restore(scenario.cli, dest, new)
    assert restored("read", scenario.bob_session, "private/notes/allergy.md").code == 0


def test_live_backup_while_a_mount_keeps_writing(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                 tmp_path: Path) -> None:
    cli = scenario.cli
    view = mounts.mount(scenario.group_session)
    stop = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def keep_writing() -> None:
        i = 0
        try:
            while not stop.is_set():
                for name in (f"channel/live-{i % 4}.md", f"channel/new-{i}.md"):
                    with open(view / name, "wb") as fh:
                        fh.write(b"live write %d\n" % i)
                written.append(i)
                i += 1
                stop.wait(0.05)  # steady saves through the whole backup, not thousands of notes to check after
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        reports = []
        for n in range(3):
            while len(written) < 3 * (n + 1):  # the writer is busy before and during each backup
                assert not errors, errors
                threading.Event().wait(0.01)
            before = len(written)
            reports.append(_backup(cli, tmp_path / f"backup{n}"))
            assert not errors, errors  # a writer that failed wrote nothing meanwhile: its error says why
            assert len(written) > before, "no write went through the mount while the backup ran"
    finally:
        stop.set()
        writer.join(timeout=60)
    assert not errors, errors
    for n, report in enumerate(reports):
        restored = _restore(cli, tmp_path / f"backup{n}", tmp_path / f"restored{n}")
        doctor = restored("--json", "doctor")
        assert doctor.code == 0 and doctor.json()["findings"] == [], doctor.text
        tree = _tree(restored, scenario.group_session)
        notes = {p: t for p, t in tree.items() if p.startswith("channel/new-")}
        assert notes, tree
        for path, text in notes.items():
            assert text == f"live write {path.removeprefix('channel/new-').removesuffix('.md')}\n"
        assert all(t.startswith("live write ") for p, t in tree.items() if p.startswith("channel/live-"))
        # every artifact the restored catalog keeps was verified; the restored home holds exactly those
        assert report["artifacts"] == len(_artifacts(tmp_path / f"backup{n}"))


def test_a_forgotten_note_is_not_in_a_later_backup(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    canary = b"Forget me: the vault code is 5517 (canary F0rg)\n"
    cli.j("write", scenario.alice_session, "private/notes/vault.md", stdin=canary)
    cli.j("forget", scenario.alice_session, "private/notes/vault.md")
    report = _backup(cli, tmp_path / "backup")
    assert report["artifacts"] == 3
    for path in (tmp_path / "backup").rglob("*"):
        if path.is_file():
            assert b"canary F0rg" not in path.read_bytes() and b"vault code" not in path.read_bytes(), path
    restored = _restore(cli, tmp_path / "backup", tmp_path / "restored")
    assert restored("read", scenario.alice_session, "private/notes/vault.md").code != 0
    assert restored.j("search", scenario.alice_session, "vault code")["results"] == []


def test_targets_inside_the_home_or_the_backup_are_refused(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    before = snapshot(cli.home)
    result = cli("backup", str(cli.home / "agents" / "bk"))
    assert result.code == 2 and "inside" in result.err
    assert snapshot(cli.home) == before
    backup = tmp_path / "backup"
    _backup(cli, backup)
    _refused_restore(cli, backup, backup / "agents" / "new", 2)


def test_readme_example_works(tmp_path: Path) -> None:
    """The copy-paste example of the README's "Backups" section, run as it is printed."""
    proc = run_readme_example("## Backups", tmp_path, timeout=120)
    assert proc.stdout.decode().endswith("ok: the artifact area matches the catalog\nkept across a restore\n")


REPO = Path(__file__).resolve().parents[1]
# The real command line in a child that waits at one checkpoint (the first time it passes it) until told to go on.
_PARKED = r"""
import os, sys
os.umask(0o077)
from scopefs.cli.main import main
from scopefs.writer import steps

target = sys.argv[1]
seen = []

def park(step):
    if step.value == target and not seen:
        seen.append(step)
        os.write(2, b"parked\n")
        os.read(int(os.environ["PARK_FD"]), 1)

steps.set_hook(park)
sys.exit(main(sys.argv[2:]))
"""


@contextlib.contextmanager
def _parked(cli: Cli, step: Step, *argv: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``scopefs ARGV`` parked at ``step``; write a byte to the returned fd to let it go on."""
    go_read, go_write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", _PARKED, step.value, *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, pass_fds=(go_read,),
                            env={**os.environ, "PYTHONPATH": str(REPO), "SCOPEFS_HOME": str(cli.home),
                                 "PARK_FD": str(go_read)})
    os.close(go_read)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        while line.startswith(b"scopefs: ") and line != b"parked\n":  # progress lines come first
            line = proc.stderr.readline()
        if line != b"parked\n":
            proc.kill()
            raise AssertionError(f"did not park at {step.value}: {line!r} {proc.communicate()[1][-2000:]!r}")
        yield proc, go_write
    finally:
        os.close(go_write)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _backup_racing_a_forget(cli: Cli, step: Step, session: str, path: str, text: bytes, canary: bytes,
                            dest: Path) -> dict[str, Any]:
    """Write ``text`` at ``path``, park a backup at ``step``, forget the note, let the backup finish: its report.
    The backup must succeed and no file of it may hold ``canary``."""
    cli.j("write", session, path, stdin=text)
    with _parked(cli, step, "--json", "backup", str(dest)) as (proc, go):
        cli.j("forget", session, path)
        os.write(go, b"x")
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    for kept in dest.rglob("*"):
        if kept.is_file():
            assert canary not in kept.read_bytes(), kept
    report: dict[str, Any] = json.loads(out)
    return report


def test_a_forget_between_the_snapshot_and_the_copy_is_not_undone(scenario: Scenario, tmp_path: Path) -> None:
    """The catalog snapshot still names the note; the forget unlinks its artifact before the copy: the cell is
    snapshotted again, and the backup holds neither the forgotten note nor its text."""
    cli = scenario.cli
    dest = tmp_path / "backup"
    report = _backup_racing_a_forget(cli, Step.BACKUP_SNAPSHOT, scenario.bob_session, "private/notes/locker.md",
                                     b"Forget me later: the locker code (canary L0ck)\n", b"canary L0ck", dest)
    assert report["resnapshots"] == 1 and report["artifacts"] == 3
    restored = _restore(cli, dest, tmp_path / "restored")
    assert restored("read", scenario.bob_session, "private/notes/locker.md").code != 0
    assert restored("read", scenario.bob_session, "private/notes/allergy.md").out == BOB_FACT


def test_a_forget_after_a_cell_was_copied_is_not_undone(scenario: Scenario, tmp_path: Path) -> None:
    """The cell is snapshotted and copied whole; the forget is acknowledged before the state database is taken:
    the backup's last looks see the cell's forgets moved on and take it again, so the note is not restored."""
    cli = scenario.cli
    dest = tmp_path / "backup"
    report = _backup_racing_a_forget(cli, Step.BACKUP_CELL_DONE, scenario.alice_session, "private/notes/b.md",
                                     b"Forget me after the copy: the gate code (canary G4te)\n", b"canary G4te",
                                     dest)
    assert report["resnapshots"] >= 1 and report["artifacts"] == 3
    restored = _restore(cli, dest, tmp_path / "restored")
    assert restored("read", scenario.alice_session, "private/notes/b.md").code != 0
    assert restored.j("search", scenario.alice_session, "gate code")["results"] == []
    assert restored("read", scenario.alice_session, "private/notes/allergy.md").out == ALICE_FACT


def test_a_write_in_flight_at_the_snapshot_is_rolled_back_on_restore(scenario: Scenario, tmp_path: Path) -> None:
    """A writer parked after its pending revision and rename: the backup runs beside it (it takes no lock), and the
    restored home has the note as it was acknowledged, doctor-clean."""
    cli = scenario.cli
    with _parked(cli, Step.RENAMED, "write", scenario.alice_session, "private/notes/allergy.md") as (proc, _go):
        _backup(cli, tmp_path / "backup")
        proc.kill()
    snapshot_catalog = apsw.Connection(str(tmp_path / "backup/agents/main/catalog.sqlite"),
                                       flags=apsw.SQLITE_OPEN_READONLY)
    try:  # the backup did catch the write between its two commits
        assert snapshot_catalog.execute("SELECT count(*) FROM write_intents WHERE state = 'pending'").fetchall() == [
            (1,)]
    finally:
        snapshot_catalog.close()
    restored = _restore(cli, tmp_path / "backup", tmp_path / "restored")
    assert restored("--json", "doctor").json()["findings"] == []
    assert restored("read", scenario.alice_session, "private/notes/allergy.md").out == ALICE_FACT
    restored.j("write", scenario.alice_session, "private/notes/allergy.md", stdin=b"next\n")
    assert restored("read", scenario.alice_session, "private/notes/allergy.md").out == b"next\n"


def test_shared_pools_are_backed_up_and_restored(scenario: Scenario, pooled: dict[str, str],  # noqa: F811
                                                 tmp_path: Path) -> None:
    cli = scenario.cli
    chosen = {name: pooled[name] for name in ("curator", "main", "dev", "lurker")}  # writer, readers, an outsider
    before = {name: _view(cli, session) for name, session in chosen.items()}
    report = _backup(cli, tmp_path / "backup")
    assert report["cells"] == ["dev", "lurker", "main", "sandbox", "social", "pool:team"]
    restored = _restore(cli, tmp_path / "backup", tmp_path / "restored")
    assert restored("doctor").code == 0
    assert {name: _view(restored, session) for name, session in chosen.items()} == before
    assert before["curator"]["tree"]["pools/team/release.md"] == POOL_FACT.decode()


def test_a_home_with_a_tampered_artifact_is_not_backed_up(scenario: Scenario, tmp_path: Path) -> None:
    """A backup that could not be restored is never written: exit 4, counts only, nothing at DEST."""
    cli = scenario.cli
    victim = artifact_path(cli.home, scenario.bob, "notes/allergy.md")
    victim.write_bytes(victim.read_bytes().replace(b"peanuts", b"walnuts"))
    result = cli("--json", "backup", str(tmp_path / "backup"))
    assert result.code == 4 and json.loads(result.out)["exit_code"] == 4
    assert "1 committed artifact(s) of the home do not verify" in result.err
    assert victim.name not in result.err and "nuts" not in result.err
    assert not (tmp_path / "backup").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".backup.")]


def test_a_manifest_that_is_not_ours_or_is_damaged_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    backup = tmp_path / "backup"
    _backup(cli, backup)
    manifest_path = backup / "manifest.json"
    original = manifest_path.read_bytes()
    manifest = json.loads(original)
    manifest_path.write_text(json.dumps({**manifest, "format_version": 99}))
    assert "newer than this scopefs" in _refused_restore(cli, backup, tmp_path / "restored", 2)
    manifest_path.write_text(json.dumps({**manifest, "cells": ["../../etc"]}))
    assert "damaged" in _refused_restore(cli, backup, tmp_path / "restored", 4)
    manifest_path.write_bytes(original[: len(original) // 2])
    assert "damaged" in _refused_restore(cli, backup, tmp_path / "restored", 4)
    manifest_path.unlink()
    assert "not a scopefs backup" in _refused_restore(cli, backup, tmp_path / "restored", 2)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    assert "not a scopefs backup" in _refused_restore(cli, empty, tmp_path / "restored", 2)
    assert "does not exist" in _refused_restore(cli, tmp_path / "nowhere", tmp_path / "restored", 2)


def _rewrite_manifest_hash(backup: Path, rel: str) -> None:
    """What someone who edits a backup's database does next: make the manifest name the new bytes."""
    import hashlib
    manifest_path = backup / "manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    data = (backup / rel).read_bytes()
    for entry in manifest["databases"]:
        if entry["path"] == rel:
            entry.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    manifest_path.write_text(json.dumps(manifest, sort_keys=True, indent=1) + "\n")


def _rebind_bob_to_alice(scenario: Scenario, state: Path, *, restore_trigger: bool) -> None:
    conn = apsw.Connection(str(state))
    try:
        trigger = sqlite_str(conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'identity_bindings_immutable'"
                                          ).fetchall()[0][0])
        conn.execute("DROP TRIGGER identity_bindings_immutable")
        conn.execute("UPDATE identity_bindings SET principal_id = ? WHERE principal_id = ?",
                     (scenario.alice, scenario.bob))
        if restore_trigger:
            conn.execute(trigger)
    finally:
        conn.close()


def test_a_database_whose_schema_was_changed_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    """A trigger dropped (and a binding edited under it), the manifest rewritten to match: exit 4, nothing made."""
    backup = tmp_path / "backup"
    _backup(scenario.cli, backup)
    _rebind_bob_to_alice(scenario, backup / "state.sqlite", restore_trigger=False)
    _rewrite_manifest_hash(backup, "state.sqlite")
    err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
    assert "does not have the schema of its version" in err


def test_a_planted_object_named_like_sqlites_own_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    """A trigger named ``sqlitex`` (``_`` is a wildcard to LIKE, so a ``sqlite_%`` filter passed it) and a view
    and table named so too, each planted in a backup whose manifest was rewritten: exit 4, nothing at NEW."""
    backup = tmp_path / "backup"
    _backup(scenario.cli, backup)
    for planted in ("CREATE TRIGGER sqlitex AFTER INSERT ON identity_bindings BEGIN SELECT RAISE(ABORT, 'x'); END",
                    "CREATE VIEW sqlitev AS SELECT 1", "CREATE TABLE sqlitet (x)"):
        state = backup / "state.sqlite"
        pristine = state.read_bytes()
        conn = apsw.Connection(str(state))
        conn.execute(planted)
        conn.close()
        _rewrite_manifest_hash(backup, "state.sqlite")
        err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
        assert "does not have the schema of its version" in err
        state.write_bytes(pristine)
        _rewrite_manifest_hash(backup, "state.sqlite")
    assert _restore(scenario.cli, backup, tmp_path / "restored").home.exists()  # the untouched backup still restores


def test_expect_manifest_refuses_a_rewritten_backup_before_anything_is_made(scenario: Scenario,
                                                                            tmp_path: Path) -> None:
    """A binding edited with its trigger put back and the manifest rewritten is whole and consistent: only the
    digest kept apart from the backup tells it is not the one that was made."""
    cli = scenario.cli
    backup = tmp_path / "backup"
    digest = _backup(cli, backup)["manifest_sha256"]
    assert _restore(cli, backup, tmp_path / "first").home.exists()  # the right digest: restored
    result = cli("restore", str(backup), "--home", str(tmp_path / "upper"), "--expect-manifest", digest.upper())
    assert result.code == 0, result.err
    _rebind_bob_to_alice(scenario, backup / "state.sqlite", restore_trigger=True)
    _rewrite_manifest_hash(backup, "state.sqlite")
    result = cli("restore", str(backup), "--home", str(tmp_path / "restored"), "--expect-manifest", digest)
    assert result.code == 4 and "not the one expected" in result.err, result.err
    assert not (tmp_path / "restored").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".restored.")]
    result = cli("restore", str(backup), "--home", str(tmp_path / "restored"), "--expect-manifest", "abc")
    assert result.code == 2 and not (tmp_path / "restored").exists()


def test_a_malformed_locator_in_a_backup_is_an_integrity_failure(scenario: Scenario, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    _backup(scenario.cli, backup)
    conn = apsw.Connection(str(backup / "agents/main/catalog.sqlite"))
    try:
        triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger'"
                                " AND tbl_name = 'revisions'").fetchall()
        for name, _sql in triggers:
            conn.execute(f'DROP TRIGGER "{name}"')
        conn.execute("UPDATE revisions SET locator = '../../x' WHERE rowid = (SELECT min(rowid) FROM revisions"
                     " WHERE state = 'active')")
        for _name, sql in triggers:
            conn.execute(sqlite_str(sql))
    finally:
        conn.close()
    _rewrite_manifest_hash(backup, "agents/main/catalog.sqlite")
    err = _refused_restore(scenario.cli, backup, tmp_path / "restored", 4)
    assert "malformed" in err


def _work_folders(target: Path, purpose: str) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.{purpose}-*"))


def test_a_killed_backups_work_folder_is_removed_by_the_next_backup(scenario: Scenario, tmp_path: Path) -> None:
    """SIGKILL leaves the 0700 work folder beside DEST, holding a copy of the memory; the next backup to the same
    DEST removes it (no live run holds its lock) and says so, and leaves only its own result."""
    cli = scenario.cli
    dest = tmp_path / "backup"
    with _parked(cli, Step.BACKUP_CELL_DONE, "backup", str(dest)) as (proc, _go):
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    [left] = _work_folders(dest, "backup")
    assert any(p.is_file() for p in left.rglob("*")), "the killed run copied nothing: the test shows nothing"
    assert not dest.exists()
    done = cli("backup", str(dest))
    assert done.code == 0, done.err
    assert "removed 1 unfinished backup folder(s)" in done.err
    assert _work_folders(dest, "backup") == [] and (dest / "manifest.json").is_file()
    _restore(cli, dest, tmp_path / "restored")  # the result is whole


def test_a_live_backups_work_folder_is_left_alone(scenario: Scenario, tmp_path: Path) -> None:
    """A backup parked mid-way holds its folder's lock: another backup to the same DEST leaves that folder be and
    finishes; the parked one, let go, finds DEST taken, fails cleanly and removes its own folder."""
    cli = scenario.cli
    dest = tmp_path / "backup"
    with _parked(cli, Step.BACKUP_SNAPSHOT, "backup", str(dest)) as (proc, go):
        [live] = _work_folders(dest, "backup")
        done = cli("backup", str(dest))
        assert done.code == 0, done.err
        assert "unfinished" not in done.err and live.is_dir()
        os.write(go, b"x")
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err  # DEST was filled meanwhile: nothing of the parked run is put there
    assert _work_folders(dest, "backup") == []
    _restore(cli, dest, tmp_path / "restored")


def test_leftovers_of_a_killed_restore_are_removed_and_nothing_else(scenario: Scenario, tmp_path: Path) -> None:
    """What a killed restore leaves beside NEW (an unlocked work folder, or an empty one it was making long ago)
    goes at the next restore to NEW; a link or a file named like one, a folder of another target, a folder whose
    name only starts like one, and a folder being made now (``.new``) stay."""
    from scopefs.catalog.ids import random_token

    cli = scenario.cli
    dest, new = tmp_path / "backup", tmp_path / "restored"
    _backup(cli, dest)
    leftover = tmp_path / f".restored.restore-{random_token()}"
    (leftover / "agents").mkdir(parents=True, mode=0o700)
    (leftover / "state.sqlite").write_bytes(b"what a killed restore copied")
    stale_new = tmp_path / f".restored.restore-{random_token()}.new"
    stale_new.mkdir(mode=0o700)
    os.utime(stale_new, (1, 1))  # made long ago
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not ours to remove\n")
    link = tmp_path / f".restored.restore-{random_token()}"
    link.symlink_to(elsewhere)
    plain = tmp_path / f".restored.restore-{random_token()}"
    plain.write_text("a file, not a work folder\n")
    making = tmp_path / f".restored.restore-{random_token()}.new"
    making.mkdir(mode=0o700)
    other = tmp_path / f".other.restore-{random_token()}"
    other.mkdir(mode=0o700)
    lookalike = tmp_path / ".restored.restore-old-manual"
    lookalike.mkdir(mode=0o700)
    (lookalike / "mine.txt").write_text("a folder of the user's own\n")
    longer = tmp_path / f".restored.restore-x.restore-{random_token()}"  # a leftover of NEW "restored.restore-x"
    longer.mkdir(mode=0o700)
    done = cli("restore", str(dest), "--home", str(new))
    assert done.code == 0, done.err
    assert "removed 1 unfinished restore folder(s)" in done.err
    assert not leftover.exists() and not stale_new.exists()
    assert link.is_symlink() and (elsewhere / "keep.txt").is_file() and plain.is_file()
    assert making.is_dir() and other.is_dir() and (lookalike / "mine.txt").is_file() and longer.is_dir()
    assert Cli(new)("read", scenario.alice_session, "private/notes/allergy.md").out == ALICE_FACT
