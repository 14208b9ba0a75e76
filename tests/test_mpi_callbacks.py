"""Callbacks and sharding on real `mpirun -np 2` / `-np 3` jobs, under a timeout."""

import os

import numpy as np
import pytest
from mpi_launch import ok, rel, run_mpi

import keras_mpfp16 as kmp

pytestmark = pytest.mark.mpi

RTOL = 1e-6


def assert_logs_close(got: dict, want: dict, what: str):
    assert set(got) == set(want), (what, sorted(got), sorted(want))
    for key in want:
        worst = max(rel(a, b) for a, b in zip(got[key], want[key]))
        assert worst <= RTOL, (what, key, got[key], want[key])


@pytest.mark.parametrize("np_", [2, 3])
def test_logs_exact_output_on_rank_0_checkpoints_and_resume(np_, tmp_path):
    result = run_mpi(np_, "cb_exact.py", str(tmp_path), timeout=240)
    recs = ok(result)
    assert len(recs) == np_
    r0 = recs[0]

    # The validation split is uneven: ranks ran different numbers of steps.
    assert len(set(r0["val_steps"])) > 1, r0["val_steps"]

    # Every rank saw exactly the same logs, per batch and per epoch.
    for r in recs[1:]:
        assert r["dist"] == r0["dist"]
        assert r["resume"] == r0["resume"]

    # ... and they equal one process's over the same full data (batch N*b),
    # although GlobalMetrics was listed after the recording callback.
    dist, ref = r0["dist"], r0["reference"]
    assert_logs_close(dist["history"], ref["history"], "epoch logs")
    assert len(dist["batches"]) == len(ref["batches"]) == 15
    for k, (got, want) in enumerate(zip(dist["batches"], ref["batches"])):
        assert_logs_close(
            {key: [v] for key, v in got.items()},
            {key: [v] for key, v in want.items()},
            f"batch {k}",
        )
    for got, want in zip(dist["weights"], ref["weights"]):
        got, want = np.asarray(got), np.asarray(want)
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    # The learning rate was scaled for N workers and logged every batch.
    lrs = [b["learning_rate"] for b in dist["batches"]]
    assert lrs[0] == pytest.approx(0.05, rel=RTOL)  # warmup starts at lr0
    assert max(lrs) > 0.05 * (np_ - 1)

    # A plain evaluate on all ranks after fit (each rank passing its own
    # shard) is global and exact, with or without GlobalMetrics (which is
    # then redundant, not applied twice).
    for r in recs:
        for which in ("after_fit_evaluate", "evaluate_global"):
            got = r[which]
            for key in ("loss", "accuracy", "auc", "wmae"):
                want = ref["history"][f"val_{key}"][-1]
                assert rel(got[key], want) <= RTOL, (which, key)

    # Only rank 0 printed a progress bar and wrote files, all atomically.
    assert result.stdout.count("Epoch 1/3") == 1, result.stdout[-3000:]
    assert [r["checkpoint_writes"] for r in recs] == [3] + [0] * (np_ - 1)
    files = sorted(os.listdir(tmp_path))
    assert files == ["ck-01.keras", "ck-02.keras", "ck-03.keras", "log-0.csv"], files

    # Resuming from the epoch-1 checkpoint reproduces epochs 2 and 3 exactly,
    # from the middle of the learning-rate warmup.
    resume = r0["resume"]
    assert resume["loaded"]["iterations"] == 5 and resume["loaded"]["skipped"] == 0
    assert resume["loaded"]["lr"] == pytest.approx(0.05)  # lr0, not a scaled rate
    assert resume["history"] == {k: v[1:] for k, v in dist["history"].items()}
    assert resume["batches"] == dist["batches"][5:]
    assert resume["weights"] == dist["weights"]

    # Unequal training steps are refused on every rank, naming the counts.
    for r in recs:
        assert r["uneven_error"] and "rank 0: 5" in r["uneven_error"], r
        assert f"rank {np_ - 1}: 4" in r["uneven_error"]


@pytest.mark.skipif(
    not hasattr(kmp, "shard"),
    reason="keras_mpfp16.shard is not exported yet (issue 3: the lead adds the "
    "`from keras_mpfp16.data import shard` line to keras_mpfp16/__init__.py)",
)
def test_three_line_imdb_script():
    result = run_mpi(2, "cb_three_line.py", timeout=240)
    recs = ok(result)
    assert len(recs) == 2
    for r in recs:
        assert r["same_weights"]
        # Each training row on exactly one rank (197 rows: 1 dropped).
        assert r["rows_here"] == 98
        assert r["rows_total"] == r["rows_distinct"] == 196
    assert recs[0]["val_loss"] == recs[1]["val_loss"]
    # One model summary and one progress bar for the whole job.
    assert result.stdout.count("Total params") == 1, result.stdout[-3000:]
    assert result.stdout.count("Epoch 1/2") == 1
