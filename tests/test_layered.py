"""``catalog.layered``: each picture of a view reads as the dict it stands for, and stays so.

The mount reads one picture on its thread while the catalog thread makes
the next from it, so an edit must never show through an earlier picture,
whatever mix of puts, removals and flattenings made either.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scopefs.catalog.layered import FLATTEN_MIN, LayeredMap, editing

KEYS = st.integers(min_value=0, max_value=300)
EDIT = st.lists(st.tuples(st.booleans(), KEYS, st.integers()), max_size=12)


def _check(picture: LayeredMap[int, int], expected: dict[int, int]) -> None:
    assert dict(picture.items()) == expected
    assert len(picture) == len(expected) and sorted(picture) == sorted(expected)
    for key in range(0, 301, 7):
        assert (key in picture) == (key in expected)
        assert picture.get(key) == expected.get(key)
        assert picture.get(key, -1) == expected.get(key, -1)


@settings(max_examples=60, deadline=None)
@given(start=st.dictionaries(KEYS, st.integers(), max_size=200), edits=st.lists(EDIT, max_size=80))
def test_every_picture_reads_as_its_dict_and_never_changes_after(start: dict[int, int],
                                                                   edits: list[list[tuple[bool, int, int]]]) -> None:
    picture: LayeredMap[int, int] = LayeredMap(start)
    expected = dict(start)
    history = [(picture, dict(expected))]
    for edit in edits:
        change = picture.edit()
        for put, key, value in edit:
            if put:
                change[key] = value
                expected[key] = value
            elif key in change:
                del change[key]
                del expected[key]
            assert len(change) == len(expected)
        picture = change.done()
        history.append((picture, dict(expected)))
    for earlier, as_it_was in history:
        _check(earlier, as_it_was)


def test_many_single_changes_flatten_into_a_new_base_and_share_it_until_then() -> None:
    picture: LayeredMap[int, int] = LayeredMap({i: i for i in range(10_000)})
    bases: list[dict[int, int]] = []  # held, so that no id is reused
    for step in range(1_000):
        change = picture.edit()
        change[step] = -step
        picture = change.done()
        if not any(base is picture._base for base in bases):
            bases.append(picture._base)
        assert len(picture._top) <= max(FLATTEN_MIN, 100)  # never more than the root of the base's size
    assert 5 <= len(bases) <= 20  # flattened now and then, shared in between
    assert all(picture[i] == -i for i in range(1_000)) and picture[5_000] == 5_000


def test_a_plain_dict_is_edited_as_a_picture_of_itself() -> None:
    source = {"a": 1, "b": 2}
    change = editing(source)
    del change["a"]
    change["c"] = 3
    assert dict(change.done().items()) == {"b": 2, "c": 3}
    assert source == {"a": 1, "b": 2}
