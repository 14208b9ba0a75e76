"""Users' whole scripts under real `mpirun -np 2` / `-np 3`, against one process.

Replica state (issue 11) and stock Keras workflows (issue 12): unseeded
ranks, BatchNorm, frozen layers, stock EarlyStopping / ReduceLROnPlateau /
ModelCheckpoint / CSVLogger / BackupAndRestore left on every rank, unsharded
validation data, evaluate / predict / load_model on all ranks or on rank 0
alone. The job is tests/mpi_scripts/whole_script.py (keras.io's Conv1D
classifier: tests/mpi_scripts/conv1d_script.py; keras.io's text classifier
from files on disk with a model on raw strings:
tests/mpi_scripts/text_classifier.py, issue 38).

The input-kinds, custom train_step and kmp-layers checks of a size share one
job (tests/mpi_scripts/scenarios.py; a failing one fails only its test); the
others read the job's output or files, set its environment, or kill it, and
keep jobs of their own.
"""

import os

import pytest
from mpi_launch import SharedJobs, ok, rel, run_mpi

pytestmark = pytest.mark.mpi


def scenario_of(item):
    """The (np, scenario, command) a test of this file reads, or None."""
    command = {
        "test_every_input_kind_is_split_and_exact": (
            "whole_script.py",
            "{dir}",
            "inputs",
        ),
        "test_custom_train_step_logs_match_one_process": (
            "whole_script.py",
            "{dir}",
            "custom",
        ),
        "test_kmp_recurrent_layers_train_in_every_policy": ("kmp_layers_fit.py",),
    }.get(item.originalname)
    if command is None:
        return None
    return item.callspec.params["np_"], item.originalname, command


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    return SharedJobs.for_module(request, tmp_path_factory, scenario_of, 560)


RTOL = 1e-6


@pytest.mark.parametrize("np_", [2, 3])
def test_replica_state_is_one_model(np_, tmp_path):
    recs = ok(run_mpi(np_, "whole_script.py", str(tmp_path), "replica", timeout=400))
    assert len(recs) == np_
    # The ranks really started from different models ...
    assert any(r["initial_differs"] for r in recs[1:])
    for r in recs:
        # ... and the first update is one process's update from rank 0's
        # initial weights on the concatenated batch (float32 rounding only).
        assert r["first_update_diff"] <= 1e-6, r["first_update_diff"]

    # BatchNorm + frozen layer + Dropout, stock EarlyStopping and
    # ReduceLROnPlateau on val_loss, 10 seeds: the same stop epoch, the same
    # learning rates, and every variable bitwise identical on every rank.
    r0 = recs[0]
    assert len(r0["runs"]) == 10
    for r in recs[1:]:
        for seed, (mine, root) in enumerate(zip(r["runs"], r0["runs"])):
            assert mine == root, (seed, r["rank"])
    # The test can fail: the callbacks really acted in some runs.
    assert any(run["stopped_epoch"] > 0 for run in r0["runs"])
    assert any(min(run["lrs"]) < max(run["lrs"]) for run in r0["runs"])
    assert any(run["epochs"] < 12 for run in r0["runs"])

    # check_replicas_every covers non-trainable variables: a frozen layer
    # changed on the last rank is named.
    for r in recs:
        err = r["frozen_error"]
        assert err and "diverged" in err and f"[{np_ - 1}]" in err, err

    # A learning rate changed on one rank only stops every rank, naming
    # the ranks' values.
    for r in recs:
        err = r["lr_error"]
        assert err and "different optimizer settings" in err, err
        assert "0.123" in err and "0.1" in err, err


@pytest.mark.parametrize("np_", [2, 3])
def test_stock_workflow_matches_one_process(np_, tmp_path):
    result = run_mpi(
        np_,
        "whole_script.py",
        str(tmp_path),
        "logs",
        timeout=300,
        env={"KERAS_MPFP16_EVALUATE_WAIT": "2"},
    )
    recs = ok(result)
    assert len(recs) == np_
    for r in recs:
        # Every log of fit (train and validation, loss, accuracy, AUC) is the
        # one-process log; no GlobalMetrics, validation data not sharded.
        hist, ref = r["history"], r["ref_history"]
        assert set(hist) == set(ref), (sorted(hist), sorted(ref))
        for key in ref:
            for got, want in zip(hist[key], ref[key]):
                assert rel(got, want) <= RTOL, (key, hist[key], ref[key])
        # evaluate on all ranks (unsharded, with sample weights) is the
        # one-process evaluate on the whole set.
        for key, want in r["ref_evaluate"].items():
            assert rel(r["evaluate"][key], want) <= RTOL, key
        assert r["split_predict_diff"] <= 1e-5
    # Rank 0 alone: load_model + evaluate + predict finish (no collective)
    # and give the one-process numbers.
    alone = recs[0]["alone"]
    for key, want in recs[0]["ref_evaluate"].items():
        assert rel(alone["evaluate"][key], want) <= RTOL, key
    assert alone["predict_diff"] <= 1e-5
    # Stock file-writing callbacks on every rank: one writer, complete files.
    files = recs[0]["files"]
    assert files == ["backup", "best.weights.h5", "last.keras", "log.csv"], files
    assert sorted(os.listdir(tmp_path / "backup")) == [
        "latest.weights.h5",
        "training_metadata.json",
    ]
    assert recs[0]["csv_lines"] == 1 + 3  # header + 3 epochs, written once


@pytest.mark.parametrize("np_", [2, 3])
def test_kill_mid_checkpoint_and_restart_resumes_identically(np_, tmp_path):
    """Stock BackupAndRestore + ModelCheckpoint on every rank: rank 0 killed
    while writing the epoch-3 checkpoint; the restarted job resumes on every
    rank at epoch 3 and ends bitwise identical to the uninterrupted run."""
    import keras

    import keras_mpfp16  # noqa: F401  (registers DistributedOptimizer for load_model)

    full = ok(run_mpi(np_, "kill_restart.py", str(tmp_path), "full", timeout=300))
    killed = run_mpi(np_, "kill_restart.py", str(tmp_path), "killed", timeout=300)
    assert killed.returncode != 0, killed.describe()
    assert not killed.records()  # nobody finished

    # The checkpoint being written when the job died is the previous one,
    # complete (atomic rename): epochs 1 and 2, i.e. 2 epochs of steps.
    steps = full[0]["iterations"] // 4
    last = keras.models.load_model(tmp_path / "run" / "last.keras")
    assert int(last.optimizer.iterations.numpy()) == 2 * steps

    resumed = ok(run_mpi(np_, "kill_restart.py", str(tmp_path), "resume", timeout=300))
    for r in resumed:
        assert r["epochs_run"] == [2, 3], r["epochs_run"]
        assert r["digest"] == full[0]["digest"]
        assert r["iterations"] == full[0]["iterations"]
        for key, values in r["history"].items():
            assert values == full[0]["history"][key][2:], key


@pytest.mark.parametrize("np_", [2, 3])
def test_every_input_kind_is_split_and_exact(np_, jobs):
    """Validation in fit and evaluate on all ranks, for tf.data of known and
    unknown length and PyDataset: the one-process numbers. validation_split:
    the union of the ranks' tails. A batch-frequency ModelCheckpoint writes."""
    recs = jobs.get(np_).records("test_every_input_kind_is_split_and_exact")
    assert len(recs) == np_
    for r in recs:
        results = r["results"]
        for name in ("tf.data", "tf.data-unknown", "PyDataset"):
            got = results[name]
            for key, values in got["ref_fit"].items():
                for a, b in zip(got["fit"][key], values):
                    assert rel(a, b) <= RTOL, (name, key, got["fit"], values)
            for key, b in got["ref_evaluate"].items():
                assert rel(got["evaluate"][key], b) <= RTOL, (name, key)
        split = results["validation_split"]
        assert rel(split["val_loss"], split["union_loss"]) <= RTOL
    assert recs[0]["files"] == ["every3.weights.h5"]


@pytest.mark.parametrize("np_", [2, 3])
def test_kmp_recurrent_layers_train_in_every_policy(np_, jobs):
    """kmp LSTM/GRU, Bidirectional, masking, unknown time dimension, partial
    last batches, stateful lanes: trains under float32, mixed_float16 and
    mixed_bfloat16 (this crashed on every rank at the first step when the
    buckets were sized from the gradients' static shapes)."""
    recs = jobs.get(np_).records("test_kmp_recurrent_layers_train_in_every_policy")
    assert len(recs) == np_
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        for r in recs:
            mine, root = r["policies"][policy], recs[0]["policies"][policy]
            assert mine["finite"], (policy, r["rank"])
            assert mine["digest"] == root["digest"], (policy, r["rank"])
            assert mine["lanes_digest"] == root["lanes_digest"], (policy, r["rank"])


@pytest.mark.parametrize("np_", [2, 3])
def test_custom_train_step_logs_match_one_process(np_, jobs):
    """keras.io's custom train_step/test_step with its own loss tracker and
    metric (a subclassed model, unseeded ranks): global logs, train and
    validation, equal to one process's; one model on every rank."""
    recs = jobs.get(np_).records("test_custom_train_step_logs_match_one_process")
    assert len(recs) == np_
    assert len({r["digest"] for r in recs}) == 1
    for r in recs:
        hist, ref = r["history"], r["ref_history"]
        assert set(hist) == set(ref) == {"loss", "mae", "val_loss", "val_mae"}
        for key in ref:
            for got, want in zip(hist[key], ref[key]):
                assert rel(got, want) <= RTOL, (key, hist[key], ref[key])


@pytest.mark.parametrize("np_", [2, 3])
def test_conv1d_classifier_with_stock_callbacks_and_load_model(np_, tmp_path):
    """keras.io's Conv1D + BatchNorm time-series classifier, three lines
    added: ModelCheckpoint(save_best_only), ReduceLROnPlateau, EarlyStopping,
    validation_split, then load_model right after fit and evaluate on every
    rank (issue 38: ranks other than 0 loaded the previous best checkpoint)."""
    result = run_mpi(np_, "conv1d_script.py", str(tmp_path), timeout=500)
    recs = ok(result)
    assert len(recs) == np_
    root = recs[0]
    for r in recs:
        # One model everywhere, and the checkpoint every rank loads right
        # after fit is the one on disk once every rank is past fit.
        assert r["fitted"] == root["fitted"], r["rank"]
        assert r["loaded_right_after"] == r["loaded_after_barrier"], r
        assert r["loaded_right_after"] == root["loaded_after_barrier"], r["rank"]
        assert r["epochs"] == root["epochs"] and r["lrs"] == root["lrs"]
        # The best val_loss the checkpoint was saved at is one process's
        # val_loss of the loaded model on the union of the ranks' tails.
        assert rel(r["best"], r["ref_val_loss"]) <= RTOL, r
        # The split evaluate of the loaded model is one process's evaluate.
        assert rel(r["test_loss"], r["ref_test"]["loss"]) <= RTOL, r
        acc = r["ref_test"]["sparse_categorical_accuracy"]
        assert rel(r["test_acc"], acc) <= RTOL, r
        assert r["test_acc"] == root["test_acc"]
    # The callbacks acted (the learning rate was reduced, or training
    # stopped early) on every rank alike (checked above).
    assert root["epochs"] < 20 or min(root["lrs"]) < max(root["lrs"]), root
    # Both learned: not bit for bit one process's training (each rank's
    # BatchNorm normalises its own batch, unseeded ranks and shuffles), and
    # the best epoch picked on 80 validation rows is noisy (measured: test
    # accuracy 0.97 / 1.0 here against 0.89 / 1.0 for one process).
    assert root["test_acc"] >= 0.8 and root["one_process_acc"] >= 0.8, root
    # One printer: Keras's progress and the script's prints once.
    assert result.stdout.count("Test accuracy") == 1, result.stdout[-3000:]
    assert result.stdout.count("Epoch 1/") == 1, result.stdout[-3000:]


def write_reviews(root, seed=0):
    """A small corpus like keras.io's IMDB folders: `train/{pos,neg}/*.txt`
    (320 files) and `test/{pos,neg}/*.txt` (200), short reviews of filler
    words with a few class words (and now and then one of the other
    class's), so the classes are learnable but not trivially."""
    import numpy as np

    rng = np.random.default_rng(seed)
    filler = (
        "the movie film plot actors story was and a it this of scenes director "
        "music ending cast script i watched saw with but at some its"
    ).split()
    cue = {
        "pos": "great excellent wonderful loved superb enjoyable brilliant moving".split(),
        "neg": "awful terrible boring hated worst dull poor waste".split(),
    }
    for split, per_class in (("train", 160), ("test", 100)):
        for label, other in (("pos", "neg"), ("neg", "pos")):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                words = list(rng.choice(filler, size=rng.integers(6, 14)))
                words += list(rng.choice(cue[label], size=rng.integers(2, 5)))
                if rng.random() < 0.3:
                    words.append(str(rng.choice(cue[other])))
                rng.shuffle(words)
                (folder / f"{i}_{label}.txt").write_text(" ".join(words) + ".\n")


@pytest.mark.parametrize("np_", [2, 3])
def test_text_classifier_from_files_with_checkpoint_and_raw_strings(np_, tmp_path):
    """keras.io's text classifier, three lines added: text files on disk ->
    text_dataset_from_directory -> TextVectorization -> .cache().prefetch()
    -> kmp.shard -> fit with ModelCheckpoint(save_best_only) and validation
    data -> load_model right after fit -> evaluate, then the end-to-end model
    on raw strings evaluated on the string Dataset (issue 38: a stale
    checkpoint on ranks other than 0, cached pipelines cut short by the data
    check, string datasets failing in evaluate)."""
    write_reviews(tmp_path / "reviews")
    result = run_mpi(np_, "text_classifier.py", str(tmp_path), timeout=500)
    recs = ok(result)
    assert len(recs) == np_
    root = recs[0]
    # 200 test files in batches of 16: 13 batches, dealt over the ranks.
    assert root["test_total_batches"] == 13
    assert sum(r["test_batches"] for r in recs) == 13, recs
    assert sum(r["e2e_batches"] for r in recs) == 13, recs
    for r in recs:
        assert r["test_batches"] < 13 and r["e2e_batches"] < 13, r
        # One vectorizer and one model everywhere; the checkpoint every rank
        # loads right after fit is the one on disk once every rank is past it.
        assert r["vocabulary"] == root["vocabulary"], r["rank"]
        assert r["fitted"] == root["fitted"], r["rank"]
        assert r["loaded_right_after"] == r["loaded_after_barrier"], r
        assert r["loaded_right_after"] == root["loaded_after_barrier"], r["rank"]
        # The best val_loss is one process's val_loss of the loaded weights.
        assert rel(r["best"], root["ref_val"]["loss"]) <= RTOL, r
        # Both split evaluates are one process's evaluate of the loaded
        # weights on the whole test set.
        for name, ref in (("test", "ref_test"), ("e2e", "ref_e2e")):
            for key in ("loss", "accuracy"):
                assert rel(r[name][key], root[ref][key]) <= RTOL, (name, key, r, root)
    # The last epoch was the best, so the checkpoint loaded right after fit
    # was written at the end of fit (where ranks other than 0 used to load
    # the previous one).
    assert root["val_loss"][-1] == min(root["val_loss"]) == root["best"], root
    # It learned (the test can tell a right number from a wrong one).
    assert root["test"]["accuracy"] >= 0.8, root
    # One printer: Keras's progress and the script's lines once.
    assert result.stdout.count("Test accuracy") == 1, result.stdout[-3000:]
    assert result.stdout.count("End-to-end test accuracy") == 1, result.stdout[-3000:]
    assert result.stdout.count("Epoch 1/") == 1, result.stdout[-3000:]
