"""KerasTuner as a client: its getting-started search under mpirun (issue 28, item 3).

The real package (an optional test dependency, in the `test` extra; the
test is skipped where it is missing). keras.io's getting-started search
(`RandomSearch`, 3 trials x 2 executions, `get_best_models`, a retrain)
with the README's three lines and docs/frameworks.md's settings, seeded:
at np=2 and 3 the same trials, scores (1e-6 relative) and best
hyperparameters as one process, the best models load, rebuild and run,
Keras's and KerasTuner's output appear once, and the tuner's directory
holds what one process writes, no torn file. Unseeded: the ranks draw
different models and the first `fit` stops with the model-signature error
naming the cause and the fix (KerasTuner catches it per trial; the job
fails later). The job is tests/mpi_scripts/keras_tuner_search.py.
"""

import json

import pytest
from mpi_launch import run_mpi

pytest.importorskip(
    "keras_tuner", reason="keras-tuner is not installed (pip install '.[test]')"
)
# KerasTuner's TensorFlow path imports TensorBoard's hparams API in every
# trial; tensorflow-cpu no longer brings TensorBoard (the `test` extra does).
pytest.importorskip(
    "tensorboard.plugins.hparams",
    reason="tensorboard, which KerasTuner needs with TensorFlow, is not installed",
)

pytestmark = pytest.mark.mpi

ENV = {"KERAS_MPFP16_ROOT_STDOUT_ONLY": "1"}  # KerasTuner prints with print


def records(out_dir, np_):
    return [json.loads((out_dir / f"record-{r}.json").read_text()) for r in range(np_)]


def search(np_, out_dir, mode="seeded"):
    result = run_mpi(
        np_, "keras_tuner_search.py", str(out_dir), mode, env=ENV, timeout=400
    )
    return result


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("np1")
    result = search(1, out_dir)
    assert result.returncode == 0, result.describe()
    return records(out_dir, 1)[0]


@pytest.mark.parametrize("np_", [2, 3])
def test_seeded_search_is_the_one_process_search(np_, tmp_path, one_process):
    result = search(np_, tmp_path)
    assert result.returncode == 0, result.describe()
    recs = records(tmp_path, np_)
    ref = one_process
    for r in recs:
        where = f"rank {r['rank']} of {np_}"
        # The same trials (hyperparameters drawn alike), the same scores up
        # to float rounding, the same best hyperparameters.
        assert [t["values"] for t in r["trials"]] == [
            t["values"] for t in ref["trials"]
        ], where
        for mine, want in zip(r["trials"], ref["trials"]):
            assert abs(mine["score"] - want["score"]) <= 1e-6 * abs(want["score"]), (
                where,
                mine,
                want,
            )
        assert r["best_values"] == ref["best_values"], where
        # The best models loaded and rebuilt (KerasTuner rebuilds them from
        # build_config.json) and run on 5 rows.
        assert r["best_call_shape"] == [5, 10], where
        assert r["best_build_config"]["input_shape"][1:] == [8, 8, 1], where
        assert (
            abs(r["retrain_loss"] - ref["retrain_loss"]) <= 1e-5 * ref["retrain_loss"]
        ), where
    # Bitwise one search on every rank.
    assert all(r["trials"] == recs[0]["trials"] for r in recs), recs
    # Rank 0 alone wrote the project: the files one process writes, whole.
    assert recs[0]["torn"] == [], recs[0]["torn"]
    assert recs[0]["files"] == ref["files"], (recs[0]["files"], ref["files"])
    # Output once: KerasTuner's own lines and Keras's summary.
    out = result.stdout
    assert out.count("Trial 3 Complete") == 1, result.describe()
    assert out.count("Total params") == 1, result.describe()


def test_unseeded_search_stops_with_the_cause_and_the_fix(tmp_path):
    result = search(2, tmp_path, mode="unseeded")
    # Different models on the ranks: such a trial stops at its first step on
    # every rank; KerasTuner records it as failed and the job fails later.
    if result.returncode == 0:
        pytest.skip("both ranks drew the same models (1 chance in 48 per trial)")
    text = result.stderr
    # A different Dense width stops the first step (model signature check);
    # the same width with a different learning rate, the step's settings
    # check. Either message names the cause and the fix.
    assert (
        "ranks are training different models" in text
        or "different optimizer settings" in text
    ), result.describe()
    assert "tuner" in text and "seed" in text, result.describe()
    assert "docs/frameworks.md" in text, result.describe()
