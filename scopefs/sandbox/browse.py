"""A person's own mount: ``scopefs browse PRINCIPAL MOUNTPOINT --agent A [--user UNIXUSER]``.

The operator (root) opens a human session for the principal
(``catalog.human``) and mounts its view at MOUNTPOINT for one local Unix
user, through the same server as ``scopefs mount --for-uid``
(``sandbox.external``): made by root with ``allow_other`` so the user can
reach it, its files shown as the user's, every request from any other uid
refused with ``EACCES`` by the gate (``vfs.gate.UidGate``). Unlike a
container's mount, root is refused too, even the root's attributes: no
runtime binds this mount, and a root-run indexer or backup job has no
business in a person's notes (the server itself answers; it asks nothing).

The user is ``--user``, else the one who ran ``sudo`` (``SUDO_USER``),
else the caller; never root and never one of the uids scopefs gives its
own sandboxes. Everything is checked before the session is opened, so bad
input changes nothing; a mount that then fails closes the session again.
The mount lasts until ``scopefs umount`` (which also closes the session)
or until the principal stops being an active human.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.human import check_human
from scopefs.sandbox import external, mounts

MAX_USER_NAME = 256


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


def local_user(name: str | None, environ: dict[str, str] | None = None) -> LocalUser:
    """``name``'s account, else ``SUDO_USER``'s, else the caller's; BadInput for root or an unknown user."""
    env = os.environ if environ is None else environ
    name = name if name is not None else env.get("SUDO_USER") or None
    try:
        if name is None:
            entry = pwd.getpwuid(os.getuid())
        else:
            if not name or len(name) > MAX_USER_NAME or "\0" in name:
                raise KeyError(name)
            entry = pwd.getpwnam(name)
    except KeyError:
        raise BadInput("unknown local user (--user names an account of this machine)") from None
    if entry.pw_uid == 0:
        raise BadInput("browse serves one unprivileged local user, not root: pass --user or run it with sudo")
    external.check_owner(entry.pw_uid, entry.pw_gid)
    return LocalUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def check_place(home: Home, mountpoint: str) -> str:
    """The resolved mount point, or BadInput (exit 2) for anything but an empty, unmounted directory
    on a path only root can change, outside the broker's folders."""
    where = mounts.absolute(mountpoint)
    mounts.check_outside_broker(home, where)
    if mounts.mounted_fstype(where) is not None:
        raise BadInput(f"{where} is already a mount point")
    mounts.check_mountpoint(where)
    external.check_place(where)
    return where


def check_request(home: Home, agent_id: str, principal_id: str) -> None:
    """The agent exists and the principal is an active human (BadInput otherwise); nothing is created."""
    home.catalog(agent_id)  # BadInput for an unknown agent
    check_human(home, principal_id)
