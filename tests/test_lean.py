"""``vfs.lean``: what a mount server leaves unloaded, and what it gives back, changes no answer.

Each check runs in a fresh interpreter, because what ``vfs.lean`` does is
decided at import and lasts for the process.
"""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
from pathlib import Path

from scopefs.catalog.digests import FAST_HASH_FROM


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


SIZES = (0, 1, 1000, FAST_HASH_FROM - 1, FAST_HASH_FROM, FAST_HASH_FROM + 1, 3 << 20)


def test_a_lean_process_hashes_every_size_as_openssl_does_and_loads_it_only_for_large_content() -> None:
    code = f"""
import scopefs.vfs.lean, hashlib, hmac, os, sys, tempfile
assert sys.modules["_hashlib"] is None                      # set aside: hashlib and hmac use Python's own
assert "libcrypto" not in open("/proc/self/maps").read()
from scopefs.catalog.digests import hash_fd, hash_head, hash_streamed, sha256_for
out = []
for size in {SIZES!r}:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    if size < {FAST_HASH_FROM}:
        digest = sha256_for(size); digest.update(data); out.append(digest.hexdigest())
        assert "libcrypto" not in open("/proc/self/maps").read(), size
        continue
    with tempfile.TemporaryFile() as f:
        f.write(data); f.flush()
        a, _ = hash_fd(f.fileno())
        b, _, _ = hash_head(f.fileno(), limit=size, keep=0)
        c, _ = hash_streamed(f.fileno(), size, lambda offset, chunk: None)
    assert a == b == c
    out.append(a)
assert "libcrypto" in open("/proc/self/maps").read()         # the first large content loaded it
out.append(hmac.new(b"key", b"message", "sha256").hexdigest())
assert hmac.compare_digest(out[-1], out[-1])
print(" ".join(out))
"""
    got = _run(code).split()
    want = [hashlib.sha256(bytes(range(256)) * (size // 256) + bytes(size % 256)).hexdigest() for size in SIZES]
    want.append(hmac.new(b"key", b"message", "sha256").hexdigest())
    assert got == want


def test_thrift_gives_the_heap_back_once_the_process_is_quiet_and_not_while_it_works() -> None:
    code = """
from scopefs.vfs.lean import Thrift, resident_bytes
thrift = Thrift()
kept, dropped = [], []
for i in range(60_000):                 # 60 MiB in malloc'd blocks (too big for pymalloc) ...
    (kept if i % 64 == 0 else dropped).append(bytes(1000) + i.to_bytes(8, "little"))
del dropped                             # ... most of it freed, in holes glibc does not return by itself
busy = resident_bytes()
thrift.look()                           # the allocating above was CPU since the last look: not quiet
assert resident_bytes() > busy - (8 << 20), "gave back while busy"
thrift.look()                           # nothing ran since: quiet, and grown by far more than the threshold
after = resident_bytes()
print(busy - after)
"""
    given_back = int(_run(code))
    assert given_back > 20 << 20, given_back


def test_a_home_gives_back_the_page_caches_of_its_databases(tmp_path: Path) -> None:
    """``Home.release_memory`` frees what its connections cached (``vfs.lean.Thrift`` calls it on a quiet mount)."""
    import apsw

    from scopefs.catalog.audit import AuditEvent, record_many
    from scopefs.catalog.home import Home

    home, _ = Home.init(tmp_path / "home")
    try:
        record_many(home.state(), [AuditEvent("read", "allow", "allowed", revision_id=f"r{i:06d}" * 20)
                                   for i in range(20_000)])
    finally:
        home.close()
    reader = Home.open(tmp_path / "home")
    try:
        assert sum(len(row[0]) for row in reader.state().execute("SELECT revision_id FROM audit")) > 2 << 20
        cached = apsw.memory_used()
        reader.release_memory()
        assert cached - apsw.memory_used() > 1 << 20  # the default cache is 2 MiB per connection
        assert len(reader.state().execute("SELECT revision_id FROM audit").fetchall()) == 20_000  # still usable
    finally:
        reader.close()
