"""The gateway API with several workers: requests at once, each on a home (catalog connections) of its own.

What must stay one for the whole process stays one: a nonce sent at once
on many workers is accepted exactly once, in process and through a real
``scopefs serve --workers N``, and so it is (with a capability's quota)
when the replay guard's look-ups are slowed down to widen any race. Writes from several threads of one process
are the writer's transactions as before: the per-agent writer lock
excludes threads of one process (each take opens its own file
description), notes written at once all land, and writes racing on one
note end as one revision each or a conflict, never a pending, orphaned or
half-written one. The homes are lent to one request at a time, and every
one of them is closed when the server stops.
"""

from __future__ import annotations

import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import apsw
import pytest

from scopefs.api.client import Client
from scopefs.api.replay import ReplayGuard
from scopefs.api.service import Service
from scopefs.api.workers import WorkerHomes, default_workers
from scopefs.catalog.errors import Denied, StorageError
from scopefs.catalog.home import Home
from scopefs.writer import lock
from tests.conftest import ACCOUNT, ALICE_FACT, ALICE_SENDER, BOB_FACT, BOB_SENDER, CHANNEL, Scenario, db_copy
from tests.mountkit import wait_until
from tests.test_api_http import _start

WORKERS = 4
AT_ONCE = 16

T = TypeVar("T")


@pytest.fixture
def racy() -> Iterator[None]:
    """Switch threads as often as the interpreter can, so that a missing lock shows."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.fixture
def service(scenario: Scenario) -> Iterator[Service]:
    homes = WorkerHomes(Home.open(scenario.cli.home), WORKERS)
    try:
        yield Service(homes)
    finally:
        homes.close()


def at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Each call on a thread of its own, all released together; their results in order."""
    gate = threading.Barrier(len(calls))

    def run(call: Callable[[], T]) -> T:
        gate.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _dm(service: Service, sender: str) -> str:
    answer = service.handle({"op": "open", "agent": "main", "chat": "direct", "channel": CHANNEL,
                             "account": ACCOUNT, "sender": sender})
    assert answer["ok"], answer
    return answer["result"]["capability"]  # type: ignore[no-any-return]


def _request(capability: str, op: str, **args: Any) -> dict[str, Any]:
    return {"op": op, "capability": capability, "nonce": secrets.token_urlsafe(16), "ts": time.time_ns() // 1000,
            "args": args}


def _revisions(scenario: Scenario, name: str) -> dict[str, int]:
    """How many revisions of the note called ``name`` are in each state (read from a copy of the catalog)."""
    with db_copy(scenario.cli.home / "agents" / "main" / "catalog.sqlite") as conn:
        rows = conn.execute("SELECT revisions.state, count(*) FROM revisions JOIN resources USING (resource_id)"
                            " WHERE resources.path LIKE ? GROUP BY revisions.state", ("%/" + name,)).fetchall()
    return {str(state): int(count) for state, count in rows}  # type: ignore[arg-type]


# -- one replay window for every worker -----------------------------------------------------------

def test_a_nonce_sent_at_once_on_many_workers_is_accepted_once(service: Service, racy: None) -> None:
    alice = _dm(service, ALICE_SENDER)
    for _ in range(10):
        request = _request(alice, "read", path="private/notes/allergy.md")
        answers = at_once([partial(service.handle, dict(request)) for _ in range(AT_ONCE)])
        accepted = [a for a in answers if a["ok"]]
        assert len(accepted) == 1, answers
        assert accepted[0]["result"]["text"] == ALICE_FACT.decode()
        for refused in (a for a in answers if not a["ok"]):
            assert refused["error"]["code"] == "denied" and refused["error"]["reason"] == "invalid-context", refused


class _SlowSet(set[tuple[str, str]]):
    """The guard's nonce set, pausing after each look-up: the widest window a check-then-add race can have."""

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        time.sleep(0.002)
        return found


class _SlowCounts(dict[str, int]):
    """The guard's per-capability counts, pausing after each read: a lost update would show."""

    def get(self, key: str, default: int | None = None) -> int | None:  # type: ignore[override]
        value = super().get(key, default)
        time.sleep(0.002)
        return value


def test_the_replay_check_is_one_step_however_slow_its_parts(racy: None) -> None:
    """The same guarantee with the guard's look-ups slowed down, so that it cannot rest on luck or on
    how rarely the interpreter switches threads: one nonce sent at once is accepted once, and a
    capability's quota is never exceeded by requests that arrive together."""
    now = time.time_ns() // 1000
    guard = ReplayGuard(now - 1_000_000, per_grant=3)
    guard._seen = _SlowSet()  # noqa: SLF001 - widening the race window is the point
    guard._by_grant = _SlowCounts()  # noqa: SLF001

    def attempt(grant: str, nonce: str) -> bool:
        try:
            guard.check(grant, nonce, now, now)
        except Denied:
            return False
        return True

    nonce = secrets.token_urlsafe(16)
    assert at_once([partial(attempt, "grant-a", nonce) for _ in range(AT_ONCE)]).count(True) == 1
    assert at_once([partial(attempt, "grant-b", secrets.token_urlsafe(16)) for _ in range(AT_ONCE)]).count(True) == 3


def test_a_nonce_sent_at_once_to_the_server_is_accepted_once(scenario: Scenario, tmp_path: Path) -> None:
    server = _start(scenario, tmp_path, "--workers", str(WORKERS))
    try:
        client = server.client
        alice = client.open("main", chat="direct", channel=CHANNEL, account=ACCOUNT, sender=ALICE_SENDER)
        for route, args in (("/v1/read", {"path": "private/notes/allergy.md"}),
                            ("/v1/write", {"path": "private/notes/once.md", "content": "written once\n"})):
            body = {k: v for k, v in _request(alice["capability"], "x", **args).items() if k != "op"}
            answers = at_once([partial(Client(str(server.socket)).post, route, body) for _ in range(AT_ONCE)])
            assert [status for status, _ in answers].count(200) == 1, answers
            for status, answer in answers:
                if status != 200:
                    assert (status, answer["error"]["reason"]) == (403, "invalid-context"), answer
        listed = client.list(alice["capability"], "private/notes")["entries"]
        assert sorted(e["name"] for e in listed) == ["allergy.md", "once.md"]
        assert client.read(alice["capability"], "private/notes/once.md")["text"] == "written once\n"
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    assert not server.socket.exists()
    assert _revisions(scenario, "once.md") == {"active": 1}  # written once: one revision, nothing pending


# -- writes from several threads of one process -----------------------------------------------------

def test_the_writer_lock_excludes_threads_of_one_process(tmp_path: Path) -> None:
    """flock belongs to an open file description: each take opens the lock file anew, so a thread's
    lock excludes another thread's as it would another process's (recovery never runs under a write)."""
    path = tmp_path / "writer.lock"
    held, release = threading.Event(), threading.Event()

    def hold(take: Callable[[], Any]) -> None:
        with take():
            held.set()
            release.wait(30)

    for take in (lambda: lock.shared(path), lambda: lock.exclusive(path, wait=True)):
        held.clear()
        release.clear()
        holder = threading.Thread(target=hold, args=(take,))
        holder.start()
        try:
            assert held.wait(30)
            with lock.exclusive(path, wait=False) as got:
                assert got is False  # the other thread's lock, shared or exclusive, keeps recovery out
        finally:
            release.set()
            holder.join(30)
        with lock.exclusive(path, wait=False) as got:
            assert got is True  # and it is free once that thread let go


def test_notes_written_at_once_on_many_workers_all_land(scenario: Scenario, service: Service) -> None:
    alice, bob = _dm(service, ALICE_SENDER), _dm(service, BOB_SENDER)
    writes = [(cap, f"private/notes/at-once-{i}.md", f"note {i} of {name}\n")
              for i in range(AT_ONCE // 2) for cap, name in ((alice, "alice"), (bob, "bob"))]
    answers = at_once([partial(service.handle, _request(cap, "write", path=path, content=text))
                       for cap, path, text in writes])
    assert all(a["ok"] for a in answers), answers
    reads = at_once([partial(service.handle, _request(cap, "read", path=path)) for cap, path, _ in writes])
    assert [r["result"]["text"] for r in reads] == [w[2] for w in writes]
    assert scenario.cli.j("doctor")["findings"] == []


def test_writes_racing_on_one_note_end_as_revisions_or_a_conflict(scenario: Scenario, service: Service) -> None:
    alice = _dm(service, ALICE_SENDER)
    path = "private/notes/contended.md"
    assert service.handle(_request(alice, "write", path=path, content="base\n"))["ok"]
    won = 0
    for round_no in range(3):
        contents = [f"round {round_no} writer {i}\n" for i in range(AT_ONCE // 2)]
        answers = at_once([partial(service.handle, _request(alice, "write", path=path, content=c))
                           for c in contents])
        landed = {a["result"]["revision"]: c for a, c in zip(answers, contents, strict=True) if a["ok"]}
        assert landed, answers  # one at least always wins
        for answer in answers:
            if not answer["ok"]:  # lost the race: told so, nothing of it written
                assert answer["error"]["code"] == "conflict" and "changed while" in answer["error"]["message"], answer
        read = service.handle(_request(alice, "read", path=path))
        assert read["result"]["text"] == landed[max(landed)]  # the newest revision that landed is the note
        won += len(landed)
    states = _revisions(scenario, "contended.md")
    assert states.pop("rolled-back", 0) <= 3 * (AT_ONCE // 2) - won  # a loser's row, if it got that far
    assert states == {"active": 1, "superseded": won}  # the base and every winner; nothing pending
    assert scenario.cli.j("doctor")["findings"] == []  # nothing pending, orphaned or unverified


def _flock_waiters(path: Path) -> int:
    """How many ``flock`` requests wait for ``path`` now (the kernel's lock table: blocked ones read ``->``)."""
    inode = f":{path.stat().st_ino} "
    with open("/proc/locks", encoding="ascii") as table:
        return sum(1 for line in table if "->" in line and " FLOCK " in line and inode in line)


def test_a_write_waiting_for_the_writer_lock_does_not_stop_other_requests(scenario: Scenario,
                                                                          service: Service) -> None:
    """With one worker, a write that waits for the writer lock (held by ``doctor --fix``, say) would
    hold up every session's request behind it; with several, the others are answered meanwhile."""
    alice, bob = _dm(service, ALICE_SENDER), _dm(service, BOB_SENDER)
    lock_path = scenario.cli.home / "agents" / "main" / "writer.lock"
    with ThreadPoolExecutor(2) as background:  # on failure the lock goes first, then these finish
        with lock.exclusive(lock_path, wait=True) as held:
            assert held
            write = background.submit(service.handle, _request(alice, "write", path="private/notes/later.md",
                                                               content="written later\n"))
            wait_until(lambda: _flock_waiters(lock_path) >= 1)  # the write is in, waiting for the lock
            for _ in range(3):
                # bounded, so that a server stuck behind the write fails here instead of hanging
                read = background.submit(service.handle, _request(bob, "read", path="private/notes/allergy.md"))
                answer = read.result(timeout=60)
                assert answer["ok"] and answer["result"]["text"] == BOB_FACT.decode(), answer
            assert not write.done()  # still waiting: the reads did not wait for it
        assert write.result(timeout=60)["ok"]
    assert service.handle(_request(alice, "read", path="private/notes/later.md"))["result"]["text"] == "written later\n"


# -- the homes ---------------------------------------------------------------------------------------

def test_a_home_is_lent_to_one_request_at_a_time_and_every_one_is_closed(scenario: Scenario, racy: None) -> None:
    homes = WorkerHomes(Home.open(scenario.cli.home), 3)
    in_use: set[int] = set()
    seen: dict[int, Home] = {}
    guard = threading.Lock()

    def use() -> None:
        with homes.lease() as home:
            with guard:
                assert id(home) not in in_use  # never lent twice at once
                in_use.add(id(home))
                seen[id(home)] = home
            home.state().execute("SELECT count(*) FROM agents").fetchall()
            with guard:
                in_use.discard(id(home))

    at_once([use for _ in range(AT_ONCE)])
    assert 1 <= len(seen) <= 3  # opened on need, never more than the size
    with homes.lease() as kept:  # still lent when the server stops
        kept_conn = kept.state()
        others = [home.state() for home in seen.values() if home is not kept]
        homes.close()
        with pytest.raises(StorageError), homes.lease():
            pass  # no lease after close
        for conn in others:
            with pytest.raises(apsw.ConnectionClosedError):
                conn.execute("SELECT 1")
        kept_conn.execute("SELECT 1")  # the request that holds it finishes on it
    with pytest.raises(apsw.ConnectionClosedError):
        kept_conn.execute("SELECT 1")  # closed as it came back


def test_workers_are_bounded_and_default_to_the_machine(scenario: Scenario, tmp_path: Path) -> None:
    assert 2 <= default_workers() <= 4
    for bad in ("0", "65", "many"):
        result = scenario.cli("serve", "--socket", str(tmp_path / "api.sock"), "--workers", bad)
        assert result.code == 2, result
        assert not (tmp_path / "api.sock").exists()
