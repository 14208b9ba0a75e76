"""A step-level backup written at N ranks resumes at M != N ranks at the same
part of the interrupted epoch (tests/mpi_scripts/resize_backup.py), and the
conversion's arithmetic (`training.preemption.step_at_new_size`)."""

from __future__ import annotations

import json
import re

import pytest

from keras_mpfp16.training.preemption import input_batch_size, step_at_new_size

ROWS, BATCH, EPOCHS = 240, 4, 3


# -- the conversion, one process --------------------------------------------------


def layout(ranks, steps=None, batch=None):
    return {"ranks": ranks, "steps_per_epoch": steps, "batch_size": batch}


def test_same_size_and_old_records_keep_the_step():
    assert step_at_new_size(13, layout(3, 20, 4), layout(3, 20, 4)) == (13, "same size")
    # Same ranks, other batch size: unchanged (as before this conversion).
    assert step_at_new_size(13, layout(3, 20, 4), layout(3, 10, 8))[0] == 13
    # A backup of an older version records no layout.
    assert step_at_new_size(7, {"epoch": 1}, layout(2, 30, 4)) == (7, "same size")
    assert step_at_new_size(7, layout(None), layout(2, 30, 4)) == (7, "same size")


def test_samples_rule_rounds_down_to_at_most_one_global_batch():
    # 3 -> 2 ranks, 4 per rank: 10 steps of 12 samples = 15 steps of 8.
    assert step_at_new_size(10, layout(3, 20, 4), layout(2, 30, 4)) == (15, "samples")
    # 11 steps of 12 = 132 samples = 16.5 steps of 8: 16 (4 samples again).
    assert step_at_new_size(11, layout(3, 20, 4), layout(2, 30, 4)) == (16, "samples")
    # 2 -> 3: 10 steps of 8 = 80 samples = 6.67 steps of 12: 6.
    assert step_at_new_size(10, layout(2, 30, 4), layout(3, 20, 4)) == (6, "samples")
    # The global batch kept (8 per rank at 3 ranks -> 12 at 2): same step.
    assert step_at_new_size(9, layout(3, 10, 8), layout(2, 10, 12)) == (9, "samples")
    for done in range(0, 31):
        for old, new in ((3, 2), (2, 3), (4, 3), (1, 5), (5, 1)):
            step, _ = step_at_new_size(done, layout(old, None, 4), layout(new, None, 4))
            skipped, trained = step * 4 * new, done * 4 * old
            assert skipped <= trained < skipped + 4 * new, (done, old, new)


def test_steps_zero_stays_zero():
    for written, now in (
        (layout(3, 20, 4), layout(2, 30, 4)),
        (layout(3, 20), layout(2, 30)),
        (layout(3), layout(2)),
    ):
        assert step_at_new_size(0, written, now)[0] == 0


def test_fraction_rule_without_batch_sizes():
    # A dataset (no batch size): the fraction of the epoch's steps.
    assert step_at_new_size(7, layout(2, 30), layout(3, 20)) == (4, "fraction")
    assert step_at_new_size(10, layout(3, 21), layout(2, 32)) == (15, "fraction")
    # Partial last batch: 83 rows per rank in 21 steps at 3 ranks, 125 in 32
    # at 2 ranks; the whole epoch maps to the whole epoch.
    assert step_at_new_size(21, layout(3, 21), layout(2, 32)) == (32, "fraction")
    assert step_at_new_size(20, layout(3, 21), layout(2, 32)) == (30, "fraction")
    # Only one side knows its batch size: the fraction.
    assert step_at_new_size(6, layout(3, 20, 4), layout(2, 30)) == (9, "fraction")


def test_ranks_rule_and_the_cap():
    # Nothing but the ranks known: per-rank batch assumed unchanged.
    assert step_at_new_size(10, layout(3), layout(2)) == (15, "ranks")
    assert step_at_new_size(10, layout(2), layout(3)) == (6, "ranks")
    # Never past the new epoch's end: 20 full steps at 3 ranks is 240
    # samples, but only 29 steps (232 samples) at 2 ranks with a smaller set.
    assert step_at_new_size(20, layout(3, 20, 4), layout(2, 29, 4)) == (29, "samples")
    assert step_at_new_size(10, layout(3), layout(2, 12)) == (12, "ranks")


def test_bad_values():
    with pytest.raises(ValueError, match="steps_done must be >= 0; received -1"):
        step_at_new_size(-1, layout(3), layout(2))
    # Malformed layout entries are treated as not recorded.
    assert step_at_new_size(4, layout(3, "x", 0), layout(2, 6, True)) == (6, "ranks")


def test_input_batch_size():
    np = pytest.importorskip("numpy")
    tf = pytest.importorskip("tensorflow")
    assert input_batch_size({"x": np.zeros((5, 2))}) == 32
    assert input_batch_size({"x": {"a": np.zeros((5, 2))}, "batch_size": 8}) == 8
    assert (
        input_batch_size({"x": [np.zeros(3), np.zeros((3, 2))], "batch_size": 2}) == 2
    )
    assert input_batch_size({"x": tf.data.Dataset.range(3), "batch_size": 4}) is None
    assert input_batch_size({"x": None}) is None


# -- real mpirun: written at N, resumed at M ----------------------------------------


def _resize(tmp_path, written: int, resumed: int):
    from mpi_launch import run_mpi

    killed = run_mpi(written, "resize_backup.py", str(tmp_path), "kill", timeout=400)
    assert killed.returncode != 0, killed.describe()
    assert not killed.records(), killed.describe()  # the job did not finish
    meta = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    rec = meta["keras_mpfp16"]
    steps = {w: ROWS // (w * BATCH) for w in (written, resumed)}
    assert rec["epoch"] == 1 and rec["steps_done"] >= 5, rec
    assert (rec["ranks"], rec["steps_per_epoch"], rec["batch_size"]) == (
        written,
        steps[written],
        BATCH,
    ), rec
    done = rec["steps_done"]
    # The same global samples, rounded down to a whole step at the new size.
    want = (done * written) // resumed

    result = run_mpi(resumed, "resize_backup.py", str(tmp_path), "resume", timeout=400)
    recs = result.ok(resumed)
    for r in recs:
        assert r["epochs_run"] == [1, 2], r
        assert r["first_step"] == want, (r, done, want)
        # Model and optimizer state at the first step run: the backup's.
        assert r["restored_equal"] is True, r
        # Trained: the backup's steps, the rest of epoch 2, all of epoch 3.
        before = steps[written] + done
        assert r["iterations"] == before + steps[resumed] - want + steps[resumed], r
        assert all(len(v) == EPOCHS - 1 for v in r["history"].values()), r
    assert recs[0]["history"] == recs[-1]["history"]
    err = result.stderr
    moved = [line for line in err.splitlines() if "keras_mpfp16: resumed at" in line]
    assert len(moved) == 2, result.describe()  # the step and the rate, once each
    step_line = next(line for line in moved if "-> step" in line)
    assert (
        f"resumed at {resumed} ranks (backup written at {written}): epoch 2, "
        f"step {done} of {steps[written]} at {written} ranks -> step {want} of "
        f"{steps[resumed]} at {resumed} ranks"
    ) in step_line, step_line
    rate_line = next(line for line in moved if "LearningRateScaler" in line)
    # Adam(0.01), rule "linear", 4 warmup epochs, at epoch 1 + want/steps:
    # the ramp 1 + (N - 1) * e / 4 for the new N, and for the old one.
    e = 1 + want / steps[resumed]
    now, was = (0.01 * (1 + (k - 1) * e / 4) for k in (resumed, written))
    for r in recs:  # the first step run has the resumed position's rate
        assert r["first_rate"] == pytest.approx(now, rel=1e-5), (r, now)
    said = re.search(r"rate is now (\S+) \(was (\S+?);", rate_line)
    assert said, rate_line
    assert float(said.group(1)) == pytest.approx(now, rel=1e-5), rate_line
    assert float(said.group(2)) == pytest.approx(was, rel=1e-5), rate_line
    assert not (tmp_path / "backup").exists()  # a finished fit deletes it


@pytest.mark.mpi
def test_backup_written_at_3_ranks_resumes_at_2(tmp_path):
    """np=3, the last rank SIGKILLed in epoch 2 after a step-level backup
    (step s >= 5 of 20); np=2 resumes at step floor(3s/2) of 30 with the
    backup's exact weights and optimizer state, LearningRateScaler's rate
    for 2 ranks (said once), and completes every epoch."""
    _resize(tmp_path, 3, 2)


@pytest.mark.mpi
def test_backup_written_at_2_ranks_resumes_at_3(tmp_path):
    """The other way: written at np=2 (30 steps per epoch), resumed at np=3
    at step floor(2s/3) of 20."""
    _resize(tmp_path, 2, 3)
