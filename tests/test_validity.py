"""``catalog.validity``: a note's own ``valid-until`` and ``superseded-by``, read the same way everywhere.

A note that says it stops being true must stop being served, so a broken
value is refused rather than read as "no expiry", and reading stays cheap
and total on any bytes (every read, listing and search result asks).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopefs.catalog.errors import BadInput
from scopefs.catalog.validity import (
    MAX_FRONT_MATTER_BYTES,
    MAX_FRONT_MATTER_LINES,
    MAX_US,
    MIN_US,
    Validity,
    format_until,
    parse_until,
    read_validity,
    with_valid_until,
)


def us(text: str) -> int:
    """Microseconds of an aware ISO datetime, computed by the standard library."""
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None
    return round(moment.timestamp() * 1_000_000)


def fm(*lines: str, body: str = "body\n") -> bytes:
    return ("---\n" + "".join(line + "\n" for line in lines) + "---\n" + body).encode()


# -- reading ---------------------------------------------------------------


def test_a_note_without_front_matter_says_nothing() -> None:
    assert read_validity(b"") == Validity(None, None)
    assert read_validity(b"# title\nvalid-until: 2000-01-01\n") == Validity()
    assert read_validity(b"\n---\nvalid-until: 2000-01-01\n---\n") == Validity()  # not at the very start
    assert read_validity(b"\xef\xbb\xbf---\nvalid-until: 2000-01-01\n---\n") == Validity()  # a BOM first
    assert read_validity(b"---\nvalid-until: 2000-01-01\nno closing fence\n") == Validity()
    assert read_validity(b"--- \nvalid-until: 2000-01-01\n---\n") == Validity()  # the fence is exact


def test_a_date_is_valid_through_that_whole_day_in_utc() -> None:
    validity = read_validity(fm("valid-until: 2025-06-30"))
    assert validity.valid_until_us == us("2025-07-01T00:00:00+00:00")
    assert not validity.expired(us("2025-06-30T23:59:59.999999+00:00"))
    assert validity.expired(us("2025-07-01T00:00:00+00:00"))


@pytest.mark.parametrize("value, expected", [
    ("2025-06-30T18:00:00Z", "2025-06-30T18:00:00+00:00"),
    ("2025-06-30T18:00Z", "2025-06-30T18:00:00+00:00"),
    ("2025-06-30 18:00:00Z", "2025-06-30T18:00:00+00:00"),
    ("2025-06-30T18:00:00+02:00", "2025-06-30T16:00:00+00:00"),
    ("2025-06-30T18:00:00-05:30", "2025-06-30T23:30:00+00:00"),
    ("2025-06-30T18:00:00.25Z", "2025-06-30T18:00:00.250000+00:00"),
    ("2025-06-30T18:00:00.123456Z", "2025-06-30T18:00:00.123456+00:00"),
    ("'2025-06-30T18:00:00Z'", "2025-06-30T18:00:00+00:00"),
    ('"2025-06-30T18:00:00Z"', "2025-06-30T18:00:00+00:00"),
    ('"2025-06-30T18:00:00Z"  # comment', "2025-06-30T18:00:00+00:00"),
    ("2025-06-30T18:00:00Z # comment", "2025-06-30T18:00:00+00:00"),
    ("  2025-06-30T18:00:00Z  ", "2025-06-30T18:00:00+00:00"),
])
def test_zoned_datetimes_and_quoted_values_are_read(value: str, expected: str) -> None:
    assert read_validity(fm("valid-until: " + value)).valid_until_us == us(expected)


def test_the_instant_itself_is_past() -> None:
    validity = Validity(valid_until_us=1_000)
    assert not validity.expired(999) and validity.expired(1_000) and validity.expired(1_001)
    assert not Validity().expired(2**62)


@pytest.mark.parametrize("value", [
    "2025-06-30T18:00:00",  # naive: refused
    "2025-06-30T18:00",
    "2025-02-30",
    "2025-13-01",
    "0000-01-01",
    "2025-6-30",
    "25-06-30",
    "20250630",
    "2025-W26-1",
    "2025-06-30T25:00:00Z",
    "2025-06-30T18:00:60Z",
    "2025-06-30T18:00:00+24:00",
    "2025-06-30T18:00:00+02:60",
    "2025-06-30T18:00:00+0200",
    "2025-06-30T18:00:00.1234567Z",
    "2025-06-30t18:00:00z",
    "٢٠٢٥-06-30",  # non-ASCII digits
    "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
    "tomorrow",
    "30d",  # durations are for the command line only
    "'2025-06-30",
    "'2025-06-30'x",
    "'it''s'",
    '"2025-06-30\\n"',
    "",
    "# only a comment",
    "''",
    "x" * 2000,
])
def test_a_malformed_valid_until_is_bad_input_naming_the_key(value: str) -> None:
    with pytest.raises(BadInput) as caught:
        read_validity(fm("valid-until: " + value))
    assert caught.value.exit_code == 2
    assert "valid-until" in str(caught.value)


def test_a_value_that_is_not_utf8_is_bad_input() -> None:
    with pytest.raises(BadInput, match="valid-until"):
        read_validity(b"---\nvalid-until: 2025-06-30\xff\n---\n")
    with pytest.raises(BadInput, match="superseded-by"):
        read_validity(b"---\nsuperseded-by: notes/\xffx.md\n---\n")


def test_superseded_by_is_a_clean_path_under_the_same_root() -> None:
    assert read_validity(fm("superseded-by: notes/new.md")) == Validity(None, "notes/new.md")
    assert read_validity(fm("superseded-by: 'new.md'")).superseded_by == "new.md"
    assert read_validity(fm("superseded-by: notes/é.md")).superseded_by == "notes/é.md"
    both = read_validity(fm("valid-until: 2025-06-30", "superseded-by: notes/new.md"))
    assert both == Validity(us("2025-07-01T00:00:00+00:00"), "notes/new.md")


def test_superseded_by_alone_does_not_end_validity() -> None:
    assert not read_validity(fm("superseded-by: notes/new.md")).expired(2**62)


@pytest.mark.parametrize("value", [
    "/private/notes/new.md", "../other/x.md", "notes/../x.md", "notes/./x.md", "notes//x.md", "drafts/",
    "a\u200bb.md", "e\u0301.md", "x" * 300, "/".join(["d"] * 40), "",
])
def test_a_malformed_superseded_by_is_bad_input_naming_the_key(value: str) -> None:
    with pytest.raises(BadInput) as caught:
        read_validity(fm("superseded-by: " + value))
    assert "superseded-by" in str(caught.value)


@pytest.mark.parametrize("line", [
    "valid-until: 2025-06-30 alice4711", "valid-until: 'alice4711", "valid-until: \"alice4711\\\"",
    "valid-until: alice4711T00:00", "superseded-by: /alice4711", "superseded-by: alice4711/../x",
    "superseded-by: alice4711\u200b", "superseded-by: 'alice4711'x",
])
def test_a_refusal_never_quotes_the_note(line: str) -> None:
    with pytest.raises(BadInput) as caught:
        read_validity(fm(line))
    assert "alice" not in str(caught.value) and "4711" not in str(caught.value)


def test_other_keys_and_lines_are_ignored() -> None:
    data = fm("title: x", "tags: [a, b]", "  valid-until: nested, not ours", "valid-untilx: 1", "# valid-until: 1",
              "Valid-Until: 1", "\xff\xfe", "valid-until : 2025-06-30", "superseded-by:notes/n.md")
    assert read_validity(data.replace("\xff\xfe".encode(), b"\xff\xfe")) == Validity(us("2025-07-01T00:00:00Z"),
                                                                                       "notes/n.md")


def test_a_key_given_twice_is_bad_input() -> None:
    with pytest.raises(BadInput, match="valid-until: given more than once"):
        read_validity(fm("valid-until: 2025-06-30", "valid-until: 2025-06-30"))
    with pytest.raises(BadInput, match="superseded-by: given more than once"):
        read_validity(fm("superseded-by: a.md", "superseded-by: b.md"))


def test_crlf_notes_and_a_note_ending_on_its_fence_are_read() -> None:
    assert read_validity(b"---\r\nvalid-until: 2025-06-30\r\n---\r\nbody").valid_until_us == us("2025-07-01T00:00Z")
    assert read_validity(b"---\nvalid-until: 2025-06-30\n---").valid_until_us == us("2025-07-01T00:00Z")


def test_only_the_first_block_is_front_matter_and_the_body_is_not_read() -> None:
    data = fm("title: x", body="---\nvalid-until: 2000-01-01\n---\n")
    assert read_validity(data) == Validity()


def test_front_matter_over_its_bounds_is_ignored_entirely() -> None:
    key = "valid-until: 2000-01-01"
    fits_lines = fm(key, *["k: v"] * (MAX_FRONT_MATTER_LINES - 3))
    assert read_validity(fits_lines).valid_until_us is not None
    assert read_validity(fm(key, *["k: v"] * (MAX_FRONT_MATTER_LINES - 2))) == Validity()
    head = len("---\n" + key + "\n" + "---\n")
    filler = "k: " + "v" * (MAX_FRONT_MATTER_BYTES - head - len("k: \n"))
    exact = fm(key, filler, body="")
    assert len(exact) == MAX_FRONT_MATTER_BYTES and read_validity(exact).valid_until_us is not None
    assert read_validity(fm(key, filler + "v", body="")) == Validity()
    assert read_validity(fm(key, filler + "v", body="").removesuffix(b"\n")).valid_until_us is not None


class _Endless:
    """A note that claims to be 1 TiB long and records what is read of it: only slices from its
    start, which it serves from a real prefix. Reading past ``MAX_FRONT_MATTER_BYTES`` fails."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.read_up_to = 0

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, key: slice) -> bytes:
        assert isinstance(key, slice) and key.start in (None, 0) and key.step is None, key
        assert key.stop is not None and key.stop <= MAX_FRONT_MATTER_BYTES, key
        self.read_up_to = max(self.read_up_to, key.stop)
        return self.prefix[:key.stop]


def test_reading_looks_at_the_first_4_kib_only() -> None:
    # Bounded work shown by what is read, not by a clock: a note of any length costs one 4 KiB slice.
    note = _Endless(fm("valid-until: 2025-06-30") + b"x" * (2 * MAX_FRONT_MATTER_BYTES))
    assert read_validity(note).valid_until_us == read_validity(note.prefix).valid_until_us is not None  # type: ignore[arg-type]
    assert note.read_up_to == MAX_FRONT_MATTER_BYTES
    unfenced = _Endless(b"---\n" + b"k: v\n" * 2_000)  # no closing fence inside the window: none at all
    assert read_validity(unfenced) == Validity()  # type: ignore[arg-type]
    assert unfenced.read_up_to == MAX_FRONT_MATTER_BYTES


# -- writing ---------------------------------------------------------------


def test_writing_adds_a_block_to_a_note_without_one() -> None:
    until = us("2025-06-30T18:00:00Z")
    assert with_valid_until(b"# note\n", until) == b"---\nvalid-until: 2025-06-30T18:00:00Z\n---\n# note\n"
    assert with_valid_until(b"", until) == b"---\nvalid-until: 2025-06-30T18:00:00Z\n---\n"


def test_writing_replaces_the_key_and_keeps_every_other_byte() -> None:
    data = b"---\ntitle: x\nvalid-until : 'garbage' \nsuperseded-by: a.md\n---\nbody\n---\nvalid-until: 1\n"
    out = with_valid_until(data, us("2025-07-01T00:00:00Z"))
    assert out == data.replace(b"valid-until : 'garbage' \n", b"valid-until: 2025-06-30\n", 1)


def test_writing_adds_the_key_before_the_closing_fence() -> None:
    assert with_valid_until(b"---\r\ntitle: x\r\n---\r\nbody", us("2025-06-30T18:00:00.5Z")) == (
        b"---\r\ntitle: x\r\nvalid-until: 2025-06-30T18:00:00.500000Z\r\n---\r\nbody")
    assert with_valid_until(b"---\n---", us("2025-07-01T00:00:00Z")) == b"---\nvalid-until: 2025-06-30\n---"


def test_a_midnight_is_written_as_the_date_the_command_line_was_given() -> None:
    assert format_until(parse_until("2025-06-30", 0)) == "2025-06-30"
    assert format_until(us("2025-06-30T00:00:00.000001Z")) == "2025-06-30T00:00:00.000001Z"
    assert format_until(MAX_US) == "9999-12-31"
    assert format_until(MIN_US) == "0001-01-01T00:00:00Z"
    for bad in (MIN_US - 1, MAX_US + 1):
        with pytest.raises(BadInput, match="out of range"):
            format_until(bad)


def test_writing_refuses_a_repeated_key_and_a_full_block() -> None:
    with pytest.raises(BadInput, match="more than once"):
        with_valid_until(fm("valid-until: 1", "valid-until: 2"), 0)
    full = fm(*["k: v"] * (MAX_FRONT_MATTER_LINES - 2))
    assert read_validity(full) == Validity()
    with pytest.raises(BadInput, match="no room"):
        with_valid_until(full, 0)


def test_an_oversized_block_stays_as_body_below_a_new_one() -> None:
    big = fm("valid-until: 2000-01-01", *["k: v"] * MAX_FRONT_MATTER_LINES)
    out = with_valid_until(big, us("2030-01-01T00:00:00Z"))
    assert out.endswith(big) and read_validity(out).valid_until_us == us("2030-01-01T00:00:00Z")


# -- the command line ------------------------------------------------------


def test_parse_until_takes_a_duration_from_now_or_an_instant() -> None:
    now = us("2025-06-01T12:00:00Z")
    assert parse_until("30d", now) == us("2025-07-01T12:00:00Z")
    assert parse_until("12h", now) == us("2025-06-02T00:00:00Z")
    assert parse_until("2025-06-30", now) == us("2025-07-01T00:00:00Z")
    assert parse_until("2025-06-30T18:00+02:00", now) == us("2025-06-30T16:00:00Z")
    assert parse_until("2020-01-01", now) == us("2020-01-02T00:00:00Z")  # already past: retire at once


@pytest.mark.parametrize("text", ["", "0d", "30", "30w", "-1d", "99999999999d", "2025-06-30T18:00", "next week",
                                  "３０d"])
def test_parse_until_refuses_the_rest(text: str) -> None:
    with pytest.raises(BadInput):
        parse_until(text, 0)


# -- properties --------------------------------------------------------------

KEYS = st.sampled_from(["valid-until", "superseded-by", "title", "valid-until ", "Valid-until", " valid-until"])
VALUES = st.one_of(
    st.sampled_from(["2025-06-30", "'2025-06-30'", "2025-06-30T18:00:00Z", "2025-06-30T18:00:00+02:00",
                     "notes/new.md", "", "x", "2025-02-30", "\"a\"", "'"]),
    st.text(max_size=20),
)
GOOD = st.sampled_from([b"valid-until: 2025-06-30", b"superseded-by: notes/new.md", b"title: t", b"tags: [a]",
                        b"valid-until: '2030-01-01T00:00+05:00'", b"superseded-by: \"x.md\" # moved"])
LINES = st.one_of(GOOD, st.tuples(KEYS, VALUES).map(lambda kv: f"{kv[0]}: {kv[1]}".encode("utf-8", "surrogatepass")),
                  st.binary(max_size=30), st.sampled_from([b"---", b"---\r", b"", b"\r"]))
NOTES = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda lines, eol, body: b"---" + eol + b"".join(line.replace(b"\n", b"") + eol for line in lines)
              + b"---" + eol + body,
              st.one_of(st.lists(LINES, max_size=6), st.lists(LINES, min_size=MAX_FRONT_MATTER_LINES - 4,
                                                               max_size=MAX_FRONT_MATTER_LINES + 2)),
              st.sampled_from([b"\n", b"\r\n"]),
              st.binary(max_size=50)),
)
INSTANTS = st.integers(min_value=MIN_US, max_value=MAX_US)


@settings(max_examples=600, deadline=None)
@given(NOTES)
def test_reading_any_bytes_raises_only_bad_input(data: bytes) -> None:
    try:
        validity = read_validity(data)
    except BadInput as exc:
        assert exc.exit_code == 2
        return
    assert validity.valid_until_us is None or MIN_US <= validity.valid_until_us <= MAX_US


@settings(max_examples=600, deadline=None)
@given(NOTES, INSTANTS)
def test_writing_then_reading_round_trips(data: bytes, until: int) -> None:
    try:
        out = with_valid_until(data, until)
    except BadInput:
        return
    assert read_validity(out.replace(b"superseded-by", b"superseded-xx")).valid_until_us == until
    try:
        before = read_validity(data)
    except BadInput:
        return
    after = read_validity(out)
    assert after == Validity(until, before.superseded_by)


@settings(max_examples=300, deadline=None)
@given(INSTANTS)
def test_every_instant_formats_and_reads_back(until: int) -> None:
    text = format_until(until)
    assert read_validity(fm("valid-until: " + text)).valid_until_us == until
    if "T" in text:  # checked against the standard library's own reading
        expected = datetime.fromisoformat(text) - datetime(1970, 1, 1, tzinfo=UTC)
    else:
        expected = timedelta(days=date.fromisoformat(text).toordinal() + 1 - date(1970, 1, 1).toordinal())
    assert expected // timedelta(microseconds=1) == until
