"""Unmodified tools work inside ``scopefs run`` (the sandbox over a session's view).

Every test runs the real command line: ``scopefs run SESSION -- TOOL...``
builds the real bubblewrap sandbox over a real FUSE mount of the session,
and the tool is the system's own (coreutils, findutils, grep, sed, python3,
vim, nano), with no option that a user would not pass. Two places are
exercised: Alice's DM session (writable root ``private/``, her note at
``private/notes/allergy.md``) and the group session (writable root
``channel/``, its note at ``channel/offsite.md``).

* Reading tools (``ls -RA``, ``find``, ``cat``, ``grep -r``) show exactly the
  view, entry for entry as ``scopefs ls`` lists it, and no other subject's
  note.
* Saving over a note (``sed -i``, vim in ex mode with its built-in defaults
  and with defaults.vim, interactive vim and nano on a real terminal) makes
  exactly one new revision of the same resource, holding the new bytes,
  attributed to the session, whose base is the old revision, now
  superseded; no other row of ``resources`` or ``revisions`` changes, so no
  scratch file (``sedXXXXXX``, swap files, ``4913``, ``note.md~``) ever
  became a resource, and the folder lists only notes inside the same
  sandbox right after the save.
* A python3 script that writes ``summary.md.tmp`` and ``os.replace``\\ s it
  makes exactly one new resource with one revision.
* A read-only root (``agent-shared/``) refuses every kind of write with
  EACCES or EROFS and nothing in the home changes.

About the terminal: the sandbox runs in a new session (``bwrap
--new-session``, so that it cannot TIOCSTI into the caller's terminal), so
it has no controlling terminal; its fds 0-2 are still the caller's
terminal and the launcher passes ``TERM`` when they are one. That is all
vim and nano need (``test_a_terminal_reaches_the_sandbox_as_its_fds``).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
from dataclasses import dataclass, replace
from pathlib import Path

import apsw
import pytest

from tests.conftest import (
    ALICE_FACT,
    BOB_FACT,
    CHANNEL_FACT,
    SCOPEFS,
    Result,
    Scenario,
    diff_snapshots,
    snapshot,
    sqlite_int,
    sqlite_str,
)
from tests.mountkit import catalog, pending_rows
from tests.test_vfs_editors import PtyProcess, sha
from tests.test_vfs_isolation import publish_shared

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 60.0
KINDS = ["private", "channel"]
CANARY = re.compile(rb"canary [A-Za-z0-9]+")
FACTS = (ALICE_FACT, BOB_FACT, CHANNEL_FACT)


# -- the two places ---------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """A session and the note of its writable root that the tests work on."""

    kind: str
    session: str
    audience: str
    note: str  # virtual path, e.g. "private/notes/allergy.md"
    fact: bytes  # the note's bytes in the scenario
    old_word: str  # a word of ``fact`` the edits replace ...
    new_word: str  # ... with this one
    foreign_root: str  # a root this session must never see

    @property
    def folder(self) -> str:
        return self.note.rsplit("/", 1)[0]

    @property
    def name(self) -> str:
        return self.note.rsplit("/", 1)[1]

    def key(self, name: str | None = None) -> str:
        """A resource path: the virtual path without its root."""
        inner = self.folder.split("/", 1)[1] if "/" in self.folder else ""
        name = name or self.name
        return f"{inner}/{name}" if inner else name

    def edited(self) -> bytes:
        assert self.old_word.encode() in self.fact
        return self.fact.replace(self.old_word.encode(), self.new_word.encode())


def place(scenario: Scenario, kind: str) -> Place:
    if kind == "private":
        return Place(kind, scenario.alice_session, scenario.alice, "private/notes/allergy.md", ALICE_FACT,
                     "hazelnuts", "walnuts", "channel")
    return Place(kind, scenario.group_session, scenario.conversation, "channel/offsite.md", CHANNEL_FACT,
                 "Lisbon", "Porto", "private")


# -- running tools in the sandbox ------------------------------------------------------------


def sandbox(scenario: Scenario, session: str, *argv: str, stdin: bytes | None = None) -> Result:
    """``scopefs run SESSION -- ARGV``; the tool must succeed."""
    result = scenario.cli("run", session, "--", *argv, stdin=stdin, timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"{argv} exited {result.code} in the sandbox: {result.err} {result.out!r}"
    return result


def then_list(command: str) -> list[str]:
    """``sh -c``: run ``command``, then (in the same sandbox and mount) list the note's folder.

    The folder is ``$1``; the listing follows a ``--listing--`` line.
    """
    return ["sh", "-c", f'{command} && echo --listing-- && ls -A "$1"', "sh"]


def listing_after(result: Result) -> set[str]:
    _, sep, tail = result.text.partition("--listing--\n")
    assert sep, f"no listing in {result.text!r}"
    return set(tail.splitlines())


class Terminal(PtyProcess):
    """``scopefs run`` on a pseudo-terminal that is its controlling terminal, as in a user's shell.

    ``setsid --ctty`` (util-linux) makes the launcher a session leader whose
    controlling terminal is its stdin, the pty; it execs in place (the child
    of Popen is no process group leader), so ``proc`` is the launcher.
    ``env --default-signal`` gives it SIGINT and SIGQUIT at their defaults,
    as a terminal's shell has them: a suite started in the background
    (``make test &``) runs with both ignored, and an ignored signal stays
    ignored across exec, down to the sandboxed program.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str]) -> None:
        self.argv = argv  # (``PtyProcess.expect``'s failures name the program)
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(["env", "--default-signal=INT,QUIT", "setsid", "--ctty", "--wait", *argv],
                                     stdin=slave, stdout=slave,
                                     stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.screen = bytearray()


def on_terminal(scenario: Scenario, session: str, *argv: str) -> Terminal:
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home), "TERM": "xterm"}
    return Terminal([SCOPEFS, "run", session, "--", *argv], env=env)


def editor_then_list(editor: str) -> list[str]:
    """``sh -c``: the editor on ``$1``, then the listing of ``$2`` on one line, between markers."""
    return ["sh", "-c", f'{editor} "$1" || exit $?; printf "\\n[listing:%s]\\n" "$(ls -A "$2" | tr "\\n" "/")"',
            "sh"]


def screen_listing(term: Terminal) -> set[str]:
    found = re.findall(rb"\[listing:([^\]\r\n]*)\]", bytes(term.screen))
    assert len(found) == 1, f"no listing after the editor: {term.tail()!r}"
    return {name.decode() for name in found[0].split(b"/") if name}


# -- the catalog, row by row -----------------------------------------------------------------


@dataclass(frozen=True)
class Rev:
    resource_id: str
    revision_no: int
    base: str | None
    state: str
    sha256: str
    session_id: str | None


@dataclass(frozen=True)
class Catalog:
    """Every resource and every revision of the agent's catalog."""

    resources: dict[str, tuple[str, str, str]]  # resource_id -> (store_id, path, state)
    revisions: dict[str, Rev]  # revision_id -> Rev

    @classmethod
    def read(cls, home: Path) -> Catalog:
        with catalog(home) as conn:
            resources = {r[0]: (r[1], r[2], r[3]) for r in
                         conn.execute("SELECT resource_id, store_id, path, state FROM resources")}
            revisions = {r[0]: Rev(*r[1:]) for r in conn.execute(
                "SELECT revision_id, resource_id, revision_no, base_revision_id, state, content_sha256,"
                " session_id FROM revisions")}
        return cls(resources, revisions)

    def live(self, store_id: str, path: str) -> str:
        found = [rid for rid, (store, p, state) in self.resources.items()
                 if store == store_id and p == path and state == "live"]
        assert len(found) == 1, (path, found)
        return found[0]

    def active(self, resource_id: str) -> str:
        found = [vid for vid, rev in self.revisions.items() if rev.resource_id == resource_id
                 and rev.state == "active"]
        assert len(found) == 1, (resource_id, found)
        return found[0]


def store_of(home: Path, audience: str) -> str:
    with catalog(home) as conn:
        rows = conn.execute("SELECT store_id FROM stores WHERE audience_id = ?", (audience,)).fetchall()
    assert len(rows) == 1, rows
    return sqlite_str(rows[0][0])


def assert_one_new_revision(scenario: Scenario, p: Place, before: Catalog, new: bytes) -> None:
    """Exactly one new active revision of the same resource; the old one superseded; nothing else."""
    home = scenario.cli.home
    store = store_of(home, p.audience)
    resource = before.live(store, p.key())
    old = before.active(resource)
    after = Catalog.read(home)

    assert after.resources == before.resources, "a resource was created, renamed or tombstoned (a scratch file?)"
    added = set(after.revisions) - set(before.revisions)
    assert len(added) == 1, f"{len(added)} new revisions instead of one"
    new_id = added.pop()
    assert after.revisions[new_id] == Rev(resource, before.revisions[old].revision_no + 1, old, "active",
                                          sha(new), p.session)
    assert after.revisions[old] == replace(before.revisions[old], state="superseded")
    unchanged = {v: r for v, r in after.revisions.items() if v not in (new_id, old)}
    assert unchanged == {v: r for v, r in before.revisions.items() if v != old}
    assert pending_rows(home) == 0
    assert scenario.cli("read", p.session, p.note).out == new


def assert_one_new_note(scenario: Scenario, p: Place, before: Catalog, name: str, data: bytes) -> None:
    """Exactly one new live resource at ``name`` with one active revision; nothing else changed."""
    home = scenario.cli.home
    store = store_of(home, p.audience)
    after = Catalog.read(home)

    created = {rid: row for rid, row in after.resources.items() if rid not in before.resources}
    assert list(created.values()) == [(store, p.key(name), "live")], f"resources created: {created}"
    assert {rid: after.resources[rid] for rid in before.resources} == before.resources
    (resource,) = created
    added = {v: r for v, r in after.revisions.items() if v not in before.revisions}
    assert list(added.values()) == [Rev(resource, 1, None, "active", sha(data), p.session)], added
    assert {v: after.revisions[v] for v in before.revisions} == before.revisions
    assert pending_rows(home) == 0
    assert scenario.cli("read", p.session, f"{p.folder}/{name}").out == data


def folder_notes(scenario: Scenario, session: str, folder: str) -> set[str]:
    return {e["name"] for e in scenario.cli.j("ls", session, folder)["entries"] if e["type"] == "note"}


# -- reading tools ---------------------------------------------------------------------------


def cli_tree(scenario: Scenario, session: str) -> dict[str, str]:
    """The whole view as ``scopefs ls`` lists it (the catalog's listing): path -> "note" or "folder"."""
    tree: dict[str, str] = {}
    todo = [""]
    while todo:
        folder = todo.pop()
        for entry in scenario.cli.j("ls", session, *([folder] if folder else []))["entries"]:
            path = f"{folder}/{entry['name']}" if folder else entry["name"]
            tree[path] = entry["type"]
            if entry["type"] == "folder":
                todo.append(path)
    return tree


def parse_ls_recursive(text: str, root: str = "/memory") -> set[str]:
    """The paths (relative to ``root``) in the output of ``ls -RA root``."""
    paths = set()
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if not lines:
            continue
        assert lines[0].endswith(":") and lines[0].startswith(root), lines[0]
        folder = lines[0][len(root):-1].lstrip("/")
        paths |= {f"{folder}/{name}" if folder else name for name in lines[1:]}
    return paths


@pytest.mark.parametrize("kind", KINDS)
def test_reading_tools_show_exactly_the_view(scenario: Scenario, kind: str) -> None:
    p = place(scenario, kind)
    tree = cli_tree(scenario, p.session)
    notes = {path for path, kind_ in tree.items() if kind_ == "note"}
    assert p.note in notes
    assert p.foreign_root not in {path.split("/")[0] for path in tree}
    contents = {path: scenario.cli("read", p.session, path, check=True).out for path in notes}

    listed = sandbox(scenario, p.session, "ls", "-RA", "/memory")
    found = sandbox(scenario, p.session, "find", "/memory", "-type", "f")
    cat = sandbox(scenario, p.session, "cat", p.note)
    grep = sandbox(scenario, p.session, "grep", "-r", "canary", "/memory")

    assert parse_ls_recursive(listed.text) == set(tree)
    assert set(found.text.splitlines()) == {f"/memory/{path}" for path in notes}
    assert cat.out == p.fact
    assert set(grep.text.splitlines()) == {f"/memory/{path}:{line}" for path, data in contents.items()
                                           for line in data.decode().splitlines() if "canary" in line}
    assert f"/memory/{p.note}:{p.fact.decode().strip()}" in grep.text.splitlines()
    for foreign in FACTS:
        if foreign != p.fact:
            found_canary = CANARY.search(foreign)
            assert found_canary is not None
            canary = found_canary.group()
            for result in (listed, found, cat, grep):
                assert canary not in result.out, f"{canary!r} leaked into the {p.kind} view"


# -- sed and python3 ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sed_in_place_is_one_new_revision(scenario: Scenario, kind: str) -> None:
    p = place(scenario, kind)
    before = Catalog.read(scenario.cli.home)
    notes = folder_notes(scenario, p.session, p.folder)

    # sed -i writes ./sedXXXXXX next to the note, then renames it over the note.
    result = sandbox(scenario, p.session, *then_list(f"sed -i 's/{p.old_word}/{p.new_word}/' {p.note}"), p.folder)

    assert listing_after(result) == notes, "sed's temporary file is still listed"
    assert_one_new_revision(scenario, p, before, p.edited())
    assert sandbox(scenario, p.session, "cat", p.note).out == p.edited()


SUMMARY_SCRIPT = """
import json, os, sys
note, folder = sys.argv[1], os.path.dirname(sys.argv[1])
with open(note, "rb") as f:
    data = f.read()
tmp = os.path.join(folder, "summary.md.tmp")
with open(tmp, "wb") as f:
    f.write(b"summary: " + data)
    f.flush()
    os.fsync(f.fileno())
during = sorted(os.listdir(folder))
os.replace(tmp, os.path.join(folder, "summary.md"))
print(json.dumps({"read": data.hex(), "during": during, "after": sorted(os.listdir(folder))}))
"""


@pytest.mark.parametrize("kind, how", [("private", "stdin"), ("channel", "argv")])
def test_python_write_temp_then_replace_is_one_new_note(scenario: Scenario, kind: str, how: str) -> None:
    p = place(scenario, kind)
    before = Catalog.read(scenario.cli.home)
    notes = folder_notes(scenario, p.session, p.folder)
    assert "summary.md" not in notes

    if how == "stdin":
        result = sandbox(scenario, p.session, "python3", "-", p.note, stdin=SUMMARY_SCRIPT.encode())
    else:
        result = sandbox(scenario, p.session, "python3", "-c", SUMMARY_SCRIPT, p.note)

    report = json.loads(result.out)
    assert bytes.fromhex(report["read"]) == p.fact
    assert set(report["during"]) == notes | {"summary.md.tmp"}  # the script's own mount shows its temp file
    assert set(report["after"]) == notes | {"summary.md"}
    assert_one_new_note(scenario, p, before, "summary.md", b"summary: " + p.fact)
    listed = sandbox(scenario, p.session, "ls", "-A", p.folder)
    assert set(listed.text.splitlines()) == notes | {"summary.md"}


# -- vim and nano ------------------------------------------------------------------------------
#
# In the sandbox HOME is /tmp and /memory is outside vim's default
# ``backupskip`` (/tmp/*), so vim does its whole backup dance on the note.

VIM_EX = {
    # No initialization at all: vim's built-in defaults (backupcopy=yes, writebackup: note.md~ copy).
    "builtin": ["vim", "-Es"],
    # What a user without a vimrc gets: defaults.vim, backupcopy=auto (the 4913 probe, then a rename).
    "defaults": ["vim", "-Es", "-N", "-u", "DEFAULTS", "-i", "NONE"],
}


@pytest.mark.parametrize("settings", sorted(VIM_EX))
@pytest.mark.parametrize("kind", KINDS)
def test_vim_ex_mode_save_is_one_new_revision(scenario: Scenario, kind: str, settings: str) -> None:
    p = place(scenario, kind)
    before = Catalog.read(scenario.cli.home)
    notes = folder_notes(scenario, p.session, p.folder)
    vim = " ".join(VIM_EX[settings])

    result = sandbox(scenario, p.session,
                     *then_list(f"{vim} -c '%s/{p.old_word}/{p.new_word}/' -c 'wq' {p.note}"), p.folder)

    assert listing_after(result) == notes, "vim left a swap, backup or 4913 file"
    assert_one_new_revision(scenario, p, before, p.edited())
    assert sandbox(scenario, p.session, "cat", p.note).out == p.edited()


@pytest.mark.parametrize("kind", KINDS)
def test_interactive_vim_on_a_terminal_saves_one_new_revision(scenario: Scenario, kind: str) -> None:
    """vim as a user without a vimrc runs it: the system vimrc, defaults.vim, a swap file."""
    p = place(scenario, kind)
    before = Catalog.read(scenario.cli.home)
    notes = folder_notes(scenario, p.session, p.folder)

    term = on_terminal(scenario, p.session, *editor_then_list("vim"), p.note, p.folder)
    try:
        term.expect(f'"{p.note}"'.encode(), failure=b"E325")  # loaded; E325: a swap file already exists
        term.send(b"\x1bGotyped in vim\x1b:wq\r")
        assert term.wait(stuck=b"Press ENTER") == 0, term.tail()
    finally:
        term.close()

    new = p.fact + b"typed in vim\n"
    assert screen_listing(term) == notes, "vim left a swap, backup or 4913 file"
    assert_one_new_revision(scenario, p, before, new)


@pytest.mark.parametrize("kind", KINDS)
def test_nano_on_a_terminal_saves_one_new_revision(scenario: Scenario, kind: str) -> None:
    """nano as installed (/etc/nanorc sets ``locking``: a ``.note.md.swp`` lock while it runs)."""
    p = place(scenario, kind)
    before = Catalog.read(scenario.cli.home)
    notes = folder_notes(scenario, p.session, p.folder)

    term = on_terminal(scenario, p.session, *editor_then_list("nano"), p.note, p.folder)
    try:
        term.expect(b"[ Read 1 line ]", failure=b"Error opening terminal")  # loaded, the editor is up
        term.send(b"typed in nano\r")  # the cursor starts on the first line
        term.send(b"\x0f")  # ^O: write out
        term.expect(b"File Name to Write")
        term.send(b"\r")
        term.expect(b"Wrote", failure=b"Error")
        term.send(b"\x18")  # ^X: exit
        assert term.wait() == 0, term.tail()
    finally:
        term.close()

    new = b"typed in nano\n" + p.fact
    assert screen_listing(term) == notes, "nano left its lock or a backup"
    assert_one_new_revision(scenario, p, before, new)


def test_a_terminal_reaches_the_sandbox_as_its_fds(scenario: Scenario) -> None:
    """Why editors work despite ``--new-session``: fds 0-2 are the terminal, TERM is passed, and
    there is no controlling terminal (so no TIOCSTI into the caller's, and /dev/tty is ENXIO)."""
    probe = ("import errno, json, os\n"
             "try:\n    os.close(os.open('/dev/tty', os.O_RDWR)); tty = 'ok'\n"
             "except OSError as e:\n    tty = errno.errorcode[e.errno]\n"
             "print('[probe:' + json.dumps({'isatty': [os.isatty(fd) for fd in (0, 1, 2)],"
             " 'size': list(os.get_terminal_size(0)), 'term': os.environ.get('TERM'), 'dev_tty': tty,"
             " 'ctty': open('/proc/self/stat').read().rsplit(')', 1)[1].split()[4]}) + ']')\n")
    term = on_terminal(scenario, scenario.alice_session, "python3", "-c", probe)
    try:
        assert term.wait() == 0, term.tail()
    finally:
        term.close()
    found = re.findall(rb"\[probe:(\{.*?\})\]", bytes(term.screen))
    assert len(found) == 1, term.tail()
    assert json.loads(found[0]) == {"isatty": [True, True, True], "size": [120, 40], "term": "xterm",
                                    "dev_tty": "ENXIO", "ctty": "0"}


def test_terminal_signals_reach_the_sandboxed_program(scenario: Scenario) -> None:
    """A window resize and Ctrl-C go to the launcher's process group (the sandbox has its own
    session); the launcher passes them on, so the program redraws or is interrupted, and the
    sandbox and its mount are not killed for it."""
    probe = ("import os, signal, sys, time\n"  # os.write: a handler's print can meet print's own lock
             "signal.signal(signal.SIGWINCH, lambda *a: os.write(1, b'[winch]\\n'))\n"
             "try:\n    print('[ready]', flush=True)\n    time.sleep(60)\n"  # Ctrl-C may come while it prints
             "except KeyboardInterrupt:\n    print('[interrupted]', flush=True)\n    sys.exit(5)\n")
    term = on_terminal(scenario, scenario.alice_session, "python3", "-c", probe)
    try:
        term.expect(b"[ready]")
        fcntl.ioctl(term.master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
        term.expect(b"[winch]")
        term.send(b"\x03")  # Ctrl-C
        term.expect(b"[interrupted]")
        assert term.wait() == 5, term.tail()  # the program's own status: the sandbox was not killed
    finally:
        term.close()


# -- read-only roots ---------------------------------------------------------------------------

GUIDE = b"Shared guide: read-only for every session (canary G5ui)\n"

READ_ONLY_SCRIPT = """
import errno, json, os
guide = "/memory/agent-shared/docs/guide.md"
attempts = {
    "open O_WRONLY": lambda: os.open(guide, os.O_WRONLY),
    "open O_RDWR": lambda: os.open(guide, os.O_RDWR),
    "open O_TRUNC": lambda: os.open(guide, os.O_WRONLY | os.O_TRUNC),
    "open O_APPEND": lambda: os.open(guide, os.O_WRONLY | os.O_APPEND),
    "truncate": lambda: os.truncate(guide, 0),
    "create in folder": lambda: os.open("/memory/agent-shared/docs/new.md", os.O_WRONLY | os.O_CREAT, 0o600),
    "create at root": lambda: os.open("/memory/agent-shared/new.md", os.O_WRONLY | os.O_CREAT, 0o600),
    "mkdir": lambda: os.mkdir("/memory/agent-shared/new"),
    "unlink": lambda: os.unlink(guide),
    "rename": lambda: os.rename(guide, "/memory/agent-shared/docs/moved.md"),
    "rmdir": lambda: os.rmdir("/memory/agent-shared/docs"),
    "chmod": lambda: os.chmod(guide, 0o666),
    "utime": lambda: os.utime(guide),
    "symlink": lambda: os.symlink("guide.md", "/memory/agent-shared/docs/link.md"),
    "setxattr": lambda: os.setxattr(guide, "user.x", b"1"),
}
out = {}
for name, attempt in attempts.items():
    try:
        result = attempt()
        out[name] = "ok"
        if isinstance(result, int):
            os.close(result)
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""

READ_ONLY_SHELL = """
printf 'from tmp\\n' > /tmp/x.md
for attempt in \\
    "sed -i s/guide/GUIDE/ agent-shared/docs/guide.md" \\
    "echo appended >> agent-shared/docs/guide.md" \\
    "echo replaced > agent-shared/docs/guide.md" \\
    "touch agent-shared/docs/new.md" \\
    "cp /tmp/x.md agent-shared/docs/" \\
    "mv /tmp/x.md agent-shared/x.md" \\
    "rm -f agent-shared/docs/guide.md" \\
    "mv $1 agent-shared/"; do
  if sh -c "$attempt" 2>/dev/null; then echo "succeeded: $attempt"; fi
done
cat agent-shared/docs/guide.md
"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_only_root_stays_read_only_inside(scenario: Scenario, kind: str) -> None:
    p = place(scenario, kind)
    home = scenario.cli.home
    publish_shared(home, "agent-shared/docs/guide.md", GUIDE, scenario.alice_session)
    assert sandbox(scenario, p.session, "cat", "agent-shared/docs/guide.md").out == GUIDE  # readable here
    before = snapshot(home, skip_tables=("audit",))
    last_audit = _last_audit(home)

    calls = json.loads(sandbox(scenario, p.session, "python3", "-c", READ_ONLY_SCRIPT).out)
    shell = sandbox(scenario, p.session, "sh", "-c", READ_ONLY_SHELL, "sh", p.note)

    refused = {name: code for name, code in calls.items() if code not in ("EROFS", "EACCES")}
    assert refused == {}, f"not refused with EROFS/EACCES: {refused}"
    assert len(calls) == 15
    assert shell.out == GUIDE, shell.text  # no attempt succeeded, the guide is intact
    assert diff_snapshots(before, snapshot(home, skip_tables=("audit",))) == []
    assert _audited_since(home, last_audit) <= {("read", "allow"), ("retrieve", "allow")}
    listed = sandbox(scenario, p.session, "ls", "-RA", "/memory/agent-shared")
    assert parse_ls_recursive(listed.text, "/memory/agent-shared") == {"docs", "docs/guide.md"}


def _last_audit(home: Path) -> int:
    conn = apsw.Connection(str(home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return sqlite_int(conn.execute("SELECT coalesce(max(audit_id), 0) FROM audit").fetchall()[0][0])
    finally:
        conn.close()


def _audited_since(home: Path, audit_id: int) -> set[tuple[str, str]]:
    """(operation, decision) of every audit row after ``audit_id`` (the audit is in state.sqlite)."""
    conn = apsw.Connection(str(home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {(r[0], r[1]) for r in conn.execute("SELECT operation, decision FROM audit WHERE audit_id > ?",
                                                   (audit_id,))}
    finally:
        conn.close()
