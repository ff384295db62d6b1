"""Searching a view from inside it: the mount's hidden ``.search`` folder.

A sandboxed process has only its mount, so ``cat /memory/.search/<query>``
must be all it needs to search its own view (``vfs/queries.py`` has the
design). What these tests hold it to, on real mounts and real sandboxes:

* Inside ``scopefs run``, Alice finds her note and never Bob's, although
  Bob's notes share the query's words (and would outrank hers); the group
  finds the channel's fact and no private note. Every result names a
  virtual path of the view that the sandbox can open at ``/memory/<path>``.
* ``.search`` is never listed, so ``ls -a``, ``ls -R``, ``find`` and
  ``grep -r`` neither show it nor descend into it, and run no search.
* ``.search/json/<query>`` is byte for byte what ``scopefs --json search``
  prints for the same session and query, and ``.search/<query>`` what
  ``scopefs search`` prints; ``.search/about/<ID>/`` narrows like
  ``--about``.
* Nothing under ``.search`` can be written: the sandbox gets EACCES or
  EROFS, a host mount exactly the EROFS a read-only root gives, and the
  home does not change.
* A revoked binding makes the very next ``cat`` fail and then ``.search``
  vanish like every other name of the view; a results file held open stops
  serving, as does one whose quoted note was tombstoned.
* Every ``cat`` searches again (a note written a moment ago is found), and
  no query text reaches a log, the audit or any other file of the home.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from scopefs.catalog.home import Home
from scopefs.writer.tombstone import delete_note
from tests.conftest import (
    ALICE_FACT,
    SCOPEFS,
    Scenario,
    db_copy,
    diff_snapshots,
    snapshot,
    sqlite_int,
)
from tests.mountkit import Mounts, errno_of, mounts, wait_until  # noqa: F401

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 60.0
ALLERGY = "private/notes/allergy.md"
OFFSITE = "channel/offsite.md"
# Bob's second note: a path only Bob has, sharing (and repeating) the query's words.
BOB_ONLY = "private/bob/peanut-diary.md"
BOB_ONLY_FACT = b"Private fact: allergic to peanuts, allergic since Lisbon (canary B0b9)\n"
QUERY = "private fact allergic peanuts Lisbon"
CAT_TEXT_AND_JSON = 'cat "/memory/.search/$1" && echo "--json--" && python3 -c "$2" "$1"'
CANARIES = {"alice": b"A1c3", "bob": b"B0b7", "bob_only": b"B0b9", "channel": b"C4an"}
# Run inside the sandbox: every result must name a file of the view whose
# cited lines hold the snippet.
CHECK_PATHS = r"""
import json, sys
found = json.load(open("/memory/.search/json/" + sys.argv[1], encoding="utf-8"))
for hit in found["results"]:
    with open("/memory/" + hit["path"], encoding="utf-8") as note:
        lines = note.read().split("\n")[hit["start_line"] - 1:hit["end_line"]]
    assert hit["snippet"] in "\n".join(lines), hit["citation"]
print(json.dumps(found))
"""


# -- helpers ----------------------------------------------------------------------


def sandboxed(scenario: Scenario, session: str, script: str, *args: str) -> str:
    """``scopefs run SESSION -- sh -c SCRIPT sh ARGS...``; must succeed; its stdout."""
    result = scenario.cli("run", session, "--", "sh", "-c", script, "sh", *args, timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"the sandbox exited {result.code}: {result.err} {result.out!r}"
    return result.text


def searches_audited(scenario: Scenario) -> int:
    """How many revisions searches have returned (one audit row each), from a copy of state.sqlite."""
    with db_copy(scenario.cli.home / "state.sqlite") as conn:
        return sqlite_int(conn.execute("SELECT count(*) FROM audit WHERE operation = 'search'").fetchall()[0][0])


def add_bob_only_note(scenario: Scenario) -> None:
    scenario.cli.j("write", scenario.bob_session, BOB_ONLY, stdin=BOB_ONLY_FACT)
    # The negative control: the query does find Bob's notes, for Bob.
    paths = {hit["path"] for hit in scenario.cli.j("search", scenario.bob_session, QUERY)["results"]}
    assert {ALLERGY, BOB_ONLY} <= paths


def read_errno(path: Path) -> int:
    return errno_of(lambda: path.read_bytes())


# -- inside a sandbox -------------------------------------------------------------------


def test_alice_finds_her_note_and_never_bobs(scenario: Scenario) -> None:
    add_bob_only_note(scenario)
    out = sandboxed(scenario, scenario.alice_session, CAT_TEXT_AND_JSON,
                    QUERY, CHECK_PATHS)
    text, _, checked = out.partition("--json--\n")
    assert text.startswith(f"{ALLERGY}#L1-L1  score ")
    assert ALICE_FACT.decode().strip() in text
    found = json.loads(checked)
    assert [hit["path"] for hit in found["results"]] == [ALLERGY]
    for leaked in (CANARIES["bob"], CANARIES["bob_only"], b"peanut-diary", b"private/bob", CANARIES["channel"]):
        assert leaked not in out.encode(), leaked


def test_the_group_finds_the_channel_fact_and_no_private_note(scenario: Scenario) -> None:
    add_bob_only_note(scenario)
    out = sandboxed(scenario, scenario.group_session, CAT_TEXT_AND_JSON,
                    QUERY, CHECK_PATHS)
    text, _, checked = out.partition("--json--\n")
    paths = [hit["path"] for hit in json.loads(checked)["results"]]
    assert paths == [OFFSITE]
    assert text.startswith(f"{OFFSITE}#L1-L1  score ") and CANARIES["channel"] in text.encode()
    for leaked in (CANARIES["alice"], CANARIES["bob"], CANARIES["bob_only"], b"private/", b"allerg"):
        assert leaked not in out.encode(), leaked


def test_listings_never_show_or_enter_the_query_folder(scenario: Scenario) -> None:
    before = searches_audited(scenario)
    out = sandboxed(scenario, scenario.alice_session,
                    "ls -a /memory; echo --R--; ls -RA /memory; echo --find--; find /memory;"
                    " echo --grep--; grep -rl allergic /memory; echo --du--; du -a /memory | cut -f2;"
                    " echo --inside--; ls -A /memory/.search /memory/.search/json /memory/.search/about;"
                    " echo --mode--; stat -c '%A %U' /memory/.search /memory/private")
    listings, _, rest = out.partition("--inside--\n")
    assert ".search" not in listings
    grep = listings.split("--grep--\n")[1].split("--du--\n")[0]
    assert grep.split() == [f"/memory/{ALLERGY}"]
    inside, _, modes = rest.partition("--mode--\n")
    assert [line for line in inside.splitlines() if line and not line.endswith(":")] == []  # all empty
    search_mode, private_mode = modes.split()[0::2]
    assert search_mode == "dr-x------" and private_mode == "drwx------"  # read-only, owner-only like the view
    assert searches_audited(scenario) == before  # no listing ran a search


def test_json_and_text_are_exactly_what_the_command_line_prints(scenario: Scenario) -> None:
    add_bob_only_note(scenario)
    for session in (scenario.alice_session, scenario.group_session):
        out = sandboxed(scenario, session, 'cat "/memory/.search/json/$1"; echo "--text--"; cat "/memory/.search/$1"',
                        QUERY)
        as_json, _, as_text = out.partition("--text--\n")
        cli_json = scenario.cli("--json", "search", session, QUERY, check=True).text
        cli_text = scenario.cli("search", session, QUERY, check=True).text
        assert as_json == cli_json
        assert as_text == cli_text
        assert json.loads(as_json)["results"]  # not merely two empty answers


def test_a_sandbox_cannot_write_under_the_query_folder(scenario: Scenario) -> None:
    before = snapshot(scenario.cli.home, skip_tables=("audit",))
    out = sandboxed(scenario, scenario.alice_session,
                    'try() { "$@" 2>&1; echo "rc=$?"; };'
                    ' try touch "/memory/.search/$1"; try sh -c "echo x > \\"/memory/.search/$1\\"";'
                    ' try sh -c "echo x >> /memory/.search/new"; try mkdir /memory/.search/d;'
                    ' try rm -f "/memory/.search/$1"; try rmdir /memory/.search/json; try rmdir /memory/.search;'
                    ' try mv /memory/private/notes/allergy.md /memory/.search/moved;'
                    ' try cp /memory/private/notes/allergy.md /memory/.search/json/copy;'
                    ' try chmod 777 /memory/.search; try truncate -s 0 "/memory/.search/$1"',
                    "allergic")
    codes = [line for line in out.splitlines() if line.startswith("rc=")]
    assert len(codes) == 11 and "rc=0" not in codes, out
    assert "Permission denied" in out or "Read-only file system" in out
    after = sandboxed(scenario, scenario.alice_session, "cat /memory/private/notes/allergy.md")
    assert after.encode() == ALICE_FACT
    changed = diff_snapshots(before, snapshot(scenario.cli.home, skip_tables=("audit",)))
    assert [d for d in changed if not d.startswith("mounts")] == []  # the sandbox servers' logs aside


def test_revocation_fails_the_next_cat_and_stops_held_results(scenario: Scenario) -> None:
    """Held open across the revocation: a results file, and a shell that searches again."""
    script = r"""
exec 3< "/memory/.search/$1" || exit 9
cat "/memory/.search/$1"; echo "--revoke--"
read line
cat "/memory/.search/$1" 2>&1; echo "first=$?"
i=0; while test -e /memory/private && test $i -lt 200; do sleep 0.05; i=$((i+1)); done
echo --view-empty--
cat "/memory/.search/$1" 2>&1; echo "search=$?"
cat /memory/private/notes/allergy.md 2>&1; echo "note=$?"
cat <&3 2>&1; echo "held=$?"
echo done
"""
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    launcher = subprocess.Popen([SCOPEFS, "run", scenario.alice_session, "--", "sh", "-c", script, "sh", "allergic"],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert launcher.stdout is not None and launcher.stdin is not None
        first = b""
        while not first.endswith(b"--revoke--\n"):
            line = launcher.stdout.readline()
            assert line, f"the sandbox ended early: {first!r}"
            first += line
        assert first.startswith(f"{ALLERGY}#L1-L1".encode()) and CANARIES["alice"] in first
        scenario.cli.j("binding", "revoke", scenario.alice_binding)
        launcher.stdin.write(b"go\n")
        launcher.stdin.close()
        rest = launcher.stdout.read().decode()
        assert launcher.wait(timeout=RUN_TIMEOUT_S) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert rest.rstrip().endswith("done"), rest
    assert "private fact" not in rest and CANARIES["alice"].decode() not in rest and f"{ALLERGY}#L" not in rest
    right_after, _, settled = rest.partition("--view-empty--\n")
    assert "first=0" not in right_after  # refused at once: the search itself asks the catalog
    # Once the mount has seen the revocation, .search is gone like every other name.
    search_out, note_out = settled.split("search=")[0], settled.split("search=")[1].split("note=")[0]
    assert "No such file or directory" in search_out and "search=0" not in settled
    assert "No such file or directory" in note_out and "note=0" not in settled
    assert "Permission denied" in settled.split("note=")[1] and "held=0" not in settled


# -- on a host mount (root: the mount's own answers, no kernel permission check first) ------


def test_writes_are_refused_exactly_like_a_read_only_root(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    result = view / ".search" / "allergic"
    assert result.read_bytes().startswith(ALLERGY.encode())
    before = snapshot(scenario.cli.home, skip_tables=("audit",))
    read_only_root = errno_of(lambda: os.close(os.open(view / "agent-shared" / "x.md", os.O_WRONLY | os.O_CREAT)))
    assert read_only_root == errno.EROFS
    def write_one(flags: int) -> None:  # no open reaches the mount (vfs.fs): the write is what is refused
        fd = os.open(result, flags)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)

    attempts = {
        "open for writing": lambda: write_one(os.O_WRONLY),
        "create over": lambda: os.close(os.open(result, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)),
        "append": lambda: write_one(os.O_WRONLY | os.O_APPEND),
        "unlink": lambda: os.unlink(result),
        "rmdir .search": lambda: os.rmdir(view / ".search"),
        "rmdir json": lambda: os.rmdir(view / ".search" / "json"),
        "rename into": lambda: os.rename(view / ALLERGY, view / ".search" / "moved"),
        "rename out": lambda: os.rename(result, view / "private" / "notes" / "results.md"),
        "truncate": lambda: os.truncate(result, 0),
        "utime": lambda: os.utime(result),
        "chmod folder": lambda: os.chmod(view / ".search", 0o777),
    }
    refused = {name: errno.errorcode.get(errno_of(call), "ok") for name, call in attempts.items()}
    assert refused == dict.fromkeys(attempts, "EROFS")
    # Every name in a query folder is a query, so nothing new can be made there either.
    assert errno_of(lambda: os.mkdir(view / ".search" / "d")) == errno.EEXIST
    assert errno_of(lambda: os.symlink("x", view / ".search" / "l")) == errno.EEXIST
    assert (view / ALLERGY).read_bytes() == ALICE_FACT
    assert diff_snapshots(before, snapshot(scenario.cli.home, skip_tables=("audit",))) == []


def test_every_cat_searches_again_and_sizes_are_exact(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    result = view / ".search" / "Miso cat named"
    assert b"private/pets.md" not in result.read_bytes()
    scenario.cli.j("write", scenario.alice_session, "private/pets.md",
                   stdin=b"Alice has a cat named Miso (canary M1so)\n")
    data = result.read_bytes()  # no wait: nothing of the last answer was cached
    assert data.startswith(b"private/pets.md#L1-L1  score ") and b"M1so" in data
    assert os.stat(result).st_size == len(data)
    as_json = (view / ".search" / "json" / "Miso cat named").read_bytes()
    assert os.stat(view / ".search" / "json" / "Miso cat named").st_size == len(as_json)
    assert json.loads(as_json)["results"][0]["path"] == "private/pets.md"


def test_a_held_results_file_stops_when_a_quoted_note_is_tombstoned(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    fd = os.open(view / ".search" / "allergic hazelnuts", os.O_RDONLY)
    try:
        assert CANARIES["alice"] in os.pread(fd, 4096, 0)
        delete_note(Home.open(scenario.cli.home), scenario.alice_session, ALLERGY)

        def refused() -> bool:
            try:
                os.pread(fd, 4096, 0)
            except PermissionError:
                return True
            return False

        wait_until(refused)  # once the mount has seen the tombstone, as for a held note
    finally:
        os.close(fd)
    assert (view / ".search" / "allergic hazelnuts").read_bytes() == b"no results\n"


def test_about_folders_narrow_like_the_about_option(scenario: Scenario, mounts: Mounts) -> None:
    scenario.cli.j("subject", "add", scenario.alice_session, ALLERGY, scenario.alice)
    view = mounts.mount(scenario.alice_session)
    about_alice = view / ".search" / "about" / scenario.alice
    text = (about_alice / "allergic").read_bytes()
    assert text.startswith(f"{ALLERGY}#L1-L1".encode())
    assert text == scenario.cli("search", scenario.alice_session, "allergic", "--about", scenario.alice,
                                check=True).out
    assert (about_alice / "json" / "allergic").read_bytes() == scenario.cli(
        "--json", "search", scenario.alice_session, "allergic", "--about", scenario.alice, check=True).out
    assert (view / ".search" / "about" / scenario.bob / "allergic").read_bytes() == b"no results\n"
    assert os.listdir(view / ".search" / "about") == [] and os.listdir(about_alice) == []


def test_names_that_are_not_queries(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    search = view / ".search"
    assert read_errno(search / "?!") == errno.EINVAL  # no words to search for
    assert read_errno(search / "   ") == errno.EINVAL  # empty once spaces are folded
    assert read_errno(search / "about" / "p_nosuchprincipal" / "allergic") == errno.EINVAL
    assert errno_of(lambda: os.stat(os.fsencode(str(search)) + b"/\xff\xfe")) == errno.ENOENT  # not UTF-8
    assert read_errno(search / "json") == errno.EISDIR
    assert (search / "json" / "json").read_bytes().startswith(b'{"arms": ')  # a query spelled like a folder
    assert (search / "json ").read_bytes() == scenario.cli("search", scenario.alice_session, "json", check=True).out
    assert read_errno(view / "private" / ".search") == errno.ENOENT  # only at the root


def test_no_query_text_reaches_the_home(scenario: Scenario, mounts: Mounts) -> None:
    marker = "quokka7731"
    view = mounts.mount(scenario.alice_session)
    for name in (f"allergic {marker}", f"json/{marker} hazelnuts", f"about/{scenario.alice}/{marker}",
                 f"about/p_nosuch{marker}/allergic", f"{marker} ?!"):
        try:
            (view / ".search" / name).read_bytes()
        except OSError:
            pass
    sandboxed(scenario, scenario.alice_session, 'cat "/memory/.search/$1"', f"allergic {marker}")
    mounts.umount(view)
    files = [p for p in scenario.cli.home.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files)  # the mount servers' logs are among them
    for path in files:
        assert marker.encode() not in path.read_bytes(), path
