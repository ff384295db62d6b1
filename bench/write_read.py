#!/usr/bin/env python3
"""Write/read benchmark: the full scopefs transaction next to plain file I/O.

What the issue asks for: a commit of a 4 KiB note through the full write
transaction (DESIGN.md §6) and a verified read of it, each timed over 1,000
operations, reported next to a plain write+fsync+rename and a plain read of
the same bytes on the same disk. A number on its own says little (a VM disk
can be 10x slower than a laptop NVMe), so every scopefs figure is printed as
a ratio to the plain baseline measured seconds apart in the same directory.

Everything runs in-process through the library API (``write_note``,
``read_note``), the way a long-lived broker would call it, plus, as context,
the ``scopefs`` command line in a subprocess, which is what operators run and
which pays interpreter start-up and imports on every call.

Run it with the project's venv (``make bench`` does)::

    .venv/bin/python bench/write_read.py            # table on stdout
    .venv/bin/python bench/write_read.py --json     # one JSON object
    .venv/bin/python bench/write_read.py --ops 200 --cli-runs 10   # quick

The working directory defaults to a fresh temporary directory under
``bench/out`` (git-ignored) and is removed afterwards unless ``--keep``.
A tmpfs directory is refused unless ``--allow-tmpfs``: fsync on tmpfs is a
no-op and would make every durable figure meaningless.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    import apsw

    from catalog import identity
    from catalog.agents import add_agent
    from catalog.db import connect, immediate
    from catalog.home import Home
    from catalog.reader import read_note
    from catalog.sessions import DirectMessage, open_session
    from catalog.subject import SubjectKind
    from writer.transaction import write_note
except ImportError as exc:  # pragma: no cover - a usage error, not a result
    sys.exit(f"cannot import scopefs ({exc}); run with the project venv: .venv/bin/python bench/write_read.py")

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_PARENT = BENCH_DIR / "out"
NOTE_BYTES = 4096
AGENT = "bench"
CHANNEL, ACCOUNT, SENDER = "bench-channel", "bench-account", "bench-sender-0001"
SAME_NOTE = "private/notes/bench.md"
CLI_NOTE = "private/notes/cli.md"
# Markers the in-process strace child opens (and fails to open) so that the
# parent can count only the fsyncs issued between them, not start-up ones.
MARK_BEGIN = "/nonexistent/scopefs-bench-mark-begin"
MARK_MIDDLE = "/nonexistent/scopefs-bench-mark-middle"
MARK_END = "/nonexistent/scopefs-bench-mark-end"


def log(message: str) -> None:
    """Progress goes to stderr so that ``--json`` output stays parseable."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------

@dataclass
class Stats:
    """Per-operation latency summary of one timed series, in microseconds."""

    name: str
    group: str  # write | read | cli | micro
    n: int
    p50_us: float
    p95_us: float
    p99_us: float
    mean_us: float
    max_us: float
    ops_per_s: float
    baseline: str | None = None
    ratio_mean: float | None = None
    ratio_p50: float | None = None
    first_tenth_mean_us: float | None = None  # drift check: does the cost grow with history?
    last_tenth_mean_us: float | None = None
    note: str = ""


def percentile(sorted_ns: Sequence[int], q: float) -> float:
    """Nearest-rank percentile: always a latency that was actually observed."""
    if not sorted_ns:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_ns), int(-(-q * len(sorted_ns) // 100))))
    return float(sorted_ns[rank - 1])


def summarize(name: str, group: str, samples_ns: Sequence[int], note: str = "") -> Stats:
    ordered = sorted(samples_ns)
    mean_ns = sum(ordered) / len(ordered)
    tenth = max(1, len(samples_ns) // 10)
    return Stats(
        name=name, group=group, n=len(ordered),
        p50_us=percentile(ordered, 50) / 1e3, p95_us=percentile(ordered, 95) / 1e3,
        p99_us=percentile(ordered, 99) / 1e3, mean_us=mean_ns / 1e3, max_us=ordered[-1] / 1e3,
        ops_per_s=1e9 / mean_ns,
        first_tenth_mean_us=sum(samples_ns[:tenth]) / tenth / 1e3,
        last_tenth_mean_us=sum(samples_ns[-tenth:]) / tenth / 1e3,
        note=note,
    )


def compare(stats: Stats, baseline: Stats) -> Stats:
    """Attach the ratio to the baseline; mean and p50 both, since tails differ."""
    stats.baseline = baseline.name
    stats.ratio_mean = stats.mean_us / baseline.mean_us
    stats.ratio_p50 = stats.p50_us / baseline.p50_us
    return stats


def time_ops(n: int, op: Callable[[int], Any], check: Callable[[int, Any], None] | None = None) -> list[int]:
    """Time ``op(i)`` for i in 0..n-1, one sample per call.

    ``check`` runs outside the timed region, so verifying every result (the
    benchmark must not time a write that silently did nothing) costs nothing.
    """
    samples: list[int] = []
    clock = time.perf_counter_ns
    for i in range(n):
        start = clock()
        result = op(i)
        samples.append(clock() - start)
        if check is not None:
            check(i, result)
    return samples


# ---------------------------------------------------------------------------
# environment
# ---------------------------------------------------------------------------

def filesystem_of(path: Path) -> dict[str, str]:
    """Mount point, type and source of the filesystem holding ``path``.

    From /proc/self/mountinfo (longest matching mount point), so the report
    states where the bytes really went rather than assuming.
    """
    real = os.path.realpath(path)
    best: dict[str, str] = {"mountpoint": "?", "fstype": "?", "source": "?"}
    best_len = -1
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mountpoint = fields[4].replace("\\040", " ")
        inside = real == mountpoint or real.startswith(mountpoint.rstrip("/") + "/")
        if inside and len(mountpoint) > best_len:
            best = {"mountpoint": mountpoint, "fstype": tail[0], "source": tail[1],
                    "options": fields[5] + ("," + tail[2] if len(tail) > 2 else "")}
            best_len = len(mountpoint)
    return best


def machine_info(workdir: Path) -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(),
        "workdir": str(workdir),
        "filesystem": filesystem_of(workdir),
    }


def payloads(n: int, size: int) -> list[bytes]:
    """``n`` distinct printable notes of exactly ``size`` bytes.

    Text rather than raw random bytes so the same payloads also work with
    ``scopefs read --json``; distinct so that no layer can dedupe them.
    """
    out = []
    for _ in range(n):
        body = base64.b64encode(os.urandom(size))[: size - 1]
        out.append(body + b"\n")
    return out


# ---------------------------------------------------------------------------
# baselines: the same bytes, the same disk, no scopefs
# ---------------------------------------------------------------------------

def plain_write(dirfd: int, tmp: str, target: str, data: bytes) -> None:
    """The textbook durable replace: write tmp, fsync, rename, fsync dir."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, target, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    os.fsync(dirfd)


def plain_read(dirfd: int, name: str) -> bytes:
    """open + read to EOF + close; nothing verified, nothing recorded."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# scopefs in-process
# ---------------------------------------------------------------------------

def setup_home(root: Path) -> tuple[Home, str]:
    """A home with one agent and one bound human in a DM session.

    The same steps as ``scopefs init / agent add / principal add / bind /
    session open --dm``, through the library. The session's subject is a
    verified user, so ``private/...`` resolves to that user's own store.
    """
    home, _ = Home.init(root)
    add_agent(home, AGENT)
    state = home.state()
    principal = identity.add_principal(state, "Bench User", "human")
    identity.bind(state, home.hmac_key(), principal, CHANNEL, ACCOUNT, SENDER)
    session = open_session(home, AGENT, DirectMessage(CHANNEL, ACCOUNT, SENDER))
    if session.subject.kind is not SubjectKind.USER:
        raise SystemExit(f"benchmark session has subject {session.subject.kind}, expected user")
    return home, session.session_id


def sqlite_commit_micro(root: Path, n: int) -> list[int]:
    """One small durable SQLite commit, with the project's own pragmas.

    Context for the analysis: the transaction and the audited read are
    bounded by how many of these they do, so its cost is the unit.
    """
    conn = connect(root / "micro.sqlite", create=True)
    try:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")

        def op(i: int) -> None:
            with immediate(conn):
                conn.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 64,))

        return time_ops(n, op)
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# the command line, as operators run it
# ---------------------------------------------------------------------------

def scopefs_executable() -> str:
    beside = Path(sys.executable).with_name("scopefs")
    if beside.exists():
        return str(beside)
    found = shutil.which("scopefs")
    if found is None:
        raise SystemExit("scopefs command not found next to this Python or on PATH")
    return found


def cli_env(home_root: Path, pycache: Path | None, *, cached: bool) -> dict[str, str]:
    """Environment for the CLI runs, with the bytecode cache made explicit.

    An installed scopefs runs from compiled bytecode; this sandbox sets
    PYTHONDONTWRITEBYTECODE and the editable checkout has no __pycache__, so
    left alone every run would recompile every module. The cached case keeps
    the .pyc files under the benchmark's own workdir (PYTHONPYCACHEPREFIX),
    so nothing is written into the source tree.
    """
    env = {**os.environ, "SCOPEFS_HOME": str(home_root)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if cached:
        assert pycache is not None
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def time_subprocess(n: int, argv: list[str], env: dict[str, str], stdin: bytes = b"",
                    expect_stdout: bytes | None = None) -> list[int]:
    """Wall time of whole processes, from fork to exit; every run must succeed."""

    def op(i: int) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(argv, input=stdin, capture_output=True, env=env)

    def check(i: int, proc: subprocess.CompletedProcess[bytes]) -> None:
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:2])} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        if expect_stdout is not None and proc.stdout != expect_stdout:
            raise SystemExit(f"{' '.join(argv[:2])} returned other bytes than were written")

    return time_ops(n, op, check)


# ---------------------------------------------------------------------------
# fsync counting with strace
# ---------------------------------------------------------------------------

_SYNC_LINE = re.compile(r"\b(fsync|fdatasync)\((\d+)(?:<([^>]*)>)?\)\s*=\s*(-?\d+)")


def classify_sync(path: str, home: Path) -> str:
    """Name what an fsync'd descriptor is, from the path strace -y shows."""
    try:
        rel = Path(path).relative_to(home).parts
    except ValueError:
        return f"outside home: {path}"
    if not rel:
        return "home directory (SQLite: state WAL file created)"
    if rel[0] == "state.sqlite-wal":
        return "state.sqlite-wal (state WAL commit)"
    if rel[0] == "state.sqlite":
        return "state.sqlite (checkpoint)"
    if len(rel) == 2 and rel[0] == "agents":
        return "agent directory (SQLite: catalog WAL file created)"
    if len(rel) >= 3 and rel[0] == "agents":
        rest = rel[2:]
        if rest[0] == "catalog.sqlite-wal":
            return "catalog.sqlite-wal (catalog WAL commit)"
        if rest[0] == "catalog.sqlite":
            return "catalog.sqlite (checkpoint)"
        if rest[0] == "staging":
            return "staged file" if len(rest) == 2 else "staging directory"
        if rest[:2] == ("memory-scopes", "v1"):
            depth = len(rest) - 2
            return {0: "scopes directory", 1: "store directory", 2: "artifact (after rename)"}.get(depth, "artifact area")
    return "/".join(rel)


def strace_syncs(argv: list[str], env: dict[str, str], stdin: bytes, home: Path, out: Path,
                 markers: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``argv`` under strace -f -y and count fsync/fdatasync by target.

    With ``markers``, syscalls are split into the segments between the
    marker opens, so start-up and exit are reported apart from the work.
    """
    trace_set = "fsync,fdatasync" + (",openat" if markers else "")
    cmd = ["strace", "-f", "-y", "-qq", "-e", f"trace={trace_set}", "-o", str(out), *argv]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"strace run failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-500:]}")
    segments: list[dict[str, int]] = [{}]
    for line in out.read_text().splitlines():
        if any(m in line for m in markers):
            segments.append({})
            continue
        found = _SYNC_LINE.search(line)
        if found is None:
            continue
        what = f"{found.group(1)}: {classify_sync(found.group(3) or '?', home)}"
        segments[-1][what] = segments[-1].get(what, 0) + 1
    return {"segments": segments, "totals": [sum(s.values()) for s in segments]}


def strace_summary_count(argv: list[str], env: dict[str, str], stdin: bytes, out: Path) -> dict[str, int]:
    """The exact ``strace -f -c -e trace=fsync,fdatasync`` count of a process."""
    cmd = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out), *argv]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"strace -c run failed ({proc.returncode})")
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if parts and parts[-1] in ("fsync", "fdatasync"):
            # % time, seconds, usecs/call, calls, [errors], syscall
            counts[parts[-1]] = int(parts[3])
    return counts


def inproc_child(home_root: Path, session_id: str, k: int) -> None:
    """Child for strace: ``k`` commits then ``k`` reads, between markers.

    The home is opened and warmed up (one write, one read) before the first
    marker, so the segments hold only the steady-state per-operation syncs.
    """
    home = Home.open(home_root)
    data = payloads(k + 1, NOTE_BYTES)
    write_note(home, session_id, SAME_NOTE, data[-1])
    read_note(home, session_id, SAME_NOTE)

    def mark(name: str) -> None:
        try:
            os.open(name, os.O_RDONLY)
        except OSError:
            pass

    mark(MARK_BEGIN)
    for i in range(k):
        write_note(home, session_id, SAME_NOTE, data[i])
    mark(MARK_MIDDLE)
    for _ in range(k):
        read_note(home, session_id, SAME_NOTE)
    mark(MARK_END)
    home.close()


def count_syncs(home_root: Path, session_id: str, scratch: Path, cli: str, env: dict[str, str],
                payload: bytes, k: int) -> dict[str, Any]:
    """fsync/fdatasync per operation: CLI (whole process) and in-process."""
    result: dict[str, Any] = {"k_inproc": k}
    result["cli_write_strace_c"] = strace_summary_count([cli, "write", session_id, CLI_NOTE], env, payload,
                                                        scratch / "cli-write.c.txt")
    result["cli_read_strace_c"] = strace_summary_count([cli, "read", session_id, CLI_NOTE], env, b"",
                                                       scratch / "cli-read.c.txt")
    result["cli_write_by_target"] = strace_syncs([cli, "write", session_id, CLI_NOTE], env, payload, home_root,
                                                 scratch / "cli-write.y.txt")["segments"][0]
    result["cli_read_by_target"] = strace_syncs([cli, "read", session_id, CLI_NOTE], env, b"", home_root,
                                                scratch / "cli-read.y.txt")["segments"][0]
    child = [sys.executable, str(Path(__file__).resolve()), "--_child", str(home_root), session_id, str(k)]
    traced = strace_syncs(child, env, b"", home_root, scratch / "inproc.y.txt",
                          markers=(MARK_BEGIN, MARK_MIDDLE, MARK_END))
    segs = traced["segments"]  # [start-up, writes, reads, exit]
    result["inproc_write_total"] = segs[1]
    result["inproc_read_total"] = segs[2]
    result["inproc_per_write"] = sum(segs[1].values()) / k
    result["inproc_per_read"] = sum(segs[2].values()) / k
    return result


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------

@dataclass
class Report:
    machine: dict[str, Any]
    config: dict[str, Any]
    results: list[Stats] = field(default_factory=list)
    syncs: dict[str, Any] | None = None
    elapsed_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "config": self.config, "results": [asdict(r) for r in self.results],
                "syncs": self.syncs, "elapsed_s": self.elapsed_s}


def run(args: argparse.Namespace, workdir: Path) -> Report:
    n, warmup = args.ops, args.warmup
    report = Report(machine_info(workdir), {"ops": n, "warmup": warmup, "note_bytes": NOTE_BYTES,
                                            "cli_runs": args.cli_runs, "gc": "enabled (as in real use)"})
    os.umask(0o077)  # as the CLI does: the home must stay private
    data = payloads(n, NOTE_BYTES)
    warm = payloads(max(warmup, 1), NOTE_BYTES)
    add = report.results.append

    # -- plain baselines: write tmp + fsync + rename + fsync(dir) -------------
    plain_dir = workdir / "plain"
    plain_dir.mkdir(mode=0o700)
    dirfd = os.open(plain_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        log(f"baseline A: plain write+fsync+rename+fsync(dir), one target, {n} ops")
        for i in range(warmup):
            plain_write(dirfd, "same.tmp", "same.dat", warm[i % len(warm)])
        base_w_same = summarize("plain write+fsync+rename, same file", "write",
                                time_ops(n, lambda i: plain_write(dirfd, "same.tmp", "same.dat", data[i])))
        log("baseline A': the same, a new target file each time")
        for i in range(warmup):
            plain_write(dirfd, "warm.tmp", f"warm-{i:05d}.dat", warm[i % len(warm)])
        base_w_new = summarize("plain write+fsync+rename, new files", "write",
                               time_ops(n, lambda i: plain_write(dirfd, "new.tmp", f"n{i:05d}.dat", data[i])))
        log("baseline B: plain open+read+close of the same bytes")
        for _ in range(warmup):
            plain_read(dirfd, "same.dat")
        base_r_same = summarize(
            "plain open+read+close, same file", "read",
            time_ops(n, lambda i: plain_read(dirfd, "same.dat"),
                     lambda i, got: None if got == data[-1] else sys.exit("plain read mismatch")))
        base_r_new = summarize(
            "plain open+read+close, distinct files", "read",
            time_ops(n, lambda i: plain_read(dirfd, f"n{i:05d}.dat"),
                     lambda i, got: None if got == data[i] else sys.exit("plain read mismatch")))
    finally:
        os.close(dirfd)

    # -- scopefs in-process ----------------------------------------------------
    home_root = workdir / "home"
    home, session_id = setup_home(home_root)
    log(f"scopefs write_note: {n} revisions of one note")
    for i in range(warmup):
        write_note(home, session_id, SAME_NOTE, warm[i % len(warm)])
    first_rev = write_note(home, session_id, SAME_NOTE, warm[0]).revision_no

    def check_write(expect_created: bool) -> Callable[[int, Any], None]:
        def check(i: int, res: Any) -> None:
            if res.size != NOTE_BYTES or res.sha256 != hashlib.sha256(data[i]).hexdigest() or \
                    res.created is not expect_created:
                sys.exit(f"write_note result does not match what was written (op {i})")
        return check

    w_same = summarize("scopefs write_note, new revision", "write",
                       time_ops(n, lambda i: write_note(home, session_id, SAME_NOTE, data[i]), check_write(False)))
    last = read_note(home, session_id, SAME_NOTE)
    if last != data[-1]:
        sys.exit("the note does not read back as the last revision written")
    revisions = home.catalog(AGENT).execute(
        "SELECT count(*) FROM revisions v JOIN resources r USING (resource_id) WHERE r.path = ?",
        ("notes/bench.md",)).fetchall()[0][0]
    add(compare(w_same, base_w_same))
    w_same.note = f"revisions {first_rev + 1}..{first_rev + n} of one note ({revisions} rows)"

    log(f"scopefs write_note: {n} distinct new notes")
    for i in range(warmup):
        write_note(home, session_id, f"private/notes/warm-{i:05d}.md", warm[i % len(warm)])
    w_new = summarize("scopefs write_note, new note", "write",
                      time_ops(n, lambda i: write_note(home, session_id, f"private/notes/n{i:05d}.md", data[i]),
                               check_write(True)))
    add(compare(w_new, base_w_new))

    log(f"scopefs read_note: {n} verified reads of one note")
    for _ in range(warmup):
        read_note(home, session_id, SAME_NOTE)
    r_same = summarize("scopefs read_note, same note", "read",
                       time_ops(n, lambda i: read_note(home, session_id, SAME_NOTE),
                                lambda i, got: None if got == data[-1] else sys.exit("read_note mismatch")))
    add(compare(r_same, base_r_same))
    log(f"scopefs read_note: {n} verified reads of distinct notes")
    r_new = summarize("scopefs read_note, distinct notes", "read",
                      time_ops(n, lambda i: read_note(home, session_id, f"private/notes/n{i:05d}.md"),
                               lambda i, got: None if got == data[i] else sys.exit("read_note mismatch")))
    add(compare(r_new, base_r_new))
    audit_rows = home.state().execute("SELECT count(*) FROM audit").fetchall()[0][0]
    report.config["audit_rows_after_in_process"] = audit_rows
    home.close()

    for base in (base_w_same, base_w_new, base_r_same, base_r_new):
        add(base)

    # -- micro context: the units the figures are made of ----------------------
    log("micro: SHA-256 of 4 KiB, one durable SQLite commit")
    add(summarize("sha256 of 4 KiB", "micro", time_ops(n, lambda i: hashlib.sha256(data[i]).hexdigest())))
    add(summarize("SQLite commit, WAL + synchronous=FULL", "micro", sqlite_commit_micro(workdir, n),
                  note="BEGIN IMMEDIATE; one INSERT; COMMIT, with catalog.db.connect's pragmas"))

    # -- the command line --------------------------------------------------------
    cli = scopefs_executable()
    env = cli_env(home_root, workdir / "pycache", cached=True)
    runs = args.cli_runs
    if runs > 0:
        log(f"CLI: {runs} runs each of python -c pass, import (cached, uncached), scopefs write, scopefs read")
        cli_payload = data[0]
        # creates the note and fills the bytecode cache under the workdir
        time_subprocess(1, [cli, "write", session_id, CLI_NOTE], env, cli_payload)
        py_start = summarize("python -c pass (interpreter start)", "cli",
                             time_subprocess(runs, [sys.executable, "-c", "pass"], env))
        py_import = summarize("python -c 'import scopefs.cli'", "cli",
                              time_subprocess(runs, [sys.executable, "-c", "import scopefs.cli"], env),
                              note="bytecode cached (PYTHONPYCACHEPREFIX in the workdir)")
        no_cache = cli_env(home_root, None, cached=False)
        py_import_nc = summarize("  same, no bytecode cache", "cli",
                                 time_subprocess(runs, [sys.executable, "-c", "import scopefs.cli"], no_cache),
                                 note="PYTHONDONTWRITEBYTECODE=1 and no __pycache__: every module compiled")
        cli_w = summarize("scopefs write (subprocess)", "cli",
                          time_subprocess(runs, [cli, "write", session_id, CLI_NOTE], env, cli_payload))
        cli_r = summarize("scopefs read (subprocess)", "cli",
                          time_subprocess(runs, [cli, "read", session_id, CLI_NOTE], env,
                                          expect_stdout=cli_payload))
        add(compare(cli_w, base_w_same))
        add(compare(cli_r, base_r_same))
        add(py_start)
        add(py_import)
        add(py_import_nc)

    # -- fsync counts ----------------------------------------------------------------
    if args.strace and shutil.which("strace"):
        log("strace: counting fsync/fdatasync per CLI write/read and per in-process operation")
        scratch = workdir / "strace"
        scratch.mkdir()
        report.syncs = count_syncs(home_root, session_id, scratch, cli, env, data[0], args.strace_ops)
    elif args.strace:
        log("strace not found; fsync counts skipped")
    return report


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------

def fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def render(report: Report) -> str:
    m, c = report.machine, report.config
    fs = m["filesystem"]
    lines = [
        f"scopefs write/read benchmark: {c['ops']} ops of {c['note_bytes']} B, {c['warmup']} warm-up ops",
        f"machine: {m['nproc']} CPU ({m['cpu']}), kernel {m['kernel']}, Python {m['python']}, SQLite {m['sqlite']}",
        f"disk: {fs['source']} {fs['fstype']} mounted on {fs['mountpoint']}; workdir {m['workdir']}",
        "",
        f"| {'operation':<42} | {'n':>5} | {'p50 µs':>8} | {'p95 µs':>8} | {'p99 µs':>8} | {'mean µs':>8} "
        f"| {'ops/s':>8} | {'× base (mean)':>13} | {'× base (p50)':>12} |",
        "|" + "|".join("-" * w for w in (44, 7, 10, 10, 10, 10, 10, 15, 14)) + "|",
    ]
    for r in report.results:
        ratio_m = f"{r.ratio_mean:.1f}×" if r.ratio_mean is not None else ""
        ratio_p = f"{r.ratio_p50:.1f}×" if r.ratio_p50 is not None else ""
        lines.append(f"| {r.name:<42} | {r.n:>5} | {fmt(r.p50_us):>8} | {fmt(r.p95_us):>8} | {fmt(r.p99_us):>8} "
                     f"| {fmt(r.mean_us):>8} | {fmt(r.ops_per_s):>8} | {ratio_m:>13} | {ratio_p:>12} |")
    lines.append("")
    lines.append("drift (mean of the first tenth -> last tenth of each scopefs series, µs):")
    for r in report.results:
        if r.name.startswith("scopefs") and r.first_tenth_mean_us is not None and r.last_tenth_mean_us is not None:
            lines.append(f"  {r.name:<42} {fmt(r.first_tenth_mean_us):>8} -> {fmt(r.last_tenth_mean_us):>8}")
    lines.append("")
    lines.append("baselines of the ratios:")
    for r in report.results:
        if r.baseline:
            lines.append(f"  {r.name}  ->  {r.baseline}")
    if report.syncs:
        s = report.syncs
        lines += ["", "fsync/fdatasync calls (strace):",
                  f"  scopefs write, whole CLI process (strace -f -c): {s['cli_write_strace_c']}",
                  f"  scopefs read,  whole CLI process (strace -f -c): {s['cli_read_strace_c']}",
                  "  CLI write by target:"]
        lines += [f"    {count:>3}  {what}" for what, count in sorted(s["cli_write_by_target"].items())]
        lines.append("  CLI read by target:")
        lines += [f"    {count:>3}  {what}" for what, count in sorted(s["cli_read_by_target"].items())]
        lines.append(f"  in-process, per write_note (mean of {s['k_inproc']}): {s['inproc_per_write']:.2f}")
        lines += [f"    {count / s['k_inproc']:>6.2f}  {what}" for what, count in sorted(s["inproc_write_total"].items())]
        lines.append(f"  in-process, per read_note (mean of {s['k_inproc']}): {s['inproc_per_read']:.2f}")
        lines += [f"    {count / s['k_inproc']:>6.2f}  {what}" for what, count in sorted(s["inproc_read_total"].items())]
    lines += ["", f"elapsed: {report.elapsed_s:.1f} s"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=int, default=1000, help="timed operations per series (default 1000)")
    p.add_argument("--warmup", type=int, default=20, help="untimed operations before each series (default 20)")
    p.add_argument("--cli-runs", type=int, default=50, help="subprocess runs per CLI series; 0 skips (default 50)")
    p.add_argument("--dir", type=Path, default=DEFAULT_PARENT,
                   help="parent of the temporary working directory (default bench/out); must be a real disk")
    p.add_argument("--keep", action="store_true", help="keep the working directory afterwards")
    p.add_argument("--allow-tmpfs", action="store_true", help="run even if --dir is on tmpfs/ramfs")
    p.add_argument("--no-strace", dest="strace", action="store_false", help="skip the fsync counts")
    p.add_argument("--strace-ops", type=int, default=200, help="operations traced in-process for fsync counts")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ops < 1 or args.warmup < 0 or args.cli_runs < 0 or args.strace_ops < 1:
        p.error("--ops and --strace-ops must be >= 1, --warmup and --cli-runs >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args._child:
        home_root, session_id, k = args._child
        inproc_child(Path(home_root), session_id, int(k))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    fs = filesystem_of(args.dir)
    if fs["fstype"] in ("tmpfs", "ramfs") and not args.allow_tmpfs:
        log(f"{args.dir} is on {fs['fstype']}: fsync is free there; pick a real disk with --dir")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="write_read-", dir=args.dir))
    started = time.perf_counter()
    try:
        report = run(args, workdir)
        report.elapsed_s = time.perf_counter() - started
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        json.dump(report.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
