"""The scenario's first reads: each session sees only what it may."""

from tests.conftest import ALICE_FACT, BOB_FACT, CHANNEL_FACT, Scenario


def test_each_session_reads_only_its_own_view(scenario: Scenario) -> None:
    cli = scenario.cli
    assert cli("read", scenario.alice_session, "private/notes/allergy.md", check=True).out == ALICE_FACT
    assert cli("read", scenario.bob_session, "private/notes/allergy.md", check=True).out == BOB_FACT
    assert cli("read", scenario.group_session, "channel/offsite.md", check=True).out == CHANNEL_FACT
    # The group cannot name a private root; Alice cannot name the channel.
    for session, path in ((scenario.group_session, "private/notes/allergy.md"),
                          (scenario.alice_session, "channel/offsite.md")):
        result = cli("read", session, path)
        assert result.code == 3 and result.out == b""
