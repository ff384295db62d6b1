#!/usr/bin/env python3
"""Fuzzing the capture sanitiser and the name/path parsers (issue 16, point 7).

Every function here reads text that a sandboxed agent, a chat participant or
an operator's file controls. Two things must hold on any input:

* **no crash**: the only exceptions are the ones the callable documents
  (``BadInput`` and its subclasses, ``BadName`` for kernel names,
  ``StorageError`` for catalog values). Anything else would surface as exit
  code 1, an ``EIO`` through a mount, or a 500 from the API, and may leave a
  half-done operation behind. A crash is reported with a shrunk reproducer.
* **linear time**: no pattern or loop whose cost grows faster than the
  input. Each callable is timed on adversarial inputs of 1 KiB to 1 MiB
  (unclosed brackets, stacked envelope prefixes, one long line, many short
  lines, ...) and its time per byte is compared between the smallest and the
  largest size; a growth over ``--max-growth`` (default 4x) is flagged.

For the sanitiser, the fuzz also checks what its tests state as properties:
sanitising a sanitised text returns it unchanged, and the result is never
longer than the input. ``split_virtual_path`` must give back the path it
was given when joined, and ``validate_component`` its input.

Inputs come from a seeded ``random.Random``: fragments of OpenClaw's
envelope (real markers and headers), path pieces, durations, ids, TOML,
Unicode that names refuse (controls, bidi, zero-width, surrogates,
unassigned, non-NFC), long runs of one character, and mutations of earlier
inputs. Each input goes through every callable; ``--jobs`` worker processes
share the inputs (each with its own seed derived from ``--seed``).

The callables are the ``specs`` of ``_targets()``: a name and how to build
its ``Target`` (the function on one ``str``, the exceptions it may raise,
how to call it in a reproducer, an optional check of its result). Add a
parser by adding an entry there.

    .venv/bin/python bench/fuzz_inputs.py [--inputs 1000000] [--seed 16] [--jobs 2] [--json]
    .venv/bin/python bench/fuzz_inputs.py --inputs 20000 --no-linearity     # a quick look
    .venv/bin/python bench/fuzz_inputs.py --from-json run.json             # re-print a saved run

Results and their analysis: ``RESULTS.md``, "Fuzzing the sanitiser and the
parsers (issue 16)".
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import multiprocessing
import os
import platform
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scopefs.catalog.errors import BadInput, StorageError

KIB = 1024
SIZES = (KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB)


# --- the callables -----------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One parser under fuzz: ``call`` takes the input text; ``expected`` are the refusals it may raise.

    ``repro`` is Python source that calls it on ``{text!r}`` (after ``setup``), for crash reports.
    ``check`` (optional) returns a problem with a successful result, or None.
    """

    call: Callable[[str], object]
    expected: tuple[type[BaseException], ...]
    repro: str
    setup: str = ""
    check: Callable[[str, object], str | None] | None = None


def _sanitiser_check(text: str, result: object) -> str | None:
    from scopefs.catalog.envelope import sanitise_capture

    assert isinstance(result, str)
    if len(result) > len(text):
        return "output longer than input"
    try:
        again = sanitise_capture(result)
    except BadInput as exc:
        return f"sanitised text refused when sanitised again ({type(exc).__name__})"
    return None if again == result else "not idempotent: sanitising the output changed it"


def _path_check(text: str, result: object) -> str | None:
    return None if isinstance(result, tuple) and "/".join(result) == text else "parts do not join back to the path"


def _same_check(text: str, result: object) -> str | None:
    return None if result == text else "returned something other than its input"


def _as_bytes(text: str) -> bytes:
    """The input's UTF-8, lone surrogates kept as their (invalid) 3-byte forms: non-UTF-8 bytes to refuse."""
    return text.encode("utf-8", "surrogatepass")


def _target(module: str, attr: str, expected: tuple[type[BaseException], ...], *, call: str = "{f}({text!r})",
            adapt: Callable[[Any, str], object] | None = None,
            check: Callable[[str, object], str | None] | None = None) -> Target:
    """A Target for ``module.attr``: called on the text, or through ``adapt(function, text)``.

    ``call`` spells the same call for a reproducer (``{f}`` is the function, ``{text!r}`` the input).
    """
    function = getattr(importlib.import_module(module), attr)
    run: Callable[[str], object] = function if adapt is None else (lambda text: adapt(function, text))
    return Target(run, expected, call.replace("{f}", attr), f"from {module} import {attr}", check)


def _targets() -> dict[str, Target]:
    """Every parser of untrusted names, paths and text in the tree, keyed by a short name.

    A module that fails to import (another engineer's work in progress) is
    left out and listed in ``skipped``, so the benchmark runs on any tree.
    Add a parser here; it is fuzzed and timed like the others.
    """
    utf8 = "{text!r}.encode('utf-8', 'surrogatepass')"
    specs: dict[str, Callable[[], Target]] = {
        "envelope.sanitise_capture": lambda: _target(
            "scopefs.catalog.envelope", "sanitise_capture", (BadInput,), check=_sanitiser_check),
        "envelope.sanitise_capture_bytes": lambda: _target(
            "scopefs.catalog.envelope", "sanitise_capture_bytes", (BadInput,), call=f"{{f}}({utf8})",
            adapt=lambda f, text: f(_as_bytes(text))),
        "paths.split_virtual_path": lambda: _target(
            "scopefs.catalog.paths", "split_virtual_path", (BadInput,), check=_path_check),
        "paths.validate_component": lambda: _target(
            "scopefs.catalog.paths", "validate_component", (BadInput,), check=_same_check),
        "paths.check_parts": lambda: _target(
            "scopefs.catalog.paths", "check_parts", (BadInput,), call="{f}(tuple({text!r}.split('/')))",
            adapt=lambda f, text: f(tuple(text.split("/")))),
        "vfs.names.decode": lambda: _target(
            "scopefs.vfs.names", "decode", (importlib.import_module("scopefs.vfs.names").BadName,),
            call=f"{{f}}({utf8})", adapt=lambda f, text: f(_as_bytes(text))),
        "vfs.names.confusable": lambda: _target(
            "scopefs.vfs.names", "confusable", (), call="{f}({text!r}, ('note.md', {text!r}.upper()))",
            adapt=lambda f, text: f(text, ("note.md", text.upper()))),
        "home.validate_agent_name": lambda: _target(
            "scopefs.catalog.home", "validate_agent_name", (BadInput,), check=_same_check),
        "home.validate_pool_name": lambda: _target(
            "scopefs.catalog.home", "validate_pool_name", (BadInput,), check=_same_check),
        "durations.parse_duration_us": lambda: _target("scopefs.catalog.durations", "parse_duration_us", (BadInput,)),
        "ids.looks_like": lambda: _target(
            "scopefs.catalog.ids", "looks_like", (), call="{f}('session', {text!r})",
            adapt=lambda f, text: f("session", text)),
        "sharing.check_grant_id": lambda: _target("scopefs.catalog.sharing", "check_grant_id", (BadInput,)),
        "sharing.parse_audience": _audience_target,
        "exposures.check_run_id": lambda: _target("scopefs.catalog.exposures", "check_run_id", (BadInput,)),
        "search.check_query": lambda: _target(
            "scopefs.catalog.search", "check_query", (BadInput,), call="{f}({text!r}, 10)",
            adapt=lambda f, text: f(text, 10)),
        "projections.check_purpose": lambda: _target("scopefs.writer.projections", "check_purpose", (BadInput,)),
        "artifacts.check_path_key": lambda: _target("scopefs.catalog.artifacts", "check_path_key", (StorageError,)),
        "artifacts.check_locator": lambda: _target("scopefs.catalog.artifacts", "check_locator", (StorageError,)),
        "pools.parse": lambda: _target(
            "scopefs.catalog.pools", "parse", (BadInput,), call=f"{{f}}({utf8}, {{{{'main', 'ops'}}}})",
            adapt=lambda f, text: f(_as_bytes(text), {"main", "ops"})),
        "claims.units": lambda: _target(
            "scopefs.catalog.claims", "units", (), call=f"{{f}}({utf8})", adapt=lambda f, text: f(_as_bytes(text))),
        "validity.read_validity": lambda: _target(
            "scopefs.catalog.validity", "read_validity", (BadInput,), call=f"{{f}}({utf8})",
            adapt=lambda f, text: f(_as_bytes(text))),
        "validity.parse_until": lambda: _target(
            "scopefs.catalog.validity", "parse_until", (BadInput,), call="{f}({text!r}, 1_800_000_000_000_000)",
            adapt=lambda f, text: f(text, 1_800_000_000_000_000)),
        "humanblock.keep_human_block": lambda: _target(
            "scopefs.catalog.humanblock", "keep_human_block", (BadInput,),
            call=f"{{f}}({utf8}, {utf8}[::-1])", adapt=lambda f, text: f(_as_bytes(text), _as_bytes(text)[::-1])),
        "delegation.parse_caps": lambda: _target(
            "scopefs.catalog.delegation", "parse_caps", (BadInput,), call="{f}([{text!r}])",
            adapt=lambda f, text: f([text])),
        "api.mounting.parse_policy": lambda: _target(
            "scopefs.api.mounting", "parse_policy", (BadInput,), call="{f}('/tmp', {text!r})",
            adapt=lambda f, text: f(tempfile.gettempdir(), text)),
    }
    targets: dict[str, Target] = {}
    skipped.clear()
    for name, build in specs.items():
        try:
            targets[name] = build()
        except Exception as exc:  # noqa: BLE001 - an unimportable module is reported, not fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
    return targets


skipped: dict[str, str] = {}


def _audience_target() -> Target:
    import apsw

    from scopefs.catalog.schema import ensure_schema
    from scopefs.catalog.schema.state import STATE_SCHEMA
    from scopefs.catalog.sharing import parse_audience

    state = apsw.Connection(":memory:")
    ensure_schema(state, STATE_SCHEMA)
    setup = ("import apsw; from scopefs.catalog.schema import ensure_schema;"
             " from scopefs.catalog.schema.state import STATE_SCHEMA;"
             " from scopefs.catalog.sharing import parse_audience;"
             " state = apsw.Connection(':memory:'); ensure_schema(state, STATE_SCHEMA)")
    return Target(lambda text: parse_audience(state, "a_main", text), (BadInput,),
                  "parse_audience(state, 'a_main', {text!r})", setup)


# --- the inputs ---------------------------------------------------------------------

CTX = "\u27e6openclaw:ctx\u27e7"
ENVELOPE = [
    CTX, "[Chat messages since your last reply - for context]", "[Recent chat messages - for context]",
    "[Current message - respond to this]", "[CURRENT MESSAGE \u2014 reply to this]",
    "[Merged earlier messages \u2014 CONTEXT ONLY]", "Current message:", "[Replying to: ", '[Replying to: "q"]',
    "[media attached: ", "[media attached 1/2: /tmp/a.jpg (image/jpeg)]", "[media attached: 2 files]",
    "Conversation info: " + CTX, "Context: " + CTX, "Context:", "```json", "```", "#4711:", "#12 Dana: ",
    "#897 2026-01-05T16:24:34Z Hana: ", " ->#897", " [reply target]", "[WhatsApp +1555 +1m Mon 2026-01-05T16:26:34Z] ",
    "[WhatsApp Family id:123@g.us Mon 2026-01-05 08:26:34 PST] Alice (+447700900123): ", "[Slack #general] Bob: ",
    "[Telegram Carol] ", "(self): ", "(sender): ", "[Mon 2026-01-05 14:30 UTC] ", "[10:42] ", "[[reply_to_current]]",
    "[[reply_to:42]]", "<active_memory_plugin>", "</active_memory_plugin>", "<relevant-memories>",
    "</relevant-memories>", "Delivery: to send a message, use the `message` tool.", "Active goal: ", " +5m",
    " just now", '{"chat_id": "1", ', '"sender_id": "2"', "Note: ", "TODO: ",
]
PATHS = ["/", "//", ".", "..", "private", "agent-shared", "projections", "notes", "x.md", "a", "**", "*", "?",
         "private/notes/x.md", "../", "./", "~", "\\", "C:", "%2e%2e", "\u2215", "\u2044", "\uff0e\uff0e", "\u3002"]
WORDS = ["30s", "15m", "12h", "7d", "0s", "3650d", "3651d", "9999999999d", "1e3s", "-5m", " 5m", "main", "ops",
         "pool-1", "own", "none", "s_" + "a" * 26, "pe_" + "b" * 26, "p_" + "c" * 26, "a" * 26, "role:",
         "conversation:", "agent-shared", "1000-1001", "0-1", "1-2147483648", "run.1:a-b", "remember", "caf\u00e9"]
TOML = ["[pools.shared]\n", "owner = \"main\"\n", "readers = [\"*\"]\n", "writers = [\"ops\"]\n", "[agents.main]\n",
        "[agents.ops]\n", "capture = \"own\"\n", "capture = \"shared\"\n", "recall = [\"own\", \"shared\"]\n", "a = [",
        "[[", "{ x = 1 }", "\"\"\"", "'''", "= ", "# c\n", "1979-05-27T07:32:00Z", "inf", "nan", "0x1f", "\\u0000"]
ODD = ["\x00", "\x01", "\x1b[2J", "\x7f", "\x85", "\xa0", "\u00ad", "\u200b", "\u200d", "\u200e", "\u202e", "\u2066",
       "\u2028", "\u2029", "\ufeff", "\ufffd", "\ud800", "\udfff", "\U0010ffff", "\ue000", "\u0378", "e\u0301",
       "\u00e9", "\u0130", "\u00df", "\ufb01", "\u043e", "\u0456", "\u0391", "\U0001f600", "\U0001f44d\U0001f3fd",
       "\u0915\u094d\u0937", "\u05d0", "\u0627\u0644", "\u4e2d\u6587", "\t", "\r", "\n", "\r\n", " ", "\u3000"]
BRACKETS = ["[", "]", "[[", "]]", "(", ")", "{", "}", "<", ">", ":", ": ", "#", "@", "+", "-", "_", "\"", "'", "`"]
GROUPS = [(ENVELOPE, 4), (PATHS, 3), (WORDS, 2), (TOML, 1), (ODD, 3), (BRACKETS, 3)]
RUN_UNITS = ["[", "]", "#", ":", " ", "\n", "a", "/", ".", "\u27e6", "[Replying to: ", "#1 a:", "[10:42] ",
             "[Slack #g +5m] ", "e\u0301", "\u200b", "9", "=", "\"", "\\", CTX + "\n"]


class Inputs:
    """A seeded stream of adversarial strings (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool: list[str] = [*ENVELOPE, *PATHS, *WORDS]
        self.weights = [w for _, w in GROUPS]

    def fragment(self) -> str:
        group = self.rng.choices(GROUPS, self.weights)[0][0]
        return self.rng.choice(group)

    def unicode_text(self) -> str:
        rng = self.rng
        out = []
        for _ in range(rng.randint(0, 40)):
            kind = rng.random()
            if kind < 0.5:
                out.append(chr(rng.randint(0x20, 0x7E)))
            elif kind < 0.7:
                out.append(chr(rng.randint(0x80, 0x2FF)))
            elif kind < 0.9:
                out.append(chr(rng.randint(0x300, 0xFFFF)))  # includes surrogates, specials, unassigned
            else:
                out.append(chr(rng.randint(0x10000, 0x10FFFF)))
        return "".join(out)

    def long_run(self) -> str:
        unit = self.rng.choice(RUN_UNITS)
        count = int(2 ** self.rng.uniform(4, 11)) // max(1, len(unit) // 4)
        run = unit * count
        return self.fragment() + run + self.fragment() if self.rng.random() < 0.5 else run

    def structured(self) -> str:
        rng = self.rng
        if rng.random() < 0.6:  # a path: mostly clean components, now and then a bad one
            parts = [rng.choice(["private", "agent-shared", "channel", "roles/ops", "notes"])]
            for _ in range(rng.randint(0, 6)):
                parts.append(rng.choice([rng.choice(WORDS), self.fragment(), self.unicode_text()[:12], "x.md"]))
            return "/".join(parts)
        lines = [rng.choice(TOML) for _ in range(rng.randint(1, 12))]
        return "".join(lines)

    def mutate(self, text: str) -> str:
        rng = self.rng
        for _ in range(rng.randint(1, 4)):
            at = rng.randint(0, len(text))
            choice = rng.random()
            if choice < 0.35:
                text = text[:at] + self.fragment() + text[at:]
            elif choice < 0.55 and text:
                end = min(len(text), at + rng.randint(1, 16))
                text = text[:at] + text[end:]
            elif choice < 0.7 and text:
                end = min(len(text), at + rng.randint(1, 32))
                text = text[:at] + text[at:end] * rng.randint(2, 8) + text[end:]
            elif choice < 0.85 and text:
                i = rng.randrange(len(text))
                text = text[:i] + chr(rng.choice([0, 10, 13, 32, 35, 47, 58, 91, 93, 0x27E6, 0x2028, 0xD800,
                                                   rng.randint(0, 0x10FFFF)])) + text[i + 1:]
            else:
                text = text.upper() if rng.random() < 0.5 else text.swapcase()
        return text[:20000]

    def next(self) -> str:
        rng = self.rng
        mode = rng.random()
        if mode < 0.4:
            text = "".join(self.fragment() for _ in range(rng.randint(1, 12)))
        elif mode < 0.55:
            text = self.unicode_text()
        elif mode < 0.6:
            text = self.long_run()
        elif mode < 0.7:
            text = self.structured()
        else:
            text = self.mutate(rng.choice(self.pool))
        if len(text) < 400 and rng.random() < 0.05:
            self.pool[rng.randrange(len(self.pool))] = text  # keep some inputs around to mutate further
        return text


# --- fuzzing --------------------------------------------------------------------------

MAX_EXAMPLES = 5  # failures kept per callable and kind


@dataclass
class Tally:
    calls: int = 0
    refused: int = 0
    seconds: float = 0.0
    crashes: int = 0
    violations: int = 0
    examples: list[dict[str, str]] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        self.calls += other.calls
        self.refused += other.refused
        self.seconds += other.seconds
        self.crashes += other.crashes
        self.violations += other.violations
        for example in other.examples:
            if len(self.examples) < MAX_EXAMPLES and all(e["signature"] != example["signature"]
                                                         for e in self.examples):
                self.examples.append(example)


def _run_one(target: Target, text: str) -> tuple[str, str] | None:
    """None when ``target`` behaved; else (kind, description). Refusals are behaviour."""
    try:
        result = target.call(text)
    except target.expected:
        return None
    except Exception as exc:  # noqa: BLE001 - any other exception is the finding
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return "crash", f"{type(exc).__name__} at {where.filename}:{where.lineno}: {str(exc)[:200]}"
    if target.check is not None:
        problem = target.check(text, result)
        if problem is not None:
            return "violation", problem
    return None


def _fuzz_worker(args: tuple[int, int]) -> tuple[dict[str, dict[str, Any]], int]:
    seed, count = args
    targets = _targets()
    tallies = {name: Tally() for name in targets}
    inputs = Inputs(seed)
    clock = time.perf_counter
    for _ in range(count):
        text = inputs.next()
        for name, target in targets.items():
            tally = tallies[name]
            started = clock()
            try:
                outcome = _run_one(target, text)
            finally:
                tally.seconds += clock() - started
            tally.calls += 1
            if outcome is None:
                continue
            kind, what = outcome
            if kind == "crash":
                tally.crashes += 1
            else:
                tally.violations += 1
            signature = f"{kind}: {what.split(': ', 1)[0]}"  # the exception and where, or the broken property
            if len(tally.examples) < MAX_EXAMPLES and all(e["signature"] != signature for e in tally.examples):
                tally.examples.append({"kind": kind, "signature": signature, "what": what, "input": text})
    return {name: dataclasses.asdict(t) for name, t in tallies.items()}, count


def _refused_count(target: Target, texts: list[str]) -> int:
    refused = 0
    for text in texts:
        try:
            target.call(text)
        except target.expected:
            refused += 1
        except Exception:  # noqa: BLE001 - counted as a crash by the fuzz itself
            pass
    return refused


def shrink(target: Target, text: str, kind: str, what: str, budget: int = 3000) -> str:
    """A shorter input that fails the same way (same kind, same exception type), by deleting chunks."""
    key = what.split(": ", 1)[0]

    def fails(candidate: str) -> bool:
        outcome = _run_one(target, candidate)
        return outcome is not None and outcome[0] == kind and outcome[1].split(": ", 1)[0] == key

    chunk = max(1, len(text) // 2)
    while chunk >= 1 and budget > 0:
        i = 0
        changed = False
        while i < len(text) and budget > 0:
            candidate = text[:i] + text[i + chunk:]
            budget -= 1
            if fails(candidate):
                text = candidate
                changed = True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return text


def reproducer(target: Target, text: str) -> str:
    call = target.repro.format(text=text)
    return f"{target.setup}; {call}" if target.setup else call


def fuzz(total: int, seed: int, jobs: int) -> tuple[dict[str, Tally], float]:
    shares = [total // jobs + (1 if i < total % jobs else 0) for i in range(jobs)]
    started = time.perf_counter()
    work = [(seed * 1000 + i, share) for i, share in enumerate(shares) if share]
    if jobs == 1:
        results = [_fuzz_worker(work[0])]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_fuzz_worker, work)
    elapsed = time.perf_counter() - started
    merged: dict[str, Tally] = {}
    for tallies, _count in results:
        for name, raw in tallies.items():
            merged.setdefault(name, Tally()).merge(Tally(**raw))
    return merged, elapsed


def refusal_rates(seed: int, sample: int = 20000) -> dict[str, float]:
    """Share of inputs each callable refuses, on a sample of the same stream (not counted in the totals)."""
    inputs = Inputs(seed * 1000)
    texts = [inputs.next() for _ in range(sample)]
    return {name: _refused_count(target, texts) / sample for name, target in _targets().items()}


# --- linearity ------------------------------------------------------------------------

def _fill(unit: str, size: int) -> str:
    """``unit`` repeated to at most ``size`` UTF-8 bytes."""
    per = len(unit.encode("utf-8", "surrogatepass"))
    text = unit * (size // per)
    return text


FAMILIES: dict[str, Callable[[int], str]] = {
    "'[' * n": lambda n: _fill("[", n),
    "'[Replying to: ' * n": lambda n: _fill("[Replying to: ", n),
    "'#1 a:' * n": lambda n: _fill("#1 a:", n),
    "'#1 a: ' * n": lambda n: _fill("#1 a: ", n),
    "one long line 'a' * n": lambda n: _fill("a", n),
    "'\\n' * n": lambda n: _fill("\n", n),
    "'a\\n' * n": lambda n: _fill("a\n", n),
    "stacked '[10:42] '": lambda n: _fill("[10:42] ", n),
    "stacked '[Slack #g +5m] '": lambda n: _fill("[Slack #g +5m] ", n),
    "'[Replying to: a +1s] ' * n": lambda n: _fill("[Replying to: a +1s] ", n),
    "'[Replying to: a +1s] ' * n + 'x'": lambda n: _fill("[Replying to: a +1s] ", n - 1) + "x",
    "500-char headers, no ']'": lambda n: _fill("[" + "a" * 498 + " ", n),
    "500-char known-channel headers": lambda n: _fill("[Telegram " + "b" * 480 + "] b: c\n", n),
    "chat lines '#1 ' + 99 chars": lambda n: _fill("#1 " + "a" * 99 + "\n", n),
    "marker lines": lambda n: _fill(CTX + "\n", n),
    "history marker, no current": lambda n: _fill("[Chat messages since your last reply - for context]\nx\n", n),
    "ctx header + unclosed json fence": lambda n: _fill("x " + CTX + "\n```json\n", n),
    "unclosed injected tags": lambda n: _fill("<relevant-memories>\n", n),
    "'{\"chat_id\":' * n": lambda n: _fill('{"chat_id":', n),
    "spaces then a prefix": lambda n: _fill(" ", n - 16) + "[10:42] x",
    "'/' * n": lambda n: _fill("/", n),
    "'a/' * n": lambda n: _fill("a/", n),
    "'e\\u0301' * n (not NFC)": lambda n: _fill("e\u0301", n),
    "'\\u200b' * n": lambda n: _fill("\u200b", n),
    "'9' * n": lambda n: _fill("9", n),
    "TOML nested '[' * n": lambda n: "a = " + _fill("[", n - 4),
    "TOML many tables": lambda n: _fill("[pools.p]\nowner = \"main\"\n", n),
}


def _time_call(target: Target, text: str, min_seconds: float = 0.02) -> float:
    """Seconds per call: the best of three runs of enough calls to take ``min_seconds``."""
    def once(reps: int) -> float:
        started = time.perf_counter()
        for _ in range(reps):
            try:
                target.call(text)
            except Exception:  # noqa: BLE001 - crashes are the fuzz's business; here only time counts
                pass
        return time.perf_counter() - started

    reps = 1
    took = once(reps)
    while took < min_seconds and reps < 1 << 16:
        reps *= max(2, min(16, int(min_seconds / max(took, 1e-6)) + 1))
        took = once(reps)
    return min(took, once(reps), once(reps)) / reps


def linearity(targets: dict[str, Target], max_growth: float) -> dict[str, Any]:
    """ns per byte for each callable, family and size; the worst family per callable and its growth."""
    report: dict[str, Any] = {}
    for name, target in targets.items():
        families: dict[str, list[float]] = {}
        for family, make in FAMILIES.items():
            row = []
            for size in SIZES:
                text = make(size)
                nbytes = max(1, len(text.encode("utf-8", "surrogatepass")))
                row.append(_time_call(target, text) / nbytes * 1e9)
            families[family] = row
        worst = max(families, key=lambda f: families[f][-1] / families[f][0])
        growth = families[worst][-1] / families[worst][0]
        # Growth over the upper sizes alone: a quadratic cost shows there too (16x from 64 KiB to 1 MiB),
        # a one-time step at some size does not.
        upper = families[worst][-1] / families[worst][SIZES.index(64 * KIB)]
        report[name] = {"families": families, "worst": worst, "growth": growth, "upper_growth": upper,
                        "flagged": growth > max_growth}
        print(f"  timed {name}: worst {worst!r} x{growth:.2f}", file=sys.stderr, flush=True)
    return report


# --- report ---------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000,
                        help="generated inputs, each run through every callable")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-growth", type=float, default=4.0, help="flag a per-byte time growing more than this")
    parser.add_argument("--no-linearity", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--from-json", metavar="FILE", help="print the report of a saved --json run")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as saved:
            print_report(json.load(saved))
        return 0

    targets = _targets()
    print(f"fuzzing {len(targets)} callables with {args.inputs} inputs each ({args.jobs} processes)",
          file=sys.stderr, flush=True)
    tallies, elapsed = fuzz(args.inputs, args.seed, args.jobs)
    rates = refusal_rates(args.seed)
    shrunk: dict[str, list[dict[str, str]]] = {}
    for name, tally in tallies.items():
        for example in tally.examples:
            small = shrink(targets[name], example["input"], example["kind"], example["what"])
            shrunk.setdefault(name, []).append({**example, "input": small, "input_chars": str(len(example["input"])),
                                                "reproducer": reproducer(targets[name], small)})
    lin = {} if args.no_linearity else linearity(targets, args.max_growth)

    result = {
        "command": " ".join(["bench/fuzz_inputs.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "inputs": args.inputs, "seed": args.seed, "jobs": args.jobs, "fuzz_seconds": elapsed,
        "calls": sum(t.calls for t in tallies.values()),
        "skipped": dict(skipped),
        "targets": {name: {"calls": t.calls, "refused_share": rates.get(name), "crashes": t.crashes,
                           "violations": t.violations, "us_per_call": t.seconds / max(1, t.calls) * 1e6,
                           "failures": shrunk.get(name, [])} for name, t in tallies.items()},
        "linearity": lin, "max_growth": args.max_growth, "sizes": list(SIZES),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    bad = any(t["crashes"] or t["violations"] for t in result["targets"].values()) or \
        any(v["flagged"] for v in lin.values())
    return 1 if bad else 0


def print_report(result: dict[str, Any]) -> None:
    print(f"{result['inputs']:,} inputs x {len(result['targets'])} callables = {result['calls']:,} calls"
          f" in {result['fuzz_seconds']:.0f} s ({result['jobs']} processes, seed {result['seed']})")
    for name, why in result["skipped"].items():
        print(f"skipped {name}: {why}")
    print()
    print("| callable | calls | refused | crashes | violations | µs/call |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, t in result["targets"].items():
        refused = "" if t["refused_share"] is None else f"{t['refused_share']:.0%}"
        print(f"| {name} | {t['calls']:,} | {refused} | {t['crashes']} | {t['violations']} | {t['us_per_call']:.1f} |")
    for name, t in result["targets"].items():
        for failure in t["failures"]:
            print(f"\n{failure['kind'].upper()} in {name}: {failure['what']}")
            print(f"  reproducer (shrunk from {failure['input_chars']} characters):")
            print(f"  .venv/bin/python -c {json.dumps(failure['reproducer'])}")
    if result["linearity"]:
        sizes = " | ".join(f"{s // KIB} KiB" for s in result["sizes"])
        print(f"\nns per byte on the worst adversarial family of each callable (flagged if it grows"
              f" more than {result['max_growth']:g}x from {result['sizes'][0] // KIB} KiB to"
              f" {result['sizes'][-1] // KIB} KiB)\n")
        print(f"| callable | worst family | {sizes} | growth | 64 KiB to 1 MiB | |")
        print("|---|---|" + "---:|" * len(result["sizes"]) + "---:|---:|---|")
        for name, v in result["linearity"].items():
            row = " | ".join(f"{x:.1f}" for x in v["families"][v["worst"]])
            print(f"| {name} | `{v['worst']}` | {row} | {v['growth']:.2f}x | {v['upper_growth']:.2f}x"
                  f" | {'FLAGGED' if v['flagged'] else 'ok'} |")


if __name__ == "__main__":
    sys.exit(main())
