#!/usr/bin/env python3
"""Write/read benchmark: the full scopefs transaction next to plain file I/O.

What the issue asks for: a commit of a 4 KiB note through the full write
transaction (DESIGN.md §6) and a verified read of it, each timed over 1,000
operations, reported next to a plain write+fsync+rename and a plain read of
the same bytes on the same disk. A number on its own says little (a VM disk
can be 10x slower than a laptop NVMe), so every scopefs figure is printed as
a ratio to its plain baseline, timed interleaved with it op by op in the same
directory.

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

    from scopefs.catalog import identity
    from scopefs.catalog.agents import add_agent
    from scopefs.catalog.db import connect, immediate
    from scopefs.catalog.home import Home
    from scopefs.catalog.reader import read_note
    from scopefs.catalog.sessions import DirectMessage, open_session
    from scopefs.catalog.subject import SubjectKind
    from scopefs.writer.steps import Step, set_hook
    from scopefs.writer.transaction import write_note
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
    """Percentiles and mean from raw samples, plus first/last tenth for drift.

    The drift pair is there because a catalog that grows with every write
    could make op 1,000 slower than op 1, which one mean would hide.
    """
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


@dataclass
class Series:
    """One timed operation kind: what to run, how to check it, its samples."""

    name: str
    group: str
    op: Callable[[int], Any]
    check: Callable[[int, Any], None] | None = None
    samples: list[int] = field(default_factory=list)

    def stats(self) -> Stats:
        return summarize(self.name, self.group, self.samples)


def run_interleaved(n: int, series: Sequence[Series]) -> None:
    """Time op ``i`` of every series before op ``i + 1`` of any (ABBA order).

    Interleaving keeps a slow patch of the shared disk from landing on one
    series only; reversing the order every other round keeps "goes right
    after the other one's fsync" from always favouring the same series.
    Checks run outside the timed region.
    """
    clock = time.perf_counter_ns
    for i in range(n):
        for s in (series if i % 2 == 0 else list(reversed(series))):
            start = clock()
            result = s.op(i)
            s.samples.append(clock() - start)
            if s.check is not None:
                s.check(i, result)


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


def source_version() -> dict[str, Any]:
    """The commit measured, and any uncommitted change outside bench/.

    The code under test moves quickly; a figure is only useful next to the
    exact version that produced it.
    """
    repo = BENCH_DIR.parent

    def git(*argv: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True)
        return proc.stdout.rstrip("\n") if proc.returncode == 0 else ""

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if not line[3:].startswith("bench/")]
    return {"commit": git("rev-parse", "--short=12", "HEAD") or "?", "subject": git("log", "-1", "--format=%s"),
            "uncommitted_outside_bench": dirty}


def machine_info(workdir: Path) -> dict[str, Any]:
    """Everything needed to judge whether two runs are comparable."""
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
        "source": source_version(),
    }


def fsync_probe(directory: Path, n: int = 100) -> dict[str, float]:
    """p50/p95 of a bare 4 KiB overwrite + fsync, to record the disk's state.

    On a shared or rate-limited virtual disk, fsync latency is bimodal (here
    ~0.2 ms when idle, ~4 ms when another tenant is busy). Taken before and
    after the run, this says which regime the figures were measured in.
    """
    path = directory / "probe.dat"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    samples = []
    try:
        for _ in range(n):
            os.pwrite(fd, os.urandom(NOTE_BYTES), 0)
            start = time.perf_counter_ns()
            os.fsync(fd)
            samples.append(time.perf_counter_ns() - start)
    finally:
        os.close(fd)
        path.unlink()
    samples.sort()
    return {"p50_us": percentile(samples, 50) / 1e3, "p95_us": percentile(samples, 95) / 1e3}


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

def write_fsynced(tmp: str | os.PathLike[str], data: bytes, *, dir_fd: int | None = None) -> None:
    """Create ``tmp`` exclusively, write all of ``data`` and fsync it."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def plain_write(dirfd: int, tmp: str, target: str, data: bytes) -> None:
    """The textbook durable replace: write tmp, fsync, rename, fsync dir."""
    write_fsynced(tmp, data, dir_fd=dirfd)
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


# What each step boundary of the transaction closes (DESIGN.md §6), for the
# per-phase breakdown taken through writer.steps' own hook.
PHASES: tuple[tuple[Step | None, str], ...] = (
    (Step.STAGED, "authorize, resolve, decide; stage + fsync (1 fsync)"),
    (Step.PENDING, "revalidate; txn 1: pending revision + intent + outbox (1 commit)"),
    (Step.RENAMED, "renameat2 staged -> final locator"),
    (Step.FINALIZED, "fsync file, fsync store dir, re-hash (2 fsyncs)"),
    (Step.ACTIVATED, "revalidate; txn 2: activate (1 commit)"),
    (Step.AUDITED, "audit drain: state insert + outbox mark (2 commits)"),
    (None, "return"),
)


def write_breakdown(home: Home, session_id: str, data: Sequence[bytes], n: int) -> list[dict[str, Any]]:
    """Mean and p50 of each phase of ``write_note``, via the checkpoint hook.

    ``writer.steps`` is the hook the crash tests use; production calls it at
    every step boundary anyway, so recording a timestamp there measures the
    real code with no patching. Run as its own series so the headline
    figures are taken without any hook installed.
    """
    marks: list[tuple[Step | None, int]] = []
    per_phase: dict[str, list[int]] = {label: [] for _, label in PHASES}
    set_hook(lambda step: marks.append((step, time.perf_counter_ns())))
    try:
        for i in range(n):
            marks.clear()
            start = time.perf_counter_ns()
            write_note(home, session_id, SAME_NOTE, data[i % len(data)])
            marks.append((None, time.perf_counter_ns()))
            at = dict(marks)
            previous = start
            for step, label in PHASES:
                per_phase[label].append(at[step] - previous)
                previous = at[step]
    finally:
        set_hook(None)
    total = sum(sum(v) for v in per_phase.values())
    return [{"phase": label, "mean_us": sum(v) / len(v) / 1e3, "p50_us": percentile(sorted(v), 50) / 1e3,
             "share": sum(v) / total} for label, v in per_phase.items()]


# ---------------------------------------------------------------------------
# the command line, as operators run it
# ---------------------------------------------------------------------------

def scopefs_executable() -> str:
    """The console script of this venv, so the CLI measured is this checkout's."""
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


def subprocess_series(name: str, group: str, argv: list[str], env: dict[str, str], stdin: bytes = b"",
                      expect_stdout: bytes | None = None) -> Series:
    """Wall time of a whole process, fork to exit; every run must succeed."""

    def op(i: int) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(argv, input=stdin, capture_output=True, env=env)

    def check(i: int, proc: subprocess.CompletedProcess[bytes]) -> None:
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        if expect_stdout is not None and proc.stdout != expect_stdout:
            raise SystemExit(f"{name} returned other bytes than were written")

    return Series(name, group, op, check)


# ---------------------------------------------------------------------------
# fsync counting with strace
# ---------------------------------------------------------------------------

# "(deleted)" follows the path of the O_TMPFILE-created staged file's fd.
_SYNC_LINE = re.compile(r"\b(fsync|fdatasync)\((\d+)(?:<([^>]*)>(?:\(deleted\))?)?\)\s*=\s*(-?\d+)")


def classify_sync(path: str, home: Path) -> str:
    """Name what an fsync'd descriptor is, from the path strace -y shows."""
    try:
        rel = Path(path).relative_to(home).parts
    except ValueError:
        return f"outside home: {path}"
    if not rel:
        return "home directory (holds state.sqlite-wal)"
    if rel[0] == "state.sqlite-wal":
        return "state.sqlite-wal (state WAL commit)"
    if rel[0] == "state.sqlite":
        return "state.sqlite (checkpoint)"
    if len(rel) == 2 and rel[0] == "agents":
        return "agent directory (holds catalog.sqlite-wal)"
    if len(rel) >= 3 and rel[0] == "agents":
        rest = rel[2:]
        if rest[0] == "catalog.sqlite-wal":
            return "catalog.sqlite-wal (catalog WAL commit)"
        if rest[0] == "catalog.sqlite":
            return "catalog.sqlite (checkpoint)"
        if rest[0] == "staging":
            # The staged file is created O_TMPFILE: its fd keeps the name
            # "staging/#<inode>" after the link and the rename, so one label
            # covers both of its fsyncs (staged, then as the artifact).
            return "staged file / artifact (one fd)" if len(rest) == 2 else "staging directory"
        if rest[:2] == ("memory-scopes", "v1"):
            depth = len(rest) - 2
            names = {0: "scopes directory", 1: "store directory", 2: "artifact (after rename)"}
            return names.get(depth, "artifact area")
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
    """One run: where, how, the figures, and the fsync accounting behind them."""

    machine: dict[str, Any]
    config: dict[str, Any]
    results: list[Stats] = field(default_factory=list)
    syncs: dict[str, Any] | None = None
    breakdown: list[dict[str, Any]] | None = None
    elapsed_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "config": self.config, "results": [asdict(r) for r in self.results],
                "breakdown": self.breakdown, "syncs": self.syncs, "elapsed_s": self.elapsed_s}


def run(args: argparse.Namespace, workdir: Path) -> Report:
    """Every comparison is timed interleaved, op by op, on one disk.

    This VM shares its two CPUs and its disk with other work, and fsync
    latency drifted 20x within one run when series were timed one after the
    other. Alternating the scopefs operation with its baseline (ABBA order,
    so neither always goes first) exposes both to the same conditions, which
    is what makes the ratio meaningful even when the absolute numbers move.
    """
    n, warmup = args.ops, args.warmup
    report = Report(machine_info(workdir), {
        "ops": n, "warmup": warmup, "note_bytes": NOTE_BYTES, "cli_runs": args.cli_runs,
        "method": "series of one comparison interleaved op by op, ABBA order; gc enabled (as in real use)",
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "fsync_probe_before": fsync_probe(workdir),
    })
    os.umask(0o077)  # as the CLI does: the home must stay private
    data = payloads(n, NOTE_BYTES)
    warm = payloads(max(warmup, 1), NOTE_BYTES)

    plain_dir = workdir / "plain"
    plain_dir.mkdir(mode=0o700)
    dirfd = os.open(plain_dir, os.O_RDONLY | os.O_DIRECTORY)
    home_root = workdir / "home"
    home, session_id = setup_home(home_root)
    micro = connect(workdir / "micro.sqlite", create=True)
    micro.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")

    def sqlite_commit(i: int) -> None:
        with immediate(micro):
            micro.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 64,))

    def check_write(expect_created: bool) -> Callable[[int, Any], None]:
        def check(i: int, res: Any) -> None:
            if res.size != NOTE_BYTES or res.sha256 != hashlib.sha256(data[i]).hexdigest() or \
                    res.created is not expect_created:
                sys.exit(f"write_note result does not match what was written (op {i})")
        return check

    def same_bytes(expected: Callable[[int], bytes], what: str) -> Callable[[int, Any], None]:
        def check(i: int, got: Any) -> None:
            if got != expected(i):
                sys.exit(f"{what} returned other bytes than were written (op {i})")
        return check

    try:
        log(f"warm-up: {warmup} ops of each kind")
        for i in range(warmup):
            w = warm[i % len(warm)]
            plain_write(dirfd, "same.tmp", "same.dat", w)
            plain_write(dirfd, "warm.tmp", f"warm-{i:05d}.dat", w)
            write_note(home, session_id, SAME_NOTE, w)
            write_note(home, session_id, f"private/notes/warm-{i:05d}.md", w)
            sqlite_commit(i)
            plain_read(dirfd, "same.dat")
            read_note(home, session_id, SAME_NOTE)
        same_resource = write_note(home, session_id, SAME_NOTE, warm[0]).resource_id

        log(f"writes, one note: {n} x (plain write+fsync+rename | write_note | SQLite commit), interleaved")
        base_w_same = Series("plain write+fsync+rename, same file", "write",
                             lambda i: plain_write(dirfd, "same.tmp", "same.dat", data[i]))
        w_same = Series("scopefs write_note, new revision", "write",
                        lambda i: write_note(home, session_id, SAME_NOTE, data[i]), check_write(False))
        sql = Series("SQLite commit, WAL + synchronous=FULL", "micro", sqlite_commit)
        run_interleaved(n, [base_w_same, w_same, sql])
        if read_note(home, session_id, SAME_NOTE) != data[-1]:
            sys.exit("the note does not read back as the last revision written")

        log(f"writes, new notes: {n} x (plain write+fsync+rename to a new name | write_note of a new note)")
        base_w_new = Series("plain write+fsync+rename, new files", "write",
                            lambda i: plain_write(dirfd, "new.tmp", f"n{i:05d}.dat", data[i]))
        w_new = Series("scopefs write_note, new note", "write",
                       lambda i: write_note(home, session_id, f"private/notes/n{i:05d}.md", data[i]), check_write(True))
        run_interleaved(n, [base_w_new, w_new])

        log(f"reads, one note: {n} x (plain open+read+close | read_note | sha256 of 4 KiB)")
        base_r_same = Series("plain open+read+close, same file", "read", lambda i: plain_read(dirfd, "same.dat"),
                             same_bytes(lambda i: data[-1], "plain read"))
        r_same = Series("scopefs read_note, same note", "read", lambda i: read_note(home, session_id, SAME_NOTE),
                        same_bytes(lambda i: data[-1], "read_note"))
        sha = Series("sha256 of 4 KiB", "micro", lambda i: hashlib.sha256(data[i]).hexdigest())
        run_interleaved(n, [base_r_same, r_same, sha])

        log(f"reads, distinct notes: {n} x (plain open+read+close | read_note), each op a different note")
        base_r_new = Series("plain open+read+close, distinct files", "read",
                            lambda i: plain_read(dirfd, f"n{i:05d}.dat"), same_bytes(lambda i: data[i], "plain read"))
        r_new = Series("scopefs read_note, distinct notes", "read",
                       lambda i: read_note(home, session_id, f"private/notes/n{i:05d}.md"),
                       same_bytes(lambda i: data[i], "read_note"))
        run_interleaved(n, [base_r_new, r_new])

        if args.breakdown_ops:
            log(f"write_note phase breakdown over {args.breakdown_ops} ops (writer.steps hook)")
            report.breakdown = write_breakdown(home, session_id, data, args.breakdown_ops)
        catalog = home.catalog(AGENT)
        report.config["revisions_of_same_note"] = catalog.execute(
            "SELECT count(*) FROM revisions WHERE resource_id = ?", (same_resource,)).fetchall()[0][0]
        audit_rows = home.state().execute("SELECT count(*) FROM audit").fetchall()[0][0]
        report.config["audit_rows_after_in_process"] = audit_rows
    finally:
        os.close(dirfd)
        micro.close()
        home.close()

    summary = {s.name: s.stats() for s in (base_w_same, w_same, sql, base_w_new, w_new, base_r_same, r_same, sha,
                                            base_r_new, r_new)}
    add = report.results.append
    add(compare(summary[w_same.name], summary[base_w_same.name]))
    add(compare(summary[w_new.name], summary[base_w_new.name]))
    add(compare(summary[r_same.name], summary[base_r_same.name]))
    add(compare(summary[r_new.name], summary[base_r_new.name]))
    for name in (base_w_same.name, base_w_new.name, base_r_same.name, base_r_new.name):
        add(summary[name])
    add(compare(summary[sql.name], summary[base_w_same.name]))
    summary[sql.name].note = "BEGIN IMMEDIATE; one INSERT; COMMIT, with catalog.db.connect's pragmas"
    add(compare(summary[sha.name], summary[base_r_same.name]))

    # -- the command line --------------------------------------------------------
    cli = scopefs_executable()
    env = cli_env(home_root, workdir / "pycache", cached=True)
    runs = args.cli_runs
    if runs > 0:
        log(f"CLI: {runs} x (python -c pass | import cached | import uncached | scopefs write | scopefs read)")
        cli_payload = data[0]
        # creates the note and fills the bytecode cache under the workdir
        for _ in range(2):
            subprocess_series("warm-up", "cli", [cli, "write", session_id, CLI_NOTE], env, cli_payload).op(0)
        no_cache = cli_env(home_root, None, cached=False)
        group = [
            subprocess_series("python -c pass (interpreter start)", "cli", [sys.executable, "-c", "pass"], env),
            subprocess_series("python -c 'import scopefs.cli.main'", "cli",
                              [sys.executable, "-c", "import scopefs.cli.main"],
                              env),
            subprocess_series("import scopefs.cli.main, no bytecode cache", "cli",
                              [sys.executable, "-c", "import scopefs.cli.main"],
                              no_cache),
            subprocess_series("scopefs write (subprocess)", "cli", [cli, "write", session_id, CLI_NOTE], env,
                              cli_payload),
            subprocess_series("scopefs read (subprocess)", "cli", [cli, "read", session_id, CLI_NOTE], env,
                              expect_stdout=cli_payload),
        ]
        run_interleaved(runs, group)
        py_start, py_import, py_import_nc, cli_w, cli_r = (s.stats() for s in group)
        py_import.note = "bytecode cached (PYTHONPYCACHEPREFIX in the workdir)"
        py_import_nc.note = "PYTHONDONTWRITEBYTECODE=1, no __pycache__: every module compiled on each run"
        cli_w.note = f"{cli_w.mean_us / summary[w_same.name].mean_us:.0f}x the in-process write_note"
        cli_r.note = f"{cli_r.mean_us / summary[r_same.name].mean_us:.0f}x the in-process read_note"
        add(compare(cli_w, summary[base_w_same.name]))
        add(compare(cli_r, summary[base_r_same.name]))
        add(py_start)
        add(py_import)
        add(py_import_nc)

    # -- fsync counts ----------------------------------------------------------------
    if args.strace and shutil.which("strace"):
        log(f"strace: fsync/fdatasync per CLI write/read, and per in-process op over {args.strace_ops} ops")
        scratch = workdir / "strace"
        scratch.mkdir()
        report.syncs = count_syncs(home_root, session_id, scratch, cli, env, data[0], args.strace_ops)
    elif args.strace:
        log("strace not found; fsync counts skipped")
    report.config["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    report.config["fsync_probe_after"] = fsync_probe(workdir)
    return report


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------

def fmt(value: float) -> str:
    """Three significant-ish digits: enough to compare, not false precision."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def render(report: Report) -> str:
    """The human table: conditions first, since they decide how to read it."""
    m, c = report.machine, report.config
    fs = m["filesystem"]
    lines = [
        f"scopefs write/read benchmark: {c['ops']} ops of {c['note_bytes']} B, {c['warmup']} warm-up ops",
        f"machine: {m['nproc']} CPU ({m['cpu']}), kernel {m['kernel']}, Python {m['python']}, SQLite {m['sqlite']}",
        f"disk: {fs['source']} {fs['fstype']} mounted on {fs['mountpoint']}; workdir {m['workdir']}",
        "code: commit {c} ({s}){d}".format(
            c=m.get("source", {}).get("commit", "?"), s=m.get("source", {}).get("subject", ""),
            d="; uncommitted: " + ", ".join(m["source"]["uncommitted_outside_bench"])
            if m.get("source", {}).get("uncommitted_outside_bench") else ""),
        "conditions: 4 KiB fsync p50/p95 {b[p50_us]:.0f}/{b[p95_us]:.0f} µs before, {a[p50_us]:.0f}/{a[p95_us]:.0f} µs"
        " after; loadavg {lb} -> {la}".format(b=c["fsync_probe_before"], a=c["fsync_probe_after"],
                                               lb=" ".join(c["loadavg_before"]), la=" ".join(c["loadavg_after"])),
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
    if report.breakdown:
        lines += ["", "write_note by phase (mean / p50 µs, share of the mean):"]
        lines += [f"  {b['mean_us']:>8.0f} / {b['p50_us']:>8.0f}  {b['share']:>5.1%}  {b['phase']}"
                  for b in report.breakdown]
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
        lines += [f"    {count / s['k_inproc']:>6.2f}  {what}"
                  for what, count in sorted(s["inproc_write_total"].items())]
        lines.append(f"  in-process, per read_note (mean of {s['k_inproc']}): {s['inproc_per_read']:.2f}")
        lines += [f"    {count / s['k_inproc']:>6.2f}  {what}"
                  for what, count in sorted(s["inproc_read_total"].items())]
    lines += ["", f"elapsed: {report.elapsed_s:.1f} s"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options; ``--_child`` is the internal entry point of the strace child."""
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
    p.add_argument("--breakdown-ops", type=int, default=200,
                   help="extra write_note ops timed phase by phase; 0 skips (default 200)")
    p.add_argument("--from-json", type=Path, metavar="FILE", help="print the table of a saved --json run and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ops < 1 or args.strace_ops < 1 or min(args.warmup, args.cli_runs, args.breakdown_ops) < 0:
        p.error("--ops and --strace-ops must be >= 1; --warmup, --cli-runs and --breakdown-ops >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run in a fresh workdir on a real disk, print, and clean up."""
    args = parse_args(argv)
    if args._child:
        home_root, session_id, k = args._child
        inproc_child(Path(home_root), session_id, int(k))
        return 0
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        report = Report(saved["machine"], saved["config"], [Stats(**r) for r in saved["results"]],
                        saved.get("syncs"), saved.get("breakdown"), saved.get("elapsed_s", 0.0))
        print(render(report))
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
