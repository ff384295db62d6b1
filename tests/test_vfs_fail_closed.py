"""A mount whose catalog cannot be read stops serving (fails closed).

The mount answers from memory. If the catalog changes and the mount can no
longer read it, it cannot know whether the change was a revocation, so it
must empty its view instead of serving the last picture it had. The
server runs here with an apsw VFS whose every read of the agent catalog
fails while a trigger file exists: a disk gone bad under the mount.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import errno_of, is_mounted, wait_until

SERVER = """
import os, sys
import apsw
from pathlib import Path
from scopefs.catalog.home import Home
from scopefs.vfs.server import serve

trigger = sys.argv[3]

class Reads(apsw.VFSFile):
    def __init__(self, name, flags):
        self._catalog = str(name.filename() if hasattr(name, "filename") else name).startswith(
            os.path.join(sys.argv[1], "agents"))
        super().__init__("", name, flags)

    def xRead(self, amount, offset):
        if self._catalog and os.path.exists(trigger):
            raise apsw.IOError("injected: the catalog cannot be read")
        return super().xRead(amount, offset)

class FailingReads(apsw.VFS):
    def __init__(self):
        super().__init__("scopefs-failing-reads", "")

    def xOpen(self, name, flags):
        return Reads(name, flags)

vfs = FailingReads()
serve(Home.open(Path(sys.argv[1]), vfs="scopefs-failing-reads"), sys.argv[2], sys.argv[4],
      on_ready=lambda: print("ready", flush=True))
"""



def test_an_unreadable_catalog_empties_the_view(scenario: Scenario, tmp_path: Path) -> None:
    home, trigger, where = scenario.cli.home, tmp_path / "fail-reads", tmp_path / "mnt"
    where.mkdir()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(home), scenario.alice_session, str(trigger),
                               str(where)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        note = where / "private" / "notes" / "allergy.md"
        assert note.read_bytes() == ALICE_FACT
        held = os.open(note, os.O_RDONLY)
        try:
            trigger.touch()
            # A change the mount must read to know what it means (it could be a revocation).
            scenario.cli("write", scenario.alice_session, "private/notes/more.md", stdin=b"x\n", check=True)
            wait_until(lambda: os.listdir(where) == [])
            assert errno_of(note.read_bytes) == errno.ENOENT
            os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
            wait_until(lambda: errno_of(lambda: os.pread(held, 4096, 0)) in (errno.EACCES, errno.EIO))
            trigger.unlink()  # the catalog is readable again: the view comes back
            wait_until(lambda: sorted(os.listdir(where)) == ["agent-shared", "postbox", "private"])
            assert note.read_bytes() == ALICE_FACT
        finally:
            os.close(held)
    finally:
        if is_mounted(where):
            subprocess.run(["fusermount3", "-u", str(where)], capture_output=True)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
