"""The capture sanitiser (issue 16, point 7): OpenClaw's envelope comes off, the words stay.

Why: every capture path hands ``catalog.envelope.sanitise_capture`` text
that arrived inside OpenClaw's scaffolding. If a kind of scaffolding
survives, other participants' messages and metadata become memory in a
store whose audience never agreed to hold them; if real words are cut,
a person's note is silently changed. So each kind is checked both ways:
stripped, with the content around it kept byte for byte.

The envelope examples are verbatim output of OpenClaw 2026.9.6's own
formatters (``formatInboundEnvelope``, ``buildHistoryContext``,
``buildInboundMediaNoteProjection``, ``buildInboundUserContextPrefix``
and its Telegram joiner), run once under Node and pasted here, so the
tests need no Node and cannot drift with a reinstall.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scopefs.catalog import envelope
from scopefs.catalog.envelope import (
    CONTEXT_MARKER,
    CURRENT_MARKERS,
    DELIVERY_HINTS,
    HISTORY_MARKERS,
    INJECTED_BLOCK_TAGS,
    MAX_CAPTURE_BYTES,
    PATTERN_SPAN,
    MostlyWrapper,
    sanitise_capture,
    sanitise_capture_bytes,
)
from scopefs.catalog.errors import BadInput, TooLarge

CTX = CONTEXT_MARKER

# --- OpenClaw 2026.9.6's own output ----------------------------------------
DIRECT = "[WhatsApp +1555 +1m Mon 2026-01-05T16:26:34Z] +1555: I am vegan, remember that"
GROUP = "[WhatsApp Family id:123@g.us Mon 2026-01-05 08:26:34 PST] Alice (+447700900123): Dinner is at 7"
SLACK = "[Slack #general] Bob: ship it on friday"
SELF = "[Telegram Carol Mon 2026-01-05T16:26:34Z] (self): note to self: buy milk"
HISTORY = ("[Chat messages since your last reply - for context]\n" + GROUP + "\n" + SLACK + "\n\n"
           "[Current message - respond to this]\n" + DIRECT)
MEDIA_ONE = '[media attached: /tmp/x/photo.jpg (image/jpeg) "photo.jpg"]'
MEDIA_MANY = ('[media attached: 2 files]\n[media attached 1/2: /tmp/x/a.jpg (image/jpeg)]\n'
              '[media attached 2/2: /tmp/x/b.pdf (application/pdf) "b.pdf"]')
TELEGRAM_PREFIX = (
    f"Conversation info: {CTX}\n```json\n"
    '{"chat_id":"-100123","message_id":"4711","reply_to_id":"4700","conversation_label":"Climbing club",'
    '"sender":{"id":"99","name":"Erin"},"timestamp":"Mon 2026-01-05T16:26:34Z","group_subject":"Climbing club",'
    '"is_group_chat":true,"history_count":2}\n```\n\n'
    f"Chat history since last reply: {CTX}\n"
    "#4700 2026-01-05T16:25:34Z Dan: are you coming on Friday?\n"
    "#4705 2026-01-05T16:26:04Z Finn: I am\n\n"
    "Current message:\n"
    '[Replying to: "are you coming on Friday?"]\n'
    "#4711:")
WINDOW_PREFIX = (
    f"Conversation info: {CTX}\n```json\n"
    '{"message_id":"900","sender":{"name":"Gus"},"timestamp":"Mon 2026-01-05T16:26:34Z","is_group_chat":true}\n'
    "```\n\n"
    f"Chat window (chronological, before current message): {CTX}\n"
    "#897 2026-01-05T16:24:34Z Hana: my address is 12 Elm St\n"
    "#898 2026-01-05T16:25:34Z ->#897 Ivan: thanks")


def _lines(text: str) -> list[str]:
    return text.split("\n")


@pytest.mark.parametrize(("wrapped", "kept"), [
    pytest.param(DIRECT, "I am vegan, remember that", id="direct envelope and its sender label"),
    pytest.param(GROUP, "Dinner is at 7", id="group envelope, sender with a phone number"),
    pytest.param(SLACK, "ship it on friday", id="channel envelope without a timestamp"),
    pytest.param(SELF, "note to self: buy milk", id="(self) label; the body's own colon stays"),
    pytest.param(HISTORY, "I am vegan, remember that", id="history window up to the current-message marker"),
    pytest.param(TELEGRAM_PREFIX + " I'll be there at 6, bring the rope", "I'll be there at 6, bring the rope",
                 id="context json, chat history, Current message:, reply quote, #id:"),
    pytest.param(WINDOW_PREFIX + "\n\n[Discord Gus +1m Mon 2026-01-05T16:26:34Z] Gus: I climb on Fridays",
                 "I climb on Fridays", id="chat window block, then the current envelope"),
    pytest.param(MEDIA_MANY + "\nhere are the slides for Monday", "here are the slides for Monday",
                 id="media notes"),
    pytest.param("[Mon 2026-01-05 14:30 UTC] my passport expires in June", "my passport expires in June",
                 id="injected timestamp"),
    pytest.param("[2026-01-05T14:30:00Z] [10:42] dentist moved to Tuesday", "dentist moved to Tuesday",
                 id="stacked bracketed timestamps"),
    pytest.param("[Replying to: \"who has the key?\"]\nthe spare key is under the mat",
                 "the spare key is under the mat", id="reply quote line"),
    pytest.param("Current message:\n[Replying to: \"when?\"]\n#812 Dana: Thursday at noon", "Thursday at noon",
                 id="#id sender prefix after wrapper lines"),
    pytest.param("keep this line\n\nContext: " + CTX + "\n```json\n{\"chat_id\": \"1\"}\n```\nmore metadata",
                 "keep this line", id="trailing channel context ends the text"),
    pytest.param("Context:\n<active_memory_plugin>\nAlice likes tea\n</active_memory_plugin>\n\nI prefer coffee",
                 "I prefer coffee", id="injected active memory"),
    pytest.param("<relevant-memories>\n- [fact] Bob's PIN is 1234\n</relevant-memories>\nI moved to Leeds",
                 "I moved to Leeds", id="injected recalled memories"),
    pytest.param(DELIVERY_HINTS[0] + "\nthe wifi password changed", "the wifi password changed",
                 id="message-tool delivery hint"),
    pytest.param("[[reply_to_current]] I'll remember the 9am standup", "I'll remember the 9am standup",
                 id="reply directive"),
    pytest.param("[CURRENT MESSAGE \u2014 reply to this]\nbook the table", "book the table",
                 id="current-message marker variant"),
    pytest.param("Active goal: ship v2" + envelope.ACTIVE_GOAL_SUFFIX + "\nthe launch moved to May",
                 "the launch moved to May", id="restated session goal"),
])
def test_each_kind_of_scaffolding_is_stripped(wrapped: str, kept: str) -> None:
    """A kind left in place would be stored as memory; a changed word would corrupt the note."""
    assert sanitise_capture(wrapped) == kept
    assert sanitise_capture(wrapped + "\n") == kept + "\n"


def test_content_around_scaffolding_survives_byte_for_byte() -> None:
    """Lines between wrappers keep every byte but trailing whitespace, indentation and odd characters included."""
    content = ["  indented: a [bracket] and a #3 tag", "caf\u00e9 \u2014 \U0001f600 \u202e\u200b zero-width",
               "\tcode = arr[0] + d['k']"]
    text = "\n".join([MEDIA_ONE, content[0], "[Replying to: \"x\"]", content[1] + "   ", DELIVERY_HINTS[1],
                      content[2], "[Mon 2026-01-05 14:30 UTC] "])
    assert _lines(sanitise_capture(text)) == content


@pytest.mark.parametrize("text", [
    "[TODO] buy milk",
    "- [ ] call mum\n- [x] pay rent",
    "see [the docs](https://example.org) and arr[0]",
    "[Signal Hill] is a nice place for a walk",
    "[1]: https://example.org/ref",
    "#1 priority: fix the roof",
    "Note: the meeting is at 5",
    "[Replying to: Bob] sure, Thursday works for me, [link] here ok",  # not a whole-line quote
    "I wrote [Chat messages since your last reply] in my notes",  # not OpenClaw's marker
    "```json\n{\"sender\": \"me\", \"text\": \"hi\"}\n```",
])
def test_content_that_merely_mentions_brackets_is_kept(text: str) -> None:
    """Brackets, hashes and colons are ordinary writing; only OpenClaw's exact shapes are scaffolding."""
    assert sanitise_capture(text) == text


@pytest.mark.parametrize("text", [
    "",
    "   \n\t\n",
    MEDIA_ONE,
    MEDIA_MANY,
    HISTORY.split("[Current message")[0],
    f"Conversation info: {CTX}\n```json\n{{\"chat_id\":\"1\"}}\n```",
    "[Mon 2026-01-05 14:30 UTC]",
    "[Telegram Bob Smith] hi",  # an envelope too ambiguous to strip: most of it is still header
    '{"chat_id": "-100123", "sender_id": "42", "message_id": "7"}',
    "#4711 Dana: ok",
    "\U0001f44d",
    "Current message:\n[Replying to: \"see you\"]\n#4711:",
])
def test_mostly_wrapper_is_refused(text: str) -> None:
    """Framing with no words of its own is not a memory; storing it would keep only metadata."""
    with pytest.raises(MostlyWrapper) as refused:
        sanitise_capture(text)
    assert refused.value.exit_code == 2
    assert isinstance(refused.value, BadInput)


def test_refusals_never_quote_the_text() -> None:
    """An error message lands in logs and on stderr: it must not carry another participant's words."""
    secret = "Hana's address is 12 Elm St"
    cases: list[tuple[str | bytes, type[BadInput]]] = [(f"[Telegram Zed Ygg] {secret[:2]}", MostlyWrapper),
                                                       (secret.encode() + b"\xff", BadInput),
                                                       ("x" * (MAX_CAPTURE_BYTES + 1), TooLarge)]
    for bad, expected in cases:
        with pytest.raises(expected) as refused:
            if isinstance(bad, bytes):
                sanitise_capture_bytes(bad)
            else:
                sanitise_capture(bad)
        message = str(refused.value)
        assert "Hana" not in message and "Zed" not in message and "xxxx" not in message
        assert message.startswith("capture refused:")


def test_input_is_bounded() -> None:
    """One capture cannot make the broker scan unbounded text; over the bound is refused, not truncated."""
    at_limit = "a" * (MAX_CAPTURE_BYTES - 1) + "\n"
    assert sanitise_capture(at_limit) == at_limit
    with pytest.raises(TooLarge):
        sanitise_capture("\u00e9" * (MAX_CAPTURE_BYTES // 2 + 1))  # under the limit in characters, over in bytes
    with pytest.raises(TooLarge):
        sanitise_capture_bytes(b"a" * (MAX_CAPTURE_BYTES + 1))


def test_bytes_entry_point() -> None:
    """The writer sanitises staged bytes: the same result, UTF-8 in and out, and non-UTF-8 refused."""
    assert sanitise_capture_bytes(DIRECT.encode() + b"\n") == b"I am vegan, remember that\n"
    with pytest.raises(BadInput):
        sanitise_capture_bytes(b"\xc3\x28 text")
    with pytest.raises(BadInput):
        sanitise_capture("lone \ud800 surrogate")
    with pytest.raises(BadInput):
        sanitise_capture(b"bytes to the text entry point")  # type: ignore[arg-type]
    with pytest.raises(BadInput):
        sanitise_capture_bytes("text to the bytes entry point")  # type: ignore[arg-type]


def test_long_lines() -> None:
    """A whole-line wrapper is known by its two ends, at any length; prefixes come off a line of any length."""
    assert sanitise_capture("[Replying to: " + "x" * 100_000 + "]\nok") == "ok"
    assert sanitise_capture("[Slack #g +5m] " * 10_000 + "the real text") == "the real text"
    assert sanitise_capture("x" * 100_000 + " [10:42] ") == "x" * 100_000 + " [10:42]"


def test_blank_lines_and_line_ends_are_normalised() -> None:
    """At most one blank line in a row, none at the ends, CRLF read as LF, the final newline kept."""
    assert sanitise_capture("\n\n a\r\n\r\n\r\n\nb  \n\n") == " a\n\nb\n"
    assert sanitise_capture("a\n" + MEDIA_ONE + "\n\n" + MEDIA_ONE + "\n\nb") == "a\n\nb"


def test_every_pattern_is_bounded() -> None:
    """A pattern with an unbounded quantifier could scan a whole line from each of many positions."""
    compiled = [value for value in vars(envelope).values() if isinstance(value, re.Pattern)]
    assert set(compiled) == set(envelope.PATTERNS)
    for pattern in compiled:
        _low, high = re._parser.parse(pattern.pattern).getwidth()
        assert high <= PATTERN_SPAN, pattern.pattern


# --- properties ----------------------------------------------------------------

FRAGMENTS = [
    CTX, *HISTORY_MARKERS, *CURRENT_MARKERS, *(tag for pair in INJECTED_BLOCK_TAGS for tag in pair),
    "[Replying to: ", "[media attached: ", "[media attached 1/2: ", "Current message:", "Context:", "Context: " + CTX,
    "```json", "```", "#4711:", "#12 Dana: ", "#897 2026-01-05T16:24:34Z Hana: ", " ->#897", "[reply target]",
    "[WhatsApp +1555 +1m Mon 2026-01-05T16:26:34Z] ", "[Slack #general] ", "[Telegram Carol] ", "(self): ",
    "(sender): ", "[Mon 2026-01-05 14:30 UTC] ", "[10:42] ", "[[reply_to_current]]", "[", "]", "[[", "]]", ":",
    ": ", "#", "\n", "\n\n", "\r\n", " ", "\t", "\u27e6", "\u27e7", "\u2014", "+5m", " just now", "@g.us",
    "group:", "id:-1", '{"chat_id": "1"', "Alice", "remember", "caf\u00e9", "\U0001f600", "\u2028", "\x00",
    DELIVERY_HINTS[0], "Active goal: x", envelope.ACTIVE_GOAL_SUFFIX,
]
pieces = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12),
                   st.builds(lambda ch, n: ch * n, st.sampled_from(["[", "#", " ", "a", ":", "]"]),
                             st.integers(1, 40)))
texts = st.lists(pieces, max_size=30).map("".join)
PROPS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LEFTOVERS = (CTX, *HISTORY_MARKERS, *CURRENT_MARKERS, *(tag for pair in INJECTED_BLOCK_TAGS for tag in pair))


def _sanitised(text: str) -> str | None:
    try:
        return sanitise_capture(text)
    except BadInput:
        return None


@PROPS
@given(texts)
def test_only_bad_input_is_raised(text: str) -> None:
    """Anything else would be a crash on adversary-influenced text (exit code 1 instead of 2)."""
    _sanitised(text)


@PROPS
@given(texts)
def test_sanitising_is_idempotent(text: str) -> None:
    """A stored capture re-sanitised (a derive of a capture, a re-import) must not change again or be refused."""
    once = _sanitised(text)
    if once is not None:
        assert sanitise_capture(once) == once


@PROPS
@given(texts)
def test_output_is_never_longer(text: str) -> None:
    """The sanitiser only removes: it never adds text a person did not write."""
    once = _sanitised(text)
    if once is not None:
        assert len(once) <= len(text)
        assert len(once.encode()) <= len(text.encode("utf-8", "surrogatepass"))


@PROPS
@given(texts)
def test_output_holds_no_envelope_markers(text: str) -> None:
    """No marker, injected block or whole-line wrapper survives, wherever it sat."""
    once = _sanitised(text)
    if once is None:
        return
    assert not any(marker in once for marker in LEFTOVERS)
    for line in once.split("\n"):
        stripped = line.strip()
        assert stripped != "Current message:" and stripped not in DELIVERY_HINTS
        assert not (stripped.startswith(("[Replying to: ", "[media attached")) and stripped.endswith("]"))
        assert line == line.rstrip()


plain_words = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"),
                                             blacklist_characters="[]#:<\u27e6`{\"'"),
                      min_size=1, max_size=20)
content_lines = (st.lists(plain_words, min_size=1, max_size=6).map(" ".join)
                 .filter(lambda line: any(ch.isalnum() for ch in line)))
line_wrappers = st.sampled_from([MEDIA_ONE, '[Replying to: "q"]', "Current message:", DELIVERY_HINTS[2],
                                 "[Mon 2026-01-05 14:30 UTC]", "<relevant-memories>\n- x\n</relevant-memories>",
                                 CTX + " stray marker", ""])
prefixes = st.sampled_from(["", "[Mon 2026-01-05 14:30 UTC] ", "[WhatsApp +1555 +1m Mon 2026-01-05T16:26:34Z] +1555: ",
                            "[Slack #general] Bob: ", "[10:42] "])


@PROPS
@given(st.lists(st.tuples(line_wrappers, prefixes, content_lines), min_size=1, max_size=8))
def test_content_lines_survive_among_wrappers(parts: list[tuple[str, str, str]]) -> None:
    """Whatever scaffolding sits around them, plain lines come out whole and in order."""
    text = "\n".join(f"{wrapper}\n{prefix}{content}" for wrapper, prefix, content in parts)
    assert [line for line in _lines(sanitise_capture(text)) if line] == [content for _, _, content in parts]
