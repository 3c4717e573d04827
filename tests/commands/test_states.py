"""The one transition table: every move it allows, and that nothing else moves."""

import pytest

from commands.states import TRANSITIONS, Event, State, dispatchable, next_state

ALLOWED = {
    ("draft", "approve"): "approved",
    ("approved", "dispatch"): "queued",
    ("failed", "dispatch"): "queued",
    ("queued", "start"): "dispatching",
    ("queued", "set-aside"): "approved",
    ("queued", "set-aside-retry"): "failed",
    ("dispatching", "succeed"): "succeeded",
    ("dispatching", "fail"): "failed",
    ("draft", "cancel"): "cancelled",
    ("approved", "cancel"): "cancelled",
    ("failed", "cancel"): "cancelled",
}


def test_the_table_is_exactly_the_documented_moves():
    assert {(str(s), str(e)): str(t) for (s, e), t in TRANSITIONS.items()} == ALLOWED


@pytest.mark.parametrize("state", State.values)
@pytest.mark.parametrize("event", Event.values)
def test_next_state_answers_from_the_table_only(state, event):
    assert next_state(state, event) == ALLOWED.get((state, event))


def test_only_approved_and_failed_are_dispatchable():
    assert [s for s in State.values if dispatchable(s)] == ["approved", "failed"]


def test_terminal_states_have_no_way_out():
    for terminal in ("succeeded", "cancelled"):
        assert all(next_state(terminal, event) is None for event in Event.values)


def test_an_unknown_state_or_event_has_no_move():
    assert next_state("lost", "dispatch") is None
    assert next_state("approved", "teleport") is None
