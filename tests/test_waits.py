"""tests/support/waits.py: a bounded wait returns what it waited for, or says what it saw instead."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.support.waits import WaitTimeout, wait_for


def test_returns_the_first_true_value():
    count = itertools.count()
    assert wait_for(lambda: next(count) >= 3 and "ready", 5, "the third poll", poll_s=0.001) == "ready"


def test_a_time_out_names_what_it_waited_for_and_what_it_saw():
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"timed out after 0.2s waiting for the queue to drain; "
                                          r"saw instead: 3 runs left") as info:
        wait_for(lambda: False, 0.2, "the queue to drain", seen=lambda: "3 runs left", poll_s=0.01)
    assert 0.2 <= time.monotonic() - start < 2
    assert isinstance(info.value, AssertionError)  # pytest reports a failed check


def test_without_seen_the_last_value_is_reported():
    with pytest.raises(WaitTimeout, match=r"waiting for two workers; last saw \[\]"):
        wait_for(lambda: [], 0.05, "two workers", poll_s=0.01)


def test_listed_errors_mean_not_yet_and_others_propagate():
    attempts = iter([ConnectionRefusedError("refused"), ConnectionRefusedError("refused"), "up"])

    def probe():
        item = next(attempts)
        if isinstance(item, Exception):
            raise item
        return item

    assert wait_for(probe, 5, "the server", retry_on=(OSError,), poll_s=0.001) == "up"
    with pytest.raises(WaitTimeout, match=r"last saw ConnectionRefusedError\('refused'\)"):
        wait_for(lambda: (_ for _ in ()).throw(ConnectionRefusedError("refused")), 0.05, "the server",
                 retry_on=(OSError,), poll_s=0.01)
    with pytest.raises(KeyError):
        wait_for(lambda: {}["missing"], 5, "the key", retry_on=(OSError,))


def test_a_process_that_is_gone_ends_the_wait_at_once():
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"the worker exited \(1\) while waiting for the first step; "
                                          r"saw instead: Traceback"):
        wait_for(lambda: False, 30, "the first step", alive=lambda: "the worker exited (1)",
                 seen=lambda: "Traceback")
    assert time.monotonic() - start < 5


def test_a_failing_description_does_not_hide_the_time_out():
    with pytest.raises(WaitTimeout, match=r"waiting for the log; seen\(\) failed: FileNotFoundError"):
        wait_for(lambda: False, 0.01, "the log", seen=lambda: open("/nonexistent/ragpool.log").read(), poll_s=0.01)
