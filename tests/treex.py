"""A tree exerciser: fsx's idea for names, folders and whole files, with a model of the tree.

``tests/fsx.py`` checks the bytes of one file. This does the same for a
folder of notes: a seeded, reproducible sequence of what tools do to a
tree (create, overwrite with ``O_TRUNC``, append, write in the middle of a
reopened file, save through a temporary name renamed over the note,
rename, remove, make and remove folders, ``touch``), each applied to the
real tree and to a model (path -> bytes, and the folders), and after every
operation the names it touched, a file's bytes or a folder's listing
checked against the model. Every ``checkpoint_every`` operations the
caller gets the model to compare with what others see (another session's
mount, the catalog).

Names keep clear of what a mount takes for scratch files (hidden names,
names ending in ``~``, digits only) and of look-alike siblings: ``nN.md``
in folders ``dN``. A folder that holds notes is not renamed (a mount
answers ``EXDEV``, and ``mv`` copies instead).
"""

from __future__ import annotations

import collections
import errno
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

NOTES = 6  # names per folder: n0.md .. n5.md
FOLDERS = 3  # d0 .. d2, under the root
LOG_KEPT = 40


class TreeMismatch(AssertionError):
    """The tree and the model disagree, or an operation failed; the message says where."""


@dataclass
class Model:
    """What the tree must hold: every file's bytes, and every folder (an emptied one stays, as on a disk,
    until ``rmdir``; on a mount it then lives only in that mount)."""

    files: dict[str, bytes] = field(default_factory=dict)
    folders: set[str] = field(default_factory=set)

    def empty_folders(self) -> list[str]:
        holding = {path.rsplit("/", 1)[0] for path in self.files if "/" in path}
        return sorted(self.folders - holding)

    def listing(self, folder: str) -> set[str]:
        prefix = folder + "/" if folder else ""
        names = {p[len(prefix):].split("/", 1)[0] for p in self.files if p.startswith(prefix)}
        return names | {f[len(prefix):].split("/", 1)[0] for f in self.folders if f.startswith(prefix)}


class TreeExerciser:
    """One folder under test (``root``, made empty if missing) and the model of what it must hold."""

    def __init__(self, root: Path, *, seed: int, checkpoint_every: int = 50,
                 checkpoint: Callable[[Model], None] | None = None, scale: int = 1) -> None:
        self.root = root
        self.scale = scale  # notes written are up to 1.5 KiB times this
        self.rng = random.Random(seed)
        self.checkpoint_every = checkpoint_every
        self.checkpoint = checkpoint
        self.model = Model()
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_KEPT)
        self.counts = collections.Counter[str]()
        root.mkdir(exist_ok=True)
        self.operations = {
            "create": self._create, "touch": self._touch, "overwrite": self._overwrite, "append": self._append,
            "write_middle": self._write_middle, "save_by_rename": self._save_by_rename,
            "rename": self._rename, "unlink": self._unlink, "mkdir": self._mkdir, "rmdir": self._rmdir,
        }

    def run(self, operations: int) -> dict[str, int]:
        for number in range(1, operations + 1):
            self._before(number)
            name = self.rng.choice(sorted(self.operations))
            try:
                what = self.operations[name](number)
            except OSError as error:
                raise TreeMismatch(self._report(f"operation {number} ({name}) failed: {error!r}")) from error
            if what is not None:
                self.log.append(f"{number:5d} {what}")
                self.counts[name] += 1
            if self.checkpoint is not None and number % self.checkpoint_every == 0:
                self._check_all(f"before checkpoint {number}")
                self.checkpoint(self._copy())
        self._check_all("at the end")
        if self.checkpoint is not None:
            self.checkpoint(self._copy())
        return dict(sorted(self.counts.items()))

    def _before(self, number: int) -> None:
        """What happens before operation ``number``: nothing here (see ``TakingTurns``)."""

    # -- the operations: each returns what it did, or None if it had nothing to act on --------

    def _create(self, number: int) -> str | None:
        return self._new(number, "create")

    def _touch(self, number: int) -> str | None:
        """``touch``: a new empty file, closed unwritten. A mount commits it when the kernel releases it,
        which it does not wait for: whatever comes next may race that commit."""
        return self._new(number, "touch")

    def _new(self, number: int, how: str) -> str | None:
        path = self._free_name()
        if path is None:
            return None
        data = self._data(number) if how == "create" else b""
        self._parent_made(path)
        fd = os.open(self.root / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if data:
                os.write(fd, data)
        finally:
            os.close(fd)
        self.model.files[path] = data
        self._check_file(path, f"{how} {path}")
        return f"{how} {path} ({len(data)} bytes)"

    def _overwrite(self, number: int) -> str | None:
        return self._rewrite(number, "overwrite")

    def _append(self, number: int) -> str | None:
        return self._rewrite(number, "append")

    def _rewrite(self, number: int, how: str) -> str | None:
        """An existing note overwritten (``O_TRUNC``, as a shell's ``>``) or appended to (``>>``)."""
        path = self._existing()
        if path is None:
            return None
        data = self._data(number)
        with open(self.root / path, "ab" if how == "append" else "wb") as out:
            out.write(data)
        self.model.files[path] = self.model.files[path] + data if how == "append" else data
        self._check_file(path, f"{how} {path}")
        return f"{how} {path} ({len(data)} bytes)"

    def _write_middle(self, number: int) -> str | None:
        path = self._existing()
        if path is None or not self.model.files[path]:
            return None
        old = self.model.files[path]
        offset = self.rng.randrange(len(old))
        data = self._data(number)[: max(1, len(old) - offset)]
        self._check_file(path, f"write_middle {path}, before")
        fd = os.open(self.root / path, os.O_RDWR)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        self.model.files[path] = old[:offset] + data + old[offset + len(data):]
        self._check_file(path, f"write_middle {path}")
        return f"write_middle {path} at {offset} ({len(data)} bytes)"

    def _save_by_rename(self, number: int) -> str | None:
        """What an editor or ``sed -i`` does: the new bytes under a scratch name, renamed over the note."""
        path = self._existing()
        if path is None:
            return None
        data = self._data(number)
        target = self.root / path
        scratch = target.with_name(f".{target.name}.{number}.swp")
        scratch.write_bytes(data)
        os.rename(scratch, target)
        self.model.files[path] = data
        self._check_file(path, f"save_by_rename {path}")
        self._check_listing(_folder_of(path), f"save_by_rename {path}")
        return f"save_by_rename {path} ({len(data)} bytes)"

    def _rename(self, number: int) -> str | None:
        source = self._existing()
        target = self._any_name()
        if source is None or target == source:
            return None
        self._parent_made(target)
        os.rename(self.root / source, self.root / target)
        self.model.files[target] = self.model.files.pop(source)
        self._check_file(target, f"rename {source} -> {target}")
        self._check_gone(source, f"rename {source} -> {target}")
        return f"rename {source} -> {target}"

    def _unlink(self, number: int) -> str | None:
        path = self._existing()
        if path is None:
            return None
        os.unlink(self.root / path)
        del self.model.files[path]
        self._check_gone(path, f"unlink {path}")
        return f"unlink {path}"

    def _mkdir(self, number: int) -> str | None:
        folder = f"d{self.rng.randrange(FOLDERS)}"
        if folder in self.model.folders:
            return None
        os.mkdir(self.root / folder)
        self.model.folders.add(folder)
        self._check_listing("", f"mkdir {folder}")
        return f"mkdir {folder}"

    def _rmdir(self, number: int) -> str | None:
        empty = self.model.empty_folders()
        if not empty:
            return None
        folder = self.rng.choice(empty)
        os.rmdir(self.root / folder)
        self.model.folders.discard(folder)
        self._check_gone(folder, f"rmdir {folder}")
        return f"rmdir {folder}"

    # -- names and bytes --------------------------------------------------------------------------

    def _any_name(self) -> str:
        note = f"n{self.rng.randrange(NOTES)}.md"
        where = self.rng.randrange(FOLDERS + 1)
        return note if where == FOLDERS else f"d{where}/{note}"

    def _free_name(self) -> str | None:
        for _ in range(8):
            path = self._any_name()
            if path not in self.model.files:
                return path
        return None

    def _existing(self) -> str | None:
        return self.rng.choice(sorted(self.model.files)) if self.model.files else None

    def _data(self, number: int) -> bytes:
        line = f"operation {number}: {self.rng.getrandbits(64):016x}\n".encode()
        return line * self.rng.randrange(1, 40) * self.scale

    def _parent_made(self, path: str) -> None:
        """``mkdir -p`` of a note's folder, as a tool writing into a new folder does first."""
        if "/" in path:
            folder = path.rsplit("/", 1)[0]
            if folder not in self.model.folders:
                os.mkdir(self.root / folder)
                self.model.folders.add(folder)

    # -- the checks ---------------------------------------------------------------------------

    def _check_file(self, path: str, when: str) -> None:
        got = (self.root / path).read_bytes()
        if got != self.model.files[path]:
            raise TreeMismatch(self._report(f"{when}: {path} holds other bytes than were written "
                                            f"({len(got)} bytes, {len(self.model.files[path])} written)"))

    def _check_gone(self, path: str, when: str) -> None:
        if (self.root / path).exists():
            raise TreeMismatch(self._report(f"{when}: {path} is still there"))
        folder = _folder_of(path)
        self._check_listing(folder, when)

    def _check_listing(self, folder: str, when: str) -> None:
        where = self.root / folder if folder else self.root
        if folder and folder not in self.model.folders:
            return  # removed
        got = {name for name in os.listdir(where) if not name.startswith(".")}
        if got != self.model.listing(folder):
            raise TreeMismatch(self._report(f"{when}: {folder or '.'} lists {sorted(got)}, "
                                            f"the model {sorted(self.model.listing(folder))}"))

    def _check_all(self, when: str) -> None:
        for path in self.model.files:
            self._check_file(path, when)
        for folder in {""} | self.model.folders:
            self._check_listing(folder, when)

    def _copy(self) -> Model:
        return Model(dict(self.model.files), set(self.model.folders))

    def _report(self, what: str) -> str:
        return f"{what}\nthe last {len(self.log)} operations:\n" + "\n".join(self.log)



def _folder_of(path: str) -> str:
    """The folder of a note's relative path ("" for the root)."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


# -- several writers in turn ---------------------------------------------------------------------


class TakingTurns(TreeExerciser):
    """Several roots (mounts of different sessions) take turns at one tree, each only once its view shows
    what the model holds (``settle``, given the root and the model, returns then). Nothing races, so every
    step is checked against one model, and a writer acting on another's changes (loading its revision,
    renaming or removing its note, appending over pages it read before) must get them right: two writers
    at once (``interleaved_writes``) can only be checked for converging, and a write lost in both views
    would converge too.

    Folders are not made or removed on their own: one without notes lives only in the mount that made it
    (or emptied it), so the listings checked are the notes and the folders that hold notes.
    """

    def __init__(self, roots: list[Path], *, seed: int, settle: Callable[[Path, Model], None],
                 turn_every: int = 4, checkpoint_every: int = 50,
                 checkpoint: Callable[[Model], None] | None = None, scale: int = 1) -> None:
        super().__init__(roots[0], seed=seed, checkpoint_every=checkpoint_every, checkpoint=checkpoint,
                         scale=scale)
        self.roots = roots
        self.settle = settle
        self.turn_every = turn_every
        self.turns = 0
        del self.operations["mkdir"], self.operations["rmdir"]

    def _before(self, number: int) -> None:
        if self.rng.randrange(self.turn_every):
            return
        root = self.rng.choice([other for other in self.roots if other != self.root])
        self.settle(root, self._copy())
        self.root = root
        root.mkdir(exist_ok=True)  # the tree's folder shows in another mount only while it holds notes
        self.turns += 1
        self.log.append(f"{number:5d} root {self.roots.index(root)} takes its turn")

    def _parent_made(self, path: str) -> None:
        if "/" in path:
            folder = path.rsplit("/", 1)[0]
            (self.root / folder).mkdir(exist_ok=True)  # an emptied one may be left in another mount only
            self.model.folders.add(folder)

    def _check_listing(self, folder: str, when: str) -> None:
        where = self.root / folder if folder else self.root
        try:
            names = {name for name in os.listdir(where) if not name.startswith(".")}
        except FileNotFoundError:
            names = set()
        files = {name for name in names if (where / name).is_file()}
        folders = {name for name in names if (where / name).is_dir()}
        prefix = folder + "/" if folder else ""
        below = [path[len(prefix):] for path in self.model.files if path.startswith(prefix)]
        meant = {name for name in below if "/" not in name}
        holding = {name.split("/", 1)[0] for name in below if "/" in name}
        if files != meant or not holding <= folders or names != files | folders:  # the last: names listed, gone
            raise TreeMismatch(self._report(f"{when}: {folder or '.'} lists {sorted(names)}, the model's notes "
                                            f"{sorted(meant)} and folders holding notes {sorted(holding)}"))


# -- several writers at once ---------------------------------------------------------------------

# What a writer may meet when another changed the tree under it and its view has not caught up yet: the
# note is gone (ENOENT), taken (EEXIST), removed here while another put a different note at its name
# (EAGAIN: ``vfs.commits``'s create), or tombstoned by the other under an open descriptor (EACCES, on a
# mount without a gate: ``vfs.fs``'s Caveats).
RACED = frozenset({errno.ENOENT, errno.EEXIST, errno.EAGAIN, errno.EACCES})


def tree_of(root: Path) -> dict[str, bytes] | None:
    """Every file under ``root`` but hidden (scratch) ones, by relative path; None if a read failed
    (a name listed a moment before it went)."""
    files = _files_under(root)
    try:
        return None if files is None else {path: (root / path).read_bytes() for path in files}
    except OSError:
        return None


def interleaved_writes(roots: list[Path], *, seed: int, operations: int) -> collections.Counter[str]:
    """Random whole-file changes to the same tree through each of ``roots`` in turn (mounts of different
    sessions), each writer acting on what its own view shows. Nothing here can be checked against a model
    (the later writer wins); what the caller checks is that the roots and the catalog converge after.
    Returns what each operation ended with; any error but ``RACED`` ones fails."""
    rng = random.Random(seed)
    outcomes = collections.Counter[str]()
    log: collections.deque[str] = collections.deque(maxlen=LOG_KEPT)

    def any_name() -> str:
        note = f"n{rng.randrange(NOTES - 1)}.md"
        where = rng.randrange(FOLDERS)
        return note if where == FOLDERS - 1 else f"d{where}/{note}"

    for number in range(1, operations + 1):
        writer = rng.randrange(len(roots))
        root = roots[writer]
        path, other = root / any_name(), root / any_name()
        name = rng.choice(("create", "touch", "overwrite", "append", "save_by_rename", "rename", "unlink", "read",
                           "pause"))
        data = f"operation {number} by {writer}: {rng.getrandbits(64):016x}\n".encode() * rng.randrange(1, 30)
        try:
            if name in ("create", "touch"):
                path.parent.mkdir(exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    if name == "create":
                        os.write(fd, data)
                finally:
                    os.close(fd)
            elif name in ("overwrite", "append"):
                fd = os.open(path, os.O_WRONLY | (os.O_TRUNC if name == "overwrite" else os.O_APPEND))
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
            elif name == "save_by_rename":
                scratch = path.with_name(f".{path.name}.{number}.swp")
                scratch.write_bytes(data)
                try:
                    os.rename(scratch, path)
                finally:
                    scratch.unlink(missing_ok=True)
            elif name == "rename":
                other.parent.mkdir(exist_ok=True)
                os.rename(path, other)
            elif name == "unlink":
                os.unlink(path)
            elif name == "read":
                path.read_bytes()
            else:
                time.sleep(0.02)  # another's change may reach this view meanwhile
            outcome = "ok"
        except OSError as error:
            if error.errno not in RACED:
                raise TreeMismatch(f"operation {number} ({name} by {writer}) failed: {error!r}\n"
                                   + "\n".join(log)) from error
            outcome = errno.errorcode[error.errno]
        log.append(f"{number:5d} {name} by {writer}: {path.relative_to(root)} -> {outcome}")
        outcomes[f"{name} {outcome}"] += 1
    return outcomes


def stats_of(root: Path) -> dict[str, tuple[int, int]] | None:
    """Every file under ``root`` but hidden ones: its size and mtime, read without reading the file (its
    pages stay what the kernel holds); None if a name went meanwhile."""
    files = _files_under(root)
    try:
        return None if files is None else {path: _size_and_time((root / path).stat()) for path in files}
    except OSError:
        return None


def _size_and_time(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_size, stat.st_mtime_ns


def _files_under(root: Path) -> list[str] | None:
    """The relative paths of the files under ``root`` but hidden ones; None while the kernel still
    shows a folder the mount no longer has (the root, or one of the exerciser's folders, found by name
    or listed, but gone when listed itself): another session removed its last note, and the kernel
    learns so within issue 14's bound, not at once."""
    found: list[str] = []

    def gone(error: OSError) -> None:
        raise error

    try:
        if not root.is_dir():
            return found  # not made in this mount, nor shown yet
        for name in [""] + [f"d{number}" for number in range(FOLDERS)]:
            folder = root / name if name else root
            if folder.is_dir():
                os.listdir(folder)
        for walked, _, files in os.walk(root, onerror=gone):
            found += [str(Path(walked, name).relative_to(root)) for name in files if not name.startswith(".")]
    except OSError:
        return None
    return found


def main(argv: list[str] | None = None) -> int:
    """``python3 tests/treex.py ROOT -N OPERATIONS -S SEED``: exit 0 and the final tree's hashes as JSON
    (for a caller outside a sandbox to compare with the catalog), or exit 1 and the failed check."""
    import argparse
    import hashlib
    import json
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the folder to exercise (made if missing)")
    parser.add_argument("-N", "--operations", type=int, default=300)
    parser.add_argument("-S", "--seed", type=int, default=1)
    args = parser.parse_args(argv)
    exerciser = TreeExerciser(args.root, seed=args.seed)
    try:
        counts = exerciser.run(args.operations)
    except TreeMismatch as failure:
        print(f"treex: seed {args.seed}: {failure}", file=sys.stderr)
        return 1
    files = {path: hashlib.sha256(data).hexdigest() for path, data in sorted(exerciser.model.files.items())}
    print(json.dumps({"by_operation": counts, "files": files}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
