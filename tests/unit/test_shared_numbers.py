"""``shared``: one object for every equal number a lease keeps, its type kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiolock._checks import shared


@given(st.one_of(st.integers(min_value=257, max_value=10**15), st.floats(allow_nan=False)))
def test_an_equal_number_is_the_same_object_of_the_same_type(number: float) -> None:
    """Two equal numbers made apart come back as one object, of the type given."""
    copy = type(number)(str(number)) if isinstance(number, int) else float(repr(number))
    first, second = shared(number), shared(copy)
    assert first is second
    assert type(first) is type(number)
    assert first == number


def test_an_int_and_an_equal_float_stay_apart() -> None:
    """``1000`` and ``1000.0`` are equal keys of a dict, yet each keeps its type."""
    assert type(shared(1000)) is int
    assert type(shared(1000.0)) is float
    assert type(shared(int("1000"))) is int
