"""A consistent copy of a home: the databases by SQLite's online backup, the artifacts and the key.

A stand-in with the signature of the full backup module (``backup_home``),
so that ``writer.migrate`` can back up before it copies anything. The
databases are copied page by page through apsw's backup API, so a live
home keeps serving while it runs and the copy is one consistent snapshot
of each database; the artifact trees and ``hmac.key`` are copied file by
file without following any symlink. The destination is created 0700 and
must not exist yet: a backup never merges into an older one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import apsw

from scopefs.catalog.errors import BadInput, storage_error
from scopefs.catalog.home import Home

_PAGES_PER_STEP = 256


def _copy_database(source: Path, dest: Path) -> None:
    src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        out = apsw.Connection(str(dest))
        try:
            with out.backup("main", src, "main") as job:
                while not job.done:
                    job.step(_PAGES_PER_STEP)
        finally:
            out.close()
    finally:
        src.close()
    os.chmod(dest, 0o600)


def _copy_tree(source: Path, dest: Path) -> None:
    """Regular files and folders only; a symlink or anything else planted in the area is left out."""
    dest.mkdir(mode=0o700)
    for entry in os.scandir(source):
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), dest / entry.name)
        elif entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, dest / entry.name, follow_symlinks=False)


def backup_home(home: Home, dest: Path) -> Any:
    """Copy ``home`` into the new folder ``dest`` (0700); returns what was copied, as counts."""
    if dest.exists() or dest.is_symlink():
        raise BadInput("the backup destination exists already")
    try:
        dest.mkdir(mode=0o700, parents=False)
        os.chmod(dest, 0o700)
        _copy_database(home.state_path, dest / "state.sqlite")
        shutil.copy2(home.key_path, dest / "hmac.key", follow_symlinks=False)
        os.chmod(dest / "hmac.key", 0o600)
        databases, files = 1, 0
        for agent_id in home.cells():  # agents and shared pools
            agent_dir = dest / home.agent_dir(agent_id).relative_to(home.root)
            agent_dir.mkdir(mode=0o700, parents=True)
            _copy_database(home.catalog_path(agent_id), agent_dir / "catalog.sqlite")
            databases += 1
            scopes = home.scopes_dir(agent_id)
            if scopes.is_dir():
                (agent_dir / "memory-scopes").mkdir(mode=0o700)
                _copy_tree(scopes, agent_dir / "memory-scopes" / "v1")
                files += sum(len(f) for _d, _s, f in os.walk(agent_dir / "memory-scopes"))
        for root, _dirs, names in os.walk(dest):
            for name in names:
                with open(os.path.join(root, name), "rb") as fh:
                    os.fsync(fh.fileno())
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise storage_error("cannot write the backup", exc) from exc
    return {"databases": databases, "artifacts": files}
