"""What `fit` decides from callback lists that differ between ranks
(training/agreement.py; the mpirun side is tests/test_mpi_files_after_fit.py)."""

import keras

from keras_mpfp16.callbacks import RootOnly, Timeline
from keras_mpfp16.training import agreement


def describe(callbacks, timelines=()):
    return agreement.describe(list(callbacks), list(timelines), True, True)


def test_rank_zero_only_writers_and_timeline_are_reconciled(tmp_path):
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "b"), save_freq=5)
    root = describe(
        [
            keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
            backup,
            keras.callbacks.CSVLogger(str(tmp_path / "l.csv")),
        ],
        [Timeline(str(tmp_path / "t.json"), steps="3-9", report="table")],
    )
    assert root["backup"] == {
        "backup_dir": str(tmp_path / "b"),
        "save_freq": 5,
        "delete_checkpoint": True,
    }
    other = describe([RootOnly(backup)])  # root_only on a rank other than 0
    assert agreement.problems([root, describe([]), other]) == []
    stand_in = agreement.timeline_from(root["timelines"][0])
    assert (stand_in.path, stand_in.window.first, stand_in.window.last) == (
        str(tmp_path / "t.json"),
        3,
        9,
    )
    assert stand_in.report_style == "table"


def test_differences_that_change_training_are_named_with_their_ranks(tmp_path):
    stop = keras.callbacks.EarlyStopping()
    root = describe([stop])
    found = agreement.problems([root, describe([]), describe([RootOnly(stop)])])
    assert len(found) == 1
    assert "EarlyStopping is passed to fit on rank 0 but not on ranks 1, 2" in found[0]
    assert "rank 2 got it wrapped in kmp.callbacks.root_only" in found[0]
    ckpt = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))
    found = agreement.problems([describe([]), describe([ckpt])])
    assert (
        found
        and "ModelCheckpoint is passed to fit on rank 1 but not on rank 0" in (found[0])
    )
    timeline = Timeline(None)
    found = agreement.problems([describe([]), describe([], [timeline])])
    assert found and found[0].startswith("Timeline:"), found
