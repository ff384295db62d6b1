"""Power loss during derive and forget: after the reboot, all of it or none of it.

The harness of ``test_powerloss.py``: the home on a loop-mounted ext4 whose
journal commits only when something syncs; a real ``scopefs`` command is
parked at a checkpoint, the filesystem is shut down without flushing its
log (a power cut), the command is killed, and the filesystem is mounted
again. A derivation cut before its activation leaves no note and no
lineage; one acknowledged keeps both, and its source's removal still holds
it. A forget cut inside its transaction changed nothing; one cut after
its commit is whole (sources and descendants denied, claims rejected),
and ``doctor --fix`` removes the bytes it had not yet unlinked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from scopefs.writer.steps import Step
from tests.conftest import Cli, db_copy, sqlite_int
from tests.crashkit import ALICE_V2, REPO, Base, build_base, catalog_path, copy_home, doctor, loop_ext4

pytestmark = pytest.mark.root

SOURCE = "private/notes/allergy.md"
DIGEST = b"Digest: the second allergy note, summarised for lunch orders\n"

_CLI_CHILD = r"""
import os, sys, time
os.umask(0o077)
from scopefs.writer import steps
from scopefs.cli.main import main

target = sys.argv[1]

def stop_here(step):
    if step.value == target:
        os.write(1, step.value.encode() + b"\n")
        time.sleep(3600)  # wait here for SIGKILL
        os._exit(70)

steps.set_hook(stop_here)
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return build_base(tmp_path_factory.mktemp("lifecycle-power-base") / "home")


@contextlib.contextmanager
def _stopped(home: Path, step: Step, *argv: str, stdin: bytes = b"") -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", _CLI_CHILD, step.value, *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), "SCOPEFS_HOME": str(home)})
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        line = proc.stdout.readline()
        if line != step.value.encode() + b"\n":
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"did not stop at {step.value}: {line!r} {err.decode(errors='replace')[-2000:]}")
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _count(home: Path, table: str) -> int:
    with db_copy(catalog_path(home)) as conn:
        return sqlite_int(conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])


@contextlib.contextmanager
def _after_cut(tmp_path: Path, base: Base, prepare: Sequence[tuple[str, ...]], step: Step, argv: tuple[str, ...],
               stdin: bytes = b"") -> Iterator[Cli]:
    """A copy of the base with ``prepare`` done (and synced), after a power cut with ``argv`` parked at ``step``
    and a reboot."""
    with loop_ext4(tmp_path) as fs:
        cli = Cli(copy_home(base, fs.mnt / "home"))
        for args in prepare:
            cli(*args[:-1], stdin=args[-1].encode(), check=True)
        fs.sync()
        with _stopped(cli.home, step, *argv, stdin=stdin):
            fs.power_cut()
        fs.reboot()
        yield cli


@pytest.mark.parametrize("step", [Step.PENDING, Step.RENAMED, Step.FINALIZED], ids=lambda s: s.value)
def test_a_derivation_cut_before_activation_leaves_nothing(base: Base, tmp_path: Path, step: Step) -> None:
    with _after_cut(tmp_path, base, [], step, ("derive", base.alice_session, "--from", SOURCE, "--to",
                                               "private/d.md"), DIGEST) as cli:
        fixed = doctor(cli, fix=True)
        assert fixed.code == 0, fixed
        assert cli("read", base.alice_session, "private/d.md").code == 3
        assert (_count(cli.home, "lineage_edges"), _count(cli.home, "derivations")) == (0, 0)
        assert cli("read", base.alice_session, SOURCE).out == ALICE_V2


def test_an_acknowledged_derivation_survives_with_its_lineage(base: Base, tmp_path: Path) -> None:
    with _after_cut(tmp_path, base, [], Step.AUDITED, ("derive", base.alice_session, "--from", SOURCE, "--to",
                                                      "private/d.md"), DIGEST) as cli:
        assert doctor(cli, fix=True).code == 0
        assert cli("read", base.alice_session, "private/d.md").out == DIGEST
        assert (_count(cli.home, "lineage_edges"), _count(cli.home, "derivations")) == (1, 1)
        cli("rm", base.alice_session, SOURCE, check=True)
        assert cli("read", base.alice_session, "private/d.md").code == 3


def test_a_forget_cut_inside_its_transaction_changed_nothing(base: Base, tmp_path: Path) -> None:
    prepare = [("derive", base.alice_session, "--from", SOURCE, "--to", "private/d.md", DIGEST.decode())]
    with _after_cut(tmp_path, base, prepare, Step.FORGETTING, ("forget", base.alice_session, SOURCE)) as cli:
        assert doctor(cli, fix=True).code == 0
        assert cli("read", base.alice_session, SOURCE).out == ALICE_V2
        assert cli("read", base.alice_session, "private/d.md").out == DIGEST
        assert (_count(cli.home, "forgets"), _count(cli.home, "rejected_claims"),
                _count(cli.home, "lineage_holds")) == (0, 0, 0)


def test_a_forget_cut_after_its_commit_is_whole(base: Base, tmp_path: Path) -> None:
    prepare = [("derive", base.alice_session, "--from", SOURCE, "--to", "private/d.md", DIGEST.decode())]
    with _after_cut(tmp_path, base, prepare, Step.FORGOTTEN, ("forget", base.alice_session, SOURCE)) as cli:
        for path in (SOURCE, "private/d.md"):
            assert cli("read", base.alice_session, path).code == 3
        assert cli("write", base.alice_session, "private/back.md", stdin=ALICE_V2).code == 3
        fixed = doctor(cli, fix=True)
        assert fixed.code == 0 and any(f["kind"] == "forgotten-artifact" for f in fixed.findings), fixed
        artifacts = b"".join(p.read_bytes() for p in (cli.home / "agents").rglob("*")
                             if p.is_file() and "memory-scopes" in str(p))
        assert ALICE_V2 not in artifacts and DIGEST not in artifacts
