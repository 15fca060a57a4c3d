"""`advance`: what is left of a list of views after a write took some of its bytes is exactly the rest of them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.views import advance


@given(st.lists(st.binary(max_size=40), max_size=8), st.data())
@pytest.mark.slow
def test_the_views_left_are_the_bytes_after_the_written_ones(parts: list[bytes], data: st.DataObject) -> None:
    joined = b"".join(parts)
    views = [memoryview(part) for part in parts]
    left = len(joined)
    while True:
        done = data.draw(st.integers(0, left))
        advance(views, done)
        joined, left = joined[done:], left - done
        assert b"".join(views) == joined
        assert not joined or len(views[0]) > 0  # (the next write starts with bytes to write)
        if not left:
            assert not views or not b"".join(views)
            break
