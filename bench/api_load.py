#!/usr/bin/env python3
"""Load on the gateway API: many concurrent sessions against one ``scopefs serve``.

Issue 13 asks what the API does with 200 concurrent sessions (a search,
read and write mix) for a few minutes: latency (p50, p99), throughput,
errors other than designed refusals (there must be none), and the
server's memory over the run (it must stay flat). A figure alone says
little on a shared VM, so the same operations are also timed in process
(``Service.handle`` called directly, one at a time, no transport) in the
same run, and every API figure is given as a ratio to that.

    .venv/bin/python bench/api_load.py                   # 200 sessions, 120 s
    .venv/bin/python bench/api_load.py --sessions 20 --seconds 10   # a quick look
    .venv/bin/python bench/api_load.py --workers 1       # the server's requests one at a time
    .venv/bin/python bench/api_load.py --json

Each session is a DM user of its own (a principal, a binding, a private
note); the clients are threads of this process using the package's own
client (``scopefs.api.client``) over the Unix socket, each opening its
session once and then looping: 60% search, 30% read, 10% write. The home
is built in process before the server starts and removed afterwards
(``--keep`` keeps it). The server answers ``--workers`` requests at once
(its default if not given), each on catalog connections of its own; the
in-process baseline is one request stream, so the ratios say what the
transport, the concurrency and the workers add or take away together.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scopefs.api.client import ApiError, Client
from scopefs.api.service import Service
from scopefs.catalog import identity
from scopefs.catalog.agents import add_agent
from scopefs.catalog.home import Home
from scopefs.catalog.sessions import DirectMessage, open_session
from scopefs.writer.transaction import write_note

CHANNEL, ACCOUNT, AGENT = "bench", "bench-account", "main"
WORDS = ("apple", "harbour", "violin", "granite", "meadow", "lantern", "orbit", "saffron", "tundra", "velvet")
MIX = (("search", 0.6), ("read", 0.3), ("write", 0.1))
DESIGNED = {"plan-expired", "invalid-context"}  # refusals the protocol makes on purpose (none expected here)


def note_text(i: int) -> bytes:
    rng = random.Random(i)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(40)]
    return ("\n".join(lines) + f"\ncanary-{i}\n").encode()


def build_home(root: Path, sessions: int) -> Path:
    """A home with one agent and ``sessions`` bound DM users, each with a private note."""
    home, _ = Home.init(root)
    add_agent(home, AGENT)
    state, key = home.state(), home.hmac_key()
    for i in range(sessions):
        principal = identity.add_principal(state, f"user{i}", "human")
        identity.bind(state, key, principal, CHANNEL, ACCOUNT, f"sender-{i}")
        session = open_session(home, AGENT, DirectMessage(CHANNEL, ACCOUNT, f"sender-{i}"))
        write_note(home, session.session_id, "private/notes/n.md", note_text(i))
    home.close()
    return root


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pick(rng: random.Random) -> str:
    roll, acc = rng.random(), 0.0
    for op, share in MIX:
        acc += share
        if roll < acc:
            return op
    return MIX[-1][0]


class Worker(threading.Thread):
    """One gateway session: opens once, then loops over the mix until told to stop."""

    def __init__(self, client: Client, index: int, stop: threading.Event, results: list[tuple[str, float, str]]):
        super().__init__(daemon=True)
        self.client, self.index, self.stop, self.results = client, index, stop, results
        self.rng = random.Random(index)

    def run(self) -> None:
        capability = self.client.open(AGENT, chat="direct", channel=CHANNEL, account=ACCOUNT,
                                      sender=f"sender-{self.index}")["capability"]
        while not self.stop.is_set():
            op = pick(self.rng)
            started = time.perf_counter()
            outcome = "ok"
            try:
                if op == "search":
                    found = self.client.search(capability, self.rng.choice(WORDS), limit=5)["results"]
                    if any(f"canary-{self.index}" not in h["snippet"] and "canary-" in h["snippet"] for h in found):
                        outcome = "leak"  # another session's canary in this view
                elif op == "read":
                    text = self.client.read(capability, "private/notes/n.md", start=35)["text"]
                    if f"canary-{self.index}" not in text:
                        outcome = "wrong-content"
                else:
                    self.client.write(capability, f"private/notes/w{self.rng.randrange(5)}.md",
                                      "written under load " + secrets.token_hex(8) + "\n")
            except ApiError as exc:
                outcome = f"refused:{exc.reason}" if exc.reason in DESIGNED else f"error:{exc.code}:{exc.status}"
            except OSError as exc:
                outcome = f"error:{type(exc).__name__}"
            self.results.append((op, time.perf_counter() - started, outcome))


def in_process(home_root: Path, ops: int) -> dict[str, list[float]]:
    """The same operations through ``Service.handle`` directly, one at a time: the baseline."""
    home = Home.open(home_root)
    service = Service(home)
    rng = random.Random(7)
    capability = service.handle({"op": "open", "agent": AGENT, "chat": "direct", "channel": CHANNEL,
                                 "account": ACCOUNT, "sender": "sender-0"})["result"]["capability"]
    timings: dict[str, list[float]] = {op: [] for op, _ in MIX}
    for _ in range(ops):
        op = pick(rng)
        args: dict[str, Any] = {"search": {"query": rng.choice(WORDS), "limit": 5},
                                "read": {"path": "private/notes/n.md", "from": 35},
                                "write": {"path": f"private/notes/w{rng.randrange(5)}.md",
                                          "content": "in process " + secrets.token_hex(8) + "\n"}}[op]
        request = {"op": op, "capability": capability, "nonce": secrets.token_urlsafe(16),
                   "ts": time.time_ns() // 1000, "args": args}
        started = time.perf_counter()
        answer = service.handle(request)
        timings[op].append(time.perf_counter() - started)
        assert answer["ok"], answer
    home.close()
    return timings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--baseline-ops", type=int, default=600)
    parser.add_argument("--workers", type=int, help="the server's --workers (default: the server's own)")
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent / "out")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="api-load-", dir=args.dir))
    os.chmod(work, 0o700)
    report: dict[str, Any] = {"sessions": args.sessions, "seconds": args.seconds, "mix": dict(MIX),
                              "workers": args.workers}
    try:
        t0 = time.perf_counter()
        home_root = build_home(work / "home", args.sessions)
        report["build_s"] = round(time.perf_counter() - t0, 1)
        baseline = in_process(home_root, args.baseline_ops)
        sock = work / "api.sock"
        workers = [] if args.workers is None else ["--workers", str(args.workers)]
        server = subprocess.Popen([str(Path(sys.executable).with_name("scopefs")), "serve", "--socket", str(sock),
                                   *workers], env={**os.environ, "SCOPEFS_HOME": str(home_root)})
        try:
            client = Client(str(sock), timeout=120)
            deadline = time.monotonic() + 30
            while True:  # bound is not listening yet: wait for the first answer
                try:
                    client.open(AGENT)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            stop, results = threading.Event(), []  # type: ignore[var-annotated]
            workers = [Worker(client, i, stop, results) for i in range(args.sessions)]
            rss: list[tuple[float, int]] = []
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            while time.perf_counter() - started < args.seconds:
                rss.append((round(time.perf_counter() - started, 1), rss_kib(server.pid)))
                time.sleep(1.0)
            stop.set()
            for worker in workers:
                worker.join(timeout=120)
            elapsed = time.perf_counter() - started
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        rows = []
        for op, _ in MIX:
            mine = [d for o, d, outcome in results if o == op and outcome == "ok"]
            base = baseline[op]
            rows.append({"op": op, "n": len(mine), "p50_ms": round(1000 * percentile(mine, 0.5), 2),
                         "p99_ms": round(1000 * percentile(mine, 0.99), 2),
                         "in_process_p50_ms": round(1000 * statistics.median(base), 2),
                         "ratio_p50": round(percentile(mine, 0.5) / statistics.median(base), 1)})
        outcomes: dict[str, int] = {}
        for _, _, outcome in results:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        in_process_rate = sum(len(v) for v in baseline.values()) / sum(sum(v) for v in baseline.values())
        report.update({
            "rows": rows, "outcomes": outcomes, "requests": len(results),
            "throughput_per_s": round(len(results) / elapsed, 1),
            "in_process_per_s": round(in_process_rate, 1),
            "rss_kib_first_last_max": [rss[1][1] if len(rss) > 1 else None, rss[-1][1], max(r for _, r in rss)],
            "rss_kib": rss,
        })
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{args.sessions} sessions, {args.seconds:g} s, mix {dict(MIX)}, server workers "
          f"{args.workers or 'default'}; home built in {report['build_s']} s")
    print(f"{'op':8} {'n':>7} {'p50 ms':>8} {'p99 ms':>8} {'in-proc p50':>12} {'x':>6}")
    for row in report["rows"]:
        print(f"{row['op']:8} {row['n']:7d} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} "
              f"{row['in_process_p50_ms']:12.2f} {row['ratio_p50']:6.1f}")
    print(f"throughput {report['throughput_per_s']}/s (in process, one at a time: {report['in_process_per_s']}/s)")
    print(f"outcomes {report['outcomes']}")
    print(f"server RSS KiB (at 1 s, at the end, max): {report['rss_kib_first_last_max']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
