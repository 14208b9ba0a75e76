"""Datasets of every element type and cached pipelines under mpirun (issue 38,
items 2 and 4).

Real `mpirun -np 2` / `-np 3`; the job is tests/mpi_scripts/data_types.py.
Before issue 38 the job failed at once (`TypeError: Cannot change data-type
for array of references` fingerprinting strings), and the cached pipeline's
shards sometimes held 4-5 batches instead of 100.
"""

import json

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi

TEXT_BATCHES, MIXED_BATCHES = 8, 8  # 30 rows in 4s, 37 rows in 5s


def union_of(recs, name):
    return [e for r in recs for e in r["shards"][name]]


@pytest.mark.parametrize("np_", [2, 3])
def test_every_element_type_is_checked_sharded_and_split(np_):
    result = run_mpi(np_, "data_types.py", timeout=540)
    recs = result.ok()
    assert [r["rank"] for r in recs] == list(range(np_)), result.describe()
    # 200 batches dealt over the ranks minus the remainder (drop_remainder),
    # every time, also on the second pass (served by the completed cache).
    for r in recs:
        assert r["cached_counts"] == [[200 // np_] * 2] * 10, r["cached_counts"]
    # shard: the parts are disjoint and together are the data, for every type.
    for name in ("strings", "bytes", "ragged", "sparse", "nested"):
        parts = [r["shards"][name] for r in recs]
        union = [e for p in parts for e in p]
        assert len(union) == len(set(union)) == 30, (name, parts)
    assert any("théta" in json.loads(e) for e in union_of(recs, "strings"))
    # The text model and the mixed-dtype dict model: every rank reports the
    # one-process metrics (the model called on every batch, on this rank),
    # with the batches split over the ranks, and the same weights.
    for r in recs:
        for got, alone in (
            (r["text_evaluate"], r["text_alone"]),
            (r["mixed_evaluate"], r["mixed_alone"]),
        ):
            for k in ("loss", "accuracy", "auc"):
                assert got[k] == pytest.approx(alone[k], rel=1e-5, abs=1e-6), (
                    k,
                    got,
                    alone,
                )
        assert r["text_weights"] == pytest.approx(recs[0]["text_weights"], rel=1e-6)
        assert r["text_predict_rows"] == 30
    assert sum(r["text_batches"] for r in recs) == TEXT_BATCHES
    assert sum(r["mixed_batches"] for r in recs) == MIXED_BATCHES
    assert all(r["text_batches"] < TEXT_BATCHES for r in recs)
