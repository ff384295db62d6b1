"""``scopefs``: the operator's and the tests' entry point (DESIGN.md §7).

Every command takes ``--home`` and ``--json``; exit codes are 0 ok, 2 bad
input, 3 denied by policy, 4 integrity failure, 1 anything else. This module
parses, calls one function of ``catalog`` or ``writer``, and prints; it
decides nothing itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, cast

from scopefs.catalog.durations import parse_duration_us
from scopefs.catalog.errors import BadInput, Denied, IntegrityError, ScopefsError
from scopefs.catalog.home import Home, resolve_home, validate_agent_name
from scopefs.cli.output import OutputLost, drop_stdout, emit, fail, lost_output, write_bytes, write_text
from scopefs.cli.provider_ids import add_id_option, id_value, required_id

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        # argparse quotes stray values back ("unrecognized arguments: X");
        # a value may be a raw provider id, so only the kind of error is kept.
        if message.startswith("unrecognized arguments"):
            message = "unrecognized arguments"
        raise BadInput(f"{message} (see '{self.prog} --help')")

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        """Help through ``cli.output``: argparse's own writer drops a write error,
        so ``--help > /dev/full`` would exit 0 having printed nothing."""
        if file is not None:
            super().print_help(file)
        else:
            write_text(self.format_help())


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--home", default=default, help="state directory (default: $SCOPEFS_HOME or ./.scopefs)")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="print exactly one JSON object on stdout")


def _home(args: argparse.Namespace) -> Home:
    return Home.open(resolve_home(args.home))


def _agents(args: argparse.Namespace, home: Home) -> list[str]:
    """``--agent`` (which must exist) or every cell of the home: each agent, then each shared pool."""
    if not args.agent:
        return home.cells()
    if not home.agent_exists(validate_agent_name(args.agent)):
        raise BadInput(f"unknown agent: {args.agent}")
    return [args.agent]


# -- commands ---------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    home, created = Home.init(resolve_home(args.home))
    emit(args.json, {"home": str(home.root), "created": created},
         [f"{'created' if created else 'exists'}: {home.root}"])
    return 0


def cmd_agent_add(args: argparse.Namespace) -> int:
    from scopefs.catalog.agents import add_agent

    home = _home(args)
    created = add_agent(home, validate_agent_name(args.agent))
    emit(args.json, {"agent_id": args.agent, "created": created}, [args.agent])
    return 0


def cmd_pools_apply(args: argparse.Namespace) -> int:
    from scopefs.catalog import pools

    home = _home(args)
    try:
        with open(args.file, "rb") as fh:
            text = fh.read(pools.MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"cannot read {args.file}: {exc.strerror}") from None
    applied = pools.apply(home, text)
    emit(args.json, {"revision": applied.revision, "sha256": applied.sha256, "changed": applied.changed,
                     "created_pools": list(applied.created_pools)},
         [f"pools revision {applied.revision}: " + ("applied" if applied.changed else "unchanged (already applied)")]
         + [f"created pool {name}" for name in applied.created_pools])
    return 0


def cmd_pools_show(args: argparse.Namespace) -> int:
    from scopefs.catalog import pools

    home = _home(args)
    shown = pools.describe(home)
    lines = [f"pools revision {shown['revision']}" if shown["applied"]
             else "no pools file applied: every agent keeps to its own cell"]
    for agent, got in shown["effective"].items():
        own = ("own rw" if got["own_writable"] else "own ro") if got["own"] else "no own store"
        pooled = ", ".join(f"pools/{name} {mode}" for name, mode in got["pools"].items())
        lines.append(f"{agent}: {own}" + (f", {pooled}" if pooled else ""))
    emit(args.json, shown, lines)
    return 0


def cmd_principal_add(args: argparse.Namespace) -> int:
    from scopefs.catalog import identity

    home = _home(args)
    principal_id = identity.add_principal(home.state(), args.name, args.kind)
    emit(args.json, {"principal_id": principal_id, "kind": args.kind}, [principal_id])
    return 0


def cmd_role_add(args: argparse.Namespace) -> int:
    from scopefs.catalog import groups

    home = _home(args)
    role_id, created = groups.add_role(home.state(), args.name)
    emit(args.json, {"role_id": role_id, "created": created}, [role_id])
    return 0


def cmd_bind(args: argparse.Namespace) -> int:
    from scopefs.catalog import identity

    sender = required_id(args, "sender")
    home = _home(args)
    binding_id, created = identity.bind(home.state(), home.hmac_key(), args.principal, args.channel, args.account,
                                        sender)
    emit(args.json, {"binding_id": binding_id, "created": created}, [binding_id])
    return 0


def cmd_binding_revoke(args: argparse.Namespace) -> int:
    from scopefs.catalog import identity

    home = _home(args)
    revoked = identity.revoke_binding(home.state(), args.binding)
    emit(args.json, {"binding_id": args.binding, "revoked": revoked},
         [f"revoked: {args.binding}" if revoked else f"already revoked: {args.binding}"])
    return 0


def cmd_conversation_add(args: argparse.Namespace) -> int:
    from scopefs.catalog import groups

    conversation = required_id(args, "conversation")
    home = _home(args)
    validate_agent_name(args.agent)
    conversation_id, created = groups.add_conversation(home.state(), home.hmac_key(), args.agent, args.channel,
                                                       args.account, conversation)
    emit(args.json, {"conversation_id": conversation_id, "created": created}, [conversation_id])
    return 0


def cmd_member_add(args: argparse.Namespace) -> int:
    from scopefs.catalog import groups

    expires = parse_duration_us(args.expires) if args.expires is not None else None
    home = _home(args)
    membership_id = groups.add_member(home.state(), args.group, args.principal, expires)
    emit(args.json, {"membership_id": membership_id}, [membership_id])
    return 0


def cmd_member_remove(args: argparse.Namespace) -> int:
    from scopefs.catalog import groups

    home = _home(args)
    removed = groups.remove_member(home.state(), args.group, args.principal)
    emit(args.json, {"removed": removed}, ["removed" if removed else "not a member"])
    return 0


def cmd_session_close(args: argparse.Namespace) -> int:
    from scopefs.catalog.sessions import close_session

    closed = close_session(_home(args), args.session)
    emit(args.json, {"session_id": args.session, "closed": closed},
         [f"closed {args.session}" if closed else f"{args.session} was already closed"])
    return 0


def cmd_session_brokers(args: argparse.Namespace) -> int:
    from scopefs.catalog.broker_sessions import listing

    found = listing(_home(args), args.agent)
    emit(args.json, {"sessions": [dataclasses.asdict(b) for b in found]},
         [f"{b.session_id} {b.command} uid {b.unix_uid}" + ("" if b.login_uid is None else f" login {b.login_uid}")
          + (" running" if b.running else " open, its run gone (doctor --fix)" if b.closed_at is None else "")
          for b in found] or ["no broker sessions"])
    return 0


def cmd_session_open(args: argparse.Namespace) -> int:
    from scopefs.catalog.sessions import DirectMessage, Group, Service, SharedMain, open_session

    modes = [args.dm, args.group, args.service is not None, args.shared_main]
    if args.child_of is not None or args.cap:
        return _session_open_child(args, sum(modes))
    if sum(modes) != 1:
        raise BadInput("session open needs exactly one of --dm, --group, --service, --shared-main, --child-of")
    opening: DirectMessage | Group | Service | SharedMain
    if not args.dm and args.sender_stdin:
        raise BadInput("--channel, --account and --sender belong to --dm")
    if args.dm:
        sender = id_value(args, "sender")
        if args.channel is None or args.account is None or sender is None:
            raise BadInput("--dm needs --channel, --account and --sender (or --sender-stdin)")
        opening = DirectMessage(args.channel, args.account, sender)
    elif args.group:
        if args.conversation is None:
            raise BadInput("--group needs --conversation")
        opening = Group(args.conversation)
    elif args.service is not None:
        opening = Service(args.service)
    else:
        opening = SharedMain()
    if not args.dm and any(v is not None for v in (args.channel, args.account, args.sender)):
        raise BadInput("--channel, --account and --sender belong to --dm")
    home = _home(args)
    session = open_session(home, validate_agent_name(args.agent), opening, session_key=args.key)
    subject = session.subject
    payload = {"session_id": session.session_id, "subject": subject.kind.value,
               "subject_principal_id": subject.principal_id,
               "subject_reason": subject.reason.value if subject.reason else None}
    emit(args.json, payload, [session.session_id, f"subject: {subject.kind.value}"
                              + (f" ({subject.reason.value})" if subject.reason else "")])
    return 0


def _session_open_child(args: argparse.Namespace, modes: int) -> int:
    """``session open --child-of SESSION --cap PATTERN...``: a delegated child (``catalog.children``)."""
    from scopefs.catalog.children import open_child

    if args.child_of is None:
        raise BadInput("--cap belongs to --child-of")
    if modes or args.key is not None or args.sender_stdin or any(
            v is not None for v in (args.channel, args.account, args.sender, args.conversation)):
        raise BadInput("--child-of takes only --agent and --cap: the child's subject is its parent's")
    if not args.cap:
        raise BadInput("--child-of needs at least one --cap PATTERN")
    session, delegation = open_child(_home(args), validate_agent_name(args.agent), args.child_of, args.cap)
    subject = session.subject
    payload = {"session_id": session.session_id, "subject": subject.kind.value,
               "subject_principal_id": subject.principal_id,
               "subject_reason": subject.reason.value if subject.reason else None,
               "parent_session_id": delegation.parent_session_id, "caps": list(delegation.caps)}
    emit(args.json, payload, [session.session_id, f"subject: {subject.kind.value}"
                              + (f" ({subject.reason.value})" if subject.reason else ""),
                              f"child of {delegation.parent_session_id}, caps: {' '.join(delegation.caps)}"])
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    """Raw bytes are streamed (hashed whole first, then copied in chunks), so a
    note of any size reads in bounded memory; ``--json`` needs it whole.

    A note whose artifact does not verify may be a save a power loss took
    (``writer.unsynced``): recovery settles those, and the read is tried
    once more, so such a note reads as the revision before it rather than
    as tampered."""
    from scopefs.writer.recovery import recover_home

    home = _home(args)
    try:
        return _read(home, args)
    except IntegrityError:
        if not recover_home(home):
            raise
    return _read(home, args)


def _read(home: Home, args: argparse.Namespace) -> int:
    from scopefs.catalog.exposures import Exposed
    from scopefs.catalog.reader import read_target, stream_note

    if not args.json:
        stream_note(home, args.session, args.path, write_bytes, actor_id=args.actor,
                    expose=lambda access, exposed: _expose(home, args.session, "read", [exposed],
                                                           agent_id=access.session.agent_id))
        return 0
    access, target, data = read_target(home, args.session, args.path, actor_id=args.actor)
    assert target.revision is not None
    _expose(home, args.session, "read", [Exposed(target.revision.revision_id, target.revision.resource_id)],
            agent_id=access.session.agent_id)  # before the bytes leave
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScopefsError("note is not UTF-8 text; read it without --json") from None
    emit(True, {"content": text, "size": len(data)})
    return 0


def _expose(home: Home, session_id: str, operation: str, exposed: list[Any], *, agent_id: str | None = None) -> None:
    """Record what a command showed (``catalog.exposures``): before the process exits, after the bytes left.

    The command line has no run: its exposures are filed under run ``cli``.
    A failure to record is reported, never silent (exit 1 after the output).
    """
    from scopefs.catalog.exposures import record_batch
    from scopefs.catalog.sessions import load_session

    agent = agent_id or load_session(home, session_id).agent_id
    record_batch(home.state(), session_id=session_id, agent_id=agent, run_id="cli", operation=operation,
                 exposed=exposed)


def cmd_write(args: argparse.Namespace) -> int:
    from scopefs.writer.transaction import write_note

    if sys.stdin is None:
        raise BadInput("write reads the note from stdin, which is closed")
    home = _home(args)
    if args.origin == "capture" or args.valid_until is not None:
        result = _write_whole(home, args)
    else:
        result = write_note(home, args.session, args.path, cast(BinaryIO, _Input(sys.stdin.buffer)),
                            actor_id=args.actor)
    emit(args.json, {"resource_id": result.resource_id, "revision_id": result.revision_id,
                     "revision": result.revision_no, "sha256": result.sha256, "size": result.size,
                     "created": result.created},
         [f"{args.path}: revision {result.revision_no} ({result.size} bytes)"])
    return 0


def _write_whole(home: Home, args: argparse.Namespace) -> Any:
    """``write`` that must see the whole text first: a capture (sanitised, keeping the human block), or a
    ``--valid-until`` (set in the note's front matter, where the mount and editors show it too)."""
    from scopefs.catalog.clock import now_us
    from scopefs.catalog.validity import parse_until, with_valid_until
    from scopefs.cli.lifecycle import read_stdin
    from scopefs.writer.capture import capture

    data = read_stdin()
    until = parse_until(args.valid_until, now_us()) if args.valid_until is not None else None
    if args.origin == "capture":
        return capture(home, args.session, args.path, data, actor_id=args.actor, valid_until=until)
    from scopefs.writer.transaction import write_note

    return write_note(home, args.session, args.path, with_valid_until(data, until) if until else data,
                      actor_id=args.actor)


class _Input:
    """stdin for the writer: a read that fails is bad input (exit 2), not a storage failure.

    Stdin opened write-only (``0>file``), say, fails its first read with
    EBADF; the writer would report any OSError as its own staging trouble
    (exit 1). Nothing is committed either way: the staged copy is dropped.
    (Stdin that is a directory never gets here: the interpreter refuses to
    start with one, see the README.)
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        try:
            return self._raw.read(size)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else exc.__class__.__name__
            raise BadInput(f"cannot read the note from stdin: {reason}") from None


def cmd_search(args: argparse.Namespace) -> int:
    from scopefs.catalog.search import search

    home = _home(args)
    from scopefs.catalog.exposures import Exposed

    outcome = search(home, args.session, args.query, limit=args.limit, about=args.about, actor_id=args.actor,
                     mode=args.mode)
    _expose(home, args.session, "search", [Exposed(hit.revision_id, hit.resource_id) for hit in outcome.hits])
    emit(args.json, outcome.payload(), outcome.lines())
    return 0


def cmd_subject(args: argparse.Namespace) -> int:
    from scopefs.catalog.about import attach, subjects_of

    home = _home(args)
    if args.verb == "list":
        found = subjects_of(home, args.session, args.path)
        emit(args.json, {"subjects": [{"principal_id": p} for p in found]}, found or ["no verified subjects"])
        return 0
    changed = attach(home, args.session, args.path, args.principal, remove=args.verb == "remove")
    emit(args.json, {"changed": changed}, [("changed" if changed else "unchanged")])
    return 0


def cmd_reindex(args: argparse.Namespace) -> int:
    from scopefs.catalog.index import reindex

    home = _home(args)
    agents = _agents(args, home)
    reports = {}
    for agent_id in agents:
        def progress(done: int, total: int, agent_id: str = agent_id) -> None:
            sys.stderr.write(f"scopefs: reindex {agent_id}: {done}/{total} revisions\n")
        reports[agent_id] = reindex(home, agent_id, model=args.model, progress=progress)
    failed = [r for report in reports.values() for r in report.failed]
    emit(args.json, {"agents": [{"agent_id": a, "revisions": r.revisions, "chunks": r.chunks, "model": r.model,
                                 "failed_revision_ids": r.failed} for a, r in reports.items()],
                     "exit_code": 4 if failed else 0},
         [f"{a}: {r.revisions} revisions, {r.chunks} chunks, model {r.model}"
          + (f"; {len(r.failed)} failed verification and stay unsearchable" if r.failed else "")
          for a, r in reports.items()])
    return 4 if failed else 0


def cmd_rm(args: argparse.Namespace) -> int:
    """What ``rm`` in a mount does: a tombstone (what was derived from it is held with it)."""
    from scopefs.writer.tombstone import delete_note

    resource_id = delete_note(_home(args), args.session, args.path, actor_id=args.actor)
    emit(args.json, {"resource_id": resource_id, "path": args.path}, [f"{args.path}: removed"])
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from scopefs.catalog.listing import list_folder

    home = _home(args)
    entries = list_folder(home, args.session, args.path or "", actor_id=args.actor)
    emit(args.json, {"entries": [{"name": e.name, "type": "folder" if e.is_dir else "note", "size": e.size}
                                 for e in entries]},
         [e.name + "/" if e.is_dir else e.name for e in entries])
    return 0


def _sessions_named(args: argparse.Namespace) -> list[str]:
    """The sessions a command acts through or reads: its SESSION, ``--child-of``, and ``derive --from
    SESSION:PATH``. None for ``audit``, whose ``--session`` only picks rows."""
    if getattr(args, "session_is_a_filter", False):
        return []
    named = [value for value in (getattr(args, "session", None), getattr(args, "child_of", None))
             if isinstance(value, str)]
    sources = [text for text in getattr(args, "sources", None) or () if isinstance(text, str)]
    if sources:
        from scopefs.writer.derive import parse_source

        own = named[0] if named else ""
        named += [parse_source(own, text)[0] for text in sources]
    return [session_id for session_id in dict.fromkeys(named) if session_id]


def cmd_doctor(args: argparse.Namespace) -> int:
    from scopefs.writer.recovery import exit_code as doctor_exit_code
    from scopefs.writer.recovery import inspect

    home = _home(args)
    agents = _agents(args, home)
    findings = []
    for agent_id in agents:
        findings.extend(inspect(home, agent_id, fix=args.fix))
    code = doctor_exit_code(findings)
    lines = [f"{f.agent_id}: {f.kind}" + (f" {f.ref}" if f.ref else "") + (f": {f.action}" if f.action else "")
             + (f" ({f.hint})" if f.hint else "") for f in findings] or ["ok: the artifact area matches the catalog"]
    journals = _read_journals(home, fix=args.fix)
    if journals["waiting"]:
        lines.append(f"read journals of stopped mounts: {journals['waiting']} file(s), "
                     + (f"{journals['recorded']} read(s) recorded" if args.fix else
                        "not yet in the audit (doctor --fix, the next mount or any audit command records them)"))
    emit(args.json, {"findings": [{"kind": f.kind, "agent_id": f.agent_id, "ref_id": f.ref, "action": f.action,
                                   "notice": f.notice, "integrity": f.integrity, "hint": f.hint} for f in findings],
                     "read_journals": journals, "exit_code": code}, lines)
    return code


def _read_journals(home: Home, *, fix: bool) -> dict[str, int | None]:
    """What killed mounts left in their read journals (``catalog.readjournal``): a notice, not a finding of
    an agent (a journal is the home's), recorded by ``--fix``."""
    from scopefs.catalog.readjournal import replay, waiting

    left = waiting(home)
    return {"waiting": left, "recorded": replay(home) if fix and left else None}


def cmd_mount(args: argparse.Namespace) -> int:
    from scopefs.catalog.human import check_served
    from scopefs.catalog.sessions import load_session
    from scopefs.sandbox import mounts

    home = _home(args)
    owner = _mount_owner(args)  # checked before anything else; the server's module is imported only for it
    if load_session(home, args.session).human:  # served owner-only by ``scopefs browse``, never otherwise
        raise BadInput("a browse session is mounted only by scopefs browse")
    check_served(home, args.session, None if owner is None else owner[0])
    shown: dict[str, object] = {} if owner is None else {"for_uid": owner[0], "for_gid": owner[1]}
    if args.foreground:
        from scopefs.vfs.server import serve

        load_session(home, args.session)  # unknown sessions: exit 2 before anything is mounted
        where = mounts.absolute(args.mountpoint)
        if owner is not None:
            from scopefs.sandbox import external

            external.check_place(where)
        lost: list[OutputLost] = []
        with mounts.claim(home, where) as let_go:  # held until the mount answers: no mount stacks on ours

            def ready() -> None:
                let_go()
                try:
                    emit(args.json, {"mountpoint": where, "session_id": args.session, "pid": os.getpid(), **shown},
                         [f"mounted at {where} (foreground)"])
                except OutputLost as exc:
                    # Nobody hears that the mount is up: take it down the way a signal does (settled,
                    # unmounted), and report once it is gone; raised in here, it would end the
                    # server's loop without either.
                    lost.append(exc)
                    os.kill(os.getpid(), signal.SIGTERM)

            if owner is None:
                serve(home, args.session, where, on_ready=ready)
            else:
                external.serve_for(home, args.session, where, *owner, on_ready=ready)
        if lost:
            raise lost[0]
        return 0
    load_session(home, args.session)
    if owner is None:
        record = mounts.start(home, args.session, args.mountpoint)
    else:
        from scopefs.sandbox import external

        record = external.start(home, args.session, args.mountpoint, *owner)
    emit(args.json, {"mountpoint": record.mountpoint, "session_id": record.session_id, "pid": record.pid, **shown},
         [f"mounted at {record.mountpoint}" + (f" for uid {owner[0]}" if owner else "")])
    return 0


def _mount_owner(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--for-uid`` and ``--for-gid`` (the gid defaults to the uid's number), checked; None for a plain mount."""
    if args.for_uid is None:
        if args.for_gid is not None:
            raise BadInput("--for-gid needs --for-uid")
        return None
    from scopefs.sandbox import external

    owner = (args.for_uid, args.for_uid if args.for_gid is None else args.for_gid)
    external.check_owner(*owner)
    return owner


def cmd_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scopefs.api.mounting import parse_policy
    from scopefs.api.server import serve

    home = _home(args)
    token_file = Path(args.token_file) if args.token_file else None
    serve(home, Path(args.socket), allow_uids=args.allow_uid, http=args.http, token_file=token_file,
          workers=args.workers, mounting=parse_policy(args.mount_base, args.mount_uids))
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from scopefs.sandbox import mounts

    home = _home(args)
    record = mounts.stop(home, args.mountpoint)
    if record is not None:
        _end_browse(home, record.session_id)
    where = os.path.realpath(args.mountpoint)
    emit(args.json, {"mountpoint": where, "session_id": record.session_id if record else None},
         [f"unmounted {where}"])
    return 0


def _end_browse(home: Home, session_id: str) -> None:
    """A browse session (``scopefs browse``) lasts as long as its mount: closed once it is unmounted."""
    from scopefs.catalog.sessions import close_session, load_session

    try:
        session = load_session(home, session_id)
    except BadInput:
        return
    if session.human:
        close_session(home, session_id)


def cmd_run(args: argparse.Namespace) -> int:
    from scopefs.catalog.sessions import load_session
    from scopefs.sandbox import launch, sessions

    argv, args.timeout = _run_options(list(args.command), args.timeout)
    if not argv:
        raise BadInput("run needs a COMMAND to run in the sandbox")
    timeout = parse_duration_us(args.timeout) / 1e6 if args.timeout else None
    from scopefs.catalog.human import check_served

    home = _home(args)
    load_session(home, args.session)  # unknown sessions: exit 2 before anything is started
    check_served(home, args.session, None)  # a person's own view never goes into an agent's sandbox
    launch.preflight()  # refuse before mounting anything if no safe sandbox can be built
    kept = sessions.for_run(home, args.session)  # a revoked session: exit 3, kept mount or not
    if kept is not None:
        return launch.run(kept, argv, timeout=timeout)
    proc, target = sessions.start(home, args.session, tied=True)
    try:
        with sessions.recorded_run(home, proc.pid, target):  # counted by ``scopefs stats`` while it runs
            return launch.run(target, argv, timeout=timeout)
    finally:
        sessions.stop_server(proc.pid, target.mountpoint)
        proc.wait()


def _run_options(words: list[str], timeout: str | None) -> tuple[list[str], str | None]:
    """Split ``[--timeout D] [--] COMMAND...``: options before the command are ours."""
    while words and words[0].startswith("--"):
        word = words.pop(0)
        if word == "--":
            break
        if word == "--timeout" and words:
            timeout = words.pop(0)
        elif word.startswith("--timeout="):
            timeout = word.split("=", 1)[1]
        else:
            raise BadInput("run: unknown option before the command (put the command after --)")
    return words, timeout


def cmd_session_up(args: argparse.Namespace) -> int:
    from scopefs.catalog.human import check_served
    from scopefs.catalog.sessions import load_session
    from scopefs.sandbox import launch, sessions

    home = _home(args)
    load_session(home, args.session)
    check_served(home, args.session, None)  # a browse session: only ``scopefs browse`` serves it (exit 2)
    launch.preflight()
    pid, target = sessions.keep(home, args.session)
    emit(args.json, {"session_id": args.session, "pid": pid, "writable": target.writable},
         ["the session's sandbox mount is up; 'scopefs run' reuses it until 'scopefs session down'"])
    return 0


def cmd_session_down(args: argparse.Namespace) -> int:
    from scopefs.sandbox import sessions

    home = _home(args)
    sessions.release(home, args.session)
    emit(args.json, {"session_id": args.session}, ["the session's sandbox mount is down"])
    return 0


# -- parser -----------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="scopefs", description="Identity-aware memory views for multi-user agents.")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, func: Callable[[argparse.Namespace], int], helptext: str,
                where: Any = sub) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = where.add_parser(name, help=helptext, description=helptext)
        _common(p, top=False)
        p.set_defaults(func=func)
        return p

    command("init", cmd_init, "create the state directory (idempotent)")

    agent = sub.add_parser("agent", help="manage agents").add_subparsers(dest="verb", required=True,
                                                                         parser_class=_Parser)
    command("add", cmd_agent_add, "add an agent cell", agent).add_argument("agent")

    pools = sub.add_parser("pools", help="shared memory pools (N:M capture and recall)").add_subparsers(
        dest="verb", required=True, parser_class=_Parser)
    command("apply", cmd_pools_apply, "make FILE.toml the pools declaration (atomic, idempotent)",
            pools).add_argument("file")
    command("show", cmd_pools_show, "the applied pools declaration and what each agent gets", pools)

    principal = sub.add_parser("principal", help="manage principals").add_subparsers(dest="verb", required=True,
                                                                                     parser_class=_Parser)
    p = command("add", cmd_principal_add, "add a principal; NAME is a display label only", principal)
    p.add_argument("name")
    p.add_argument("--kind", choices=("human", "service"), required=True)

    role = sub.add_parser("role", help="manage roles").add_subparsers(dest="verb", required=True, parser_class=_Parser)
    command("add", cmd_role_add, "add a role (its name is its folder under roles/)", role).add_argument("name")

    p = command("bind", cmd_bind, "bind a channel sender to a human principal")
    p.add_argument("principal")
    p.add_argument("--channel", required=True)
    p.add_argument("--account", required=True)
    add_id_option(p, "sender", required=True, what="sender's")

    binding = sub.add_parser("binding", help="manage bindings").add_subparsers(dest="verb", required=True,
                                                                               parser_class=_Parser)
    command("revoke", cmd_binding_revoke, "revoke a binding; its sessions are denied from now on",
            binding).add_argument("binding")

    conversation = sub.add_parser("conversation", help="manage conversations").add_subparsers(
        dest="verb", required=True, parser_class=_Parser)
    p = command("add", cmd_conversation_add, "register a group conversation for an agent", conversation)
    for flag in ("--agent", "--channel", "--account"):
        p.add_argument(flag, required=True)
    add_id_option(p, "conversation", required=True, what="provider's conversation")

    member = sub.add_parser("member", help="manage memberships").add_subparsers(dest="verb", required=True,
                                                                                parser_class=_Parser)
    p = command("add", cmd_member_add, "add a principal to a conversation or role", member)
    p.add_argument("group", metavar="CONVERSATION|ROLE|role:NAME")
    p.add_argument("principal")
    p.add_argument("--expires", metavar="DURATION", help="evidence freshness bound, e.g. 12h or 7d")
    p = command("remove", cmd_member_remove, "remove a principal from a conversation or role", member)
    p.add_argument("group", metavar="CONVERSATION|ROLE|role:NAME")
    p.add_argument("principal")

    session = sub.add_parser("session", help="manage sessions").add_subparsers(dest="verb", required=True,
                                                                               parser_class=_Parser)
    p = command("open", cmd_session_open, "open a session; its subject is fixed for life", session)
    p.add_argument("--agent", required=True)
    p.add_argument("--dm", action="store_true")
    p.add_argument("--group", action="store_true")
    p.add_argument("--service", metavar="PRINCIPAL")
    p.add_argument("--shared-main", action="store_true")
    p.add_argument("--channel")
    p.add_argument("--account")
    add_id_option(p, "sender", required=False, what="sender's")
    p.add_argument("--conversation")
    p.add_argument("--key", metavar="SESSION_KEY",
                   help="the gateway's key for this logical session: reused while its subject holds;"
                        " a changed subject binds the key to a new session and refuses the old one")
    p.add_argument("--child-of", metavar="SESSION",
                   help="open a delegated child of SESSION: its subject, and at most its current view")
    p.add_argument("--cap", metavar="PATTERN", action="append", default=[],
                   help="with --child-of (1 to 32): a folder of the view the child may use, e.g."
                        " private/projects or agent-shared/**")
    p = command("close", cmd_session_close, "end a session for good: every later operation and mount is refused",
                session)
    p.add_argument("session")
    p = command("brokers", cmd_session_brokers, "the sessions admin commands opened for their runs: which command,"
                " which uid (the run behind the audit rows naming them)", session)
    p.add_argument("--agent", required=True)
    p = command("up", cmd_session_up, "keep the session's sandbox mount up so that each run reuses it", session)
    p.add_argument("session")
    p = command("down", cmd_session_down, "stop the session's kept sandbox mount", session)
    p.add_argument("session")

    for name, func, helptext in (
        ("read", cmd_read, "print a note of the session's view (verified against its hash)"),
        ("write", cmd_write, "write stdin as a new revision of a note; missing folders are created"),
    ):
        p = command(name, func, helptext)
        p.add_argument("session")
        p.add_argument("path", help="a virtual path, e.g. private/notes/x.md")
        p.add_argument("--actor", metavar="PRINCIPAL", help="the principal causing this operation")
        if name == "write":
            p.set_defaults(changes_as_session=True)
            p.add_argument("--origin", choices=("human", "capture"), default="human",
                           help="capture: machine-made from chat (envelope stripped, the human block kept)")
            p.add_argument("--valid-until", metavar="DATE|DURATION",
                           help="deny the note after this (YYYY-MM-DD, an ISO time, or e.g. 30d); front matter")
    p = command("rm", cmd_rm, "remove a note (a tombstone, as rm in a mount); notes derived from it are held")
    p.set_defaults(changes_as_session=True)
    p.add_argument("session")
    p.add_argument("path")
    p.add_argument("--actor", metavar="PRINCIPAL")
    p = command("ls", cmd_ls, "list a folder of the session's view")
    p.add_argument("session")
    p.add_argument("path", nargs="?", default="")
    p.add_argument("--actor", metavar="PRINCIPAL")

    p = command("search", cmd_search, "search the session's view by words and meaning; results name virtual paths")
    p.add_argument("session")
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=10, help="how many results (1-100, default 10)")
    p.add_argument("--about", metavar="PRINCIPAL", help="only notes carrying this verified subject (a principal id)")
    p.add_argument("--mode", choices=("hybrid", "words", "vectors"), default="hybrid",
                   help="both arms (default; each degrades to the other, saying so) or exactly one")
    p.add_argument("--actor", metavar="PRINCIPAL")

    subject = sub.add_parser("subject", help="verified subjects of notes").add_subparsers(
        dest="verb", required=True, parser_class=_Parser)
    for verb, helptext in (("add", "attach a verified subject (a principal id) to a note"),
                           ("remove", "detach a verified subject from a note")):
        p = command(verb, cmd_subject, helptext, subject)
        p.set_defaults(changes_as_session=True)
        p.add_argument("session")
        p.add_argument("path")
        p.add_argument("principal")
    p = command("list", cmd_subject, "list a note's verified subjects", subject)
    p.add_argument("session")
    p.add_argument("path")

    p = command("reindex", cmd_reindex, "rebuild the search index from verified artifacts; --model switches models")
    p.add_argument("--agent")
    p.add_argument("--model", help="scopefs-hashing-v2-<dimension> (the default, 256)"
                                   " or wordllama:l2_supercat-256 (the [embeddings] extra)")

    p = command("mount", cmd_mount, "mount the session's view at MOUNTPOINT; returns once it answers")
    p.add_argument("session")
    p.add_argument("mountpoint")
    p.add_argument("--foreground", action="store_true", help="stay attached until unmounted")
    p.add_argument("--for-uid", type=int, metavar="UID",
                   help="serve the view to processes of this uid alone (a container's), shown as their files;"
                        " it unmounts itself when the session ends")
    p.add_argument("--for-gid", type=int, metavar="GID", help="the group its files show (default: the uid's number)")
    p = command("umount", cmd_umount, "unmount a view (also clears a mount whose server died)")
    p.add_argument("mountpoint")
    p = command("run", cmd_run, "run COMMAND in a sandbox whose only memory is the session's view, at /memory")
    p.add_argument("session")
    p.add_argument("--timeout", metavar="DURATION", help="kill the sandbox after this long (exit 124)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments (after --)")

    p = command("serve", cmd_serve, "serve the gateway API on a Unix socket (and loopback HTTP with a token)")
    p.add_argument("--socket", required=True, metavar="PATH")
    p.add_argument("--allow-uid", type=int, action="append", default=[], metavar="UID",
                   help="a peer uid allowed on the socket, besides root and this user (repeatable)")
    p.add_argument("--http", metavar="127.0.0.1:PORT", help="also listen on loopback TCP (needs --token-file)")
    p.add_argument("--token-file", metavar="F", help="a 0600 file holding the bearer token for --http")
    p.add_argument("--workers", type=int, metavar="N",
                   help="requests answered at once, each with its own catalog connections"
                        " (default: one per CPU, 2 to 4)")
    p.add_argument("--mount-base", metavar="DIR", help="let clients mount sessions for their sandboxes, only"
                                                      " in folders under DIR (with --mount-uids)")
    p.add_argument("--mount-uids", metavar="LO-HI", help="the uids such mounts may be served to")

    from scopefs.cli import browse, lifecycle, postbox, sharing

    sharing.register(sub, command, _Parser)
    postbox.register(sub, command, _Parser)
    lifecycle.register(sub, command, _Parser)
    browse.register(sub, command, _Parser)

    from scopefs.cli import history

    history.register(sub, command, _Parser)

    from scopefs.cli import backup

    backup.register(sub, command, _Parser)

    from scopefs.cli import migrate

    migrate.register(sub, command, _Parser)

    from scopefs.cli import ops

    ops.register(sub, command, _Parser)

    p = command("doctor", cmd_doctor, "check the artifact area against the catalog; --fix repairs")
    p.add_argument("--fix", action="store_true")
    p.add_argument("--agent")
    return parser


def _log_to_stderr() -> None:
    """Library warnings (a search arm that degraded, say) as one ``scopefs:`` line each."""
    import logging

    logger = logging.getLogger("scopefs")
    if any(getattr(h, "scopefs_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("scopefs: %(message)s"))
    handler.scopefs_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    os.umask(0o077)
    _log_to_stderr()
    if sys.stdout is None:  # started with stdout closed: nowhere to report anything
        return 1
    raw = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in (raw[:raw.index("--")] if "--" in raw else raw)
    try:
        args = build_parser().parse_args(raw)
        as_json = bool(getattr(args, "json", as_json))
        named = _sessions_named(args)
        changing = args.session if getattr(args, "changes_as_session", False) else None
        if named or changing:  # the one place every command naming a session passes
            from scopefs.catalog.human import check_command_line

            check_command_line(_home(args), named, changing=changing)
        code: int = args.func(args)
        return code
    except Denied as exc:
        return fail(as_json, exc.exit_code, str(exc), exc.reason)
    except ScopefsError as exc:
        return fail(as_json, exc.exit_code, str(exc))
    except KeyboardInterrupt:
        return fail(as_json, 1, "interrupted")
    except OutputLost as exc:  # before OSError: stdout failing is not storage trouble
        return lost_output(exc)
    except BrokenPipeError:  # a closed stdout written to outside ``cli.output``: quiet, as before
        drop_stdout()
        return 1
    except Exception as exc:  # noqa: BLE001 - sorted below: storage trouble or a bug
        if not isinstance(exc, OSError) and type(exc).__module__ != "apsw":  # a bug: one line, no values
            return fail(as_json, 1, f"internal error: {exc.__class__.__name__}")
        # Unexpected storage trouble: one line naming the class of failure,
        # never a path or a value that might carry content.
        return fail(as_json, 1, f"storage failure: {exc.__class__.__name__}"
                    + (f" ({os.strerror(exc.errno)})" if isinstance(exc, OSError) and exc.errno else ""))


if __name__ == "__main__":
    sys.exit(main())
