"""The pipelined 16-bit reduction's plan: how a bucket is cut into segments
(`runtime/mpi/pipeline.py`; the schedule itself runs in
tests/test_mpi_wire_pipeline.py)."""

import pytest

from keras_mpfp16 import config
from keras_mpfp16.runtime.mpi import pipeline


def test_off_or_short_rows_are_one_segment():
    assert pipeline.plan(1000, 4, segment=0) == (1, 250)
    assert pipeline.plan(1000, 4, segment=250) == (1, 250)
    assert pipeline.plan(1001, 4, segment=250) == (2, 126)


@pytest.mark.parametrize("length", [1, 999, 10_007, 6_553_600, 25_178_113])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("segment", [1000, 32_000, 262_144])
def test_segments_cover_the_bucket_with_little_padding(length, n, segment):
    count, seg = pipeline.plan(length, n, segment=segment)
    assert seg <= max(segment, -(-length // n))
    assert count * n * seg >= length  # every value has a place
    assert count * n * seg - length < n * count  # padding: under one per row
    if count > 1:
        assert seg <= segment


def test_the_setting_is_read_and_validated():
    try:
        config.set("WIRE_PIPELINE_SEGMENT", 500)
        assert pipeline.segment_length() == 500
        assert pipeline.plan(4000, 2) == (4, 500)
        with pytest.raises(ValueError, match="WIRE_PIPELINE_SEGMENT"):
            config.set("WIRE_PIPELINE_SEGMENT", -1)
    finally:
        config.set("WIRE_PIPELINE_SEGMENT", 0)
    assert pipeline.plan(4000, 2) == (1, 2000)
