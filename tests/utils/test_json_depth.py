"""The JSON reader's depth bound against the depth of the parsed value, measured by a walk written here."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from captioning.utils.json_files import MAX_DEPTH, JsonError, parse_json


def depth_of(value: object) -> int:
    """Arrays and objects nested in ``value`` (a scalar is 0 deep)."""
    if isinstance(value, list):
        return 1 + max((depth_of(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(item) for item in value.values()), default=0)
    return 0


# Strings full of what could fool a scan: brackets, quotes, backslashes and escapes.
tricky_text = st.text(alphabet='[]{}"\\ab\n\u00e9', max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(tricky_text, children, max_size=3),
    max_leaves=40,
)


def nested(value: object, depth: int) -> object:
    """``value`` inside ``depth`` more arrays and objects, alternating."""
    for level in range(depth):
        value = [value] if level % 2 else {'k"[': value}
    return value


@settings(max_examples=150, deadline=None)
@given(values, st.integers(min_value=MAX_DEPTH - 12, max_value=MAX_DEPTH + 3))
def test_the_bound_refuses_exactly_the_values_deeper_than_it(value, extra):
    document = nested(value, extra)
    text = json.dumps(document, ensure_ascii=False)
    if depth_of(document) > MAX_DEPTH:
        with pytest.raises(JsonError, match="nested too deeply"):
            parse_json(text.encode("utf-8"))
    else:
        assert parse_json(text.encode("utf-8")) == document


@pytest.mark.parametrize("escaped", ['"\\\\"', '"\\""', '"\\\\\\""', '"[\\"{"'])
def test_escapes_before_a_bracket_do_not_shift_the_strings(escaped):
    deep = "[" * (MAX_DEPTH - 1) + f"[{escaped}]" + "]" * (MAX_DEPTH - 1)
    assert depth_of(json.loads(deep)) == MAX_DEPTH
    assert parse_json(deep) == json.loads(deep)
    with pytest.raises(JsonError, match="nested too deeply"):
        parse_json("[" + deep + "]")
