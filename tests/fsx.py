#!/usr/bin/env python3
"""A file-system exerciser: fsx's algorithm, in Python's standard library only.

Why our own: fsx (Apple, 1998; today in xfstests and LTP) ships in no package
of the registries our machines and CI reach (Debian 12, PyPI, npm), and
Debian's copy inside the OpenAFS sources is not served there. So this is
fsx's algorithm written again, not its code: one file and a model of its
bytes in memory; a seeded, reproducible sequence of the five classic
operations (read, write, mapped read, mapped write, truncate) applied to the
file; every byte read and the size after every operation checked against
the model; and the file closed and opened again every ``--reopen`` operations
(fsx's ``-c`` does it at random), when a mount commits what was written.
After each reopen the whole file is read and checked, which fsx itself does
only at the end.

It imports nothing of the project, so the sandbox's own ``python3`` can run
it inside ``scopefs run`` (``python3 - ARGS`` with this file on stdin).
Exit 0 with a JSON summary on stdout when every check held; exit 1 with the
failed check and the operations before it on stderr. The written bytes are
fsx's kind of pattern (the operation's number plus a seeded byte at odd
offsets), so a byte that lands in the wrong place or from the wrong write
shows as a mismatch. As with fsx, a mapped access past the end of a file
that the file system cut short behind the model's back kills the process
with SIGBUS rather than failing a check: a test worker that dies in a
mapped operation has found that.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import mmap
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass

PAGE = mmap.PAGESIZE
OPERATIONS = ("read", "write", "mapread", "mapwrite", "truncate")
LOG_KEPT = 32


class Mismatch(AssertionError):
    """The file and the model disagree, or an operation failed; the message says where."""


@dataclass(frozen=True)
class Step:
    """One operation as fsx logs it: enough to replay the run by its seed."""

    number: int
    name: str
    offset: int
    size: int
    length_after: int

    def __str__(self) -> str:
        return f"{self.number:6d} {self.name:8s} {self.offset:#9x} {self.size:#7x} -> length {self.length_after:#x}"


@dataclass(frozen=True)
class Summary:
    """What a run did, printed as JSON by the command line."""

    operations: int
    reopens: int
    final_length: int
    by_operation: dict[str, int]


class Exerciser:
    """One file under test and the model of what it must hold.

    ``on_reopen`` is called with the model's bytes while the file is closed,
    between every close and the next open: a mount has committed by then, so
    a caller can check what other sessions and the catalog see.

    ``descriptors`` above 1 keeps that many descriptors of the file open,
    each operation going through one of them at random and each reopen
    closing and opening the one just used (the others stay open: on a disk
    that close commits nothing, through a mount it commits what every
    descriptor wrote). The final check closes them all.
    """

    def __init__(self, path: str, *, seed: int, max_length: int = 256 * 1024, max_op: int = 64 * 1024,
                 reopen_every: int = 10, mapped: bool = True, descriptors: int = 1,
                 on_reopen: Callable[[bytes], None] | None = None) -> None:
        self.path = path
        self.rng = random.Random(seed)
        self.max_length = max_length
        self.max_op = max_op
        self.reopen_every = reopen_every
        self.names = OPERATIONS if mapped else ("read", "write", "truncate")
        self.on_reopen = on_reopen
        self.model = bytearray()
        # fsx's pattern: the operation's number at even offsets, plus a seeded byte at odd ones.
        odd = bytearray(self.rng.randbytes(max_length))
        odd[0::2] = bytes(len(odd[0::2]))
        self.odd = bytes(odd)
        self.log: collections.deque[Step] = collections.deque(maxlen=LOG_KEPT)
        self.counts = collections.Counter[str]()
        self.reopens = 0
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.fds = [self.fd] + [os.open(path, os.O_RDWR) for _ in range(descriptors - 1)]

    # -- the run --------------------------------------------------------------------------

    def run(self, operations: int) -> Summary:
        doing = "the first open"
        try:
            for number in range(1, operations + 1):
                if len(self.fds) > 1:
                    self.fd = self.rng.choice(self.fds)
                name = self.rng.choice(self.names)
                doing = f"operation {number} ({name})"
                offset, size = getattr(self, "_" + name)(number)
                self.log.append(Step(number, name, offset, size, len(self.model)))
                self.counts[name] += 1
                self._check_size(f"after operation {number}")
                if self.reopen_every and number % self.reopen_every == 0:
                    doing = f"the reopen after operation {number}"
                    self.reopen(doing)
            doing = "the final check"
            for fd in self.fds:
                if fd != self.fd:
                    os.close(fd)
            self.fds = [self.fd]
            self.reopen(doing)
        except (OSError, ValueError) as error:  # ValueError: a mapping longer than the size the file now has
            raise Mismatch(self._report(f"{doing} failed: {error!r}")) from error
        finally:
            for fd in self.fds:
                if fd >= 0:
                    with contextlib.suppress(OSError):  # a close may fail too (a mount commits there):
                        os.close(fd)  # the first failure is the one reported
        return Summary(operations, self.reopens, len(self.model), dict(sorted(self.counts.items())))

    def reopen(self, when: str) -> None:
        """Close (a mount commits here), let the caller look, open again, check every byte."""
        which = self.fds.index(self.fd)
        os.close(self.fd)
        self.fd = self.fds[which] = -1
        if self.on_reopen is not None:
            self.on_reopen(bytes(self.model))
        self.fd = self.fds[which] = os.open(self.path, os.O_RDWR)
        self.reopens += 1
        self._check_size(when)
        self._check(0, os.pread(self.fd, len(self.model) + 1, 0), when, whole=True)

    # -- the five operations: each returns (offset, size) for the log -------------------

    def _read(self, number: int) -> tuple[int, int]:
        offset, size = self._inside()
        if size:
            self._check(offset, os.pread(self.fd, size, offset), f"read {number}")
        return offset, size

    def _mapread(self, number: int) -> tuple[int, int]:
        offset, size = self._inside()
        if size:
            start = offset - offset % PAGE
            with mmap.mmap(self.fd, offset + size - start, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ,
                           offset=start) as mapped:
                self._check(offset, mapped[offset - start:], f"mapped read {number}")
        return offset, size

    def _write(self, number: int) -> tuple[int, int]:
        offset, size = self._anywhere()
        if size:
            data = self._pattern(number, offset, size)
            if os.pwrite(self.fd, data, offset) != size:
                raise Mismatch(self._report(f"write {number} was short"))
            self._model_write(offset, data)
        return offset, size

    def _mapwrite(self, number: int) -> tuple[int, int]:
        offset, size = self._anywhere()
        if size:
            data = self._pattern(number, offset, size)
            if len(self.model) < offset + size:  # a mapping cannot grow a file: fsx extends it first
                os.ftruncate(self.fd, offset + size)
                self.model.extend(bytes(offset + size - len(self.model)))
            start = offset - offset % PAGE
            with mmap.mmap(self.fd, offset + size - start, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start) as mapped:
                mapped[offset - start:] = data
                mapped.flush()  # msync(MS_SYNC), as fsx does before munmap
            self._model_write(offset, data)
        return offset, size

    def _truncate(self, number: int) -> tuple[int, int]:
        length = self.rng.randrange(self.max_length)
        os.ftruncate(self.fd, length)
        if length < len(self.model):
            del self.model[length:]
        else:
            self.model.extend(bytes(length - len(self.model)))
        return length, 0

    # -- the model ------------------------------------------------------------------------

    def _inside(self) -> tuple[int, int]:
        """A range within the file, as fsx picks reads: zero-sized when the file is empty."""
        length = len(self.model)
        if not length:
            return 0, 0
        offset = self.rng.randrange(length)
        return offset, min(self.rng.randrange(self.max_op + 1), length - offset)

    def _anywhere(self) -> tuple[int, int]:
        """A range anywhere below the longest length, as fsx picks writes (holes included)."""
        offset = self.rng.randrange(self.max_length)
        return offset, min(self.rng.randrange(self.max_op + 1), self.max_length - offset)

    def _pattern(self, number: int, offset: int, size: int) -> bytes:
        shift = bytes((number + byte) & 0xFF for byte in range(256))
        return self.odd[offset:offset + size].translate(shift)

    def _model_write(self, offset: int, data: bytes) -> None:
        if len(self.model) < offset:
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset:offset + len(data)] = data

    def _check_size(self, when: str) -> None:
        found = os.fstat(self.fd).st_size
        if found != len(self.model):
            raise Mismatch(self._report(f"{when}: the file's size is {found:#x}, the model's {len(self.model):#x}"))

    def _check(self, offset: int, got: bytes, when: str, *, whole: bool = False) -> None:
        wanted = bytes(self.model[offset:offset + len(got)]) if not whole else bytes(self.model)
        if got == wanted:
            return
        if len(got) != len(wanted):
            raise Mismatch(self._report(f"{when}: {len(got):#x} bytes read at {offset:#x}, {len(wanted):#x} expected"))
        first = next(i for i, (a, b) in enumerate(zip(got, wanted, strict=True)) if a != b)
        raise Mismatch(self._report(f"{when}: byte {offset + first:#x} is {got[first]:#04x}, "
                                    f"the model's {wanted[first]:#04x}"))

    def _report(self, what: str) -> str:
        steps = "\n".join(str(step) for step in self.log)
        return f"{what}\nthe last {len(self.log)} operations (number, name, offset, size):\n{steps}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="the file to exercise (created, or truncated to empty)")
    parser.add_argument("-N", "--operations", type=int, default=1000)
    parser.add_argument("-S", "--seed", type=int, default=1)
    parser.add_argument("-l", "--max-length", type=int, default=256 * 1024)
    parser.add_argument("-o", "--max-op", type=int, default=64 * 1024)
    parser.add_argument("-c", "--reopen", type=int, default=10, help="close and open again every N operations")
    parser.add_argument("--no-mapped", action="store_true", help="no mapped reads or writes (fsx -R -W)")
    parser.add_argument("-d", "--descriptors", type=int, default=1, help="descriptors kept open at once")
    args = parser.parse_args(argv)
    exerciser = Exerciser(args.path, seed=args.seed, max_length=args.max_length, max_op=args.max_op,
                          reopen_every=args.reopen, mapped=not args.no_mapped, descriptors=args.descriptors)
    try:
        summary = exerciser.run(args.operations)
    except Mismatch as failure:
        print(f"fsx: seed {args.seed}: {failure}", file=sys.stderr)
        return 1
    print(json.dumps(dataclasses.asdict(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
