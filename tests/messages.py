"""What a test checks in an error message: what it names, not its wording.

A message may be reworded freely; what it must keep are its names: the file, the key, the entry, the
value it refuses and the fix (the flag or key to set). These helpers check those, so a reworded
message passes and one that stops naming any of them fails.

- ``raises_naming(error, *needles)``: like ``pytest.raises(error)``, and the message is one line that
  holds every needle (each a plain substring, not a pattern).
- ``assert_naming(message, *needles)``: the same check on a message already in hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def assert_naming(message: str, *needles: object, one_line: bool = True) -> str:
    """``message`` is one line (unless ``one_line`` is False) holding every needle (``str()`` of each)."""
    assert needles, "name at least one thing the message must hold"
    if one_line:
        assert "\n" not in message.strip(), message
    for needle in needles:
        assert str(needle) in message, (str(needle), message)
    return message


@contextmanager
def raises_naming(
    error: type[BaseException] | tuple[type[BaseException], ...], *needles: object, one_line: bool = True
) -> Iterator[pytest.ExceptionInfo]:
    """``pytest.raises(error)`` whose message (``str()`` of the exception) names every needle."""
    with pytest.raises(error) as caught:
        yield caught
    message = caught.value.args[0] if isinstance(caught.value, KeyError) and caught.value.args else None
    assert_naming(str(message if isinstance(message, str) else caught.value), *needles, one_line=one_line)
