"""Files written during `fit` are complete on every rank when `fit` returns,
and callback lists that differ between ranks (Horovod's habit) make no
collective on some ranks only (issue 38, items 1 and 5). The job is
tests/mpi_scripts/files_after_fit.py; rank 0's writes are slowed down so
that leaving `fit` early would show."""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("np_", [2, 3])
def test_files_complete_after_fit_and_rank_zero_only_callbacks(np_, tmp_path):
    result = run_mpi(np_, "files_after_fit.py", str(tmp_path), timeout=500)
    recs = result.ok(np_)
    root = recs[0]
    for r in recs:
        for fit, root_fit in zip(r["files"], root["files"]):
            how = fit["how"]
            # Right after fit, every rank reads the files rank 0 finished:
            # the same checkpoint as after a barrier (issue 38: the previous
            # best one), the CSV log with every epoch's row, the backup of
            # the last epoch (written in the background on rank 0).
            assert fit["right_after"] == fit["after_barrier"], (how, r["rank"], fit)
            assert fit["right_after"] == root_fit["after_barrier"], (how, r["rank"])
            assert fit["right_after"]["csv_lines"] == 1 + 3, (how, fit)
            assert fit["right_after"]["backup_epoch"] == 3, (how, fit)
            assert fit["epochs"] == [0, 1, 2], (how, fit)
            assert fit["model"] == root_fit["model"], (how, r["rank"])
        # A file rank 0 wrote at the end of a collective evaluate.
        assert r["evaluate_report"], r["rank"]
        # A Timeline on rank 0 only: every rank recorded, rank 0 merged.
        assert r["files"][1]["trace"], r["files"][1]
        # Rank 0's BackupAndRestore (appended on rank 0 only) resumes every
        # rank at its epoch.
        assert r["resume"]["epochs"] == [3, 4], r["resume"]
        assert r["resume"]["model"] == root["resume"]["model"]
        assert not r["resume"]["backup_left"]  # Keras's delete at the end
        # Differences that cannot be reconciled: one clear error on every
        # rank, naming the callback and the ranks; the job goes on.
        errors = r["errors"]
        assert set(errors) == {
            "EarlyStopping",
            "ReduceLROnPlateau",
            "ModelCheckpoint",
            "Timeline",
            "KERAS_MPFP16_OVERLAP",
        }
        for name, message in errors.items():
            assert message is not None, (name, r["rank"])
            kind = "SettingsDiffer" if name.startswith("KERAS_") else "CallbacksDiffer"
            assert message.startswith(kind + ":"), message
            assert name in message, message
            assert message == root["errors"][name], (name, r["rank"])
        # Each rank's value is named.
        values = ", ".join(f"rank {k}: {k == np_ - 1}" for k in range(np_))
        assert f"({values})" in errors["KERAS_MPFP16_OVERLAP"]
        others = ", ".join(str(k) for k in range(1, np_))
        lacking = f"rank {others}" if np_ == 2 else f"ranks {others}"
        assert f"on rank 0 but not on {lacking}" in errors["EarlyStopping"]
        assert "root_only" in errors["ReduceLROnPlateau"]
        assert f"on rank {np_ - 1} but not on rank 0" in errors["ModelCheckpoint"]
        assert f"rank {np_ - 1}: 1" in errors["Timeline"]
        assert r["final"] == root["final"]
