"""``scopefs explain|audit|audit impact|audit prune|stats|quarantine``: the operator's questions and reviews.

Thin wiring: parse, call ``catalog.explain``, ``catalog.auditlog`` or
``catalog.metrics`` (and ``sandbox.census`` for live mounts), print. Every
value printed is an id, a reason code, a count or a time; no note content,
query or snippet is ever read here. ``audit exposures`` lives with the
lifecycle commands (``cli.lifecycle``); ``audit`` with no subcommand is the
query, so both share one parser (``register_audit``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import stat
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, resolve_home, validate_agent_name
from scopefs.cli.output import emit

Command = Any


def _home(args: argparse.Namespace) -> Home:
    return Home.open(resolve_home(args.home))


# -- explain ------------------------------------------------------------------

def cmd_explain(args: argparse.Namespace) -> int:
    from scopefs.catalog.explain import explain

    found = explain(_home(args), args.session, args.path)
    emit(args.json, found.as_dict(), found.lines())
    return 0


# -- audit --------------------------------------------------------------------

def cmd_audit_query(args: argparse.Namespace) -> int:
    from scopefs.catalog.auditlog import Filters, parse_since, query
    from scopefs.catalog.clock import now_us
    from scopefs.catalog.readjournal import replay

    agent = validate_agent_name(args.agent) if args.agent is not None else None
    since = parse_since(args.since, now_us()) if args.since is not None else None
    home = _home(args)
    replay(home)  # reads a killed mount served and had not recorded yet (``catalog.readjournal``)
    rows = query(home, Filters(agent, since, args.op, args.decision, args.reason, args.session, args.limit))
    lines = [f"{r['at_us']} {r['agent_id'] or '-'} {r['operation']} {r['decision']} {r['reason']}"
             f" session={r['session_id'] or '-'} subject={r['subject_kind'] or '-'} actor={r['actor_id'] or '-'}"
             f" store={r['store_id'] or '-'} revision={r['revision_id'] or '-'}" for r in rows]
    emit(args.json, {"rows": rows, "count": len(rows)}, lines or ["no matching audit rows"])
    return 0


def cmd_audit_impact(args: argparse.Namespace) -> int:
    from scopefs.catalog.auditlog import impact
    from scopefs.catalog.identity import get_principal
    from scopefs.catalog.readjournal import replay

    agent = validate_agent_name(args.agent) if args.agent is not None else None
    home = _home(args)
    get_principal(home.state(), args.principal)  # bad input records nothing, not even the replay below
    if agent is not None and not home.agent_exists(agent):
        raise BadInput(f"unknown agent: {agent}")
    replay(home)  # reads a killed mount served and had not recorded yet (``catalog.readjournal``)
    found = impact(home, args.principal, agent)
    lines = []
    for s in found["sessions"]:
        lines.append(f"session {s['session_id']} ({s['subject_kind']}, agent {s['agent_id']}, via {s['via']}"
                     + "".join(f" {s[k]}" for k in ("membership_id", "binding_id") if k in s) + "):"
                     f" {len(s['revision_ids'])} revision(s)")
        lines.extend(f"  {r}" for r in s["revision_ids"])
    lines.append(f"{len(found['sessions'])} session(s), {len(found['revision_ids'])} distinct revision(s) exposed")
    if found["pruned_before_us"] is not None:
        lines.append(pruned_note(found["pruned_before_us"]))
    emit(args.json, found, lines)
    return 0


def pruned_note(cutoff_us: int) -> str:
    """The line a report built from the audit adds once a prune removed part of what it would count."""
    when = datetime.fromtimestamp(cutoff_us / 1e6, tz=UTC).isoformat(timespec="seconds")
    return (f"incomplete before {when}: 'audit prune' removed older audit rows and exposures of closed sessions,"
            " which this does not count")


def cmd_audit_prune(args: argparse.Namespace) -> int:
    from scopefs.catalog.auditlog import prune
    from scopefs.catalog.durations import parse_duration_us
    from scopefs.catalog.readjournal import replay

    parse_duration_us(args.older_than)  # bad input records nothing, not even the replay below
    home = _home(args)
    if args.yes:  # a preview changes nothing; a prune records a killed mount's reads before old ones go
        replay(home)
    done = prune(home, args.older_than, apply=args.yes)
    verb = "removed" if done["applied"] else "would remove (run again with --yes)"
    emit(args.json, done, [f"{verb}: {done['audit_rows']} audit row(s), {done['exposure_rows']} exposure row(s)"
                           f" older than {args.older_than}"])
    return 0


def register_audit(audit: argparse.ArgumentParser, parser_class: type[argparse.ArgumentParser],
                   command: Command) -> Any:
    """The ``audit`` query's filters on ``audit`` itself, and its subcommands' parser (returned)."""
    audit.set_defaults(func=cmd_audit_query, session_is_a_filter=True)  # a broker session's rows may be asked
    audit.add_argument("--agent")
    audit.add_argument("--since", metavar="DURATION|DATE", help="e.g. 7d, or 2026-01-31 (UTC)")
    audit.add_argument("--op", metavar="OP", help="an operation, e.g. read, search, append")
    audit.add_argument("--decision", metavar="allow|deny|error")
    audit.add_argument("--reason", metavar="CODE", help="a stable reason code, e.g. outside-view")
    audit.add_argument("--session", metavar="SESSION")
    audit.add_argument("--limit", type=int, default=100, help="at most this many rows, newest first (default 100)")
    verbs = audit.add_subparsers(dest="verb", required=False, parser_class=parser_class)
    p = command("impact", cmd_audit_impact, "which sessions and revisions a principal's audience was shown"
                " (each exposure at the time it was served)", verbs)
    p.add_argument("--principal", required=True)
    p.add_argument("--agent")
    p = command("prune", cmd_audit_prune, "remove audit and exposure rows older than a duration (preview without"
                " --yes)", verbs)
    p.add_argument("--older-than", required=True, metavar="DURATION")
    p.add_argument("--yes", action="store_true", help="remove them; without it, only say how many would go")
    return verbs


# -- stats --------------------------------------------------------------------

def cmd_stats(args: argparse.Namespace) -> int:
    from scopefs.catalog.metrics import collect
    from scopefs.sandbox.census import mounts_up

    home = _home(args)
    target = _check_target(args.prometheus, home.root) if args.prometheus is not None else None
    metrics = collect(home)
    metrics.mounts_up = mounts_up(home)
    payload = metrics.as_dict()
    if target is not None:
        write_atomically(target.path, prometheus_text(payload), target.mode)
    emit(args.json, payload, _stat_lines(payload) + ([f"written: {target.path}"] if target is not None else []))
    return 0


PROMETHEUS_MARK = b"# HELP scopefs_"  # how every file this command writes begins
NEW_FILE_MODE = 0o644  # a metrics collector reads it; it holds no id and no content


@dataclass(frozen=True)
class Target:
    path: Path
    mode: int  # the replaced file's permission bits, or NEW_FILE_MODE


def _check_target(name: str, home_root: Path) -> Target:
    """The Prometheus file, refused (BadInput, nothing written) unless it is safe to replace.

    A rename over any plain file would destroy it, so: never anywhere inside the home (its folder resolved
    through symlinks: ``state.sqlite`` or ``hmac.key`` would go), its folder must exist, and an existing
    file must be a plain file that is empty or one this command wrote (it begins ``# HELP scopefs_``).
    """
    path = Path(os.path.abspath(name))
    if not path.parent.is_dir():
        raise BadInput(f"--prometheus: no such folder: {path.parent}")
    if Path(os.path.realpath(path.parent)).is_relative_to(os.path.realpath(home_root)):
        raise BadInput("--prometheus: the target is inside the scopefs home; write it elsewhere")
    if path.is_symlink() or path.exists() and not path.is_file():
        raise BadInput("--prometheus: the target exists and is not a plain file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Target(path, NEW_FILE_MODE)
    except OSError:
        raise BadInput("--prometheus: the target exists and cannot be read") from None
    try:
        info = os.fstat(fd)
        head = os.read(fd, len(PROMETHEUS_MARK)) if stat.S_ISREG(info.st_mode) else b""
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode) or (info.st_size and head != PROMETHEUS_MARK):
        raise BadInput("--prometheus: the target exists and is not a scopefs Prometheus file; refusing to"
                       " replace it (remove it or name a new file)")
    return Target(path, stat.S_IMODE(info.st_mode))


def _stat_lines(p: dict[str, Any]) -> list[str]:
    def q(lat: dict[str, float | None]) -> str:
        return " ".join(f"{k}={'-' if v is None else f'{v * 1000:.2f}ms'}" for k, v in lat.items())

    lines = [f"decision {d['op']} {d['decision']} {d['reason']}: {d['count']}" for d in p["decisions"]]
    lines += [f"hash mismatches: {p['hash_mismatches']}", f"postfilter drops: {p['postfilter_drops']}",
              f"searches: {p['search']['count']} ({q(p['search']['latency_seconds'])})",
              f"writes: {p['write']['count']} ({q(p['write']['latency_seconds'])})"]
    lines += [f"repair backlog {k}: {v}" for k, v in p["repair_backlog"].items()]
    lines += [f"mounts up ({k}): {v}" for k, v in p["mounts_up"].items()]
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float | int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    return repr(float(value)) if isinstance(value, float) else str(value)


def prometheus_text(p: dict[str, Any]) -> str:
    """The text exposition format: HELP and TYPE for every family, labels from fixed vocabularies only."""
    out: list[str] = []

    def family(name: str, kind: str, helptext: str, samples: list[tuple[dict[str, str], float | int | None]],
               suffix: str = "") -> None:
        out.append(f"# HELP scopefs_{name} {helptext}")
        out.append(f"# TYPE scopefs_{name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            out.append(f"scopefs_{name}{suffix}{{{text}}} {_num(value)}" if text else
                       f"scopefs_{name}{suffix} {_num(value)}")

    family("audit_decisions", "gauge", "Audited decisions retained, by operation, decision and reason code.",
           [({"op": d["op"], "decision": d["decision"], "reason": d["reason"]}, d["count"]) for d in p["decisions"]])
    family("hash_mismatches", "gauge", "Reads and searches refused because an artifact failed verification.",
           [({}, p["hash_mismatches"])])
    family("postfilter_drops", "gauge", "Search candidates the prefilter admitted and the postfilter denied.",
           [({}, p["postfilter_drops"])])
    family("repair_backlog", "gauge", "What doctor would find, by kind.",
           [({"kind": k}, v) for k, v in p["repair_backlog"].items()])
    family("mounts_up", "gauge", "Live scopefs mounts of this home, by kind.",
           [({"kind": k}, v) for k, v in p["mounts_up"].items()])
    for name, key, helptext in (("search_latency_seconds", "search", "Search latency (recent searches)."),
                                ("write_latency_seconds", "write", "Write latency, pending to active (recent).")):
        lat = p[key]["latency_seconds"]
        family(name, "summary", helptext, [({"quantile": str(int(k[1:]) / 100)}, v) for k, v in lat.items()])
        out.append(f"scopefs_{name}_count {p[key]['count']}")
    return "\n".join(out) + "\n"


def write_atomically(path: Path, text: str, mode: int = NEW_FILE_MODE) -> None:
    """A temporary file in the same folder, synced, renamed over ``path``, the folder synced: a reader sees the
    old file or the new one, never a part. ``mode``: the replaced file's, so a chosen one is kept."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def cmd_quarantine_list(args: argparse.Namespace) -> int:
    from scopefs.writer.quarantine import quarantine_listing

    home = _home(args)
    agent = validate_agent_name(args.agent)
    if not home.agent_exists(agent):
        raise BadInput(f"unknown agent: {agent}")
    found = quarantine_listing(home, agent)
    lines = [f"migrated {m['path']} ({m['class']}, {m['size']} bytes, revision {m['revision_id']})"
             for m in found["migrated"]]
    lines += [f"derived {d['path']} ({d['size']} bytes, revision {d['revision_id']})" for d in found["derived"]]
    lines += [f"tampered {t['name']} ({t['size']} bytes)" for t in found["tampered"]]
    lines += [f"file {f['name']} ({'-' if f['size'] is None else f['size']} bytes)" for f in found["files"]]
    lines.append(f"{len(found['migrated'])} migrated note(s), {len(found['tampered'])} tampered copy(ies),"
                 f" {len(found['files'])} other file(s), {len(found['derived'])} mixed-audience derivation(s);"
                 " no session's view shows any of them")
    emit(args.json, {"agent_id": agent, **found}, lines)
    return 0


def cmd_quarantine_release(args: argparse.Namespace) -> int:
    from scopefs.writer.quarantine_review import release

    done = release(_home(args), args.agent, args.path, owner=args.owner, to=args.to, as_path=args.as_name,
                   yes=args.yes)
    p = done.preview
    what = f"{p['path']} ({p['class']}, {p['size']} bytes, revision {p['revision_id']}) to {p['to']} as {p['as']}"
    if done.result is None:
        emit(args.json, {**p, "released": False}, [f"would release {what}",
                                                   "preview only: nothing was written; add --yes to do it"])
    else:
        emit(args.json, {**p, "released": True, "new_revision_id": done.result.revision_id},
             [f"released {what}: revision {done.result.revision_id}; the quarantined note is tombstoned"])
    return 0


def cmd_quarantine_purge(args: argparse.Namespace) -> int:
    from scopefs.writer.quarantine_review import purge

    done = purge(_home(args), args.agent, args.entries, yes=args.yes)
    verb = "purged" if done.applied else "would purge"
    lines = [f"{verb} note {q.shown} (every revision)" for q in done.notes]
    lines += [f"{verb} file {name}" for name in done.files]
    if not done.applied:
        lines.append("preview only: nothing was removed; add --yes to do it")
    emit(args.json, done.as_dict(args.agent), lines)
    return 0


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    p = command("explain", cmd_explain, "why a path of a session's view is writable, read-only, or not there")
    p.add_argument("session")
    p.add_argument("path", help="a virtual path, e.g. private/notes/x.md (the mount's .search and .history"
                   " folders are not covered)")
    quarantine = sub.add_parser("quarantine", help="what an agent's quarantine holds").add_subparsers(
        dest="verb", required=True, parser_class=parser_class)
    p = command("list", cmd_quarantine_list, "list what an agent's quarantine holds (names, sizes, ids; no content):"
                " notes migrate could not give a person, mixed-audience derivations, tampered copies and orphans"
                " doctor --fix moved aside",
                quarantine)
    p.add_argument("--agent", required=True)
    p = command("release", cmd_quarantine_release, "copy a note the migration quarantined into a person's private"
                " store, a conversation's, a role's or agent-shared, and tombstone it in quarantine (a preview"
                " unless --yes)",
                quarantine)
    p.add_argument("--agent", required=True)
    p.add_argument("path", help="the note's path as 'quarantine list' prints it (migration/...)")
    p.add_argument("--owner", metavar="PRINCIPAL", help="into this person's private store (an active human with a"
                   " live binding)")
    p.add_argument("--to", metavar="agent-shared|role:ROLE|conversation:ID", help="into agent-shared, a role's"
                   " store, or a conversation's channel store (a group's transcript)")
    p.add_argument("--as", dest="as_name", metavar="PATH", help="the path inside that store (default: the note's"
                   " source path, without migration/<area>/); a note there is never overwritten")
    p.add_argument("--yes", action="store_true", help="release (without it: preview only)")
    p = command("purge", cmd_quarantine_purge, "remove quarantined notes (every revision and its bytes, as forget"
                " does) or files doctor moved aside (a preview unless --yes)", quarantine)
    p.add_argument("--agent", required=True)
    p.add_argument("entries", nargs="+", metavar="ENTRY", help="a note's path (migration/..., derived/...) or a"
                   " file's name (tampered-...), as 'quarantine list' prints them")
    p.add_argument("--yes", action="store_true", help="purge (without it: preview only)")
    p = command("stats", cmd_stats, "operational numbers without content or ids (--prometheus FILE writes"
                " the text format atomically; refuses a file in the home or one it did not write)")
    p.add_argument("--prometheus", metavar="FILE")
