"""A sender's or a conversation's provider id read from stdin, so that it never sits on a command line.

A command line is public on this host: every local user reads it in
``/proc/PID/cmdline`` (``ps``), and shells keep it in their history. The
catalog never stores a raw provider id (only keyed HMACs), and no log or
audit row names one, so an operator's ``bind`` or an adapter's ``message
add`` run once per group message was the one place left that showed it.
Each flag that takes one has a twin that reads it from stdin instead:
``--sender-stdin``, ``--conversation-stdin``. The id is the first line,
exactly (only the line end is dropped), at most
``identity.MAX_PROVIDER_FIELD_BYTES`` bytes. Only that line is read, so a
caller may keep the pipe open; a lone carriage return inside it is
refused. A refusal never quotes what was read.
"""

from __future__ import annotations

import argparse
import sys

from scopefs.catalog.errors import BadInput
from scopefs.catalog.identity import MAX_PROVIDER_FIELD_BYTES


def add_id_option(parser: argparse.ArgumentParser, name: str, *, required: bool, what: str) -> None:
    """``--NAME ID`` and ``--NAME-stdin``, one of them (``required``: exactly one)."""
    either = parser.add_mutually_exclusive_group(required=required)
    either.add_argument(f"--{name}", metavar=name.upper(),
                        help=f"the {what} id (visible to every local user while the command runs: see"
                             f" --{name}-stdin)")
    either.add_argument(f"--{name}-stdin", action="store_true",
                        help=f"read the {what} id from stdin (one line), keeping it out of the process table")


def id_value(args: argparse.Namespace, name: str) -> str | None:
    """The id given for ``name``: from the command line, from stdin if ``--NAME-stdin``, or None."""
    if not getattr(args, f"{name.replace('-', '_')}_stdin", False):
        value: str | None = getattr(args, name.replace("-", "_"))
        return value
    return _read_id(name)


def required_id(args: argparse.Namespace, name: str) -> str:
    """``id_value`` of a flag argparse requires (one of the two is always given)."""
    value = id_value(args, name)
    if value is None:
        raise BadInput(f"--{name} or --{name}-stdin is required")
    return value


def _read_id(name: str) -> str:
    flag = f"--{name}-stdin"
    if sys.stdin is None:
        raise BadInput(f"{flag}: stdin is closed")
    try:
        data = sys.stdin.buffer.readline(MAX_PROVIDER_FIELD_BYTES + 3)  # the id, "\r\n", one byte too many
    except OSError:
        raise BadInput(f"{flag}: cannot read stdin") from None
    line = data[:-1] if data.endswith(b"\n") else data
    line = line[:-1] if line.endswith(b"\r") else line
    if b"\r" in line:
        raise BadInput(f"{flag}: the id must be one line")
    if len(line) > MAX_PROVIDER_FIELD_BYTES:
        raise BadInput(f"{flag}: the id is longer than {MAX_PROVIDER_FIELD_BYTES} bytes")
    try:
        return line.decode("utf-8", errors="strict")  # emptiness and control characters: identity.provider_field
    except UnicodeDecodeError:
        raise BadInput(f"{flag}: the id is not valid UTF-8") from None
