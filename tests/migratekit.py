"""A realistic OpenClaw legacy layout, built the way OpenClaw 2026.9 writes it, for the migration tests.

Workspace: ``USER.md``, ``MEMORY.md`` and a lower-case ``memory.md`` twin,
``DREAMS.md`` with diary, light, REM and deep blocks between OpenClaw's
markers, daily notes (plain and slugged), nested notes, the dreaming
machine state under ``memory/.dreams/`` and a phase report, a reference
file the operator marks ``--shared``, a symlink pointing out of the
workspace, a file whose bytes are not UTF-8 and one whose name is not.
State dir: ``agents/main/sessions/sessions.json`` naming transcripts for
Alice's DM (bound to Alice in the scenario), a group and the shared main
key; on request another person's DM (Carol, never bound; or Bob, bound)
and an account-less DM key, either of which makes the workspace's memory
no longer Alice's alone; a reset archive and an
unreferenced transcript; the two derived index databases (real SQLite).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import apsw

from tests.conftest import ACCOUNT, ALICE_SENDER, CHANNEL, GROUP_CONVERSATION

CAROL_SENDER = "tg-sender-carol-6610044291"  # never bound: "a DM of another person"
MEMORY = b"# Memory\n\n- Alice's durable fact: the garden plan is due in May (canary M3m0)\n"
USER = b"# User\n\n- Prefer short answers. (canary U5er)\n"
DIARY = b"Dear diary: a quiet night (canary D1ar)"
LIGHT = b"## Light Sleep\n- staged from transcripts (canary L1gh)"
REM = b"## REM Sleep\n- themes (canary R3mm)"
DEEP = b"## Deep Sleep\n- promoted 2 (canary D33p)"
DREAMS = (b"# Dreams\n\nOutside any block (canary O0ut)\n"
          b"<!-- openclaw:dreaming:diary:start -->\n" + DIARY + b"\n<!-- openclaw:dreaming:diary:end -->\n"
          b"<!-- openclaw:dreaming:light:start -->\n" + LIGHT + b"\n<!-- openclaw:dreaming:light:end -->\n"
          b"<!-- openclaw:dreaming:rem:start -->\n" + REM + b"\n<!-- openclaw:dreaming:rem:end -->\n"
          b"<!-- openclaw:dreaming:deep:start -->\n" + DEEP + b"\n<!-- openclaw:dreaming:deep:end -->\n"
          b"Trailing human text (canary T4il)\n")
DREAMS_KEPT = (b"# Dreams\n\nOutside any block (canary O0ut)\n"
               b"<!-- openclaw:dreaming:diary:start -->\n" + DIARY + b"\n<!-- openclaw:dreaming:diary:end -->\n"
               b"Trailing human text (canary T4il)\n")
DAILY = b"# 2026-11-30\n- met about the garden (canary Da1y)\n"
HANDBOOK = b"# Team handbook\nLunch is at noon. (canary H4nd)\n"
LATIN1 = "Caf\xe9 cr\xe8me, na\xefve (canary L4t1)\n".encode("latin-1")
ALICE_TRANSCRIPT = b'{"type":"session","id":"s-alice"}\n{"role":"user","text":"hi (canary Tr4a)"}\n'
OTHER_TRANSCRIPT = b'{"type":"session","id":"s-other"}\n{"role":"user","text":"mine (canary Tr0b)"}\n'
GROUP_TRANSCRIPT = b'{"type":"session","id":"s-group"}\n{"role":"user","text":"team (canary Gr0p)"}\n'
CANARIES = (b"M3m0", b"U5er", b"D1ar", b"L1gh", b"R3mm", b"D33p", b"O0ut", b"T4il", b"Da1y", b"H4nd", b"L4t1",
            b"Tr4a", b"Tr0b", b"Gr0p")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _sqlite(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE memory_index_chunks (text TEXT, source TEXT)")
    conn.execute("INSERT INTO memory_index_chunks VALUES ('indexed copy (canary Idx0)', 'MEMORY.md')")
    conn.close()


def build_layout(root: Path, *, other_sender: str | None = None, no_account_dm: bool = False,
                 agent: str = "main") -> tuple[Path, Path]:
    """(workspace, state dir) under ``root``; ``other_sender``: whose DM sits beside Alice's, if anyone's."""
    ws, state = root / "workspace", root / "openclaw"
    _write(ws / "USER.md", USER)
    _write(ws / "MEMORY.md", MEMORY)
    _write(ws / "memory.md", b"# an older lower-case twin\n")
    _write(ws / "DREAMS.md", DREAMS)
    _write(ws / "memory" / "2026-11-30.md", DAILY)
    _write(ws / "memory" / "2026-12-01-standup.md", b"# standup\n- slugged daily note\n")
    _write(ws / "memory" / "projects" / "garden" / "plan.md", b"# garden plan\n- beds: 4\n")
    _write(ws / "memory" / ".dreams" / "short-term-recall.json", b'{"entries": []}\n')
    _write(ws / "memory" / ".dreams" / "events.jsonl", b'{"event":"sweep"}\n')
    _write(ws / "memory" / ".dreams" / "session-corpus" / "2026-12-01.txt", b"redacted corpus line\n")
    _write(ws / "memory" / "dreaming" / "deep" / "2026-12-01.md", b"# deep report\n")
    _write(ws / "memory" / "latin1.md", LATIN1)
    _write(ws / "memory" / "attachment.pdf", b"%PDF-1.4 not a note\n")
    _write(ws / "reference" / "handbook.md", HANDBOOK)
    _write(ws / "AGENTS.md", b"# agent instructions: not memory, not scanned\n")
    _write(root / "outside-secret.md", b"outside the workspace (canary 0ut5)\n")
    os.symlink(root / "outside-secret.md", ws / "memory" / "escape.md")
    (ws / "memory" / os.fsdecode(b"bad-\xff-name.md")).write_bytes(b"a name that is not UTF-8\n")
    sessions = state / "agents" / agent / "sessions"
    keys = {
        f"agent:{agent}:{CHANNEL}:{ACCOUNT}:direct:{ALICE_SENDER}": "s-alice",
        f"agent:{agent}:{CHANNEL}:group:{GROUP_CONVERSATION}": "s-group",
        f"agent:{agent}:main": "s-main",
    }
    if other_sender is not None:
        keys[f"agent:{agent}:{CHANNEL}:{ACCOUNT}:direct:{other_sender}"] = "s-other"
    if no_account_dm:
        keys[f"agent:{agent}:{CHANNEL}:direct:{ALICE_SENDER}"] = "s-noaccount"
    _write(sessions / "sessions.json", json.dumps(
        {key: {"sessionId": sid, "updatedAt": 1764633600000} for key, sid in keys.items()}, indent=2).encode())
    _write(sessions / "s-alice.jsonl", ALICE_TRANSCRIPT)
    _write(sessions / "s-other.jsonl", OTHER_TRANSCRIPT)
    _write(sessions / "s-group.jsonl", GROUP_TRANSCRIPT)
    _write(sessions / "s-main.jsonl", b'{"type":"session","id":"s-main"}\n')
    _write(sessions / "s-noaccount.jsonl", b'{"type":"session","id":"s-noaccount"}\n')
    _write(sessions / "s-old.jsonl.reset.2026-11-01T00-00-00Z", b'{"type":"session","id":"s-old"}\n')
    _write(sessions / "s-orphan.jsonl", b'{"type":"session","id":"s-orphan"}\n')
    _sqlite(state / "agents" / agent / "agent" / "openclaw-agent.sqlite")
    _write(state / "agents" / agent / "agent" / "auth-profiles.json", b'{"token": "not copied (canary 4uth)"}\n')
    _sqlite(state / "memory" / f"{agent}.sqlite")
    return ws, state


def tree_hash(root: Path) -> str:
    """Every entry under ``root`` (names, types, modes, sizes, mtimes, bytes, link targets), as one digest."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest.update(os.fsencode(os.path.relpath(path, root)) + b"\0")
            digest.update(f"{st.st_mode}:{st.st_size}:{st.st_mtime_ns}".encode())
            if os.path.islink(path):
                digest.update(os.fsencode(os.readlink(path)))
            elif os.path.isfile(path):
                with open(path, "rb") as fh:
                    digest.update(fh.read())
    return digest.hexdigest()
