"""``scopefs stats``: numbers without ids or content, and a Prometheus file written atomically.

Real homes, real reads (allowed, denied, and one of a tampered artifact),
real searches and a real FUSE mount. The output is checked for every id
and every note text the home holds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
from pathlib import Path
from typing import Any

import apsw
import pytest

from scopefs.sandbox.mounts import server_alive
from tests.conftest import (
    ACCOUNT,
    ALICE_SENDER,
    BOB_FACT,
    BOB_SENDER,
    CHANNEL,
    GROUP_CONVERSATION,
    MIKE1_SENDER,
    MIKE2_SENDER,
    Scenario,
    artifact_path,
    diff_snapshots,
    snapshot,
)
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

NOTES = {"private/notes/allergy.md", "channel/offsite.md"}


def _activity(s: Scenario) -> None:
    s.cli("read", s.alice_session, "private/notes/allergy.md", check=True)
    s.cli("read", s.group_session, "channel/offsite.md", check=True)
    assert s.cli("read", s.alice_session, "channel/offsite.md").code == 3
    assert s.cli("read", s.group_session, "private/notes/allergy.md").code == 3
    s.cli.j("write", s.alice_session, "private/notes/old.md", "--valid-until", "2020-01-01",
            stdin=b"Alice once had a zebra named Quill\n")
    s.cli("search", s.alice_session, "zebra Quill", check=True)  # the expired note: admitted, then dropped
    s.cli("search", s.alice_session, "allergic", check=True)
    tampered = bytearray(BOB_FACT)
    tampered[0] ^= 0x20
    artifact_path(s.cli.home, s.bob, "notes/allergy.md").write_bytes(bytes(tampered))
    assert s.cli("read", s.bob_session, "private/notes/allergy.md").code == 4


def test_stats_counts_decisions_integrity_drops_latency_and_backlog(scenario: Scenario) -> None:
    s = scenario
    _activity(s)
    before = snapshot(s.cli.home)
    got = s.cli.j("stats")
    decisions = {(d["op"], d["decision"], d["reason"]): d["count"] for d in got["decisions"]}
    assert decisions[("read", "allow", "allowed")] == 2
    assert decisions[("read", "deny", "outside-view")] == 2
    assert decisions[("read", "error", "revision-stale")] == 1
    assert decisions[("append", "allow", "allowed")] == 4
    assert got["hash_mismatches"] == 1
    assert got["postfilter_drops"] >= 1
    assert got["search"]["count"] == 2 and got["write"]["count"] == 4
    for kind in ("search", "write"):
        lat = got[kind]["latency_seconds"]
        assert set(lat) == {"p50", "p95", "p99"} and 0 < lat["p50"] <= lat["p95"] <= lat["p99"] < 600
    assert got["repair_backlog"] == {"pending-intents": 0, "unsynced-revisions": 0, "undrained-audit": 0,
                                     "unindexed-revisions": 0, "quarantined-entries": 0, "postbox-pending": 0}
    assert got["mounts_up"] == {"mount": 0, "sandbox": 0, "run": 0}
    text = s.cli("stats")
    assert text.code == 0 and b"hash mismatches: 1\n" in text.out
    assert snapshot(s.cli.home) == before  # stats reads; it writes nothing


def test_the_backlog_is_what_doctor_would_report(scenario: Scenario) -> None:
    s = scenario
    scopes = s.cli.home / "agents" / s.agent / "memory-scopes" / "v1"
    (scopes / "stray-file").write_bytes(b"not anyone's note\n")
    assert s.cli.j("stats")["repair_backlog"]["quarantined-entries"] == 0
    assert s.cli("doctor", "--fix").code == 0
    assert s.cli.j("stats")["repair_backlog"]["quarantined-entries"] == 1


def _ids(home: Path) -> set[str]:
    """Every id of a person, session, conversation, binding, membership, store, resource or revision."""
    found: set[str] = set()
    for db in [home / "state.sqlite", *home.glob("agents/*/catalog.sqlite")]:
        conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            for table, column in (("principals", "principal_id"), ("identity_bindings", "binding_id"),
                                  ("conversations", "conversation_id"), ("memberships", "membership_id"),
                                  ("session_index", "session_id"), ("sessions", "session_id"),
                                  ("stores", "store_id"), ("resources", "resource_id"),
                                  ("revisions", "revision_id"), ("storage_roots", "path_key")):
                try:
                    found |= {str(r[0]) for r in conn.execute(f"SELECT {column} FROM {table}")}
                except apsw.SQLError:
                    continue
        finally:
            conn.close()
    return found


def test_no_id_path_or_note_text_in_any_output(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    _activity(s)
    prom = tmp_path / "scopefs.prom"
    outputs = [s.cli("stats").out, s.cli("--json", "stats").out,
               s.cli("stats", "--prometheus", str(prom)).out]
    outputs.append(prom.read_bytes())
    ids = _ids(s.cli.home)
    assert len(ids) > 10
    texts = [ALICE_SENDER, BOB_SENDER, MIKE1_SENDER, MIKE2_SENDER, ACCOUNT, GROUP_CONVERSATION, "Alice", "Bob",
             "Mike", "hazelnuts", "peanuts", "Lisbon", "zebra", "Quill", "canary", *NOTES, "allergy", "offsite"]
    for out in outputs:
        for needle in [*ids, *texts]:
            assert needle.encode() not in out, needle
    assert CHANNEL.encode() not in prom.read_bytes()


_SAMPLE = re.compile(r'(scopefs_[a-z_]+)(?:\{((?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\})? (\S+)')
_LABEL = re.compile(r'([a-z_]+)="((?:[^"\\]|\\.)*)"')
VOCABULARY = {"op", "decision", "reason", "kind", "quantile"}


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """A strict reader of the text format: every sample belongs to a family with HELP and TYPE first."""
    families: dict[str, dict[str, Any]] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, helptext = line[7:].split(" ", 1)
            assert name not in families and helptext
            families[name] = {"help": helptext, "samples": []}
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert name in families and "type" not in families[name]
            assert kind in ("gauge", "counter", "summary")
            families[name]["type"] = kind
        else:
            found = _SAMPLE.fullmatch(line)
            assert found is not None, line
            name = found[1]
            family = name[: -len("_count")] if name.endswith("_count") and name not in families else name
            assert family in families and "type" in families[family], line
            labels = dict(_LABEL.findall(found[2] or ""))
            assert set(labels) <= VOCABULARY, labels
            value = float(found[3])  # "NaN" parses too
            families[family]["samples"].append((name, labels, value))
    return families


def test_the_prometheus_file_parses_and_is_replaced_atomically(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    _activity(s)
    prom = tmp_path / "metrics" / "scopefs.prom"
    prom.parent.mkdir()
    prom.write_text("# HELP scopefs_hash_mismatches an older file this command wrote\n")
    first_inode = prom.stat().st_ino
    done = s.cli.j("stats", "--prometheus", str(prom))
    families = parse_prometheus(prom.read_text())
    assert prom.stat().st_ino != first_inode  # replaced by a rename, never rewritten in place
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    assert sorted(os.listdir(prom.parent)) == ["scopefs.prom"]  # no temporary file left
    assert families["scopefs_hash_mismatches"]["samples"] == [("scopefs_hash_mismatches", {}, 1.0)]
    assert families["scopefs_search_latency_seconds"]["type"] == "summary"
    quantiles = {x[1].get("quantile") for x in families["scopefs_search_latency_seconds"]["samples"]}
    assert quantiles == {"0.5", "0.95", "0.99", None}
    decisions = families["scopefs_audit_decisions"]["samples"]
    assert ("scopefs_audit_decisions", {"op": "read", "decision": "deny", "reason": "outside-view"}, 2.0) in decisions
    by_kind = {x[1]["kind"]: x[2] for x in families["scopefs_repair_backlog"]["samples"]}
    assert by_kind == dict.fromkeys(done["repair_backlog"], 0.0)
    assert {x[1]["kind"] for x in families["scopefs_mounts_up"]["samples"]} == {"mount", "sandbox", "run"}
    second_inode = prom.stat().st_ino
    s.cli.j("stats", "--prometheus", str(prom))
    assert prom.stat().st_ino != second_inode and parse_prometheus(prom.read_text())
    assert sorted(os.listdir(prom.parent)) == ["scopefs.prom"]


def test_a_bad_prometheus_target_is_bad_input_and_changes_nothing(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep me\n")
    link = tmp_path / "link.prom"
    link.symlink_to(elsewhere)
    folder = tmp_path / "afolder"
    folder.mkdir()
    for target in (tmp_path / "missing" / "x.prom", link, folder):
        bad = s.cli("stats", "--prometheus", str(target))
        assert bad.code == 2 and bad.out == b"", target
    assert elsewhere.read_text() == "keep me\n" and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["afolder", "elsewhere", "home", "link.prom"]


def test_stats_never_replaces_a_file_of_the_home_or_one_it_did_not_write(scenario: Scenario, tmp_path: Path) -> None:
    """A rename over any plain file destroys it: the home's own key and database, or an unrelated file, are
    refused (exit 2, nothing changed); an empty file or an earlier Prometheus file is replaced, its mode kept."""
    s = scenario
    home = s.cli.home
    before = snapshot(home)
    modes = {name: stat.S_IMODE((home / name).stat().st_mode) for name in ("hmac.key", "state.sqlite")}
    via_link = tmp_path / "to-home"
    via_link.symlink_to(home)
    for target in (home / "hmac.key", home / "state.sqlite", via_link / "hmac.key", home / "new.prom",
                   home / "agents" / s.agent / "catalog.sqlite"):
        bad = s.cli("stats", "--prometheus", str(target))
        assert bad.code == 2 and bad.out == b"" and "inside the scopefs home" in bad.err, target
    assert diff_snapshots(before, snapshot(home)) == []
    assert {name: stat.S_IMODE((home / name).stat().st_mode) for name in modes} == modes
    assert not (home / "new.prom").exists()
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("keep me\n")
    bad = s.cli("stats", "--prometheus", str(unrelated))
    assert bad.code == 2 and bad.out == b"" and unrelated.read_text() == "keep me\n"
    previous = tmp_path / "scopefs.prom"
    s.cli("stats", "--prometheus", str(previous), check=True)
    assert stat.S_IMODE(previous.stat().st_mode) == 0o644  # a new file
    previous.chmod(0o640)
    s.cli("stats", "--prometheus", str(previous), check=True)
    assert stat.S_IMODE(previous.stat().st_mode) == 0o640 and parse_prometheus(previous.read_text())
    empty = tmp_path / "empty.prom"
    empty.touch()
    s.cli("stats", "--prometheus", str(empty), check=True)
    assert parse_prometheus(empty.read_text())


def test_mounts_up_counts_live_servers_and_not_stale_records(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    s = scenario
    where = mounts.mount(s.alice_session)
    assert s.cli.j("stats")["mounts_up"] == {"mount": 1, "sandbox": 0, "run": 0}
    records = [p for p in (s.cli.home / "mounts").iterdir() if "." not in p.name]
    assert len(records) == 1
    pid = json.loads(records[0].read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not server_alive(pid))
    assert records[0].exists()  # the record stays behind; it is not trusted
    assert s.cli.j("stats")["mounts_up"] == {"mount": 0, "sandbox": 0, "run": 0}
    mounts.umount(where)  # clears the stale mount the killed server left


def test_a_stopped_mount_server_is_not_up_and_never_hangs_stats(scenario: Scenario,
                                                                 mounts: Mounts) -> None:  # noqa: F811
    """A SIGSTOPped server never answers statvfs; the census gives up after its deadline and counts it down."""
    import time

    s = scenario
    where = mounts.mount(s.alice_session)
    records = [p for p in (s.cli.home / "mounts").iterdir() if "." not in p.name]
    pid = json.loads(records[0].read_text())["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = s.cli("--json", "stats", timeout=30)
        assert done.code == 0 and json.loads(done.out)["mounts_up"] == {"mount": 0, "sandbox": 0, "run": 0}
        assert time.monotonic() - started < 20
    finally:
        os.kill(pid, signal.SIGCONT)
    assert s.cli.j("stats")["mounts_up"] == {"mount": 1, "sandbox": 0, "run": 0}  # answering again once resumed
    mounts.umount(where)


def test_a_kept_sandbox_mount_counts_while_it_is_up(scenario: Scenario) -> None:
    s = scenario
    s.cli("session", "up", s.alice_session, check=True)
    try:
        assert s.cli.j("stats")["mounts_up"] == {"mount": 0, "sandbox": 1, "run": 0}
    finally:
        s.cli("session", "down", s.alice_session, check=True)
    assert s.cli.j("stats")["mounts_up"] == {"mount": 0, "sandbox": 0, "run": 0}


def test_a_runs_own_mount_counts_while_its_command_runs(scenario: Scenario) -> None:
    """A ``scopefs run`` without a kept mount starts one for its command: counted as a run while the command
    waits, gone from the count and the registry after; a killed launcher's record is not counted, and the
    next run removes it."""
    import subprocess
    import sys

    s = scenario
    env = {**os.environ, "SCOPEFS_HOME": str(s.cli.home)}
    scopefs = str(Path(sys.executable).with_name("scopefs"))

    def started(*command: str) -> subprocess.Popen[bytes]:
        launcher = subprocess.Popen([scopefs, "run", s.alice_session, "--", *command], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert launcher.stdout is not None
        assert launcher.stdout.readline() == b"started\n", launcher.communicate(timeout=60)
        return launcher

    def run_records() -> list[str]:
        return sorted(p.name for p in (s.cli.home / "mounts").iterdir() if p.name.startswith("run-"))

    launcher = started("sh", "-c", "echo started; read line")
    try:
        assert s.cli.j("stats")["mounts_up"] == {"mount": 0, "sandbox": 0, "run": 1}
        assert len(run_records()) == 1
        launcher.communicate(b"go\n", timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0
    assert s.cli.j("stats")["mounts_up"] == {"mount": 0, "sandbox": 0, "run": 0} and run_records() == []

    killed = started("sh", "-c", "echo started; sleep 300")
    [left] = run_records()
    killed.kill()  # SIGKILL: no clean-up of its own; its server, tied to it, goes too
    killed.wait()
    pid = json.loads((s.cli.home / "mounts" / left).read_text())["pid"]
    wait_until(lambda: not server_alive(pid, "scopefs.sandbox.server"), timeout=30)
    assert run_records() == [left]
    assert s.cli.j("stats")["mounts_up"]["run"] == 0
    s.cli("run", s.alice_session, "--", "true", check=True)
    assert run_records() == []


def test_search_timings_stay_bounded_and_ride_in_the_search_audit(scenario: Scenario,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from scopefs.catalog import searchstats
    from scopefs.catalog.home import Home
    from scopefs.catalog.search import search

    monkeypatch.setattr(searchstats, "KEPT", 3)
    home = Home.open(scenario.cli.home)
    try:
        for _ in range(5):
            search(home, scenario.alice_session, "allergic")
        rows = home.state().execute("SELECT results, dropped FROM search_stats ORDER BY stat_id").fetchall()
        assert len(rows) == 3 and all(r[0] == 1 for r in rows)
        # One audit row per search, each in the transaction that wrote its timing row.
        assert home.state().execute("SELECT count(*) FROM audit WHERE operation = 'search'").fetchall()[0][0] == 5
    finally:
        home.close()


def test_a_search_that_exposed_nothing_records_its_timing_without_a_disk_sync(scenario: Scenario) -> None:
    """The timing row alone is a metric: no fdatasync for it. A search that exposed something still syncs
    the commit that audits it (the timing row rides along, adding none)."""
    from scopefs.catalog.home import Home
    from scopefs.catalog.search import search
    from tests.faultkit import FaultPlan, faulty_vfs

    plan = FaultPlan()  # counts xWrite and xSync, fails nothing
    with faulty_vfs(plan) as vfs:
        home = Home.open(scenario.cli.home, vfs=vfs)
        try:
            search(home, scenario.alice_session, "allergic")  # opens every connection before counting
            plan.armed = True
            assert search(home, scenario.alice_session, "zebra xylophone quasar").hits == ()
            plan.armed = False
            assert plan.counts["xWrite"] > 0 and plan.counts["xSync"] == 0, plan.counts
            plan.counts = dict.fromkeys(plan.counts, 0)
            plan.armed = True
            assert search(home, scenario.alice_session, "allergic").hits
            plan.armed = False
            assert plan.counts["xSync"] > 0, plan.counts  # the search audit stays durable
            rows = home.state().execute("SELECT results FROM search_stats ORDER BY stat_id").fetchall()
            assert [r[0] for r in rows] == [1, 0, 1]
        finally:
            home.close()
