"""The supervisor's restart rules as pure functions (launch/supervisor.py): the first FREE_RESTARTS
restarts within the window go at once, each one past that waits twice as long as the one before up to
BACKOFF_MAX_S, and no count of restarts ever makes it give up (it once exited after 5). Stated here
from the rule, not from the constants' use in the code."""

from __future__ import annotations

import pytest

from tokenrouter.launch import supervisor
from tokenrouter.launch.supervisor import backoff_s


def test_the_first_five_restarts_within_the_window_go_at_once() -> None:
    assert supervisor.FREE_RESTARTS == 5 and supervisor.RESTART_WINDOW_S == 600.0
    assert [backoff_s(n) for n in range(1, 6)] == [0.0] * 5


def test_past_them_each_waits_twice_as_long_from_one_second_up_to_fifteen() -> None:
    assert [backoff_s(n) for n in range(6, 12)] == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


@pytest.mark.parametrize("restarts", [20, 1000, 10**6])
def test_it_never_gives_up_however_many_restarts_came(restarts: int) -> None:
    assert backoff_s(restarts) == 15.0  # a wait, never an exit or an error
