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


def test_settings_the_step_depends_on_travel_and_are_named_when_they_differ():
    """The settings that decide the train step's collectives are part of each
    rank's description; one that differs is named with every rank's value
    (the `fit` side, every rank raising SettingsDiffer: the mpirun test)."""
    from keras_mpfp16 import _settings

    agreed = {s.name for s in _settings.settings() if s.same_on_every_rank}
    assert agreed == {
        "KERAS_MPFP16_OVERLAP",
        "KERAS_MPFP16_WIRE_PIPELINE_SEGMENT",
        "KERAS_MPFP16_WIRE_SCHEDULE",
    }
    # Every setting whose doc asks for the same value on every rank is checked.
    for s in _settings.settings():
        if "must be the same on every rank" in s.doc.lower():
            assert s.same_on_every_rank, s.name
    mine = describe([])
    assert {name for name, _ in mine["settings"]} == agreed
    assert agreement.settings_problems([mine, describe([])]) == []
    _settings.set("wire_pipeline_segment", 4096)
    try:
        other = describe([])
    finally:
        _settings.reset("wire_pipeline_segment")
    found = agreement.settings_problems([mine, other, mine])
    assert len(found) == 1, found
    assert found[0].startswith(
        "KERAS_MPFP16_WIRE_PIPELINE_SEGMENT differs between ranks "
        "(rank 0: 0, rank 1: 4096, rank 2: 0)."
    ), found
    assert "mpirun -x KERAS_MPFP16_WIRE_PIPELINE_SEGMENT" in found[0]
