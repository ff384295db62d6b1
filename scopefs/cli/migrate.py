"""``scopefs migrate``: an OpenClaw agent's legacy memory into scoped stores (``writer.migrate``).

Thin wiring: parse, plan, print the plan; with ``--apply --confirm DIGEST``
carry it out. Progress goes to stderr, as a bar on a terminal (rich) and as
plain lines otherwise; stdout holds the report only (one JSON object with
``--json``). Paths and classes are printed, never content.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scopefs.catalog.home import Home, resolve_home
from scopefs.cli.output import emit

Command = Callable[..., argparse.ArgumentParser]


def _state_dir(arg: str | None) -> str | None:
    """``--state-dir``, else ``~/.openclaw`` when it exists (OpenClaw's default), else none: no transcripts."""
    if arg is not None:
        return arg
    default = Path.home() / ".openclaw"
    return str(default) if default.is_dir() else None


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int, int, Any, str], None]]:
    if sys.stderr is not None and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(file=sys.stderr), transient=True) as bar:
            task = bar.add_task("migrate", total=total)

            def tick(_done: int, _total: int, _item: Any, _status: str) -> None:
                bar.advance(task)
            yield tick
        return

    def line(done: int, count: int, item: Any, status: str) -> None:
        print(f"migrate: {done}/{count} {status} {item.source}{'#' + item.part if item.part else ''}",
              file=sys.stderr, flush=True)
    yield line


def _lines(payload: dict[str, Any]) -> list[str]:
    out = []
    for item in payload["items"]:
        where = item["destination"] or "-"
        part = f"#{item['part']}" if item["part"] else ""
        out.append(f"{item['action']:<12} {item['source']}{part} -> {where} ({item['class']}, {item['reason']})"
                   f" [{item['status']}]")
    out.append(f"plan {payload['plan_digest']}: " + ", ".join(f"{n} {a}" for a, n in payload["summary"].items()))
    if not payload["applied"]:
        out.append("nothing was changed; after review, apply exactly this plan with: --apply --confirm"
                   f" {payload['plan_digest']}")
    elif payload["backup_removed"]:
        out.append("cutover recorded; the pre-migration backup was removed (it served only to roll back or resume"
                   " a run that had not reached cutover)")
    elif payload["backup"]:
        out.append(f"cutover recorded; the pre-migration backup could not be removed: {payload['backup']}"
                   " ('scopefs doctor --fix' retries)")
    else:
        out.append("this plan was applied already; nothing changed")
    return out


def cmd_migrate(args: argparse.Namespace) -> int:
    from scopefs.writer.migrate import apply, make_plan, preview

    home = Home.open(resolve_home(args.home))
    plan = make_plan(home, args.agent, os.path.abspath(args.workspace), state_dir=_state_dir(args.state_dir),
                     owner=args.owner, shared=tuple(args.shared or ()), openclaw_agent=args.openclaw_agent)
    if not args.apply:
        report = preview(home, plan)
    else:
        with _progress(sum(1 for i in plan.items if i.destination)) as tick:
            report = apply(home, plan, args.confirm, tick)
    payload = report.as_dict()
    emit(args.json, payload, _lines(payload))
    return 0


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    p = command("migrate", cmd_migrate, "move an OpenClaw agent's legacy memory into scoped stores (dry run unless"
                                        " --apply)")
    p.add_argument("--agent", required=True, help="the scopefs agent to migrate into")
    p.add_argument("--workspace", required=True, metavar="DIR", help="the OpenClaw agent's workspace")
    p.add_argument("--state-dir", metavar="DIR", help="OpenClaw's state folder (default: ~/.openclaw if present)")
    p.add_argument("--openclaw-agent", metavar="ID", help="the OpenClaw agent id (default: the --agent name)")
    p.add_argument("--owner", metavar="PRINCIPAL", help="the one person whose private store takes the memory")
    p.add_argument("--shared", action="append", metavar="PATH",
                   help="a workspace file the operator marks as reference material for agent-shared/ (repeat)")
    p.add_argument("--apply", action="store_true", help="carry out the plan (needs --confirm)")
    p.add_argument("--confirm", metavar="PLAN_DIGEST", help="the plan_digest of the reviewed dry run")
