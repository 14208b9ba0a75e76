import pytest

from keras_mpfp16.backend.buckets import plan_buckets


def test_everything_fits_in_one_bucket():
    assert plan_buckets([4, 8, 16], 100) == [[0, 1, 2]]


def test_reverse_order_greedy_packing():
    # Last gradients first (backprop order); a bucket closes before overflowing.
    assert plan_buckets([10, 10, 10, 10], 25) == [[2, 3], [0, 1]]


def test_oversized_gradient_gets_its_own_bucket():
    assert plan_buckets([5, 100, 5], 20) == [[2], [1], [0]]


def test_every_index_exactly_once():
    sizes = [3, 17, 1, 40, 8, 8, 2, 33]
    flat = sorted(i for b in plan_buckets(sizes, 20) for i in b)
    assert flat == list(range(len(sizes)))


@pytest.mark.parametrize("bad", [0, -1])
def test_nonpositive_bucket_rejected(bad):
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([1], bad)
