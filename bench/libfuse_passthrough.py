"""libfuse's own passthrough server in C: the floor of any FUSE filesystem on this machine.

``bench/passthrough.py`` is the floor of a *Python* FUSE server: every
request costs pyfuse3 and trio's work. Whether a target is out of reach
because of the kernel (a request's round trip on this VM) or because of
Python needs a server that costs next to nothing per request. libfuse
ships one: ``passthrough_ll.c``, the low-level example of the libfuse
release the Makefile installs (Debian's ``libfuse3-dev`` puts it under
``/usr/share/doc/libfuse3-dev/examples``). It is compiled here from that
installed copy, never from a copy kept in this repository, into
``bench/out/bin`` (once per source: the binary's name carries the
source's hash).

It is run with the cache settings of the Python passthrough (entry and
attribute timeouts of 1 s, ``keep_cache`` on every open: ``cache=always``
with ``timeout=1``), scopefs's mount options, and libfuse's defaults
otherwise (a pool of worker threads, no writeback cache).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import resource
import subprocess
import tempfile
from pathlib import Path

EXAMPLES = Path("/usr/share/doc/libfuse3-dev/examples")
SOURCES = ("passthrough_ll.c", "passthrough_helpers.h")
BIN_DIR = Path(__file__).resolve().parent / "out" / "bin"
FSTYPE = "fuse.libfuse"


def _source(name: str) -> bytes:
    """An example file as installed (Debian may compress the larger ones)."""
    plain, packed = EXAMPLES / name, EXAMPLES / f"{name}.gz"
    if plain.exists():
        return plain.read_bytes()
    if packed.exists():
        return gzip.decompress(packed.read_bytes())
    raise FileNotFoundError(f"{plain} is missing: libfuse's examples come with libfuse3-dev (make deps)")


def binary() -> Path:
    """The compiled server, built now if this source was never built here."""
    sources = {name: _source(name) for name in SOURCES}
    digest = hashlib.sha256(b"".join(sources[name] for name in SOURCES)).hexdigest()[:16]
    built = BIN_DIR / f"passthrough_ll-{digest}"
    if built.exists():
        return built
    flags = subprocess.run(["pkg-config", "fuse3", "--cflags", "--libs"], capture_output=True, text=True,
                           check=True).stdout.split()
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="libfuse-") as scratch:
        for name, data in sources.items():
            Path(scratch, name).write_bytes(data)
        out = BIN_DIR / f".{built.name}.{os.getpid()}"  # beside the binary: the rename below is atomic
        try:
            done = subprocess.run(["cc", "-O2", "-Wall", str(Path(scratch) / SOURCES[0]), "-o", str(out), *flags],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"building libfuse's passthrough_ll failed: {done.stderr[-500:]}")
            os.replace(out, built)  # whole or not at all: a half-built binary is never found
        finally:
            out.unlink(missing_ok=True)
    return built


def raise_open_files() -> None:
    """For ``Popen(preexec_fn=...)``: passthrough_ll keeps a descriptor open for every inode the
    kernel remembers (until its FORGET), and libfuse 3.14's does not raise its own limit, so a
    10,000-note tree runs it out of the usual soft limit of 1,024 (``cp -r`` fails with EMFILE).
    The hard limit (20,000 here, and not raised: this machine refuses even root) holds the tree
    or its copy, not both, which is why ``fuse_bench`` copies into a fresh mount."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def command(source: Path, mountpoint: Path, mount_options: frozenset[str]) -> list[str]:
    """The foreground server of ``source`` at ``mountpoint``, mounted with ``mount_options`` (scopefs's)."""
    options = sorted(o for o in mount_options if not o.startswith(("fsname=", "subtype=")))
    options += ["fsname=libfuse", "subtype=libfuse", f"source={os.fspath(source)}", "cache=always", "timeout=1"]
    return [str(binary()), "-f", "-o", ",".join(options), os.fspath(mountpoint)]
