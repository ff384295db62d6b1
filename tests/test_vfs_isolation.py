"""A mounted view is the session's whole world, and nothing more (DESIGN.md §1, §4, §5).

* The tree holds only the session's virtual roots; another store's bytes
  never appear anywhere under it (``grep -r``).
* A name outside the view, a resource denied to the session and a missing
  file answer every call with the same errno (invariant 3).
* Nothing observable from the mount counts or orders other stores' notes:
  inode numbers are this mount's own, ``statfs`` is a constant.
* xattrs, read-only roots, the ambiguous view and hostile names, links and
  special files are refused with a clear errno and change nothing.
* A symlink or hard link planted in the artifact area is never followed:
  the note reads ``EIO``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog.access import authorize_session
from scopefs.catalog.fsafe import open_dir
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Mount, Op
from scopefs.catalog.view import READ_WRITE
from scopefs.writer import lock
from scopefs.writer import transaction as tx
from scopefs.writer.stores import ensure_store
from tests.conftest import (
    ALICE_FACT,
    BOB_FACT,
    CHANNEL_FACT,
    Cli,
    Scenario,
    artifact_path,
    diff_snapshots,
    snapshot,
)
from tests.mountkit import Mounts, live_notes, mounts, wait_until  # noqa: F401

NOTE = "private/notes/allergy.md"
GUIDE = b"Agent-shared guide: how to file an expense (canary G5hd)\n"
SECRET = b"Agent-shared note hidden from some sessions (canary D3ny)\n"
ENOTSUP = {errno.ENOTSUP, errno.EOPNOTSUPP}


# -- helpers ----------------------------------------------------------------

def publish_shared(home_dir: Path, path: str, data: bytes, via_session: str) -> str:
    """Write a note into the agent-shared store; returns its resource id.

    No session may write there (its placement is read-only for everyone),
    and the operator command that publishes into it is not built yet. This
    stands in for it: the writer's own staged-rename transaction, run with
    an operator view whose only root is a writable agent-shared mount.
    """
    home = Home.open(home_dir)
    access = authorize_session(home, via_session, Op.APPEND)
    shared = Mount("agent-shared", "agent-shared", "", READ_WRITE, READ_WRITE)
    access = dataclasses.replace(access, view=dataclasses.replace(access.view, mounts=(shared,), excluded=()))
    parts = split_virtual_path(path)
    staging_fd = open_dir(home.staging_dir(access.agent_id))
    try:
        with tx._staged(staging_fd, data) as staged:
            with lock.shared(home.lock_path(access.agent_id)):
                target, op = tx._plan(access, parts, None)
                assert target.mount is not None  # _plan refused a path outside every mount
                store = target.store or ensure_store(access, target.mount)
                return tx._commit(access, store, target, op, staging_fd, staged, None).resource_id
    finally:
        os.close(staging_fd)


def policy(home_dir: Path, resource_id: str, effect: Effect, capabilities: tuple[Op, ...],
           audience_kind: AudienceKind, audience_id: str = "") -> None:
    catalog = Home.open(home_dir).catalog("main")
    for capability in capabilities:
        add_entry(catalog, "main", target_kind="resource", target_id=resource_id, effect=effect,
                  capability=capability, audience_kind=audience_kind, audience_id=audience_id)


@dataclasses.dataclass
class Shared:
    guide: str  # agent-shared/docs/guide.md: readable by users, the group and (explicitly) the ambiguous view
    denied: str  # agent-shared/denied.md: denied to Alice; default-denied to the ambiguous view
    deep: str  # agent-shared/hidden-dir/deep.md: the same, one folder down


def setup_shared(scenario: Scenario) -> Shared:
    home = scenario.cli.home
    guide = publish_shared(home, "agent-shared/docs/guide.md", GUIDE, scenario.alice_session)
    denied = publish_shared(home, "agent-shared/denied.md", SECRET, scenario.alice_session)
    deep = publish_shared(home, "agent-shared/hidden-dir/deep.md", SECRET, scenario.alice_session)
    policy(home, guide, Effect.ALLOW, (Op.RETRIEVE, Op.READ), AudienceKind.SUBJECT_KIND, "ambiguous")
    for resource in (denied, deep):
        policy(home, resource, Effect.DENY, (Op.READ,), AudienceKind.PRINCIPAL, scenario.alice)
    return Shared(guide, denied, deep)


def ambiguous_session(scenario: Scenario) -> str:
    return str(scenario.cli.j("session", "open", "--agent", "main", "--shared-main")["session_id"])


def session_of(scenario: Scenario, who: str) -> str:
    if who == "ambiguous":
        return ambiguous_session(scenario)
    return {"alice": scenario.alice_session, "bob": scenario.bob_session, "group": scenario.group_session}[who]


def _read_or_errno(path: Path) -> bytes | int:
    try:
        return path.read_bytes()
    except OSError as exc:
        return exc.errno or -1


def _write_one(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


def outcome(fn: Callable[..., object], *args: object) -> str:
    """'ok' or the errno name of the OSError ``fn(*args)`` raised (an fd it returns is closed)."""
    try:
        result = fn(*args)
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else repr(exc)
    if isinstance(result, int) and not isinstance(result, bool) and result >= 0:
        os.close(result)
    return "ok"


def tree(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(str(Path(dirpath, name).relative_to(root)))
    return out


def home_state(home: Path) -> dict[str, Any]:
    """The whole home (audit rows aside), without the broker's mount registry."""
    return {k: v for k, v in snapshot(home, skip_tables=("audit",)).items()
            if k != "mounts" and not k.startswith("mounts/")}


def settle(mounts: Mounts, where: Path) -> None:  # noqa: F811
    """Wait for everything the mount may still do in the background: unmount it.

    ``scopefs umount`` returns only after the server committed pending
    removals and its audit batch and exited.
    """
    mounts.umount(where)


# -- what the tree holds -------------------------------------------------------

ROOTS = {
    "alice": ["agent-shared", "postbox", "private", "projections"],
    "group": ["agent-shared", "channel", "postbox", "projections"],
    "ambiguous": ["agent-shared"],
}


@pytest.mark.parametrize("who", ROOTS)
def test_the_tree_holds_only_the_session_roots(scenario: Scenario, mounts: Mounts, who: str) -> None:  # noqa: F811
    setup_shared(scenario)
    where = mounts.mount(session_of(scenario, who))
    assert sorted(os.listdir(where)) == ROOTS[who]
    expected = {
        "alice": {"agent-shared", "agent-shared/docs", "agent-shared/docs/guide.md", "postbox", "private",
                  "private/notes", "private/notes/allergy.md", "projections", "projections/agent-shared"},
        "group": {"agent-shared", "agent-shared/docs", "agent-shared/docs/guide.md", "agent-shared/denied.md",
                  "agent-shared/hidden-dir", "agent-shared/hidden-dir/deep.md", "channel", "channel/offsite.md",
                  "postbox", "projections", "projections/agent-shared", "projections/channel"},
        "ambiguous": {"agent-shared", "agent-shared/docs", "agent-shared/docs/guide.md"},
    }[who]
    assert tree(where) == expected
    for root in {"private", "channel", "projections", "postbox", "agent", "roles"} - set(ROOTS[who]):
        assert outcome(os.stat, where / root) == "ENOENT", root


def _grep(pattern: bytes, where: Path) -> tuple[int, bytes]:
    proc = subprocess.run(["grep", "-r", "-a", "-F", "-e", pattern, str(where)], capture_output=True, timeout=60,
                          check=False)
    return proc.returncode, proc.stdout


def test_another_store_s_bytes_never_appear_under_a_mount(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    setup_shared(scenario)
    # More of Bob's notes, at names Alice also uses and names she does not.
    scenario.cli.j("write", scenario.bob_session, "private/bob-only/diary.md", stdin=BOB_FACT * 3)
    scenario.cli.j("write", scenario.bob_session, "private/notes/diet.md", stdin=BOB_FACT)
    alice = mounts.mount(scenario.alice_session, "alice")
    group = mounts.mount(scenario.group_session, "group")

    bob_canary = BOB_FACT.split(b"(")[1].split(b")")[0]  # "canary B0b7"
    alice_canary = ALICE_FACT.split(b"(")[1].split(b")")[0]
    channel_canary = CHANNEL_FACT.split(b"(")[1].split(b")")[0]
    # Positive controls: grep does find what each view holds.
    assert _grep(alice_canary, alice)[0] == 0
    assert _grep(channel_canary, group)[0] == 0
    assert _grep(b"canary G5hd", alice)[0] == 0
    # Never another store's bytes, nor the agent-shared note denied to Alice.
    for pattern in (bob_canary, BOB_FACT.rstrip(b"\n"), b"peanuts", channel_canary, b"canary D3ny"):
        assert _grep(pattern, alice) == (1, b""), pattern
    for pattern in (bob_canary, alice_canary, b"hazelnuts", b"peanuts"):
        assert _grep(pattern, group) == (1, b""), pattern
    # Bob's names cannot be looked up either.
    for name in ("private/bob-only", "private/bob-only/diary.md", "private/notes/diet.md"):
        assert outcome(os.stat, alice / name) == "ENOENT", name
    assert "private" not in os.listdir(group)
    assert outcome(lambda: os.stat(group / "private")) == "ENOENT"
    assert outcome(lambda: os.listdir(group / "private")) == "ENOENT"


# -- outside, denied and missing look the same ----------------------------------

def _battery(where: Path, rel: str) -> dict[str, str]:
    """Every way a caller might probe a name; each one's errno (or 'ok')."""
    p = where / rel
    sibling = p.with_name(p.name + "-renamed")
    return {
        "stat": outcome(lambda: os.stat(p)),
        "lstat": outcome(lambda: os.lstat(p)),
        "stat-child": outcome(lambda: os.stat(p / "x.md")),
        "open-read": outcome(lambda: os.open(p, os.O_RDONLY)),
        "open-write": outcome(lambda: os.open(p, os.O_WRONLY)),
        "open-dir": outcome(lambda: os.open(p, os.O_RDONLY | os.O_DIRECTORY)),
        "listdir": outcome(lambda: os.listdir(p)),
        "readlink": outcome(lambda: os.readlink(p)),
        "getxattr": outcome(lambda: os.getxattr(p, "user.x")),
        "listxattr": outcome(lambda: os.listxattr(p)),
        "unlink": outcome(lambda: os.unlink(p)),
        "rmdir": outcome(lambda: os.rmdir(p)),
        "rename-from": outcome(lambda: os.rename(p, sibling)),
        "truncate": outcome(lambda: os.truncate(p, 0)),
        "chmod": outcome(lambda: os.chmod(p, 0o600)),
        "utime": outcome(lambda: os.utime(p)),
        "create": outcome(lambda: os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)),
        "mkdir": outcome(lambda: os.mkdir(p)),
    }


INDISTINGUISHABLE = {
    # session: [(hidden name, missing name, why the first is hidden)]
    "group": [("private", "nonexistent", "outside the view"),
              ("private/notes/allergy.md", "nonexistent/notes/allergy.md", "outside the view"),
              ("roles", "nonexistent", "outside the view")],
    "alice": [("agent-shared/denied.md", "agent-shared/missing.md", "explicit deny"),
              ("agent-shared/hidden-dir", "agent-shared/missing-dir", "folder of a denied note"),
              ("agent-shared/hidden-dir/deep.md", "agent-shared/missing-dir/deep.md", "explicit deny"),
              ("channel", "nonexistent", "outside the view")],
    "ambiguous": [("agent-shared/denied.md", "agent-shared/missing.md", "default deny"),
                  ("agent-shared/hidden-dir", "agent-shared/missing-dir", "folder of a denied note"),
                  ("private", "nonexistent", "outside the view")],
}


@pytest.mark.parametrize("who", INDISTINGUISHABLE)
def test_outside_denied_and_missing_names_are_indistinguishable(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                                who: str) -> None:
    setup_shared(scenario)
    # The hidden names exist for someone: the group sees the shared notes, Alice her private root.
    group = mounts.mount(scenario.group_session, "control-group")
    alice = mounts.mount(scenario.alice_session, "control-alice")
    assert (group / "agent-shared/denied.md").read_bytes() == SECRET
    assert (group / "agent-shared/hidden-dir/deep.md").read_bytes() == SECRET
    assert (alice / NOTE).read_bytes() == ALICE_FACT
    where = {"alice": alice, "group": group}.get(who) or mounts.mount(session_of(scenario, who), who)
    before = home_state(scenario.cli.home)

    for hidden, missing, why in INDISTINGUISHABLE[who]:
        seen_hidden, seen_missing = _battery(where, hidden), _battery(where, missing)
        assert seen_hidden == seen_missing, (who, hidden, why)
        assert seen_hidden["stat"] == seen_hidden["open-read"] == seen_hidden["listdir"] == "ENOENT", seen_hidden
        parent = where / Path(hidden).parent
        if outcome(os.listdir, parent) == "ok":
            assert Path(hidden).name not in os.listdir(parent)
    # A folder holding only denied notes looks like an empty one (size, links, mode).
    if who == "alice":
        def shape(p: Path) -> tuple[int, int, int, int]:
            st = os.stat(p)
            return st.st_mode, st.st_nlink, st.st_size, st.st_blocks
        assert sorted(os.listdir(where / "agent-shared")) == ["docs"]
        assert shape(where / "agent-shared") == shape(where / "postbox")
    for m in list(mounts.active):
        settle(mounts, m)
    assert diff_snapshots(before, home_state(scenario.cli.home)) == []


# -- nothing counts or orders other stores ------------------------------------

BOB_NOTES = {
    "private/notes/diet.md": b"Bob: no dairy\n",
    "private/zeta/plan.md": b"Bob: plan\n",
    "private/a/b/c.md": b"Bob: deep\n",
}


BOB_TREE = ["agent-shared", "postbox", "private", "private/notes", "private/notes/allergy.md",
            "private/notes/diet.md", "private/zeta", "private/zeta/plan.md", "private/a", "private/a/b",
            "private/a/b/c.md", "projections", "projections/agent-shared"]


def _inodes(where: Path) -> dict[str, int]:
    """st_ino of Bob's whole tree, each name first looked up in one fixed order.

    (Names are looked up one by one, not listed: a listing shows a folder's
    children all at once, in an order of the server's choosing.)
    """
    out = {".": os.stat(where).st_ino}
    for rel in BOB_TREE:
        out[rel] = os.lstat(where / rel).st_ino
    assert tree(where) == set(BOB_TREE)  # nothing else is there
    assert {rel: os.lstat(where / rel).st_ino for rel in BOB_TREE} == {k: v for k, v in out.items() if k != "."}
    return out


def test_inode_numbers_do_not_reveal_other_stores(scenario: Scenario, scenario_template: Scenario,
                                                  mounts: Mounts, tmp_path: Path) -> None:  # noqa: F811
    """Two copies of one home differ only in 51 notes of others, written before Bob's: Bob sees the same inodes."""
    quiet_home = scenario.cli.home
    busy_home = tmp_path / "busy-home"
    shutil.copytree(scenario_template.cli.home, busy_home, symlinks=True)

    quiet, busy = Home.open(quiet_home), Home.open(busy_home)
    for i in range(50):  # rows Bob's notes come after, in the busy copy only
        tx.write_note(busy, scenario.alice_session, f"private/bulk/{i:02d}.md", b"alice %d\n" % i)
    tx.write_note(busy, scenario.group_session, "channel/more.md", b"channel\n")
    for home in (quiet, busy):
        for path, data in BOB_NOTES.items():
            tx.write_note(home, scenario.bob_session, path, data)

    seen_quiet = _inodes(mounts.mount(scenario.bob_session, "quiet"))
    busy_mounts = Mounts(Cli(busy_home), tmp_path / "busy-mnt")
    try:
        seen_busy = _inodes(busy_mounts.mount(scenario.bob_session, "busy"))
    finally:
        busy_mounts.cleanup()
    assert seen_quiet == seen_busy
    # Numbered by this mount, in the order it first showed a name: 1 is the
    # root, then 2, 3, ... with no gaps where other stores' rows would be.
    assert seen_quiet == {".": 1, **{rel: 2 + i for i, rel in enumerate(BOB_TREE)}}


def test_statfs_is_one_constant_for_every_session(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    views = [mounts.mount(scenario.alice_session, "alice"), mounts.mount(scenario.group_session, "group"),
             mounts.mount(ambiguous_session(scenario), "ambiguous")]
    first = [os.statvfs(v) for v in views]
    assert first[0] == first[1] == first[2]
    assert os.statvfs(views[0] / "private/notes") == first[0]

    home = Home.open(scenario.cli.home)  # Bob writes a lot: many notes and a large one
    for i in range(30):
        tx.write_note(home, scenario.bob_session, f"private/many/{i:02d}.md", b"b" * 4096)
    tx.write_note(home, scenario.bob_session, "private/large.bin", os.urandom(1 << 20) * 8)
    wait_until(lambda: len(live_notes(scenario.cli.home, scenario.bob)) == 32)
    after = [os.statvfs(v) for v in views]
    assert after == first


# -- xattrs ------------------------------------------------------------------

def test_xattrs_are_refused_and_change_nothing(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    setup_shared(scenario)
    where = mounts.mount(scenario.alice_session)
    before = home_state(scenario.cli.home)
    targets = [where, where / "private", where / "private/notes", where / NOTE, where / "agent-shared/docs/guide.md"]
    for target in targets:
        for call, *args in (
            (os.getxattr, target, "user.scopefs.owner"),
            (os.getxattr, target, "trusted.overlay.opaque"),
            (os.listxattr, target),
            (os.setxattr, target, "user.scopefs.owner", b"bob"),
            (os.setxattr, target, "user.audience", b"any", os.XATTR_CREATE),
            (os.setxattr, target, "trusted.scopefs", b"1"),
            (os.removexattr, target, "user.scopefs.owner"),
        ):
            name = (call.__name__, *args[1:])
            with pytest.raises(OSError) as caught:
                call(*args)
            assert caught.value.errno in ENOTSUP | {errno.ENODATA}, (target, name, caught.value)
        # Nothing was stored: asking again still finds nothing.
        with pytest.raises(OSError) as caught:
            os.getxattr(target, "user.scopefs.owner")
        assert caught.value.errno in ENOTSUP | {errno.ENODATA}
    assert (where / NOTE).read_bytes() == ALICE_FACT
    settle(mounts, where)
    assert diff_snapshots(before, home_state(scenario.cli.home)) == []


# -- read-only roots ---------------------------------------------------------

def _readonly_ops(where: Path, who: str) -> dict[str, Callable[[], object]]:
    guide = where / "agent-shared/docs/guide.md"
    ops: dict[str, Callable[[], object]] = {
        "create": lambda: os.open(where / "agent-shared/new.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
        "create-in-folder": lambda: os.open(where / "agent-shared/docs/new.md", os.O_WRONLY | os.O_CREAT, 0o600),
        "create-over-hidden-name": lambda: _write_one(where / "agent-shared/denied.md", os.O_WRONLY | os.O_CREAT),
        # No open reaches the mount (vfs.fs): root's open for writing succeeds (a sandbox's uid is
        # refused by the modes, EACCES) and its first write is refused.
        "open-write": lambda: _write_one(guide, os.O_WRONLY),
        "open-rdwr": lambda: _write_one(guide, os.O_RDWR),
        "open-append": lambda: _write_one(guide, os.O_WRONLY | os.O_APPEND),
        "open-trunc": lambda: os.open(guide, os.O_WRONLY | os.O_TRUNC),
        "unlink": lambda: os.unlink(guide),
        "mkdir": lambda: os.mkdir(where / "agent-shared/newdir"),
        "mkdir-in-folder": lambda: os.mkdir(where / "agent-shared/docs/sub"),
        "rmdir": lambda: os.rmdir(where / "agent-shared/docs"),
        "rename-within-folder": lambda: os.rename(guide, where / "agent-shared/docs/moved.md"),
        "rename-within-root": lambda: os.rename(guide, where / "agent-shared/moved.md"),
        "rename-folder": lambda: os.rename(where / "agent-shared/docs", where / "agent-shared/docs2"),
        "truncate": lambda: os.truncate(guide, 0),
        "truncate-grow": lambda: os.truncate(guide, 1 << 20),
        "chmod-note": lambda: os.chmod(guide, 0o666),
        "chmod-root": lambda: os.chmod(where / "agent-shared", 0o777),
        "utime": lambda: os.utime(guide, (0, 0)),
    }
    writable = {"alice": "private/notes/allergy.md", "group": "channel/offsite.md"}.get(who)
    if writable is not None:  # moving between a writable root and the read-only one
        ops["rename-out"] = lambda: os.rename(guide, where / Path(writable).parent / "guide.md")
        ops["rename-in"] = lambda: os.rename(where / writable, where / "agent-shared/moved.md")
    if who == "group":
        ops["create-in-projections"] = lambda: os.open(where / "projections/channel/x.md",
                                                       os.O_WRONLY | os.O_CREAT, 0o600)
        ops["mkdir-in-projections"] = lambda: os.mkdir(where / "projections/channel/x")
        ops["create-by-projections"] = lambda: os.open(where / "projections/x.md", os.O_WRONLY | os.O_CREAT, 0o600)
    if who == "ambiguous":  # every write, wherever it is aimed
        ops["create-at-root"] = lambda: os.open(where / "x.md", os.O_WRONLY | os.O_CREAT, 0o600)
        ops["mkdir-at-root"] = lambda: os.mkdir(where / "private")
        ops["chmod-mount-root"] = lambda: os.chmod(where, 0o777)
    return ops


@pytest.mark.parametrize("who", ["alice", "group", "ambiguous"])
def test_read_only_roots_refuse_every_change_with_erofs(scenario: Scenario, mounts: Mounts, who: str) -> None:  # noqa: F811
    setup_shared(scenario)
    session = session_of(scenario, who)
    where = mounts.mount(session)
    assert (where / "agent-shared/docs/guide.md").read_bytes() == GUIDE
    before = home_state(scenario.cli.home)
    seen = {name: outcome(op) for name, op in _readonly_ops(where, who).items()}
    assert seen == dict.fromkeys(seen, "EROFS")
    # A shell redirect reports the same.
    shell = subprocess.run(["sh", "-c", f"echo x > '{where}/agent-shared/docs/guide.md'"], capture_output=True,
                           text=True, timeout=30, env={**os.environ, "LC_ALL": "C"})
    assert shell.returncode != 0 and "Read-only file system" in shell.stderr
    assert (where / "agent-shared/docs/guide.md").read_bytes() == GUIDE
    assert sorted(os.listdir(where / "agent-shared/docs")) == ["guide.md"]
    settle(mounts, where)
    assert diff_snapshots(before, home_state(scenario.cli.home)) == []
    assert scenario.cli("read", session, "agent-shared/docs/guide.md").out == GUIDE


# -- hostile input ------------------------------------------------------------

HOSTILE_NAMES: dict[str, tuple[bytes, int]] = {
    # label: (name as raw bytes, errno for creating it)
    "control-soh": (b"a\x01b.md", errno.EINVAL),
    "control-tab": (b"tab\there.md", errno.EINVAL),
    "control-newline": (b"new\nline.md", errno.EINVAL),
    "control-escape": (b"esc\x1b[31m.md", errno.EINVAL),
    "control-del": (b"del\x7f.md", errno.EINVAL),
    "c1-control": ("c1\u0085.md".encode(), errno.EINVAL),
    "256-bytes": (b"a" * 256, errno.ENAMETOOLONG),
    "256-bytes-multibyte": ("é".encode() * 128, errno.ENAMETOOLONG),
    "1000-bytes": (b"n" * 996 + b".md", errno.ENAMETOOLONG),
    "not-utf8": (b"\xff\xfe.md", errno.EINVAL),
    "latin1": (b"caf\xe9.md", errno.EINVAL),
    "overlong-utf8": (b"\xc0\xaf.md", errno.EINVAL),
    "surrogate-utf8": (b"\xed\xa0\x80.md", errno.EINVAL),
    "not-nfc": ("cafe\u0301.md".encode(), errno.EINVAL),
    "not-nfc-angstrom": ("A\u030angstrom.md".encode(), errno.EINVAL),
    "zero-width": ("aller\u200bgy.md".encode(), errno.EINVAL),
    "bidi-override": ("rtl\u202egpj.md".encode(), errno.EINVAL),
    "bom": ("\ufeffnote.md".encode(), errno.EINVAL),
    "cyrillic-a": ("\u0430llergy.md".encode(), errno.EINVAL),
    "cyrillic-u": ("allerg\u0443.md".encode(), errno.EINVAL),
    "fullwidth-a": ("\uff41llergy.md".encode(), errno.EINVAL),
    "other-case": (b"Allergy.md", errno.EINVAL),
    "upper-case": (b"ALLERGY.MD", errno.EINVAL),
}


def _renameat2(src: bytes, dst: bytes, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, src, at_fdcwd, dst, flags) != 0:
        return ctypes.get_errno()
    return 0


def test_hostile_names_and_special_files_get_clear_errnos_and_change_nothing(scenario: Scenario,
                                                                           mounts: Mounts) -> None:  # noqa: F811
    setup_shared(scenario)
    scenario.cli.j("write", scenario.alice_session, "private/notes/diet.md", stdin=b"no gluten\n")
    where = mounts.mount(scenario.alice_session)
    notes = os.fsencode(where / "private/notes")
    listing = sorted(os.listdir(notes))
    assert listing == [b"allergy.md", b"diet.md"]
    before = home_state(scenario.cli.home)

    wrong: list[tuple[object, ...]] = []
    for label, (name, code) in HOSTILE_NAMES.items():
        path = notes + b"/" + name
        want = errno.errorcode[code]
        seen = {
            "create": outcome(os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
            "mkdir": outcome(os.mkdir, path),
            "rename-to": outcome(os.rename, notes + b"/diet.md", path),
            "mknod-regular": outcome(os.mknod, path, stat.S_IFREG | 0o600),
        }
        expected = {"create": want, "mkdir": want, "rename-to": want, "mknod-regular": "EPERM"}
        # A name that cannot exist is simply not there.
        looked = outcome(os.stat, path)
        if seen != expected or looked not in ({"ENOENT", "ENAMETOOLONG"} if code == errno.ENAMETOOLONG
                                              else {"ENOENT"}):
            wrong.append((label, seen, looked))
    # A look-alike of a folder's name is refused too.
    if outcome(lambda: os.mkdir(where / "private/Notes")) != "EINVAL":
        wrong.append(("folder-case", outcome(lambda: os.stat(where / "private/Notes"))))

    note = notes + b"/allergy.md"
    special = {
        "symlink": (lambda: os.symlink(b"allergy.md", notes + b"/link.md"), "EPERM"),
        "symlink-absolute": (lambda: os.symlink(b"/etc/passwd", notes + b"/passwd"), "EPERM"),
        "symlink-out-of-view": (lambda: os.symlink(b"../../../home", notes + b"/escape"), "EPERM"),
        "hard-link": (lambda: os.link(note, notes + b"/hard.md"), "EPERM"),
        "hard-link-across-roots": (lambda: os.link(where / "agent-shared/docs/guide.md",
                                                   where / "private/notes/guide.md"), "EPERM"),
        "fifo": (lambda: os.mkfifo(notes + b"/fifo"), "EPERM"),
        "char-device": (lambda: os.mknod(notes + b"/null", stat.S_IFCHR | 0o600, os.makedev(1, 3)), "EPERM"),
        "socket-node": (lambda: os.mknod(notes + b"/sock", stat.S_IFSOCK | 0o600), "EPERM"),
        "setxattr": (lambda: os.setxattr(note, "user.audience", b"any"), "EOPNOTSUPP"),
    }
    for label, (call, want) in special.items():
        got = outcome(call)
        if got != want and not (want == "EOPNOTSUPP" and got == "ENOTSUP"):
            wrong.append((label, got))
    tmpfile = outcome(lambda: os.open(notes, os.O_TMPFILE | os.O_RDWR, 0o600))
    if tmpfile not in {"EOPNOTSUPP", "ENOTSUP", "EPERM", "EINVAL", "EISDIR"}:
        wrong.append(("O_TMPFILE", tmpfile))
    exchanged = _renameat2(note, notes + b"/diet.md", 2)  # RENAME_EXCHANGE
    if exchanged != errno.EINVAL:
        wrong.append(("RENAME_EXCHANGE", errno.errorcode.get(exchanged, exchanged)))
    assert wrong == []

    assert sorted(os.listdir(notes)) == listing
    assert (where / NOTE).read_bytes() == ALICE_FACT
    assert (where / "private/notes/diet.md").read_bytes() == b"no gluten\n"
    settle(mounts, where)
    assert diff_snapshots(before, home_state(scenario.cli.home)) == []


# -- planted links in the artifact area ---------------------------------------

@pytest.mark.parametrize("when", ["before-mount", "after-a-read"])
@pytest.mark.parametrize("kind", ["symlink", "hard-link"])
def test_a_planted_link_in_the_artifact_area_is_never_followed(scenario: Scenario, mounts: Mounts, kind: str,  # noqa: F811
                                                                when: str) -> None:
    """Alice's artifact is swapped for a link to a file in Bob's store holding the very same bytes.

    Only the link itself is wrong (the content would pass the hash check),
    so an EIO here proves the link was refused, not that a hash differed.
    """
    scenario.cli.j("write", scenario.bob_session, "private/notes/copy.md", stdin=ALICE_FACT)
    home = scenario.cli.home
    mine = artifact_path(home, scenario.alice, "notes/allergy.md")
    bobs = artifact_path(home, scenario.bob, "notes/copy.md")
    assert mine.parent != bobs.parent and bobs.read_bytes() == ALICE_FACT

    def plant() -> None:
        mine.unlink()
        if kind == "symlink":
            os.symlink(bobs, mine)
        else:
            os.link(bobs, mine)

    if when == "before-mount":
        plant()
        where = mounts.mount(scenario.alice_session)
    else:
        where = mounts.mount(scenario.alice_session)
        assert (where / NOTE).read_bytes() == ALICE_FACT
        plant()
    assert os.lstat(mine).st_nlink == 2 if kind == "hard-link" else os.path.islink(mine)

    if when != "before-mount":  # the kernel serves the verified pages it holds until the mount's recheck
        wait_until(lambda: _read_or_errno(where / NOTE) in (errno.EIO, ALICE_FACT)
                   and _read_or_errno(where / NOTE) == errno.EIO, timeout=10)  # the sweep is each second
    for _ in range(2):  # the refusal sticks
        with pytest.raises(OSError) as caught:
            (where / NOTE).read_bytes()
        assert caught.value.errno == errno.EIO
    cat = subprocess.run(["cat", str(where / NOTE)], capture_output=True, timeout=30)
    assert cat.returncode != 0 and cat.stdout == b""
    # The name is still there (with the catalog's size); only its bytes are refused.
    assert os.listdir(where / "private/notes") == ["allergy.md"]
    assert os.stat(where / NOTE).st_size == len(ALICE_FACT)
    # The link's target is untouched and still Bob's.
    assert bobs.read_bytes() == ALICE_FACT
