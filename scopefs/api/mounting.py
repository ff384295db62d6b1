"""Where and for whom the API may mount a session: the operator decides, never the client.

``scopefs mount --for-uid`` is an operator's command; handing the same power
to whatever client can reach the socket would let it make root mount a
view over any empty root-owned folder (``/srv``, ``/run/sshd``...), for any
uid. So the API's ``mount`` is off unless the server was started with
``--mount-base DIR --mount-uids LO-HI``: a client then names only a leaf
under that folder and a uid in that range, and each session holds at most
one such mount.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from scopefs.catalog.errors import BadInput

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


@dataclass(frozen=True)
class MountPolicy:
    base: Path
    uids: range

    def place(self, name: object, uid: object) -> tuple[Path, int]:
        """The mount point for ``name`` (made if missing) and the checked uid; BadInput otherwise."""
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise BadInput("name must be 1-64 characters of a-z, 0-9, '_' and '-', starting with a letter or digit")
        if not isinstance(uid, int) or isinstance(uid, bool) or uid not in self.uids:
            raise BadInput(f"uid must be in this server's --mount-uids ({self.uids.start}-{self.uids.stop - 1})")
        where = self.base / name
        try:
            os.mkdir(where, 0o755)
        except FileExistsError:
            pass
        return where, uid


def parse_policy(base: str | None, uids: str | None) -> MountPolicy | None:
    """``--mount-base`` and ``--mount-uids`` (both or neither)."""
    if base is None and uids is None:
        return None
    if base is None or uids is None:
        raise BadInput("--mount-base and --mount-uids go together")
    found = re.fullmatch(r"(\d{1,10})-(\d{1,10})", uids)
    if found is None or not 1 <= int(found[1]) <= int(found[2]) < 2**31:
        raise BadInput("--mount-uids is LO-HI, 1 <= LO <= HI")
    where = Path(base).absolute()
    if not where.is_dir():
        raise BadInput(f"--mount-base {where} is not a folder")
    return MountPolicy(where, range(int(found[1]), int(found[2]) + 1))
