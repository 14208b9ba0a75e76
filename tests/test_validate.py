"""keras_mpfp16._validate: one message style, numpy scalars accepted alike."""

import numpy as np
import pytest

from keras_mpfp16 import _validate as v
from keras_mpfp16.data import shard


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_positive_int_accepts_python_and_numpy_integers(value):
    got = v.positive_int("batch_size", value)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [0, -1, 2.0, "2", True, np.bool_(True), None])
def test_positive_int_rejects_with_the_name_the_value_and_what_is_allowed(value):
    with pytest.raises(ValueError) as info:
        v.positive_int("batch_size", value)
    assert str(info.value) == (
        "Invalid value for argument `batch_size`: expected an integer >= 1. "
        f"Received: batch_size={value!r}"
    )


def test_none_only_when_allowed_and_said_so():
    assert v.positive_int("steps", None, allow_none=True) is None
    with pytest.raises(ValueError, match="expected None or an integer >= 1"):
        v.positive_int("steps", 0, allow_none=True)
    assert v.non_negative_int("n", np.int16(0)) == 0
    with pytest.raises(ValueError, match=r"expected an integer >= 0. Received: n=-1"):
        v.non_negative_int("n", -1)


def test_integer_range():
    assert v.integer("rank", np.int64(2), minimum=0, maximum=2) == 2
    with pytest.raises(ValueError, match=r"an integer in \[0, 2\]. Received: rank=3"):
        v.integer("rank", 3, minimum=0, maximum=2)


def test_one_of_never_confuses_booleans_and_integers():
    allowed = ("auto", True, False)
    assert v.one_of("use_cudnn", True, allowed) is True
    assert v.one_of("use_cudnn", np.str_("auto"), allowed) == "auto"
    for bad in (1, 0, "yes", None):
        with pytest.raises(ValueError) as info:
            v.one_of("use_cudnn", bad, allowed)
        assert str(info.value) == (
            "Invalid value for argument `use_cudnn`: expected one of 'auto', "
            f"True, False. Received: use_cudnn={bad!r}"
        )
    assert v.one_of("k", 2, (1, 2)) == 2
    with pytest.raises(ValueError):
        v.one_of("k", np.zeros(2), (1, 2))  # an array is not a choice


@pytest.mark.parametrize(
    "value", [0.5, 1, np.float32(0.5), np.float64(1.0), np.int8(1)]
)
def test_number_accepts_python_and_numpy_reals(value):
    got = v.number("decay", value, minimum=0, min_inclusive=False, maximum=1)
    assert got == float(value) and type(got) is float


@pytest.mark.parametrize(
    "value, expected",
    [
        (0, r"a finite number in \(0, 1\]"),
        (1.5, r"a finite number in \(0, 1\]"),
        (float("nan"), r"a finite number in \(0, 1\]"),
        (True, r"a finite number in \(0, 1\]"),
        ("0.5", r"a finite number in \(0, 1\]"),
    ],
)
def test_number_rejects_out_of_range_nan_bool_and_strings(value, expected):
    with pytest.raises(ValueError, match=expected + r". Received: decay="):
        v.number("decay", value, minimum=0, min_inclusive=False, maximum=1)


def test_number_bounds_and_infinity():
    assert v.number("x", float("inf"), finite=False) == float("inf")
    with pytest.raises(ValueError, match="a finite number >= 0"):
        v.number("x", float("inf"), minimum=0)
    with pytest.raises(ValueError, match="a finite number < 1"):
        v.number("x", 1, maximum=1, max_inclusive=False)
    with pytest.raises(ValueError, match="expected a number or a callable"):
        v.number("x", "a", expected="a number or a callable")


def test_shard_takes_numpy_integers_for_rank_and_num_ranks():
    """Failed before: shard() accepted only Python ints for rank/num_ranks."""
    x = np.arange(10)
    got = shard(x, rank=np.int64(1), num_ranks=np.int64(2), batch_size=np.int32(2))
    want = shard(x, rank=1, num_ranks=2, batch_size=2)
    np.testing.assert_array_equal(got, want)
