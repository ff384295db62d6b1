"""``scopefs history SESSION PATH``: the revisions of a note the session may read.

Thin wiring like the rest of the command line: ``catalog.history`` decides
what is shown (and refuses exactly as ``scopefs read`` does); this parses
and prints. Each revision comes with its time, actor and origin, ids only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scopefs.catalog.home import Home, resolve_home
from scopefs.cli.output import emit

Command = Callable[..., argparse.ArgumentParser]


def cmd_history(args: argparse.Namespace) -> int:
    from scopefs.catalog.history import note_history

    shown = note_history(Home.open(resolve_home(args.home)), args.session, args.path, actor_id=args.actor)
    emit(args.json, shown.payload(), shown.lines() or [f"{shown.path}: no revisions to show"])
    return 0


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add ``history`` to the top-level subparsers ``sub``."""
    p = command("history", cmd_history, "list the revisions of a note of the session's view"
                                        " (time, actor, origin, size, hash); a mount shows them under .history/")
    p.add_argument("session")
    p.add_argument("path", help="a virtual path, e.g. private/notes/x.md")
    p.add_argument("--actor", metavar="PRINCIPAL", help="the principal causing this operation")
