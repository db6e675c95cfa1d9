"""The one bounded wait of the test suite: poll until true, or fail saying what was awaited and what was seen.

Every wait in a test has a bound and, on time-out, names what it waited for and what it saw
instead. ``bench/`` keeps its own (``bench.recovery.wait_until``): a benchmark must not import
``tests/``.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out (an AssertionError, so pytest reports it as a failed check)."""


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, *, seen: Callable[[], object] | None = None,
             poll_s: float = 0.05, retry_on: tuple[type[BaseException], ...] = (),
             alive: Callable[[], str | None] | None = None) -> T:
    """Call ``predicate`` every ``poll_s`` until it returns something true, and return that, for at
    most ``timeout_s`` seconds.

    ``retry_on``: exceptions the predicate may raise while the thing is not up yet (a refused
    connection): caught and polled again. ``alive``: called each round; a string it returns (a
    process exited, a thread died) ends the wait at once with that message. On time-out a
    :class:`WaitTimeout` names ``what`` and what ``seen()`` returns, else the predicate's last
    value or exception."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = predicate()
        except retry_on as exc:
            value, last = None, exc
        else:
            if value:
                return value
            last = value
        if alive is not None and (gone := alive()):
            raise WaitTimeout(f"{gone} while waiting for {what}" + _instead(seen, last))
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout_s:g}s waiting for {what}" + _instead(seen, last))
        time.sleep(poll_s)


def _instead(seen: Callable[[], object] | None, last: object) -> str:
    if seen is not None:
        try:
            return f"; saw instead: {seen()}"
        except Exception as exc:  # the description must not hide the time-out
            return f"; seen() failed: {exc!r}"
    return f"; last saw {last!r}"
