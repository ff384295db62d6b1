"""``scopefs backup DEST`` and ``scopefs restore SRC --home NEW``: thin wiring for ``writer.backup``/``writer.restore``.

Progress is one line per stage on stderr (``scopefs: backup: ...``), so a
long run shows where it is without touching stdout, which stays the one
JSON object ``--json`` promises.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scopefs.catalog.home import Home, resolve_home
from scopefs.cli.output import emit

Command = Callable[..., argparse.ArgumentParser]


def _progress(verb: str) -> Callable[[str], None]:
    def say(line: str) -> None:
        try:
            sys.stderr.write(f"scopefs: {verb}: {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass  # progress is a courtesy: a closed stderr never fails the work

    return say


def cmd_backup(args: argparse.Namespace) -> int:
    from scopefs.writer.backup import backup_home

    home = Home.open(resolve_home(args.home))
    try:
        report = backup_home(home, Path(args.dest), progress=_progress("backup"))
    finally:
        home.close()
    emit(args.json, report.as_dict(),
         [f"backup written to {report.dest}: {len(report.cells)} cell(s), {report.artifacts} artifact(s)"
          f" ({report.artifact_bytes} bytes), databases {report.database_bytes} bytes",
          f"manifest sha256 {report.manifest_sha256}"]
         + ([f"{report.skipped} kept file(s) of removed notes did not verify and were left out"]
            if report.skipped else []))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from scopefs.writer.restore import restore_home

    report = restore_home(Path(args.src), resolve_home(args.home), progress=_progress("restore"),
                          expect_manifest=args.expect_manifest)
    emit(args.json, report.as_dict(),
         [f"restored into {report.home}: {len(report.cells)} cell(s), {report.artifacts} artifact(s) verified"
          f" ({report.artifact_bytes} bytes)", f"manifest sha256 {report.manifest_sha256}"])
    return 0


def register(sub: Any, command: Command, parser_class: type[argparse.ArgumentParser]) -> None:
    p = command("backup", cmd_backup, "write a consistent backup of the home (live) to DEST (absent or empty)")
    p.add_argument("dest", metavar="DEST")
    p = command("restore", cmd_restore, "restore the backup SRC into a new home (--home NEW, absent or empty),"
                " verified whole before anything is readable")
    p.add_argument("src", metavar="SRC")
    p.add_argument("--expect-manifest", metavar="SHA256", default=None,
                   help="the manifest_sha256 the backup printed, kept where the backup's readers cannot change it:"
                        " any other manifest is refused (exit 4) before anything is made")
