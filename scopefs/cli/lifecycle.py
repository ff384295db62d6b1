"""``scopefs derive|forget|lineage|audit exposures``: the lifecycle of derived memory.

Thin wiring like the rest of the command line: parse, call one function of
``writer.derive``, ``writer.forget``, ``writer.release`` or
``catalog.exposures``, print. Content arrives on stdin and never reaches
an output line, a log or the audit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, resolve_home, validate_agent_name
from scopefs.cli.output import emit

Command = Callable[..., argparse.ArgumentParser]
MAX_STDIN = 1 << 30


def _home(args: argparse.Namespace) -> Home:
    return Home.open(resolve_home(args.home))


def read_stdin() -> bytes:
    """The content of a derivation: stdin, whole (it is sanitised and checked as one text)."""
    if sys.stdin is None:
        raise BadInput("the content is read from stdin, which is closed")
    try:
        data = sys.stdin.buffer.read(MAX_STDIN + 1)
    except OSError as exc:
        raise BadInput(f"cannot read stdin ({exc.strerror or 'error'})") from None
    if len(data) > MAX_STDIN:
        raise BadInput("the content is larger than 1 GiB")
    return data


def cmd_derive(args: argparse.Namespace) -> int:
    from scopefs.writer.derive import derive

    derived = derive(_home(args), args.session, args.sources, args.to, read_stdin(), kind=args.kind,
                     actor_id=args.actor)
    result = derived.result
    emit(args.json, {"path": args.to, "kind": derived.kind, "resource_id": result.resource_id,
                     "revision_id": result.revision_id, "revision": result.revision_no, "sha256": result.sha256,
                     "size": result.size, "sources": derived.sources},
         [f"{args.to}: revision {result.revision_no} ({result.size} bytes), a {derived.kind} of"
          f" {len(derived.sources)} source(s)"])
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    from scopefs.writer.forget import forget

    report = forget(_home(args), args.session, args.paths, dry_run=args.dry_run, actor_id=args.actor)
    payload = report.as_dict()
    verb = "would forget" if report.dry_run else "forgot"
    lines = [f"{verb} {n['path']} ({n['relation']}, {n['revisions']} revision(s))" for n in payload["forgotten"]]
    lines += [f"refused {r.get('path') or r.get('revision_id')}: {r['reason']}" for r in payload["refusals"]]
    lines.append(f"{report.claims} claim(s) {'would be' if report.dry_run else 'are now'} rejected")
    emit(args.json, payload, lines)
    return 3 if payload["refusals"] and not payload["forgotten"] else 0


def cmd_lineage_release(args: argparse.Namespace) -> int:
    from scopefs.writer.release import release

    result = release(_home(args), args.session, args.path, actor_id=args.actor)
    emit(args.json, {"path": args.path, "resource_id": result.resource_id, "revision_id": result.revision_id,
                     "revision": result.revision_no},
         [f"{args.path}: released as revision {result.revision_no}, independent of its sources"])
    return 0


def cmd_audit_exposures(args: argparse.Namespace) -> int:
    from scopefs.catalog.access import current_access, resolve
    from scopefs.catalog.exposures import exposures_of
    from scopefs.catalog.lineage import resource_revisions
    from scopefs.catalog.paths import split_virtual_path
    from scopefs.catalog.readjournal import replay

    home = _home(args)
    agent = validate_agent_name(args.agent)
    if args.revision is not None:
        revisions = [args.revision]
    else:
        session, path = args.path_of
        parts = split_virtual_path(path)
        access, _problem = current_access(home, session)  # the operator asks: a closed session still names paths
        target = resolve(access, parts)
        if access.session.agent_id != agent or target.resource is None:
            raise BadInput("no note at that path of that session's view (of this agent)")
        revisions = resource_revisions(home.catalog(access.agent_id), access.agent_id, target.resource.resource_id)
    replay(home)  # reads a killed mount served and had not recorded yet (``catalog.readjournal``)
    rows = exposures_of(home.state(), agent, revisions)
    payload: dict[str, Any] = {"agent_id": agent, "revisions": revisions, "exposures": rows}
    emit(args.json, payload, [f"{r['revision_id']} seen by {r['session_id']} ({r['operation']}, run {r['run_id']})"
                              f" first at {r['first_at_us']}, {r['count']} time(s)" for r in rows]
         or ["no recorded exposure"])
    return 0


def _audit_query(args: argparse.Namespace) -> int:
    from scopefs.cli.ops import cmd_audit_query

    return cmd_audit_query(args)


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    p = command("derive", cmd_derive, "write stdin as a note derived from others, never wider than its sources")
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("--from", dest="sources", action="append", required=True, metavar="[SESSION:]PATH",
                   help="a source note (repeat); SESSION: reads it through another session's view")
    p.add_argument("--to", required=True, metavar="PATH")
    p.add_argument("--kind", choices=("summary", "compaction", "digest"), default="summary")
    p.add_argument("--actor", metavar="PRINCIPAL")

    p = command("forget", cmd_forget, "forget notes, what was derived from them, and their claims")
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--dry-run", action="store_true", help="report what would be forgotten; change nothing")
    p.add_argument("--actor", metavar="PRINCIPAL")

    lineage = sub.add_parser("lineage", help="derived notes held by their lineage").add_subparsers(
        dest="verb", required=True, parser_class=parser_class)
    p = command("release", cmd_lineage_release, "approve a held derived note as independent (a new revision)",
                lineage)
    p.set_defaults(changes_as_session=True)  # refused for a browse or broker session (cli.main)
    p.add_argument("session")
    p.add_argument("path")
    p.add_argument("--actor", metavar="PRINCIPAL")

    from scopefs.cli.ops import register_audit

    audit = register_audit(command("audit", _audit_query, "query the redacted audit (filters below), or a subcommand:"
                                   " exposures, impact, prune"), parser_class, command)
    p = command("exposures", cmd_audit_exposures, "which sessions were shown a note's revisions, and when", audit)
    p.add_argument("--agent", required=True)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--path-of", nargs=2, metavar=("SESSION", "PATH"), help="every revision of the note at PATH"
                       " of SESSION's view")
    which.add_argument("--revision", metavar="REVISION", help="one revision id")
