#!/usr/bin/env python3
"""What the catalog's per-save checks cost in SQLite, statement by statement, on the apsw installed.

Every save re-reads the session's identity binding and the store's policy
entries three times (the plan, then inside each of the two commit
transactions: DESIGN.md §6). On SQLite 3.54.0 and 3.54.1 each of those joins
took 6-20 us instead of 2-3 us: the library re-prepares the cached statement
at every run (``sqlite3Reprepare`` under ``sqlite3_step`` in a native
profile), which is why pyproject.toml keeps apsw below 3.54. Run this on a
candidate apsw before moving the lock (``make lock``):

    .venv/bin/python bench/statement_cost.py                  # the locked apsw
    .venv/bin/pip install -q apsw==X.Y.Z.W && .venv/bin/python bench/statement_cost.py
    .venv/bin/pip install -q -c requirements.lock apsw        # the locked one again

It makes a throwaway home (``scopefs init``, one agent, one session, one
note), runs each function the save path calls on that home's own
connections many times, and prints microseconds per call. Nothing it reads
is secret; the home is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import apsw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scopefs.catalog.home import Home  # noqa: E402 - after the path, for a scratch venv's python
from scopefs.catalog.identity import binding_live  # noqa: E402
from scopefs.catalog.stores import policy_entries  # noqa: E402


def _cli(home: Path, *args: str, stdin: bytes | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "scopefs.cli.main", "--home", str(home), "--json", *args], input=stdin,
                         check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout) if out.stdout.strip() else {}


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()  # the statement is prepared and cached before timing
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scopefs-stmt-") as scratch:
        home_dir = Path(scratch) / "home"
        _cli(home_dir, "init")
        _cli(home_dir, "agent", "add", "main")
        person = _cli(home_dir, "principal", "add", "Someone", "--kind", "human")["principal_id"]
        where = ("--channel", "bench", "--account", "bench-account", "--sender", "bench-sender")
        _cli(home_dir, "bind", person, *where)
        session = _cli(home_dir, "session", "open", "--agent", "main", "--dm", *where)["session_id"]
        _cli(home_dir, "write", session, "private/a.md", stdin=b"a note\n")
        home = Home.open(home_dir)
        state, catalog = home.state(), home.catalog("main")
        binding = state.execute("SELECT binding_id, principal_id FROM identity_bindings LIMIT 1").fetchone()
        store = catalog.execute("SELECT store_id FROM stores LIMIT 1").fetchone()[0]
        resource = catalog.execute("SELECT resource_id FROM resources LIMIT 1").fetchone()[0]
        checks: dict[str, Callable[[], object]] = {
            "policy entries (a join, an OR of two indexed terms)":
                lambda: policy_entries(catalog, "main", store, resource),
            "identity binding live (a join)": lambda: binding_live(state, binding[0], binding[1]),
            "a resource by its key (no join)":
                lambda: catalog.execute("SELECT path FROM resources WHERE resource_id = ?", (resource,)).fetchall(),
        }
        try:
            results = {name: round(_per_call_us(fn, args.calls), 2) for name, fn in checks.items()}
        finally:
            home.close()
    report = {"sqlite": apsw.sqlite_lib_version(), "apsw": apsw.apsw_version(), "us_per_call": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"SQLite {report['sqlite']} (apsw {report['apsw']})")
        for name, us in results.items():
            print(f"  {us:7.2f} us  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
