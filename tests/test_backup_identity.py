"""A preemption backup belongs to one job (issue 28, item 0), in one process:
the writer record's comparison, the default directory, the resume setting,
and the removal of temporary files left by dead processes. The multi-process
behaviour is `test_a_backup_belongs_to_the_job_that_wrote_it` in
tests/test_mpi_preemption.py."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import pytest

from keras_mpfp16.runtime.supervision import atomic_files, preemption
from keras_mpfp16.training import preemption as training_preemption


def _model(optimizer="adam", units=4):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_script_name_for_the_default_directory():
    assert preemption.script_name(["/a/b/train.py", "--x"]) == "train"
    assert preemption.script_name(["-c"]) == "interactive"
    assert preemption.script_name([""]) == "interactive"
    assert preemption.script_name(["/p/mypkg/__main__.py"]) == "mypkg"
    assert preemption.script_name(["/usr/bin/ipython"]) == "ipython"


def test_default_directory_is_per_script(monkeypatch):
    monkeypatch.delenv("KERAS_MPFP16_PREEMPTION_DIR", raising=False)
    monkeypatch.setattr(sys, "argv", ["/x/train_lstm.py"])
    assert preemption.settings()[1] == os.path.join(
        "keras_mpfp16_preemption", "train_lstm"
    )
    monkeypatch.setenv("KERAS_MPFP16_PREEMPTION_DIR", "/scratch/b")
    assert preemption.settings()[1] == "/scratch/b"


def test_resume_setting_values_and_error(monkeypatch):
    monkeypatch.delenv("KERAS_MPFP16_PREEMPTION_RESUME", raising=False)
    assert preemption.resume_policy() == "same-job"
    for value in ("always", "fresh", "same-job"):
        monkeypatch.setenv("KERAS_MPFP16_PREEMPTION_RESUME", value)
        assert preemption.resume_policy() == value
    monkeypatch.setenv("KERAS_MPFP16_PREEMPTION_RESUME", "yes")
    with pytest.raises(ValueError, match="KERAS_MPFP16_PREEMPTION_RESUME"):
        preemption.resume_policy()


def test_same_job_elsewhere_is_the_same_identity():
    """Ranks, host, time, pid and Slurm job id are recorded, not compared."""
    a = training_preemption.job_identity(_model())
    b = training_preemption.job_identity(_model())
    b.update(ranks=7, host="other", time="later", pid=1, slurm_job_id="99")
    assert training_preemption.differences(b, a) == []


def test_another_optimizer_model_or_arguments_differ(monkeypatch):
    mine = training_preemption.job_identity(_model())
    sgd = training_preemption.job_identity(_model("sgd"))
    wider = training_preemption.job_identity(_model(units=5))
    assert any(
        "optimizer (Adam vs" in d for d in training_preemption.differences(sgd, mine)
    )
    assert training_preemption.differences(wider, mine) == ["model (its configuration)"]
    monkeypatch.setattr(sys, "argv", [sys.argv[0], "--epochs", "9"])
    other_args = training_preemption.job_identity(_model())
    assert training_preemption.differences(other_args, mine)[0].startswith("arguments")
    # No record at all (an older version's backup): not the same job.
    assert training_preemption.differences(mine, None)


def test_learning_rate_changes_do_not_change_the_identity():
    model = _model()
    before = training_preemption.job_identity(model)
    model.optimizer.learning_rate.assign(0.123)
    after = training_preemption.job_identity(model)
    assert training_preemption.differences(after, before) == []


def test_message_names_the_backup_writer_and_the_ways_out():
    mine = training_preemption.job_identity(_model())
    theirs = training_preemption.job_identity(_model("sgd"))
    theirs.update(command="python other.py", time="2026-12-02 10:00:00 UTC")
    theirs.update(host="node3", ranks=3, slurm_job_id="4711")
    text = training_preemption.another_job_message("bk/fit-1", mine, theirs)
    for part in (
        "the preemption backup in bk/fit-1 was written by another job",
        "`python other.py` at 2026-12-02 10:00:00 UTC on node3 (3 ranks, Slurm job 4711)",
        "optimizer (",
        "delete bk/fit-1",
        "KERAS_MPFP16_PREEMPTION_RESUME=fresh",
        "KERAS_MPFP16_PREEMPTION_RESUME=always",
        "KERAS_MPFP16_PREEMPTION_DIR",
    ):
        assert part in text, (part, text)


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        f".model.tmp-{dead.pid}.keras": False,
        f".ck-03.tmp-{dead.pid}.r1.weights.h5": False,
        f".log.tmp-{dead.pid}.r0": False,
        f".model.tmp-{os.getpid()}.r0.keras": True,  # this process: alive
        f".model.tmp-{dead.pid}x.keras": True,  # not our pattern
        "model.keras": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"12345")
    removed = atomic_files.remove_stale_temporaries(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == sorted(
        n for n, keep in names.items() if not keep
    )
    for name, keep in names.items():
        assert (tmp_path / name).exists() == keep, name
    assert atomic_files.remove_stale_temporaries(str(tmp_path / "missing")) == []


def test_temporary_path_names_match_the_cleanup_pattern(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    path = atomic_files.temporary_path("ck/last.keras")
    assert os.path.basename(path) == f".last.tmp-{os.getpid()}.r2.keras"
