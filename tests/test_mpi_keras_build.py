"""Models built before `fit` come out as Keras builds them (issue 28, item 1).

A `Sequential` without an `Input` fitted under mpirun used to come out with
the first batch's shape, batch dimension included (`model.inputs ==
[(32, 28, 28, 1)]`) where one process gives `(None, 28, 28, 1)`, and a
`.keras` file saved after it could not be called with another batch size.
Now the pre-`fit` build uses the input spec Keras's own first step is traced
with. The same script (tests/mpi_scripts/keras_build.py) under real
`mpirun -np 2` / `-np 3` and in one process: `model.inputs`,
`get_build_config()` and the saved `.keras` config equal one process's, for
Sequential, functional and subclassed models, numpy and `tf.data` inputs,
and the saved model reloads and runs on another batch size.
"""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi

PARTS = [
    f"{model}/{data}"
    for model in ("sequential", "subclassed")
    for data in ("numpy", "numpy-full", "tf.data", "tf.data-drop")
] + ["functional/numpy", "functional/tf.data-drop"]
# Where Keras's own fit leaves the batch dimension None (a partial last
# batch, a dataset batched without drop_remainder) and where it fixes it.
BATCH_DIM = {
    "numpy": None,
    "numpy-full": 32,
    "tf.data": None,
    "tf.data-drop": 32,
}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    result = run_mpi(
        1, "keras_build.py", str(tmp_path_factory.mktemp("np1")), timeout=300
    )
    assert result.returncode == 0, result.describe()
    recs = {r["part"]: r for r in result.records()}
    assert sorted(recs) == sorted(PARTS), result.describe()
    return recs


def test_one_process_reference_is_what_keras_builds(one_process):
    """The reference itself: Keras's own batch dimension, per input kind."""
    for part, r in one_process.items():
        model, data = part.split("/")
        if model == "functional":  # built by its Input, whatever the data
            assert r["inputs"] == [[[None, 6, 6, 1], "float32"]], r
            continue
        assert r["build_config"]["input_shape"][0] == BATCH_DIM[data], (part, r)
        if model == "sequential":
            assert r["inputs"] == [[[BATCH_DIM[data], 6, 6, 1], "float32"]], r
        if BATCH_DIM[data] is None:
            assert r["reload_call"] == "ok", (part, r["reload_call"])


@pytest.mark.parametrize("np_", [2, 3])
def test_models_are_built_as_one_process_builds_them(np_, tmp_path, one_process):
    result = run_mpi(np_, "keras_build.py", str(tmp_path), timeout=400)
    recs = result.ok()
    assert len(recs) == np_ * len(PARTS), result.describe()
    for r in recs:
        want = one_process[r["part"]]
        where = (r["part"], f"rank {r['rank']} of {np_}")
        assert r["inputs"] == want["inputs"], (*where, r["inputs"], want["inputs"])
        assert r["build_config"] == want["build_config"], (
            *where,
            r["build_config"],
            want["build_config"],
        )
        assert r["saved_config"] == want["saved_config"], where
        # The saved model reloads and runs on 5 rows (not the batch size),
        # giving the trained model's outputs.
        assert r["reload_call"] == "ok", (*where, r["reload_call"])
        assert r["reload_diff"] <= 1e-6, where
