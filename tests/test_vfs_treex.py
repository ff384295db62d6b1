"""Trees of notes changed as tools change them, through mounts: what every view and the catalog end with.

``tests/treex.py`` does to a folder what tools do (create, overwrite,
append, write in the middle, save through a scratch name renamed over the
note, rename, remove, folders made and removed), checks every step against
a model, and hands the model over every 25 operations: then another
session's mount must show exactly those notes with those bytes, and the
catalog must hold them as the live notes of the folder, within the bound
of issue 14's point 3 (a removal becomes a tombstone after its grace).

Two sessions writing the same folder at once cannot be checked against a
model (the later writer wins), so what is checked is that they converge:
once both stop, both mounts and the catalog show the same notes, byte for
byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import Scenario
from tests.mountkit import Mounts, live_notes, mounts, second_group_session, wait_until  # noqa: F401
from tests.treex import Model, TakingTurns, TreeExerciser, interleaved_writes, stats_of, tree_of


def _in_catalog(scenario: Scenario, folder: str) -> dict[str, str | None]:
    """The live notes of the group's store under ``folder``, by path below it: their active revision's hash."""
    prefix = folder + "/"
    return {path[len(prefix):]: note.active_sha256
            for path, note in live_notes(scenario.cli.home, scenario.conversation).items() if path.startswith(prefix)}


def _hashes(files: dict[str, bytes]) -> dict[str, str | None]:
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_one_writer_s_tree_is_what_another_session_and_the_catalog_show(
        scenario: Scenario, mounts: Mounts, seed: int) -> None:
    writer = mounts.mount(scenario.group_session) / "channel" / "tree"
    reader = mounts.mount(second_group_session(scenario)) / "channel" / "tree"
    checkpoints = 0

    def others_see(model: Model) -> None:
        nonlocal checkpoints
        checkpoints += 1
        wait_until(lambda: tree_of(reader) == model.files)
        wait_until(lambda: _in_catalog(scenario, "tree") == _hashes(model.files))

    done = TreeExerciser(writer, seed=seed, checkpoint_every=25, checkpoint=others_see).run(300)
    assert checkpoints == 300 // 25 + 1
    assert {"create", "overwrite", "append", "write_middle", "save_by_rename", "rename", "unlink"} <= done.keys()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_two_sessions_writing_one_folder_at_once_converge(scenario: Scenario, mounts: Mounts, seed: int) -> None:
    roots = [mounts.mount(scenario.group_session) / "channel" / "tree",
             mounts.mount(second_group_session(scenario)) / "channel" / "tree"]
    roots[0].mkdir()
    (roots[0] / "started.md").write_bytes(b"both writers see this folder\n")
    wait_until(lambda: (roots[1] / "started.md").exists())

    outcomes = interleaved_writes(roots, seed=seed, operations=400)
    changed = sum(count for what, count in outcomes.items()
                  if what.endswith(" ok") and not what.startswith(("read", "pause")))
    assert changed > 100  # most changes went through: the writers did not just refuse each other

    def converged() -> bool:
        first, second = tree_of(roots[0]), tree_of(roots[1])
        return first is not None and first == second and _in_catalog(scenario, "tree") == _hashes(first)

    wait_until(converged)


@pytest.mark.slow
@pytest.mark.parametrize("seed, caught_up_by, scale", [(1, "bytes", 1), (2, "bytes", 1), (3, "sizes and times", 1),
                                                       (4, "sizes and times", 1000)])
def test_sessions_taking_turns_at_one_tree_each_act_on_the_other_s_changes(
        scenario: Scenario, mounts: Mounts, seed: int, caught_up_by: str, scale: int) -> None:
    """Two sessions' mounts take turns at one folder, each once its view shows the other's last change: every
    step is checked against one model, and so is the catalog every 25 operations.

    A view has caught up, once the catalog holds the model, when it reads the model's bytes, or (never
    reading a file, so that what its kernel cached stays there) when it lists the model's notes with the
    sizes and times the last writer's view shows. A page kept from a replaced revision is then read by
    the next step's check. The last case writes up to 1.5 MB at a time (appends make notes larger), loaded
    and hashed on threads, read in many pieces."""
    roots = [mounts.mount(scenario.group_session) / "channel" / "tree",
             mounts.mount(second_group_session(scenario)) / "channel" / "tree"]

    def caught_up(root: Path, model: Model) -> None:
        # The catalog first: a view that shows the model may only not have seen the last changes yet (a
        # note removed in the writer's mount stays in the catalog, and so in other views, for its grace).
        wait_until(lambda: _in_catalog(scenario, "tree") == _hashes(model.files))
        if caught_up_by == "bytes":
            wait_until(lambda: tree_of(root) == model.files)
            return
        writer = turns.root

        def same_stats() -> bool:
            seen = stats_of(root)
            return seen is not None and seen.keys() == model.files.keys() and seen == stats_of(writer)

        wait_until(same_stats)

    def in_catalog(model: Model) -> None:
        wait_until(lambda: _in_catalog(scenario, "tree") == _hashes(model.files))

    turns = TakingTurns(roots, seed=seed, settle=caught_up, checkpoint_every=25, checkpoint=in_catalog,
                        scale=scale)
    done = turns.run(200)
    assert turns.turns > 30
    assert {"create", "touch", "overwrite", "append", "write_middle", "save_by_rename", "rename",
            "unlink"} <= done.keys()


def test_the_tree_exerciser_finds_a_note_changed_behind_its_back(tmp_path: Path) -> None:
    root = tmp_path / "tree"

    def meddle(model: Model) -> None:
        if model.files:
            path = sorted(model.files)[0]
            (root / path).write_bytes(model.files[path] + b"meddled\n")

    with pytest.raises(AssertionError, match=r"holds other bytes than were written"):
        TreeExerciser(root, seed=1, checkpoint_every=10, checkpoint=meddle).run(100)


def _mirrored(root: Path, model: Model, *, flawed: bool) -> None:
    """``root`` made to hold exactly the model's notes, as a view that caught up does; if ``flawed``, one
    note keeps one byte less, as a view that missed part of a revision would."""
    for path in tree_of(root) or {}:
        if path not in model.files:
            (root / path).unlink()
    for path, data in sorted(model.files.items()):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    if flawed and any(model.files.values()):
        path = max(model.files, key=lambda name: len(model.files[name]))
        (root / path).write_bytes(model.files[path][:-1])


@pytest.mark.parametrize("flawed", [False, True], ids=["caught-up", "a-byte-missed"])
def test_turns_taken_on_trees_that_catch_up_pass_and_a_byte_missed_fails(tmp_path: Path, flawed: bool) -> None:
    roots = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    turns = TakingTurns(roots, seed=7, settle=lambda root, model: _mirrored(root, model, flawed=flawed),
                        checkpoint_every=10, checkpoint=lambda model: None)
    if flawed:
        with pytest.raises(AssertionError, match=r"holds other bytes than were written"):
            turns.run(200)
    else:
        assert turns.run(200)["save_by_rename"] > 0
        assert turns.turns > 20


@pytest.mark.slow
def test_the_tree_exerciser_inside_scopefs_run_leaves_its_tree_in_the_catalog(scenario: Scenario) -> None:
    """The sandbox's own python3 runs the exerciser on ``/memory`` (each step checked inside); once the run
    and its mount end, the catalog holds exactly the tree it reported."""
    exerciser = Path(__file__).with_name("treex.py").read_bytes()
    result = scenario.cli("run", scenario.group_session, "--", "python3", "-", "channel/tree", "-N", "300",
                          "-S", "5", stdin=exerciser, timeout=240)
    assert result.code == 0, f"the tree exerciser failed in the sandbox: {result.err}"
    reported = json.loads(result.out)
    assert reported["by_operation"].get("touch", 0) > 0 and reported["by_operation"].get("save_by_rename", 0) > 0
    assert _in_catalog(scenario, "tree") == reported["files"]
