"""Exposure receipts, gateway session keys, pools and session ends, through the gateway API in process.

Every content-bearing answer (read, search) carries a receipt naming the
revisions it exposed (ids, never content) that was recorded before the
answer was returned; a gateway's session key reuses one session while its
subject holds and refuses the old one once it is rebound; a capability is
bound to the policy revision of every cell its view reaches, a shared
pool's included.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

from scopefs.api.mounting import parse_policy
from scopefs.api.service import Service
from scopefs.catalog.home import Home
from tests.conftest import ACCOUNT, ALICE_FACT, ALICE_SENDER, BOB_SENDER, CHANNEL, Scenario, db_copy
from tests.mountkit import is_mounted, wait_until
from tests.test_api_service import Clock, _call, _ok, _refused, api  # noqa: F401 - a fixture

KEY = "agent:main:telegram:direct:receipt-key-canary-R7k2"


def _open(service: Service, sender: str = ALICE_SENDER, **extra: Any) -> dict[str, Any]:
    return _ok(service.handle({"op": "open", "agent": "main", "chat": "direct", "channel": CHANNEL,
                               "account": ACCOUNT, "sender": sender, **extra}))


def _exposure_rows(home: Path) -> list[tuple[Any, ...]]:
    with db_copy(home / "state.sqlite") as conn:
        return conn.execute("SELECT receipt_id, run_id, operation, revision_id, resource_id FROM exposures"
                            " ORDER BY exposure_id").fetchall()


def test_a_read_carries_a_receipt_recorded_before_it_returned(scenario: Scenario,
                                                              api: tuple[Service, Clock]) -> None:
    service, clock = api
    cap = _open(service)["capability"]
    answer = _ok(_call(service, clock, cap, "read", path="private/notes/allergy.md", run="run-1"))
    assert answer["text"].encode() == ALICE_FACT
    receipt = answer["receipt"]
    assert receipt["run_id"] == "run-1" and receipt["exposure_revision"] == 1
    assert [sorted(e) for e in receipt["exposed"]] == [["resource_id", "revision_id"]]
    rows = _exposure_rows(scenario.cli.home)
    assert rows == [(receipt["receipt_id"], "run-1", "read", receipt["exposed"][0]["revision_id"],
                     receipt["exposed"][0]["resource_id"])]
    # The same revision again in the same run adds nothing to the run's exposure set.
    again = _ok(_call(service, clock, cap, "read", path="private/notes/allergy.md", run="run-1"))["receipt"]
    assert again["exposure_revision"] == 1 and again["receipt_id"] != receipt["receipt_id"]
    raw = (scenario.cli.home / "state.sqlite").read_bytes()
    assert b"hazelnuts" not in raw  # ids only, never content


def test_a_search_receipt_names_every_revision_it_quotes(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    service, clock = api
    cap = _open(service)["capability"]
    found = _ok(_call(service, clock, cap, "search", query="allergic hazelnuts", run="run-2"))
    assert found["results"]
    receipt = found["receipt"]
    assert len(receipt["exposed"]) == len({r["path"] for r in found["results"]})
    assert {row[3] for row in _exposure_rows(scenario.cli.home)} == {e["revision_id"] for e in receipt["exposed"]}
    nothing = _ok(_call(service, clock, cap, "search", query="zzqqxx nothing matches this"))
    assert nothing["receipt"]["exposed"] == [] and nothing["receipt"]["run_id"]
    bad = _call(service, clock, cap, "search", query="x", run="../not a run id")
    _refused(bad, "bad-input")


def test_a_session_key_reuses_its_session_and_a_rebound_capability_fails(scenario: Scenario,
                                                                         api: tuple[Service, Clock]) -> None:
    service, clock = api
    first = _open(service, session_key=KEY)
    second = _open(service, session_key=KEY)
    assert first["capability"] != second["capability"]
    with db_copy(scenario.cli.home / "agents" / "main" / "catalog.sqlite") as conn:
        keyed = conn.execute("SELECT count(DISTINCT session_id) FROM session_keys").fetchall()[0][0]
    assert keyed == 1  # two opens, one session
    _ok(_call(service, clock, first["capability"], "read", path="private/notes/allergy.md"))
    _open(service, sender=BOB_SENDER, session_key=KEY)  # the key now names Bob's session
    for cap in (first["capability"], second["capability"]):
        _refused(_call(service, clock, cap, "read", path="private/notes/allergy.md"), "denied", "session-rebound")
    raw = b"".join(p.read_bytes() for p in scenario.cli.home.rglob("*") if p.is_file())
    assert b"receipt-key-canary" not in raw


def test_a_capability_follows_the_pools_file(scenario: Scenario, api: tuple[Service, Clock], tmp_path: Path) -> None:
    service, clock = api
    cli = scenario.cli
    cli.j("agent", "add", "dev")
    pools = tmp_path / "pools.toml"
    pools.write_text('[agents.main]\ncapture = "own"\nrecall = ["own", "team"]\n[pools.team]\nowner = "main"\n')
    cli.j("pools", "apply", str(pools))
    opened = _open(service)
    assert "pools/team" in opened["roots"] and opened["capture"] == "private"
    cap = opened["capability"]
    # Alice's DM holds private/: it reads the pool and never writes it; main's service session curates.
    _refused(_call(service, clock, cap, "write", path="pools/team/shared.md", content="no\n"), "denied", "default-deny")
    curator = cli.j("principal", "add", "curator", "--kind", "service")["principal_id"]
    service_session = cli.j("session", "open", "--agent", "main", "--service", curator)["session_id"]
    cli.j("write", service_session, "pools/team/shared.md", stdin=b"pool note\n")
    assert _ok(_call(service, clock, cap, "read", path="pools/team/shared.md"))["text"] == "pool note\n"
    pools.write_text('[agents.main]\ncapture = "own"\nrecall = ["own"]\n[pools.team]\nowner = "main"\n')
    cli.j("pools", "apply", str(pools))
    _refused(_call(service, clock, cap, "read", path="private/notes/allergy.md"), "denied", "plan-expired")
    reopened = _open(service)["capability"]
    _refused(_call(service, clock, reopened, "read", path="pools/team/shared.md"), "denied", "outside-view")


def test_close_ends_the_session_for_every_capability(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    service, clock = api
    cap = _open(service)["capability"]
    other = _open(service)["capability"]
    assert _ok(_call(service, clock, cap, "close")) == {"closed": True}
    _refused(_call(service, clock, cap, "read", path="private/notes/allergy.md"), "denied", "invalid-context")
    assert _ok(_call(service, clock, other, "read", path="private/notes/allergy.md"))["text"].encode() == ALICE_FACT


def test_run_ids_are_bounded(api: tuple[Service, Clock]) -> None:
    service, clock = api
    cap = _open(service)["capability"]
    for run in ("", "x" * 129, "a b", "ü", 5):
        _refused(_call(service, clock, cap, "read", path="private/notes/allergy.md", run=run), "bad-input")
    _ok(_call(service, clock, cap, "read", path="private/notes/allergy.md", run=secrets.token_hex(32)))


def test_mount_serves_the_session_to_one_uid_until_it_is_closed(scenario: Scenario, tmp_path: Path) -> None:
    """``mount`` is ``scopefs mount --for-uid`` for a gateway's own sandbox (``tests/test_sandbox_external.py``
    drives such a mount from a real sandbox), only where and for whom the operator allowed; ``close`` ends
    the session, and with it the mount."""
    home = Home.open(scenario.cli.home)
    clock = Clock()
    try:
        closed = Service(home, clock=clock)
        cap = _open(closed)["capability"]
        _refused(_call(closed, clock, cap, "mount", name="alice", uid=1234), "bad-input")  # not enabled
        service = Service(home, clock=clock, mounting=parse_policy(str(tmp_path), "1234-1239"))
        cap = _open(service)["capability"]
        for name, uid in (("alice", 0), ("alice", 1240), ("../etc", 1234), ("a/b", 1234), ("", 1234)):
            _refused(_call(service, clock, cap, "mount", name=name, uid=uid), "bad-input")
        where = tmp_path / "alice"
        try:
            mounted = _ok(_call(service, clock, cap, "mount", name="alice", uid=1234))
            assert mounted == {"mountpoint": str(where), "for_uid": 1234, "for_gid": 1234}
            assert is_mounted(where)
            _refused(_call(service, clock, cap, "mount", name="again", uid=1234), "bad-input")  # one per session
            assert _ok(_call(service, clock, cap, "close")) == {"closed": True}
            wait_until(lambda: not is_mounted(where))
        finally:
            if is_mounted(where):
                subprocess.run(["fusermount3", "-uz", str(where)], check=False)
    finally:
        home.close()
