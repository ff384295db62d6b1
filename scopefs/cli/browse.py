"""``scopefs browse PRINCIPAL MOUNTPOINT --agent A [--user UNIXUSER] [--foreground]``.

Thin wiring: ``sandbox.browse`` checks the request and the place,
``catalog.human`` opens the person's session, ``sandbox.external`` serves
it to their uid alone. Everything is checked before the session is
opened (bad input: exit 2, nothing changed).
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable
from typing import Any

from scopefs.catalog.home import Home, resolve_home, validate_agent_name
from scopefs.cli.output import OutputLost, emit

Command = Callable[..., argparse.ArgumentParser]


def cmd_browse(args: argparse.Namespace) -> int:
    from scopefs.catalog.human import open_human_session
    from scopefs.catalog.sessions import close_session
    from scopefs.sandbox import browse, external, mounts

    home = Home.open(resolve_home(args.home))
    agent_id = validate_agent_name(args.agent)
    browse.check_request(home, agent_id, args.principal)
    user = browse.local_user(args.user)
    where = browse.check_place(home, args.mountpoint)
    session = open_human_session(home, agent_id, args.principal, user.uid)
    shown = {"session_id": session.session_id, "principal_id": args.principal, "mountpoint": where,
             "user": user.name, "for_uid": user.uid, "for_gid": user.gid}
    lines = [f"{session.session_id}: {where} serves {args.principal}'s memory to {user.name} (uid {user.uid})"]
    try:
        if not args.foreground:
            record = external.start(home, session.session_id, where, user.uid, user.gid, owner_only=True)
            emit(args.json, {**shown, "pid": record.pid}, lines)
            return 0
        lost: list[OutputLost] = []
        with mounts.claim(home, where) as let_go:

            def ready() -> None:
                let_go()
                try:
                    emit(args.json, {**shown, "pid": os.getpid()}, [*lines, "(foreground: unmount to end it)"])
                except OutputLost as exc:  # nobody hears it is up: take it down as a signal does
                    lost.append(exc)
                    os.kill(os.getpid(), signal.SIGTERM)

            external.serve_for(home, session.session_id, where, user.uid, user.gid, on_ready=ready,
                               owner_only=True)
        close_session(home, session.session_id)  # a foreground browse ends with its mount
        if lost:
            raise lost[0]
        return 0
    except BaseException:
        close_session(home, session.session_id)  # never left open without its mount
        raise


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add ``browse`` to the top-level subparsers ``sub``."""
    p = command("browse", cmd_browse, "mount a person's own memory (their DM's view) for them at MOUNTPOINT,"
                                      " served to one local user alone; edits are theirs, origin 'human'")
    p.add_argument("principal", help="a human principal id (principal add NAME --kind human)")
    p.add_argument("mountpoint", help="an empty directory on a path only root can change, e.g. /srv/memory/alice")
    p.add_argument("--agent", required=True)
    p.add_argument("--user", metavar="UNIXUSER",
                   help="the local account it is served to (default: SUDO_USER, else the caller; never root)")
    p.add_argument("--foreground", action="store_true", help="stay attached until unmounted")
