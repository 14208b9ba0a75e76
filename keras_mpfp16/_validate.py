"""Argument checks with one message style, for every public entry point.

Each check returns the value normalised (a Python `int` or `float`, so numpy
scalars such as `np.int64(4)` are accepted wherever a Python number is) or
raises `ValueError` in Keras's style, naming the argument, what is allowed
and what was received:

    Invalid value for argument `batch_size`: expected an integer >= 1.
    Received: batch_size=0

Booleans are never numbers here (`True` is not a batch size). Imports only
the standard library, so every layer of the package may use it (`runtime/`
included, which must not import Keras).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

__all__ = ["integer", "non_negative_int", "number", "one_of", "positive_int"]


def _fail(name: str, expected: str, value: Any) -> ValueError:
    return ValueError(
        f"Invalid value for argument `{name}`: expected {expected}. "
        f"Received: {name}={value!r}"
    )


def _is_bool(value: Any) -> bool:
    # numpy's bool_ is not a subclass of bool; recognise it by name.
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _or_none(text: str, allow_none: bool) -> str:
    return f"None or {text}" if allow_none else text


def integer(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    """`value` as an `int` if it is an integer (Python or numpy) in range.

    Args:
        name: The argument's name, for the message.
        value: What the caller passed.
        minimum: Smallest allowed value, or None.
        maximum: Largest allowed value, or None.
        allow_none: Accept None (returned as None).

    Returns:
        `int(value)`, or None.

    Example:

    >>> integer("rank", np.int64(1), minimum=0, maximum=3)
    1
    """
    if value is None and allow_none:
        return None
    if minimum is not None and maximum is not None:
        expected = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        expected = f"an integer >= {minimum}"
    elif maximum is not None:
        expected = f"an integer <= {maximum}"
    else:
        expected = "an integer"
    if (
        not _is_int(value)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        raise _fail(name, _or_none(expected, allow_none), value)
    return int(value)


def positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """`value` as an `int` if it is an integer >= 1 (Python or numpy).

    Example:

    >>> positive_int("batch_size", np.int64(32))
    32
    """
    return integer(name, value, minimum=1, allow_none=allow_none)


def non_negative_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """`value` as an `int` if it is an integer >= 0 (Python or numpy)."""
    return integer(name, value, minimum=0, allow_none=allow_none)


def _same(value: Any, allowed: Any) -> bool:
    if _is_bool(value) != _is_bool(allowed):
        return False  # 1 is not True, 0 is not False
    try:
        return bool(value == allowed)
    except Exception:  # noqa: BLE001 - e.g. arrays: not equal to a choice
        return False


def one_of(name: str, value: Any, allowed: Sequence[Any]) -> Any:
    """`value` if it equals one of `allowed` (booleans only match booleans).

    Example:

    >>> one_of("rule", "sqrt", ("linear", "sqrt", "paper", "none"))
    'sqrt'
    """
    for choice in allowed:
        if _same(value, choice):
            return choice
    listed = ", ".join(repr(a) for a in allowed)
    raise _fail(name, f"one of {listed}", value)


def number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
    finite: bool = True,
    allow_none: bool = False,
    expected: str | None = None,
) -> float | None:
    """`value` as a `float` if it is a real number in the given range.

    Args:
        name: The argument's name, for the message.
        value: What the caller passed (Python or numpy int or float).
        minimum: Lower bound, or None.
        maximum: Upper bound, or None.
        min_inclusive: Whether `minimum` itself is allowed.
        max_inclusive: Whether `maximum` itself is allowed.
        finite: Reject infinities (NaN is always rejected).
        allow_none: Accept None (returned as None).
        expected: The message's description of what is allowed, when the
            caller accepts more than numbers (e.g. "a number in (0, 1] or
            a callable"). By default it is made from the bounds.

    Returns:
        `float(value)`, or None.

    Example:

    >>> number("decay", 0.97, minimum=0, min_inclusive=False, maximum=1)
    0.97
    """
    if value is None and allow_none:
        return None
    parts = ["a finite number" if finite else "a number"]
    if minimum is not None and maximum is not None:
        left = "[" if min_inclusive else "("
        right = "]" if max_inclusive else ")"
        parts.append(f"in {left}{minimum:g}, {maximum:g}{right}")
    elif minimum is not None:
        parts.append(f"{'>=' if min_inclusive else '>'} {minimum:g}")
    elif maximum is not None:
        parts.append(f"{'<=' if max_inclusive else '<'} {maximum:g}")
    if expected is None:
        expected = _or_none(" ".join(parts), allow_none)
    if not isinstance(value, numbers.Real) or _is_bool(value):
        raise _fail(name, expected, value)
    x = float(value)
    if math.isnan(x) or (finite and math.isinf(x)):
        raise _fail(name, expected, value)
    if minimum is not None and (x < minimum or (x == minimum and not min_inclusive)):
        raise _fail(name, expected, value)
    if maximum is not None and (x > maximum or (x == maximum and not max_inclusive)):
        raise _fail(name, expected, value)
    return x
