"""``scopefs grant|publish|unpublish|project|projection``: sharing on purpose, from the command line.

Thin wiring like the rest of the command line: parse, call one function of
``writer.publish``, ``writer.unpublish`` or ``writer.projections``, print. A preview (no
``--yes``) prints what would be written where and for whom, and changes
nothing; its first lines are the caller's own note, printed escaped.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scopefs.catalog.clock import now_us
from scopefs.catalog.durations import parse_duration_us
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, resolve_home, validate_agent_name
from scopefs.cli.output import emit

Command = Callable[..., argparse.ArgumentParser]


def _home(args: argparse.Namespace) -> Home:
    return Home.open(resolve_home(args.home))


def cmd_grant_publisher(args: argparse.Namespace) -> int:
    from scopefs.writer.publish import grant_publisher

    grant = grant_publisher(_home(args), args.agent, args.principal, args.scope)
    emit(args.json, {"grant_id": grant.grant_id, "agent_id": grant.agent_id, "created": grant.created},
         [grant.grant_id if grant.created else f"{grant.grant_id} (already granted)"])
    return 0


def cmd_grant_revoke(args: argparse.Namespace) -> int:
    from scopefs.writer.publish import revoke_grant

    revoked = revoke_grant(_home(args), args.grant)
    emit(args.json, {"grant_id": args.grant, "revoked": revoked},
         [f"revoked: {args.grant}" if revoked else f"already revoked: {args.grant}"])
    return 0


def _preview_lines(preview: dict[str, Any], done: str | None) -> list[str]:
    lines = [f"source: {preview['source']} (revision {preview['source_revision']}, {preview['bytes']} bytes)",
             f"target: {preview['target']} -> {preview['target_path']}"]
    if "purpose" in preview:
        lines.append(f"purpose: {preview['purpose']}")
        lines.append("expires: never (no expiry, recorded)" if preview["no_expiry"]
                     else f"expires: in {max(0, preview['expires_at_us'] - now_us()) // 1_000_000} s")
    audience = preview["audience"]
    if isinstance(audience, list):
        people = ", ".join(f"{m['label'] or '(no label)'} ({m['principal_id']})" for m in audience)
        lines.append(f"audience today: {people or 'nobody'}")
    else:
        lines.append(f"audience: {audience}")
    if preview.get("replaces"):
        lines.append(f"replaces projection {preview['replaces']}")
    lines.append("first lines:")
    lines += [f"  | {line}" for line in preview["first_lines"]]
    lines.append(done or "preview only: nothing was written; add --yes to do it")
    return lines


def cmd_publish(args: argparse.Namespace) -> int:
    from scopefs.writer.publish import publish

    out = publish(_home(args), args.session, args.path, args.to, name=args.as_name, yes=args.yes)
    payload: dict[str, Any] = {"preview": out.preview, "published": out.result is not None}
    done = None
    if out.result is not None:
        payload.update(resource_id=out.result.resource_id, revision_id=out.result.revision_id,
                       revision=out.result.revision_no)
        done = f"published: {out.preview['target_path']} revision {out.result.revision_no}"
    emit(args.json, payload, _preview_lines(out.preview, done))
    return 0


def cmd_unpublish(args: argparse.Namespace) -> int:
    from scopefs.writer.unpublish import unpublish

    out = unpublish(_home(args), args.agent, args.paths, yes=args.yes)
    verb = "unpublished" if out.forget_id is not None else "would unpublish"
    lines = [f"{verb} {n.shown} (every revision)" for n in out.notes]
    held = "held" if out.forget_id is not None else "would be held"
    lines.append(f"{out.held} derived revision(s) {held} with them")
    if out.forget_id is None:
        lines.append("preview only: nothing was removed; add --yes to do it")
    emit(args.json, out.as_dict(args.agent), lines)
    return 0


def cmd_project(args: argparse.Namespace) -> int:
    from scopefs.writer.projections import Expiry, check_purpose, project

    check_purpose(args.purpose)
    expiry = Expiry.choose(parse_duration_us(args.expires) if args.expires is not None else None, args.no_expiry)
    out = project(_home(args), args.session, args.path, args.to, purpose=args.purpose, expiry=expiry,
                  name=args.as_name, yes=args.yes)
    payload: dict[str, Any] = {"preview": out.preview, "projected": out.result is not None,
                               "projection_id": out.projection_id, "replaced_projection_id": out.replaced}
    done = None
    if out.result is not None:
        payload.update(revision_id=out.result.revision_id)
        done = f"projected: {out.projection_id} -> {out.preview['target_path']}"
    emit(args.json, payload, _preview_lines(out.preview, done))
    return 0


def cmd_projection_list(args: argparse.Namespace) -> int:
    from scopefs.catalog.projections import list_projections

    home = _home(args)
    agent = validate_agent_name(args.agent)
    if not home.agent_exists(agent):
        raise BadInput("unknown agent")
    now = now_us()
    found = [p.as_dict(now, state) for p, state in list_projections(home.catalog(agent), agent, args.source_session)]
    emit(args.json, {"projections": found},
         [f"{p['projection_id']} {p['state']} {p['target']} from {p['source_session_id']}: {p['purpose']}"
          for p in found] or ["no projections"])
    return 0


def cmd_projection_revoke(args: argparse.Namespace) -> int:
    from scopefs.cli.ops import pruned_note
    from scopefs.writer.projections import revoke_projection

    out = revoke_projection(_home(args), args.projection)
    emit(args.json, {"projection_id": out.projection_id, "revoked": out.revoked,
                     "exposed_session_ids": out.exposed_sessions, "pruned_before_us": out.pruned_before_us},
         [f"revoked: {out.projection_id}" if out.revoked else f"already revoked: {out.projection_id}",
          f"sessions that were shown it: {', '.join(out.exposed_sessions) or 'none'}"]
         + ([] if out.pruned_before_us is None else [pruned_note(out.pruned_before_us)]))
    return 0


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add the sharing commands to the top-level subparsers ``sub``."""
    grant = sub.add_parser("grant", help="publisher authority").add_subparsers(dest="verb", required=True,
                                                                              parser_class=parser_class)
    p = command("publisher", cmd_grant_publisher,
                "let a principal's own sessions publish into agent-shared/ or a role store", grant)
    p.add_argument("--agent", required=True)
    p.add_argument("--principal", required=True)
    p.add_argument("--scope", required=True, metavar="agent-shared|role:ROLE")
    command("revoke", cmd_grant_revoke, "revoke a publisher grant", grant).add_argument("grant")

    p = command("publish", cmd_publish, "copy one of the subject's own notes into agent-shared/ or a role store"
                                        " (a preview unless --yes)")
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("path", help="a note of the session's own store, e.g. private/notes/x.md")
    p.add_argument("--to", required=True, metavar="agent-shared|role:ROLE")
    p.add_argument("--as", dest="as_name", metavar="NAME",
                   help="its path inside the target (default: its path inside its own root)")
    p.add_argument("--yes", action="store_true", help="publish (without it: preview only)")

    p = command("unpublish", cmd_unpublish, "an admin removes notes from agent-shared/ or roles/<role>/: every"
                " revision and its bytes; what was derived from them is held (a preview unless --yes)")
    p.add_argument("--agent", required=True)
    p.add_argument("paths", nargs="+", metavar="PATH", help="as a view shows it: agent-shared/... or roles/ROLE/...")
    p.add_argument("--yes", action="store_true", help="unpublish (without it: preview only)")

    p = command("project", cmd_project, "a reviewed copy of one private note for one audience"
                                        " (a preview unless --yes)")
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("path", help="a note of the session's private/, e.g. private/notes/x.md")
    p.add_argument("--to", required=True, metavar="conversation:CONV|role:ROLE|agent-shared")
    p.add_argument("--purpose", required=True, metavar="TEXT", help="why (1-500 characters; shown to reviewers)")
    p.add_argument("--expires", metavar="DURATION", help="it ends after this long, e.g. 7d")
    p.add_argument("--no-expiry", action="store_true", help="it never ends by itself (recorded as chosen)")
    p.add_argument("--as", dest="as_name", metavar="NAME", help="its path in the target (default: the same path)")
    p.add_argument("--yes", action="store_true", help="project (without it: preview only)")

    projection = sub.add_parser("projection", help="projections").add_subparsers(dest="verb", required=True,
                                                                                parser_class=parser_class)
    p = command("list", cmd_projection_list, "every projection of an agent, with its state", projection)
    p.add_argument("--agent", required=True)
    p.add_argument("--source-session", metavar="SESSION")
    command("revoke", cmd_projection_revoke, "revoke a projection; prints the sessions that were shown it",
            projection).add_argument("projection")
