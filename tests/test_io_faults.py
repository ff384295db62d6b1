"""Injected I/O errors end in a clean failure and never in trusted bytes.

DESIGN.md §6: a write either activates a revision whose bytes and catalog
rows are durable, or fails with a clear error, leaving no staged file and
the previous revision active. An fsync error is final: the write fails and
nothing later (a retry, recovery, ``doctor --fix``) activates the bytes
whose sync failed.

Three injection layers, none of which touches the code under test:

1. strace fails the Nth ``fsync`` / ``fdatasync`` of the real CLI with EIO,
   for every N observed in an uninjected write, then one N past the end;
2. a tiny tmpfs fails real writes with ENOSPC (staging, then SQLite's WAL),
   and a tmpfs without free inodes fails file and directory creation;
3. an apsw VFS inheriting the default one fails SQLite's Nth ``xWrite`` or
   ``xSync`` in-process, once (transient) or from N on (a dead disk).

Each test sweeps all its call sites and reports every bad N at once.
"""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from scopefs.catalog.errors import BadInput, Denied, ScopefsError, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.reader import read_note
from scopefs.writer import placing
from scopefs.writer.recovery import inspect
from scopefs.writer.steps import Step, set_hook
from scopefs.writer.transaction import WriteResult, write_note
from tests.conftest import Cli
from tests.faultkit import (
    COMMIT,
    CONTENT_FILES,
    SQLITE_DIRS,
    FaultPlan,
    Prepared,
    Target,
    Trace,
    catalog_leftovers,
    classify,
    faulty_vfs,
    free_bytes,
    grow_tmpfs,
    one_line_error,
    prepare,
    staging_entries,
    strace_cli,
    tmpfs,
)

TARGETS = ["replace", "first"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The seed scenario, built once through the CLI; every run works on a copy."""
    return prepare(tmp_path_factory.mktemp("io-faults") / "home")


@pytest.fixture(scope="module")
def ramdisk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tmpfs for the in-process VFS sweeps.

    Their faults are injected above the filesystem, so the filesystem's own
    fsync cost buys nothing there; on this disk it would make the few hundred
    runs take half a minute instead of a few seconds.
    """
    with tmpfs(tmp_path_factory.mktemp("ramdisk"), "size=256m,mode=0700") as mnt:
        yield mnt


# -- checks shared by the CLI runs ----------------------------------------------------

def check_cli_read(cli: Cli, target: Target, expected: bytes | None, when: str) -> list[str]:
    """The note reads back ``expected`` byte for byte; ``None``: it does not exist."""
    result = cli("read", target.session, target.path)
    if expected is None:
        if result.code != Denied.exit_code or result.out:
            return [f"{when}: the note should not exist, read gave exit {result.code} and {len(result.out)} bytes"]
        return []
    if result.code != 0:
        return [f"{when}: read failed with exit {result.code}: {result.err.strip()}"]
    if result.out != expected:
        which = "the new content" if result.out != target.old else "the old content"
        return [f"{when}: read returned {which} ({len(result.out)} bytes), want {len(expected)} bytes"]
    return []


def check_settled(cli: Cli, home: Path, agent: str, target: Target, expected: bytes | None) -> list[str]:
    """Run ``doctor --fix`` once; afterwards nothing is pending and ``expected`` is what reads back.

    The read after the repair is the "never trusted later" check: if
    recovery completed an intent whose sync had failed, the new bytes would
    show up here.
    """
    problems = []
    doctor = cli("doctor", "--fix")
    if doctor.code != 0:
        problems.append(f"doctor --fix exited {doctor.code}: {doctor.text.strip()!r} {doctor.err.strip()!r}")
    leftovers = {k: v for k, v in catalog_leftovers(home, agent).items() if v}
    if leftovers:
        problems.append(f"after doctor --fix the catalog still holds {leftovers}")
    if staging_entries(home, agent):
        problems.append(f"after doctor --fix staging still holds {staging_entries(home, agent)}")
    problems += check_cli_read(cli, target, expected, "after doctor --fix")
    return problems


# -- 1. strace: EIO from fsync / fdatasync at every call site -------------------------

def _window_end(kinds: list[str]) -> int:
    """Index of the last sync the activation commit depends on.

    The write's content syncs (staged file, final artifact, store
    directory) come first; the catalog WAL syncs right after them are the
    activation commit. Everything up to there must succeed for the write
    to be acknowledged; later syncs (audit drain, checkpoint on close) come
    after the revision is durably active.
    """
    content = [i for i, k in enumerate(kinds) if k in ("artifact", "store-dir")]
    assert content, f"no artifact or store-directory sync in an uninjected write: {kinds}"
    end = None
    for i in range(content[-1] + 1, len(kinds)):
        if kinds[i] != "catalog-wal":
            break
        end = i
    assert end is not None, f"no catalog commit after the content syncs: {kinds}"
    return end


def _redundant_dir_sync(trace: Trace, index: int, window_end: int, preexisting_wals: set[str]) -> bool:
    """True if a failed SQLite directory sync cannot cost an acknowledged commit.

    SQLite syncs a WAL's directory once, after creating the WAL file, so
    that the file's name is durable. Its failure is harmless only if every
    WAL in that directory existed before the run, or the directory was
    synced successfully by another call after the WAL was opened and before
    the activation commit.
    """
    directory = trace.syncs[index].path
    wals = [w for w in trace.wal_opened_before_sync if str(Path(w).parent) == directory]
    if not wals:
        return False
    for wal in wals:
        if wal in preexisting_wals:
            continue
        opened = trace.wal_opened_before_sync[wal]
        if not any(c.ok and c.path == directory and c.index != index and opened <= c.index <= window_end
                   for c in trace.syncs):
            return False
    return True


@pytest.mark.root
@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("syscall", ["fsync", "fdatasync"])
def test_sync_eio_at_every_call_site_fails_cleanly_and_is_never_trusted(
        prepared: Prepared, tmp_path: Path, syscall: str, target_name: str) -> None:
    """EIO at the Nth fsync/fdatasync of ``scopefs write``, for every N, then N past the end.

    A failed write exits 1 with one stderr line, leaves staging empty and the
    old revision active; ``doctor --fix`` settles everything and still the
    old bytes read back, so the bytes whose sync failed are never trusted.
    A sync failure before the activation commit must never be acknowledged.
    fdatasync is what SQLite uses for its WAL and directories; fsync is what
    the writer uses for the staged file, the artifact and its directories.
    """
    target, agent = prepared.target(target_name), prepared.agent
    base_home = prepared.clone(tmp_path / "baseline")
    result, baseline = strace_cli(base_home, ["write", target.session, target.path], stdin=b"baseline\n",
                                  trace_file=tmp_path / "baseline.trace")
    assert result.code == 0, f"uninjected write failed: {result.err}"
    assert not baseline.injected()
    base_kinds = [classify(base_home, agent, c.path) for c in baseline.syncs]
    window_end = _window_end(base_kinds)
    total = baseline.count(syscall)
    assert total >= (3 if syscall == "fsync" else 2), f"too few {syscall} calls observed: {base_kinds}"
    shutil.rmtree(base_home)

    problems: list[str] = []
    for n in range(1, total + 2):
        home = prepared.clone(tmp_path / f"n{n}")
        cli = Cli(home)
        new = f"new content; {syscall} EIO at call {n}\n".encode()
        wal_paths = (home / "state.sqlite-wal", home / "agents" / agent / "catalog.sqlite-wal")
        preexisting = {str(p) for p in wal_paths if p.exists()}
        result, trace = strace_cli(home, ["write", target.session, target.path], stdin=new,
                                   trace_file=tmp_path / f"n{n}.trace", inject=(syscall, n))
        injected = trace.injected()
        run: list[str] = []
        critical = False
        if n > total:
            if injected:
                run.append(f"an injection hit although only {total} {syscall} calls were observed")
            if result.code != 0:
                run.append(f"uninjected write failed: exit {result.code}: {result.err.strip()}")
            where = "no injection"
        elif len(injected) != 1 or injected[0].syscall != syscall:
            problems.append(f"{syscall} #{n}: strace injected {len(injected)} failures, want exactly 1")
            shutil.rmtree(home)
            continue
        else:
            call = injected[0]
            kind = classify(home, agent, call.path)
            kinds = [classify(home, agent, c.path) for c in trace.syncs]
            where = f"{kind} (sync {call.index + 1} of the write)"
            if kinds[:call.index + 1] != base_kinds[:call.index + 1]:
                run.append(f"the syncs before the injection differ from the uninjected run: {kinds} vs {base_kinds}")
            critical = call.index <= window_end and not (
                kind in SQLITE_DIRS and _redundant_dir_sync(trace, call.index, window_end, preexisting))
            if kind in CONTENT_FILES and any(c.path == call.path for c in trace.syncs[call.index + 1:]):
                run.append("the file whose sync failed was synced again (retried) in the same run")

        if result.code == 0:
            if critical:
                run.append("the write was acknowledged (exit 0) although a sync it depends on failed:"
                           " the failed sync was trusted"
                           + (" (SQLite ignores the result of the directory sync it issues after creating a"
                              " WAL file, so the new WAL's directory entry is not known to be durable)"
                              if kind in SQLITE_DIRS else ""))
            expected: bytes | None = new
        else:
            why = one_line_error(result)
            if why:
                run.append(why)
            if result.out:
                run.append(f"a failed write printed on stdout: {result.out!r}")
            if staging_entries(home, agent):
                run.append(f"the failed write left staged files: {staging_entries(home, agent)}")
            expected = target.old
        run += check_cli_read(cli, target, expected, "right after the write")
        run += check_settled(cli, home, agent, target, expected)
        problems += [f"{syscall} #{n} on {where}, write exit {result.code} {result.err.strip()!r}: {p}" for p in run]
        shutil.rmtree(home)
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


# -- 2. ENOSPC on a tiny tmpfs -------------------------------------------------------------

_NO_SPACE = re.compile(r"no space|full", re.IGNORECASE)


@pytest.mark.root
@pytest.mark.parametrize("target_name", TARGETS)
def test_note_larger_than_free_space_fails_cleanly(prepared: Prepared, tmp_path: Path, target_name: str) -> None:
    """A note that cannot fit: one clear line, no staged file left, nothing activated."""
    target, agent = prepared.target(target_name), prepared.agent
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "size=1m,mode=0700"):
        home = prepared.clone(mnt / "home")
        cli = Cli(home)
        size = free_bytes(mnt) + 256 * 1024
        result = cli("write", target.session, target.path, stdin=b"z" * size)
        assert one_line_error(result) is None, one_line_error(result)
        assert _NO_SPACE.search(result.err), f"the error does not say the disk is full: {result.err!r}"
        assert result.out == b""
        assert staging_entries(home, agent) == [], "the staged file was not removed"
        assert free_bytes(mnt) > 256 * 1024, "the failed write still holds the space it staged"
        grow_tmpfs(mnt, "64m")  # room to inspect; the state to inspect is what the failure left
        problems = check_cli_read(cli, target, target.old, "after the failure")
        problems += check_settled(cli, home, agent, target, target.old)
        assert not problems, "\n".join(problems)


@pytest.mark.root
def test_writes_near_the_space_limit_succeed_or_fail_cleanly(prepared: Prepared, tmp_path: Path) -> None:
    """Sizes that fit in staging but leave too little for SQLite's WAL appends.

    Sweeping the note size downward from "fills the disk" crosses the point
    where the staged file fits but a WAL append of the pending or the
    activation commit fails, then the point where everything fits. Every
    outcome must be a clean success or a clean failure, with nothing pending
    after ``doctor --fix``. The sweep must reach both kinds of outcome, and a
    failure past staging, or it proved nothing.
    """
    target, agent = prepared.replace, prepared.agent
    mnt = tmp_path / "mnt"
    outcomes: list[str] = []
    problems: list[str] = []
    for margin in range(0, 272 * 1024, 16 * 1024):
        with tmpfs(mnt, "size=1m,mode=0700"):
            home = prepared.clone(mnt / "home")
            cli = Cli(home)
            size = free_bytes(mnt) - margin
            new = (f"margin {margin}; ".encode() * (size // 10 + 1))[:size]
            result = cli("write", target.session, target.path, stdin=new)
            run: list[str] = []
            if result.code == 0:
                outcomes.append("success")
                expected: bytes | None = new
            else:
                outcomes.append("staging-failure" if "stage" in result.err else "later-failure")
                why = one_line_error(result)
                if why:
                    run.append(why)
                if staging_entries(home, agent):
                    run.append(f"staged files left behind: {staging_entries(home, agent)}")
                expected = target.old
            grow_tmpfs(mnt, "64m")
            run += check_cli_read(cli, target, expected, "after the write")
            run += check_settled(cli, home, agent, target, expected)
            problems += [f"free-{margin}B ({size} bytes), exit {result.code} {result.err.strip()!r}: {p}" for p in run]
    assert not problems, "\n".join(problems)
    assert "success" in outcomes and "later-failure" in outcomes, (
        f"the sweep did not cross both limits; outcomes by margin: {outcomes}")


@pytest.mark.root
@pytest.mark.parametrize("target_name", TARGETS)
def test_no_free_inodes_raises_storage_error_in_process(prepared: Prepared, tmp_path: Path,
                                                        target_name: str) -> None:
    """With no inode left, a write (library call) fails with StorageError, nothing else.

    The catalog connections are opened first (SQLite's -wal and -shm exist),
    so the first thing to fail is the writer's own file or directory
    creation: the staging file for a replace, the lazy store directory for a
    first write. Library callers (the future FUSE server) map ScopefsError
    to errnos; a raw OSError would escape that mapping.
    """
    target, agent = prepared.target(target_name), prepared.agent
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "size=16m,nr_inodes=256,mode=0700"):
        root = prepared.clone(mnt / "home")
        filler = mnt / "filler"
        new = b"no inode for this\n"
        home = Home.open(root)
        try:
            home.state()
            home.catalog(agent)
            filler.mkdir()
            for i in range(10_000):
                try:
                    (filler / str(i)).touch()
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
            else:
                raise AssertionError("the inode limit was never reached")
            try:
                outcome: object = write_note(home, target.session, target.path, new)
            except Exception as exc:  # noqa: BLE001 - the type is what is under test
                outcome = exc
        finally:
            home.close()
        leftover_staging = staging_entries(root, agent)
        shutil.rmtree(filler)
        problems = _check_in_process_outcome(outcome, None)
        if isinstance(outcome, WriteResult):
            problems.append("the write succeeded although no inode was left for its staged file")
        if leftover_staging:
            problems.append(f"staged files left behind: {leftover_staging}")
        problems += _settle_in_process(root, agent, target, new if isinstance(outcome, WriteResult) else target.old,
                                       new)
        assert not problems, "\n".join(problems)


# -- 3. apsw VFS: xWrite / xSync failures in-process ----------------------------------------

def _check_in_process_outcome(outcome: object, fired_before_activation: bool | None) -> list[str]:
    """A failed write raises a one-line ScopefsError of the storage class (exit 1)."""
    if isinstance(outcome, WriteResult):
        if fired_before_activation:
            return ["write_note returned success although an injected failure hit before the activation"
                    " commit: the failed write or sync was trusted"]
        return []
    assert isinstance(outcome, BaseException)
    name = f"{type(outcome).__module__}.{type(outcome).__qualname__}"
    if not isinstance(outcome, ScopefsError):
        return [f"a raw {name} leaked out of write_note instead of StorageError: {outcome!r}"]
    problems = []
    if isinstance(outcome, (BadInput, Denied)) or outcome.exit_code != StorageError.exit_code:
        problems.append(f"a storage failure surfaced as {name} (exit {outcome.exit_code}): {outcome}")
    message = str(outcome)
    if not message.strip() or "\n" in message:
        problems.append(f"unclear error message from {name}: {message!r}")
    return problems


def _settle_in_process(root: Path, agent: str, target: Target, expected: bytes | None, new: bytes) -> list[str]:
    """With a fresh, healthy Home: recovery settles everything and ``expected`` reads back.

    Reading before and after recovery shows both that nothing was activated
    by the failed write and that recovery did not complete it later.
    """
    problems: list[str] = []
    home = Home.open(root)
    try:
        def read(when: str) -> None:
            try:
                data = read_note(home, target.session, target.path)
            except Denied:
                if expected is not None:
                    problems.append(f"{when}: the note is unreadable (denied), want {len(expected)} bytes")
                return
            except ScopefsError as exc:
                problems.append(f"{when}: read failed: {type(exc).__name__}: {exc}")
                return
            if expected is None:
                problems.append(f"{when}: a first write that failed is readable ({len(data)} bytes)")
            elif data != expected:
                which = {target.old: "the old content", new: "the new content"}.get(data, "unknown bytes")
                problems.append(f"{when}: read returned {which} ({len(data)} bytes), want {len(expected)} bytes")

        read("before recovery")
        findings = inspect(home, agent, fix=True)
        unfixed = [f"{f.kind} {f.ref}" for f in findings if f.action is None or f.integrity]
        if unfixed:
            problems.append(f"recovery left findings unfixed: {unfixed}")
        read("after recovery")
    finally:
        home.close()
    leftovers = {k: v for k, v in catalog_leftovers(root, agent).items() if v}
    if leftovers:
        problems.append(f"after recovery the catalog still holds {leftovers}")
    if staging_entries(root, agent):
        problems.append(f"after recovery staging still holds {staging_entries(root, agent)}")
    return problems


def _faulty_write(root: Path, plan: FaultPlan, target: Target, data: bytes,
                  durable: bool = True) -> tuple[object, bool | None]:
    """One in-process write through the faulty VFS.

    Returns the WriteResult or the exception, and whether the first injected
    failure came before the activation commit had returned (None if nothing
    was injected). The writer's own step hook tells which steps completed.
    """
    steps: list[Step] = []
    fired_before: list[bool] = []
    plan.on_fire = lambda: fired_before.append(Step.ACTIVATED not in steps)
    set_hook(steps.append)
    try:
        with faulty_vfs(plan) as vfs_name:
            home = Home.open(root, vfs=vfs_name)
            try:
                plan.armed = True
                try:
                    outcome: object = write_note(home, target.session, target.path, data, durable=durable)
                except Exception as exc:  # noqa: BLE001 - the type is what is under test
                    outcome = exc
                finally:
                    plan.armed = False  # the "disk" heals: closing and recovery run on healthy storage
            finally:
                home.close()
    finally:
        set_hook(None)
    return outcome, (fired_before[0] if fired_before else None)


@pytest.mark.root
@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("sticky", [False, True], ids=["once", "from-n-on"])
@pytest.mark.parametrize(("kind", "durable"), [("xWrite", True), ("xSync", True), ("xWrite", False),
                                              (COMMIT, True), (COMMIT, False)],
                         ids=["xWrite", "xSync", "xWrite-close", "commit", "commit-close"])  # a close syncs nothing
def test_vfs_fault_at_every_call_fails_cleanly(prepared: Prepared, ramdisk: Path, tmp_path: Path, kind: str,
                                               durable: bool, sticky: bool, target_name: str) -> None:
    """SQLite's Nth xWrite/xSync fails, for every N of one write, then N past the end; or its Nth commit
    reaches the log whole and then fails (``COMMIT``: the commit a writer cannot trust either way).

    ``once`` is a transient error (the writer's own rollback then succeeds);
    ``from-n-on`` is a dying disk (the rollback fails too, and recovery must
    roll the intent back because its files are already gone). Either way:
    StorageError, no staged file, and after recovery with a healthy Home
    nothing pending and the old revision active; a failure before the
    activation commit is never acknowledged.
    """
    target, agent = prepared.target(target_name), prepared.agent
    work = ramdisk / tmp_path.name
    counting = FaultPlan()
    root = prepared.clone(work / "count")
    outcome, _ = _faulty_write(root, counting, target, b"counting run\n", durable)
    assert isinstance(outcome, WriteResult), f"uninjected write failed: {outcome!r}"
    total = counting.counts[kind]
    assert total >= 1, f"no {kind} call observed in one write: {counting.counts}"
    shutil.rmtree(root)

    problems: list[str] = []
    for n in range(1, total + 2):
        root = prepared.clone(work / f"n{n}")
        new = f"new content; {kind} failure at call {n}\n".encode()
        plan = FaultPlan(kind, n, sticky=sticky)
        outcome, fired_before_activation = _faulty_write(root, plan, target, new, durable)
        run: list[str] = []
        if n <= total and not plan.fired:
            run.append("the injection never fired")
        if n > total and plan.fired:
            run.append("an injection fired past the observed calls")
        if n > total and not isinstance(outcome, WriteResult):
            run.append(f"uninjected write failed: {outcome!r}")
        run += _check_in_process_outcome(outcome, fired_before_activation)
        if isinstance(outcome, WriteResult):
            expected: bytes | None = new
        else:
            expected = target.old
            # A close that cannot tell whether its commit landed (the catalog fails from then on) keeps its
            # marker for recovery (``writer.placing``): what must never stay is a staged file.
            left = [e for e in staging_entries(root, agent) if durable or not sticky or not placing.is_marker(e)]
            if left:
                run.append(f"the failed write left staged files: {left}")
        run += _settle_in_process(root, agent, target, expected, new)
        label = "success" if isinstance(outcome, WriteResult) else f"{type(outcome).__name__}: {outcome}"
        problems += [f"{kind} #{n} ({plan.fired[0][1].rsplit('/', 1)[-1] if plan.fired else '-'}), {label}: {p}"
                     for p in run]
        shutil.rmtree(root)
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)
