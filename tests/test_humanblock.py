"""``catalog.humanblock``: a machine write keeps the human-notes block byte for byte, or fails.

The block is what a person wrote by hand; a machine write that loses it
loses it for good. So every rule is checked on examples, and the two
guarantees (the previous region and all of the new content around it are
kept; nothing but BadInput escapes on any bytes) on generated notes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopefs.catalog.errors import BadInput
from scopefs.catalog.humanblock import END, START, HumanBlockDamaged, human_region, keep_human_block


def note(before: bytes, region: bytes, after: bytes) -> bytes:
    return before + START + region + END + after


# -- human_region ---------------------------------------------------------


def test_a_note_without_markers_has_no_block() -> None:
    assert human_region(b"") is None
    assert human_region(b"# title\nmachine text\n") is None


def test_the_region_is_the_bytes_between_the_markers() -> None:
    assert human_region(note(b"# t\n", b"\nmine\r\n\x00\xff", b"\n")) == b"\nmine\r\n\x00\xff"
    assert human_region(START + END) == b""


@pytest.mark.parametrize("data", [
    b"text " + START + b" mine",  # only the start
    b"mine " + END + b" text",  # only the end
    note(b"", b"x", b"") + START,  # start repeated
    START + b"x" + START + b"y" + END,  # start repeated, inside
    note(b"", b"x", END),  # end repeated
    END + b"x" + START,  # end before start
    note(b"", b"x", b"").replace(b"start -->", b"start-->"),  # a mangled marker reads as missing
])
def test_damaged_markers_are_refused_with_exit_2(data: bytes) -> None:
    with pytest.raises(HumanBlockDamaged) as caught:
        human_region(data)
    assert isinstance(caught.value, BadInput) and caught.value.exit_code == 2


def test_the_message_names_the_markers_and_never_the_content() -> None:
    secret = b"alice's door code is 4711"
    with pytest.raises(HumanBlockDamaged) as caught:
        keep_human_block(note(b"", secret, b""), b"regenerated " + secret[:5])
    message = str(caught.value)
    assert "4711" not in message and "alice" not in message
    assert START.decode() in message and END.decode() in message
    assert "\n" not in message


# -- keep_human_block ------------------------------------------------------


def test_a_new_note_or_one_without_a_block_is_written_as_given() -> None:
    assert keep_human_block(None, b"fresh") == b"fresh"
    assert keep_human_block(b"old text, no block", b"new text") == b"new text"
    assert keep_human_block(None, note(b"a", b"b", b"c")) == note(b"a", b"b", b"c")


def test_new_content_with_damaged_markers_is_taken_when_nothing_is_protected() -> None:
    # Decision: nothing to protect, so nothing to refuse; the next machine write then fails.
    damaged = b"generated " + START + b" only"
    assert keep_human_block(None, damaged) == damaged
    assert keep_human_block(b"no block", damaged) == damaged
    with pytest.raises(HumanBlockDamaged):
        keep_human_block(damaged, b"regenerated")


def test_the_previous_region_replaces_the_new_one_byte_for_byte() -> None:
    previous = note(b"# Old\nold machine text\n", b"\nmy notes\r\n\xff\x00 \n", b"\nold tail\n")
    new = note(b"# New\nnew machine text\n", b"\nplaceholder\n", b"\nnew tail\n")
    assert keep_human_block(previous, new) == note(b"# New\nnew machine text\n", b"\nmy notes\r\n\xff\x00 \n",
                                                   b"\nnew tail\n")


def test_the_new_content_decides_where_the_block_sits() -> None:
    previous = note(b"top\n", b"mine", b"\nbottom\n")
    assert keep_human_block(previous, note(b"", b"", b"\neverything after\n")) == note(b"", b"mine",
                                                                                      b"\neverything after\n")


def test_an_empty_previous_region_empties_the_new_one() -> None:
    assert keep_human_block(note(b"a", b"", b"b"), note(b"c", b"machine put this here", b"d")) == note(b"c", b"", b"d")


@pytest.mark.parametrize("new", [
    b"regenerated without the block",
    b"regenerated " + START + b" half",
    b"regenerated " + END + b" half",
    note(b"", b"x", b"") + note(b"", b"y", b""),
    END + b"x" + START,
])
def test_a_write_without_one_well_formed_block_fails_where_the_note_had_one(new: bytes) -> None:
    with pytest.raises(HumanBlockDamaged, match="content being written"):
        keep_human_block(note(b"a", b"mine", b"b"), new)


@pytest.mark.parametrize("previous", [
    b"a " + START + b" mine, end marker deleted by hand",
    b"mine, start marker deleted " + END,
    END + b" mine " + START,
    note(b"", b"mine", b"") + END,
])
def test_a_note_whose_markers_a_person_broke_refuses_every_machine_write(previous: bytes) -> None:
    for new in (b"plain", note(b"", b"", b""), previous):
        with pytest.raises(HumanBlockDamaged, match="current revision"):
            keep_human_block(previous, new)


def test_removing_both_markers_by_hand_removes_the_protection() -> None:
    # People may change the block freely, including deleting it.
    assert keep_human_block(b"the person deleted the block", b"machine text") == b"machine text"


# -- properties --------------------------------------------------------------

# Bytes rich in marker pieces, so that damaged and well-formed layouts are both common.
PIECES = st.sampled_from([START, END, START[:10], END[-6:], b"<!--", b"-->", b"\n", b"\r\n", b"\x00\xff", b"x"])
TEXT = st.lists(st.one_of(PIECES, st.binary(max_size=20)), max_size=12).map(b"".join)
CLEAN = TEXT.map(lambda b: b.replace(START, b"").replace(END, b"")).filter(lambda b: START not in b and END not in b)


@settings(max_examples=300, deadline=None)
@given(pb=CLEAN, region=TEXT.filter(lambda b: START not in b and END not in b), pa=CLEAN,
       nb=CLEAN, placeholder=CLEAN, na=CLEAN)
def test_the_previous_region_and_all_of_new_outside_it_are_kept(pb: bytes, region: bytes, pa: bytes,
                                                                 nb: bytes, placeholder: bytes, na: bytes) -> None:
    previous = note(pb, region, pa)
    new = note(nb, placeholder, na)
    result = keep_human_block(previous, new)
    assert human_region(result) == region
    assert result.startswith(nb + START) and result.endswith(END + na)
    assert result == nb + START + region + END + na


@settings(max_examples=500, deadline=None)
@given(previous=st.one_of(st.none(), TEXT, st.binary(max_size=200)), new=st.one_of(TEXT, st.binary(max_size=200)))
def test_nothing_but_bad_input_escapes_and_a_result_always_keeps_the_region(previous: bytes | None,
                                                                            new: bytes) -> None:
    try:
        kept = human_region(previous) if previous is not None else None
    except BadInput:
        kept = None
        with pytest.raises(HumanBlockDamaged):
            keep_human_block(previous, new)
        return
    try:
        result = keep_human_block(previous, new)
    except BadInput as exc:
        assert isinstance(exc, HumanBlockDamaged) and kept is not None
        return
    if kept is None:
        assert result == new
    else:
        assert human_region(result) == kept
