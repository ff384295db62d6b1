"""Editors and file tools save cleanly through a real mount (DESIGN.md §4, §6).

Every test drives a real tool (vim, nano, sed, python3, cp, mv, bash, touch)
as root on a real FUSE mount of a scenario session, then checks the catalog
directly:

* saving over a note makes exactly one new active revision holding exactly
  the new bytes, on the same resource (same ``resource_id``);
* no scratch name (swap file, backup, vim's ``4913`` probe, ``sed``'s and
  Python's temporaries) ever becomes a resource, live or tombstoned;
* scratch files are seen only by the mount that made them: another mount of
  the same session, another session of the same subject and ``scopefs ls``
  never list them, ``stat`` them or open them;
* creating a note by the same routes makes exactly one resource with one
  revision; ``touch`` makes one empty note;
* renaming a note inside its folder keeps its resource and its revisions.

Two places are exercised: Alice's private store, with the note alone in a
sub-folder like the scenario's ``private/notes/allergy.md``, and the group's
channel store, with the note at the root like ``channel/offsite.md``. Each
store is seen through a mount of the editing session and a mount of a
second session of the same subject (the observer); the save tests share
these mounts (module scope) and each works on a note and folder of its own.

About vim: its default ``backupskip`` holds ``/tmp/*`` and pytest's mounts
live under /tmp, so vim would skip the backup dance it does for a note
anywhere else (``4913`` probe, rename to ``note.md~``, create, write,
unlink). Every vim run clears ``backupskip`` for that reason; nothing else
of its configuration changes beyond what each case names.

Pending removals (an unlink or a rename away not followed by a new file)
are committed after a grace period. :func:`settle` ``fsync``\\ s the folder,
which commits them at once, so a save that left one behind shows up as a
tombstone instead of being waited for.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scopefs.catalog.home import Home
from scopefs.writer.transaction import write_note
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    CHANNEL,
    CHANNEL_FACT,
    Cli,
    Scenario,
    sqlite_str,
)
from tests.mountkit import (  # noqa: F401
    Mounts,
    all_resource_paths,
    catalog,
    live_notes,
    mounts,
    pending_rows,
    second_group_session,
    wait_until,
)

TOOL_TIMEOUT_S = 30.0


# -- helpers -------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(argv, check=False, cwd=cwd, env=env, capture_output=True, timeout=TOOL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}: {proc.stderr!r} {proc.stdout!r}"


def settle(folder: Path) -> None:
    """fsync the folder: the mount commits the removals pending under it now."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        raise AssertionError(f"the note's folder is gone (ENOENT) right after the save: {folder}") from None
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def absent(path: Path) -> bool:
    """Neither stat-able nor openable: exactly like a name that never existed."""
    for probe in (os.stat, os.lstat, lambda p: os.close(os.open(p, os.O_RDONLY))):
        try:
            probe(path)
        except FileNotFoundError:
            continue
        return False
    return True


def store_resources(home: Path, audience_id: str) -> dict[str, tuple[str, str]]:
    """Every resource of the store whose audience is ``audience_id``: id -> (path, state)."""
    with catalog(home) as conn:
        rows = conn.execute("SELECT r.resource_id, r.path, r.state FROM resources r JOIN stores s USING (store_id)"
                            " WHERE s.audience_id = ?", (audience_id,)).fetchall()
    return {sqlite_str(row[0]): (sqlite_str(row[1]), sqlite_str(row[2])) for row in rows}


class PtyProcess:
    """A program on its own pseudo-terminal, driven by keystrokes."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        self.argv = argv
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.screen = bytearray()

    def _pump(self, wait: float) -> bool:
        """Read what the program printed; False once its terminal is closed."""
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the program closed its terminal
            return False
        self.screen.extend(chunk)
        return bool(chunk)

    def tail(self) -> bytes:
        return bytes(self.screen[-1500:])

    def expect(self, text: bytes, timeout: float = TOOL_TIMEOUT_S, *, failure: bytes | None = None) -> None:
        """Wait until ``text`` shows up; fail at once on ``failure`` (an error message)."""
        start = len(self.screen)
        deadline = time.monotonic() + timeout
        while text not in self.screen[start:]:
            if failure is not None and failure in self.screen[start:]:
                raise AssertionError(f"{self.argv[0]} showed {failure!r}: {self.tail()!r}")
            if time.monotonic() > deadline or not self._pump(0.05):
                raise AssertionError(f"{self.argv[0]} never showed {text!r}; last output: {self.tail()!r}")

    def send(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait(self, timeout: float = TOOL_TIMEOUT_S, *, stuck: bytes | None = None) -> int:
        """The exit code; fails at once if ``stuck`` (a prompt that waits for the user) shows up."""
        start = len(self.screen)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline or (stuck is not None and stuck in self.screen[start:]):
                raise AssertionError(f"{self.argv[0]} did not exit; last output: {self.tail()!r}")
            if not self._pump(0.05):
                break
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


# -- the stores under test -------------------------------------------------------


@dataclass
class Side:
    """One writable store, mounted for its session, again for that session, and for a second session."""

    scenario: Scenario
    kind: str  # "private" or "channel"
    audience: str
    session: str
    other_session: str
    editor: Path  # mount of ``session``: the tools run here
    twin: Path  # a second mount of ``session``
    observer: Path  # mount of ``other_session``

    @property
    def home(self) -> Path:
        return self.scenario.cli.home


@dataclass
class Note:
    """The note one test works on, in a folder of the side's store."""

    side: Side
    folder: str  # virtual folder, e.g. "private/vim_es" or "channel"
    name: str
    tools_home: Path

    @property
    def home(self) -> Path:
        return self.side.home

    @property
    def audience(self) -> str:
        return self.side.audience

    def inner(self, name: str | None = None) -> str:
        """A path inside the store (resource paths leave out the root)."""
        folder = "/".join(self.folder.split("/")[1:])
        name = name or self.name
        return f"{folder}/{name}" if folder else name

    def edit_dir(self) -> Path:
        return self.side.editor / self.folder

    def twin_dir(self) -> Path:
        return self.side.twin / self.folder

    def observe_dir(self) -> Path:
        return self.side.observer / self.folder

    def env(self) -> dict[str, str]:
        """A clean environment: an empty HOME, so no user vimrc or nanorc is read."""
        self.tools_home.mkdir(parents=True, exist_ok=True)
        return {"HOME": str(self.tools_home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "xterm",
                "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

    def note_names(self) -> set[str]:
        """Live notes directly in the folder, from the catalog."""
        prefix = self.inner("x")[:-1]
        return {p[len(prefix):] for p in live_notes(self.home, self.audience)
                if p.startswith(prefix) and "/" not in p[len(prefix):]}

    def cli_names(self, session: str) -> set[str]:
        return {e["name"] for e in self.side.scenario.cli.j("ls", session, self.folder)["entries"]}


def _second_session(scenario: Scenario, kind: str) -> str:
    if kind == "channel":
        return second_group_session(scenario)
    return str(scenario.cli.j("session", "open", "--agent", scenario.agent, "--dm", "--channel", CHANNEL,
                              "--account", ACCOUNT, "--sender", ALICE_SENDER)["session_id"])


def make_side(kind: str, scenario: Scenario, kit: Mounts) -> Side:
    other = _second_session(scenario, kind)
    if kind == "channel":
        session, audience = scenario.group_session, scenario.conversation
    else:
        session, audience = scenario.alice_session, scenario.alice
    return Side(scenario, kind, audience, session, other, kit.mount(session, name=f"{kind}-editor"),
                kit.mount(session, name=f"{kind}-twin"), kit.mount(other, name=f"{kind}-observer"))


@pytest.fixture(scope="module")
def sides(scenario_template: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Side]]:
    """Both stores, mounted once for the module; each test uses a note and folder of its own."""
    base = tmp_path_factory.mktemp("editors")
    shutil.copytree(scenario_template.cli.home, base / "home", symlinks=True)
    scenario = dataclasses.replace(scenario_template, cli=Cli(base / "home"))
    kit = Mounts(scenario.cli, base / "mnt")
    try:
        yield {kind: make_side(kind, scenario, kit) for kind in ("private", "channel")}
    finally:
        kit.cleanup()


def prepare(side: Side, folder: str, name: str, data: bytes, tmp: Path) -> Note:
    """Write the note (through the writer, as ``scopefs write`` does) and wait until every mount shows it."""
    home = Home.open(side.home)
    try:
        write_note(home, side.session, f"{folder}/{name}", data)
    finally:
        home.close()
    note = Note(side, folder, name, tmp / "tools-home")
    for where in (note.edit_dir(), note.twin_dir(), note.observe_dir()):
        wait_until((where / name).exists)
    return note


def drop_scratch(note: Note) -> None:
    """Remove what a tool left in the editor's folder (never a note), for the next test."""
    try:
        names = set(os.listdir(note.edit_dir())) - note.note_names()
    except OSError:
        return
    for name in names:
        path = note.edit_dir() / name
        if path.is_file():
            try:
                path.unlink()
            except OSError:
                pass


# -- routes that save over an existing note ------------------------------------------
#
# Each edits ``note`` in the editor's mount, given its current bytes and a
# scratch directory outside the mount, and returns the bytes the note must
# now hold plus the scratch names the editor's own mount may still show (a
# backup the editor keeps).

Edit = Callable[[Note, bytes, Path], tuple[bytes, set[str]]]

VIM_LINE = "saved by vim"


def _vim(note: Note, old: bytes, *options: str) -> bytes:
    argv = ["vim", *options, "-c", "set backupskip=", "-c", f"normal Go{VIM_LINE}", "-c", "wq", note.name]
    run(argv, cwd=note.edit_dir(), env=note.env())
    return old + VIM_LINE.encode() + b"\n"


def edit_vim_es(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    """``vim -Es``: no initialization file at all, vim's built-in defaults (copying backup)."""
    return _vim(note, old, "-Es"), set()


def edit_vim_defaults(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    """defaults.vim, what a user without a vimrc gets: backupcopy=auto, so ``4913`` + rename."""
    return _vim(note, old, "-Es", "-N", "-u", "DEFAULTS", "-i", "NONE"), set()


def edit_vim_backupcopy_yes(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    return _vim(note, old, "-Es", "-N", "-u", "NONE", "-i", "NONE", "-c", "set backupcopy=yes"), set()


def edit_vim_backup_kept(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    """``set backup writebackup``: vim renames the note to ``note.md~`` and keeps it."""
    data = _vim(note, old, "-Es", "-N", "-u", "NONE", "-i", "NONE", "-c", "set backup writebackup")
    return data, {note.name + "~"}


NANO_LINE = "saved by nano"


def nano_types_a_line(argv: list[str], cwd: Path, env: dict[str, str], line: str) -> None:
    """Real nano on a pty: type ``line`` (the cursor starts on the first line), write out (^O), exit (^X)."""
    editor = PtyProcess(argv, cwd=cwd, env=env)
    try:
        editor.expect(b"GNU nano")
        editor.send(line.encode() + b"\r")
        editor.send(b"\x0f")  # ^O: write out
        editor.expect(b"File Name to Write")
        editor.send(b"\r")
        editor.expect(b"Wrote", failure=b"Error")
        editor.send(b"\x18")  # ^X: exit
        assert editor.wait() == 0, editor.tail()
    finally:
        editor.close()


def _nano(note: Note, old: bytes, *options: str) -> bytes:
    nano_types_a_line(["nano", *options, note.name], note.edit_dir(), note.env(), NANO_LINE)
    return NANO_LINE.encode() + b"\n" + old


def edit_nano(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    """nano as installed (/etc/nanorc sets ``locking``: a ``.note.md.swp`` lock while it runs)."""
    return _nano(note, old), set()


def edit_nano_backup(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    """``nano --backup``: the old content is kept as ``note.md~``."""
    return _nano(note, old, "--backup"), {note.name + "~"}


def edit_sed_inplace(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    run(["sed", "-i", "s/allergic/ALLERGIC/; s/offsite/OFFSITE/; $a saved by sed", note.name],
        cwd=note.edit_dir(), env=note.env())
    new = old.replace(b"allergic", b"ALLERGIC", 1).replace(b"offsite", b"OFFSITE", 1) + b"saved by sed\n"
    return new, set()


_REPLACE_TMPN = """
import os, sys
path, data = sys.argv[1], bytes.fromhex(sys.argv[2])
folder, name = os.path.split(path)
tmp = os.path.join(folder, f".{name}.tmp{os.getpid()}")
with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, path)
"""

_REPLACE_NAMED_TEMPORARY = """
import os, sys, tempfile
path, data = sys.argv[1], bytes.fromhex(sys.argv[2])
with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
    assert os.path.basename(f.name).startswith("tmp"), f.name
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
os.replace(f.name, path)
"""


def _python(note: Note, script: str, data: bytes, name: str) -> None:
    run([sys.executable, "-c", script, str(note.edit_dir() / name), data.hex()], cwd=note.edit_dir(), env=note.env())


def edit_python_tmpn_replace(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    new = old + b"saved by python via .note.md.tmpN + os.replace\n"
    _python(note, _REPLACE_TMPN, new, note.name)
    return new, set()


def edit_python_namedtemporary_replace(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    new = b"rewritten by python via NamedTemporaryFile + os.replace\n"
    _python(note, _REPLACE_NAMED_TEMPORARY, new, note.name)
    return new, set()


def edit_cp_over(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    source = tmp / "source.md"
    source.write_bytes(b"copied over by cp\n")
    run(["cp", str(source), note.name], cwd=note.edit_dir(), env=note.env())
    return source.read_bytes(), set()


def edit_mv_from_tmp(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    source = tmp / "moved.md"
    data = b"moved over by mv from /tmp\n"
    source.write_bytes(data)
    run(["mv", str(source), note.name], cwd=note.edit_dir(), env=note.env())
    assert not source.exists()
    return data, set()


def edit_shell_truncate(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    run(["bash", "-c", 'printf "%s\\n" "replaced by the shell" > "$1"', "_", note.name],
        cwd=note.edit_dir(), env=note.env())
    return b"replaced by the shell\n", set()


def edit_shell_append(note: Note, old: bytes, tmp: Path) -> tuple[bytes, set[str]]:
    run(["bash", "-c", 'printf "%s\\n" "appended by the shell" >> "$1"', "_", note.name],
        cwd=note.edit_dir(), env=note.env())
    return old + b"appended by the shell\n", set()


EDITS: list[Edit] = [
    edit_vim_es, edit_vim_defaults, edit_vim_backupcopy_yes, edit_vim_backup_kept,
    edit_nano, edit_nano_backup, edit_sed_inplace,
    edit_python_tmpn_replace, edit_python_namedtemporary_replace,
    edit_cp_over, edit_mv_from_tmp, edit_shell_truncate, edit_shell_append,
]


def _route(fn: Callable[..., object]) -> str:
    return fn.__name__.split("_", 1)[1]


def place(side: Side, route: str) -> tuple[str, str, bytes]:
    """Where a test's note lives: alone in a sub-folder (private) or at the root (channel)."""
    if side.kind == "private":
        return f"private/{route}", "allergy.md", ALICE_FACT
    return "channel", f"{route}.md", CHANNEL_FACT


def read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def reads_as(path: Path, data: bytes) -> bool:
    return read_or_none(path) == data


def check_observers(note: Note, name: str, data: bytes) -> None:
    """The second mount and the second session see the new bytes, and nothing but notes."""
    notes = note.note_names()
    for where in (note.twin_dir(), note.observe_dir()):
        try:
            wait_until(functools.partial(reads_as, where / name, data))
        except AssertionError as late:  # seen once in a full run, never reproduced: say what was there
            raise AssertionError(f"{where / name} still reads {read_or_none(where / name)!r}, not {data!r};"
                                 f" mount logs: {mount_logs(note.home)}") from late
        assert set(os.listdir(where)) == notes, where


def mount_logs(home: Path) -> dict[str, str]:
    """The end of each mount server's log in ``home`` (warnings and errors only: no content is logged)."""
    return {log.name: log.read_text(errors="replace")[-2000:] for log in sorted((home / "mounts").glob("*.log"))}


@pytest.mark.parametrize("edit", EDITS, ids=_route)
@pytest.mark.parametrize("kind", ["private", "channel"])
def test_save_over_note_is_one_new_revision_of_the_same_resource(sides: dict[str, Side], kind: str, edit: Edit,
                                                                   tmp_path: Path) -> None:
    folder, name, old = place(sides[kind], _route(edit))
    note = prepare(sides[kind], folder, name, old, tmp_path)
    try:
        # The other mounts have read (and may cache) the old bytes.
        for where in (note.twin_dir(), note.observe_dir()):
            assert (where / name).read_bytes() == old
        key = note.inner()
        before = live_notes(note.home, note.audience)
        resources = store_resources(note.home, note.audience)
        paths_before = all_resource_paths(note.home)
        assert before[key].active_sha256 == sha(old) and before[key].revisions == 1

        new, leftovers = edit(note, old, tmp_path)
        assert new != old
        settle(note.edit_dir())

        after = live_notes(note.home, note.audience)
        assert set(after) == set(before), "a note appeared or vanished"
        assert after[key].resource_id == before[key].resource_id, "the note lost its identity"
        assert after[key].revisions == 2, f"{after[key].revisions - 1} new revisions instead of one"
        assert after[key].active_sha256 == sha(new), "the active revision does not hold the new bytes"
        assert {p: h for p, h in after.items() if p != key} == {p: h for p, h in before.items() if p != key}
        assert store_resources(note.home, note.audience) == resources, "a resource was created or tombstoned"
        assert all_resource_paths(note.home) == paths_before, "a scratch name became a resource"
        assert pending_rows(note.home) == 0

        assert (note.edit_dir() / name).read_bytes() == new
        assert set(os.listdir(note.edit_dir())) == note.note_names() | leftovers
        for leftover in leftovers:  # kept by the editor: readable here, nowhere else
            assert (note.edit_dir() / leftover).read_bytes() == old
            assert absent(note.twin_dir() / leftover) and absent(note.observe_dir() / leftover)
            assert leftover not in note.cli_names(note.side.session)
        check_observers(note, name, new)
    finally:
        drop_scratch(note)


# -- routes that create a new note ---------------------------------------------------------

Create = Callable[[Note, Path], bytes]


def create_vim_es(note: Note, tmp: Path) -> bytes:
    run(["vim", "-Es", "-c", "set backupskip=", "-c", "normal icreated by vim", "-c", "wq", note.name],
        cwd=note.edit_dir(), env=note.env())
    return b"created by vim\n"


def create_vim_defaults(note: Note, tmp: Path) -> bytes:
    run(["vim", "-Es", "-N", "-u", "DEFAULTS", "-i", "NONE", "-c", "set backupskip=", "-c",
         "normal icreated by vim", "-c", "wq", note.name], cwd=note.edit_dir(), env=note.env())
    return b"created by vim\n"


def create_nano(note: Note, tmp: Path) -> bytes:
    editor = PtyProcess(["nano", note.name], cwd=note.edit_dir(), env=note.env())
    try:
        editor.expect(b"GNU nano")
        editor.send(b"created by nano")
        editor.send(b"\x0f")
        editor.expect(b"File Name to Write")
        editor.send(b"\r")
        editor.expect(b"Wrote", failure=b"Error")
        editor.send(b"\x18")
        assert editor.wait() == 0, editor.tail()
    finally:
        editor.close()
    return b"created by nano\n"


def create_python_tmpn_replace(note: Note, tmp: Path) -> bytes:
    data = b"created by python via .note.md.tmpN + os.replace\n"
    _python(note, _REPLACE_TMPN, data, note.name)
    return data


def create_python_namedtemporary_replace(note: Note, tmp: Path) -> bytes:
    data = b"created by python via NamedTemporaryFile + os.replace\n"
    _python(note, _REPLACE_NAMED_TEMPORARY, data, note.name)
    return data


def create_cp(note: Note, tmp: Path) -> bytes:
    source = tmp / "source.md"
    source.write_bytes(b"created by cp\n")
    run(["cp", str(source), note.name], cwd=note.edit_dir(), env=note.env())
    return source.read_bytes()


def create_mv_from_tmp(note: Note, tmp: Path) -> bytes:
    source = tmp / "moved.md"
    data = b"created by mv from /tmp\n"
    source.write_bytes(data)
    run(["mv", str(source), note.name], cwd=note.edit_dir(), env=note.env())
    assert not source.exists()
    return data


def create_shell_truncate(note: Note, tmp: Path) -> bytes:
    run(["bash", "-c", 'printf "%s\\n" "created by >" > "$1"', "_", note.name], cwd=note.edit_dir(), env=note.env())
    return b"created by >\n"


def create_shell_append(note: Note, tmp: Path) -> bytes:
    run(["bash", "-c", 'printf "%s\\n" "created by >>" >> "$1"', "_", note.name], cwd=note.edit_dir(),
        env=note.env())
    return b"created by >>\n"


def create_touch(note: Note, tmp: Path) -> bytes:
    run(["touch", note.name], cwd=note.edit_dir(), env=note.env())
    return b""


CREATES: list[Create] = [
    create_vim_es, create_vim_defaults, create_nano, create_python_tmpn_replace,
    create_python_namedtemporary_replace, create_cp, create_mv_from_tmp, create_shell_truncate,
    create_shell_append, create_touch,
]


@pytest.mark.parametrize("create", CREATES, ids=_route)
@pytest.mark.parametrize("kind", ["private", "channel"])
def test_new_note_is_one_resource_with_one_revision(sides: dict[str, Side], kind: str, create: Create,
                                                    tmp_path: Path) -> None:
    side = sides[kind]
    folder = "private/notes" if kind == "private" else "channel"
    note = Note(side, folder, f"new-{_route(create)}.md", tmp_path / "tools-home")
    key = note.inner()
    try:
        for where in (note.edit_dir(), note.twin_dir(), note.observe_dir()):
            assert absent(where / note.name)
        before = live_notes(note.home, note.audience)
        resources = store_resources(note.home, note.audience)
        paths_before = all_resource_paths(note.home)

        data = create(note, tmp_path)
        settle(note.edit_dir())
        # An empty file is committed when the kernel releases it, which close(2) does not wait for.
        wait_until(lambda: key in live_notes(note.home, note.audience) and not pending_rows(note.home))
        after = live_notes(note.home, note.audience)

        assert set(after) == set(before) | {key}
        assert after[key].revisions == 1, f"{after[key].revisions} revisions instead of one"
        assert after[key].active_sha256 == sha(data)
        assert {p: h for p, h in after.items() if p != key} == before
        created = {r: v for r, v in store_resources(note.home, note.audience).items() if r not in resources}
        assert created == {after[key].resource_id: (key, "live")}, "more than one resource was created"
        assert all_resource_paths(note.home) == paths_before | {key}, "a scratch name became a resource"
        assert pending_rows(note.home) == 0

        assert (note.edit_dir() / note.name).read_bytes() == data
        assert set(os.listdir(note.edit_dir())) == note.note_names()
        check_observers(note, note.name, data)
    finally:
        drop_scratch(note)


@pytest.mark.parametrize("kind", ["private", "channel"])
def test_rename_within_folder_keeps_the_resource(sides: dict[str, Side], kind: str, tmp_path: Path) -> None:
    folder, name, data = place(sides[kind], "rename")
    note = prepare(sides[kind], folder, name, data, tmp_path)
    new_name = "renamed.md"
    old_key, new_key = note.inner(), note.inner(new_name)
    before = live_notes(note.home, note.audience)
    resources = store_resources(note.home, note.audience)
    resource_id = before[old_key].resource_id

    run(["mv", name, new_name], cwd=note.edit_dir(), env=note.env())
    settle(note.edit_dir())

    after = live_notes(note.home, note.audience)
    assert set(after) == set(before) - {old_key} | {new_key}
    assert after[new_key].resource_id == resource_id, "the note lost its identity"
    assert after[new_key].revisions == 1, "a rename is not a new revision"
    assert after[new_key].active_sha256 == sha(data)
    assert {p: h for p, h in after.items() if p != new_key} == {p: h for p, h in before.items() if p != old_key}
    assert store_resources(note.home, note.audience) == {**resources, resource_id: (new_key, "live")}
    assert pending_rows(note.home) == 0

    assert set(os.listdir(note.edit_dir())) == note.note_names()
    assert absent(note.edit_dir() / name)
    assert (note.edit_dir() / new_name).read_bytes() == data
    for where in (note.twin_dir(), note.observe_dir()):
        wait_until(functools.partial(absent, where / name))
    check_observers(note, new_name, data)


def test_the_folder_stays_usable_after_saving_its_only_note(sides: dict[str, Side], tmp_path: Path) -> None:
    """A shell sitting in the note's folder keeps working after a save (vim and nano need it)."""
    note = prepare(sides["private"], "private/cwd", "allergy.md", ALICE_FACT, tmp_path)
    script = 'printf "%s\\n" "saved" > allergy.md && ls . && : > .allergy.md.swp && rm .allergy.md.swp'
    proc = subprocess.run(["bash", "-c", script], check=False, cwd=note.edit_dir(), env=note.env(),
                          capture_output=True, timeout=TOOL_TIMEOUT_S)
    assert proc.returncode == 0, f"the folder broke under the shell after the save: {proc.stderr!r}"
    assert proc.stdout == b"allergy.md\n"


# -- scratch files stay in the mount that made them ---------------------------------------------


@pytest.mark.parametrize("kind", ["private", "channel"])
def test_running_vim_swap_file_is_invisible_elsewhere_then_saves_cleanly(sides: dict[str, Side], kind: str,
                                                                         tmp_path: Path) -> None:
    """Interactive vim as a user without a vimrc runs it (system vimrc + defaults.vim), on a pty."""
    folder, name, old = place(sides[kind], "interactive")
    note = prepare(sides[kind], folder, name, old, tmp_path)
    swap = f".{name}.swp"
    key = note.inner()
    before = live_notes(note.home, note.audience)
    resources = store_resources(note.home, note.audience)
    paths_before = all_resource_paths(note.home)
    try:
        vim = PtyProcess(["vim", "-c", "set backupskip=", name], cwd=note.edit_dir(), env=note.env())
        try:
            # vim's own swap file, visible and readable in vim's mount.
            wait_until(lambda: (read_or_none(note.edit_dir() / swap) or b"").startswith(b"b0VIM"),
                       timeout=TOOL_TIMEOUT_S)
            assert swap in os.listdir(note.edit_dir())
            for where in (note.twin_dir(), note.observe_dir()):
                assert swap not in os.listdir(where), where
                assert absent(where / swap), where
            for session in (note.side.session, note.side.other_session):
                assert note.cli_names(session) == note.note_names()
            assert all_resource_paths(note.home) == paths_before
            assert live_notes(note.home, note.audience) == before

            vim.send(b"\x1bGosaved by interactive vim\x1b:wq\r")
            assert vim.wait(stuck=b"Press ENTER") == 0, vim.tail()
        finally:
            vim.close()
        settle(note.edit_dir())

        new = old + b"saved by interactive vim\n"
        after = live_notes(note.home, note.audience)
        assert set(after) == set(before)
        assert after[key].resource_id == before[key].resource_id
        assert after[key].revisions == 2, f"{after[key].revisions - 1} new revisions instead of one"
        assert after[key].active_sha256 == sha(new)
        assert store_resources(note.home, note.audience) == resources
        assert all_resource_paths(note.home) == paths_before
        assert set(os.listdir(note.edit_dir())) == note.note_names(), "vim left scratch files behind"
        assert (note.edit_dir() / name).read_bytes() == new
        check_observers(note, name, new)
    finally:
        drop_scratch(note)


SCRATCH_NAMES = [
    ".offsite.md.swp", ".offsite.md.swx", "offsite.md~", "4913", "#offsite.md#", ".#offsite.md",
    "sedAb12Cd", "tmpk3_x9q2z", ".offsite.md.tmp4711", "offsite.md.part",
]


def test_scratch_files_are_invisible_to_other_mounts_and_sessions(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    side = make_side("channel", scenario, mounts)
    note = Note(side, "channel", "offsite.md", tmp_path / "tools-home")
    before = live_notes(note.home, note.audience)
    resources = store_resources(note.home, note.audience)
    paths_before = all_resource_paths(note.home)
    notes = note.note_names()
    assert notes == {"offsite.md"}

    held = []
    try:
        for index, name in enumerate(SCRATCH_NAMES):
            fd = os.open(note.edit_dir() / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, f"scratch {index}\n".encode())
            os.fsync(fd)
            if index % 2:
                os.close(fd)
            else:
                held.append(fd)  # still open, like a running editor's swap file
        assert set(os.listdir(note.edit_dir())) == notes | set(SCRATCH_NAMES)
        for index, name in enumerate(SCRATCH_NAMES):
            assert (note.edit_dir() / name).read_bytes() == f"scratch {index}\n".encode()
            for where in (note.twin_dir(), note.observe_dir()):
                assert absent(where / name), f"{name} is visible in {where}"
        for where in (note.twin_dir(), note.observe_dir()):
            assert set(os.listdir(where)) == notes
        for session in (side.session, side.other_session):
            assert note.cli_names(session) == notes
        assert live_notes(note.home, note.audience) == before
        assert store_resources(note.home, note.audience) == resources

        # Each mount has a scratch namespace of its own: the same name is free elsewhere.
        fd = os.open(note.twin_dir() / "4913", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"twin's own\n")
        os.close(fd)
        assert (note.twin_dir() / "4913").read_bytes() == b"twin's own\n"
        assert (note.edit_dir() / "4913").read_bytes() == f"scratch {SCRATCH_NAMES.index('4913')}\n".encode()
        assert absent(note.observe_dir() / "4913")
    finally:
        for fd in held:
            os.close(fd)
    settle(note.edit_dir())
    settle(note.twin_dir())
    assert live_notes(note.home, note.audience) == before
    assert store_resources(note.home, note.audience) == resources
    assert all_resource_paths(note.home) == paths_before
    for session in (side.session, side.other_session):
        assert note.cli_names(session) == notes

    # Scratch files die with their mount: a new mount of the session has none, and nothing was committed.
    mounts.umount(side.editor)
    again = mounts.mount(side.session, name="again")
    assert set(os.listdir(again / note.folder)) == notes
    assert live_notes(note.home, note.audience) == before
    assert store_resources(note.home, note.audience) == resources
    assert all_resource_paths(note.home) == paths_before
