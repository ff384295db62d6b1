"""``scopefs postbox|message|deposit``: the postbox from the command line.

``message add`` is the channel adapter's call when a message arrives in a
group; ``deposit`` is the group's (the content on stdin); ``postbox
list|approve|reject|purge`` are the owner's, from its own DM session;
``postbox enable|disable`` the operator's, for one person.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from scopefs.catalog.clock import now_us
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, resolve_home
from scopefs.cli.output import emit
from scopefs.cli.provider_ids import add_id_option, required_id


def _home(args: argparse.Namespace) -> Home:
    return Home.open(resolve_home(args.home))


def cmd_postbox_mode(args: argparse.Namespace) -> int:
    from scopefs.catalog.postbox import set_mode

    mode = args.mode if args.verb == "enable" else None
    changed = set_mode(_home(args).state(), args.principal, mode)
    emit(args.json, {"principal_id": args.principal, "mode": mode, "changed": changed},
         [f"postbox {'on (' + mode + ')' if mode else 'off'}" + ("" if changed else " (already)")])
    return 0


def cmd_message_add(args: argparse.Namespace) -> int:
    from scopefs.writer.postbox import add_message

    sender = required_id(args, "sender")
    handle = add_message(_home(args), args.session, args.channel, args.account, sender)
    emit(args.json, {"message_handle": handle}, [handle])
    return 0


def cmd_deposit(args: argparse.Namespace) -> int:
    from scopefs.catalog.postbox import DEPOSIT_MAX_BYTES
    from scopefs.writer.postbox import deposit

    if sys.stdin is None:
        raise BadInput("deposit reads the content from stdin, which is closed")
    try:
        data = sys.stdin.buffer.read(DEPOSIT_MAX_BYTES + 1)  # one byte more than a deposit may hold: refused
    except OSError:
        raise BadInput("cannot read the deposit from stdin") from None
    deposit(_home(args), args.session, args.handle, data, actor_id=args.actor)
    emit(args.json, {"deposited": True}, ["deposited"])
    return 0


def _when(us: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(us / 1_000_000))


def cmd_postbox_list(args: argparse.Namespace) -> int:
    from scopefs.writer.postbox import review

    found = review(_home(args), args.session)
    now = now_us()
    pending = [i.as_dict(now) for i in found.pending]
    notices: list[dict[str, Any]] = [{"conversation_id": c, "first_at_us": at, "first_item_id": i}
                                     for c, at, i in found.notices]
    lines = [f"{p['item_id']} from conversation {p['conversation_id']} at {_when(p['created_at_us'])}"
             + (f" (actor {p['actor_id']})" if p["actor_id"] else "") for p in pending] or ["no pending items"]
    lines += [f"notice: first deposit from conversation {n['conversation_id']} at {_when(n['first_at_us'])}"
              for n in notices]
    emit(args.json, {"pending": pending, "notices": notices}, lines)
    return 0


def cmd_postbox_approve(args: argparse.Namespace) -> int:
    from scopefs.writer.postbox import approve

    item, result = approve(_home(args), args.session, args.item, args.to)
    emit(args.json, {"item_id": item.item_id, "resource_id": result.resource_id, "revision_id": result.revision_id},
         [f"approved {item.item_id}: revision {result.revision_no}"])
    return 0


def cmd_postbox_reject(args: argparse.Namespace) -> int:
    from scopefs.writer.postbox import reject

    item = reject(_home(args), args.session, args.item)
    emit(args.json, {"item_id": item.item_id}, [f"rejected {item.item_id}"])
    return 0


def cmd_postbox_purge(args: argparse.Namespace) -> int:
    from scopefs.writer.postbox import purge

    purged = purge(_home(args), args.session, args.from_conversation)
    emit(args.json, {"item_ids": [i.item_id for i in purged]}, [f"purged {len(purged)} item(s)"])
    return 0


def register(sub: Any, command: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add the postbox commands to the top-level subparsers ``sub``."""
    postbox = sub.add_parser("postbox", help="the postbox: deposits from groups, reviewed by their owner"
                             ).add_subparsers(dest="verb", required=True, parser_class=parser_class)
    p = command("enable", cmd_postbox_mode, "let groups deposit into a person's quarantine, for review", postbox)
    p.add_argument("principal")
    p.add_argument("--mode", choices=("review",), default="review")
    p = command("disable", cmd_postbox_mode, "refuse every deposit for a person from now on", postbox)
    p.add_argument("principal")
    command("list", cmd_postbox_list, "pending items and notices, from the owner's DM session",
            postbox).add_argument("session")
    p = command("approve", cmd_postbox_approve, "copy a pending item into private/ (then it leaves the postbox)",
                postbox)
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("item")
    p.add_argument("--to", metavar="private/PATH", help="where (default: private/postbox/ITEM.md)")
    p = command("reject", cmd_postbox_reject, "drop a pending item", postbox)
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("item")
    p = command("purge", cmd_postbox_purge, "drop every pending item from one conversation", postbox)
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("--from", dest="from_conversation", required=True, metavar="CONVERSATION")

    message = sub.add_parser("message", help="message handles").add_subparsers(dest="verb", required=True,
                                                                               parser_class=parser_class)
    p = command("add", cmd_message_add, "a handle for a message that arrived in a group (the adapter's call)",
                message)
    p.add_argument("session", metavar="GROUP_SESSION")
    p.add_argument("--channel", required=True)
    p.add_argument("--account", required=True)
    add_id_option(p, "sender", required=True, what="sender's")

    p = command("deposit", cmd_deposit, "file stdin into the quarantine of a message's sender (one generic refusal)")
    p.add_argument("session")
    p.add_argument("handle")
    p.add_argument("--actor", metavar="PRINCIPAL", help="the group member whose message this answers (provenance)")
