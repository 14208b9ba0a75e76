"""Smoke runs of the examples and the convergence scripts, at tiny sizes.

Each run is a real process (plain `python`, or `mpirun -np 2` through
`mpi_launch.run_mpi`) under a timeout; the tests check that it finishes and
prints its metric as a finite number in range. The per-shot metric itself is
checked against a direct threshold sweep.
"""

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_launch import mpi_env, run_mpi

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import shots  # noqa: E402  (examples/shots.py)

# The real EEG set lives outside the repository; a clone without it skips.
EEG = Path(
    os.environ.get(
        "KERAS_MPFP16_EEG", ROOT.parent / "shared" / "data" / "SelfRegulationSCP1.npz"
    )
)
needs_eeg = pytest.mark.skipif(
    not EEG.exists(),
    reason=f"real EEG data not found at {EEG} (set KERAS_MPFP16_EEG to its path)",
)


def run_python(script, *args, timeout=120):
    """Runs `python examples/SCRIPT ARGS`; returns stdout, failing with the output."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=mpi_env(),
        cwd=ROOT,
    )
    assert done.returncode == 0, (
        f"{script} {args} exited {done.returncode} after "
        f"{time.monotonic() - start:.1f}s\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout


def metric(output, label):
    """The number after `label:` in the output, checked finite."""
    found = re.findall(rf"{label}: ([-+0-9.eEnaif]+)", output)
    assert found, f"no '{label}:' in the output:\n{output[-3000:]}"
    value = float(found[-1])
    assert math.isfinite(value), (label, value)
    return value


# -- the per-shot metric --------------------------------------------------------


def test_roc_auc_is_the_area_under_the_alarm_roc():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=80).astype(float)  # many ties
    labels = rng.random(80) < 0.2
    # Sweep every alarm threshold: an alarm when the score exceeds t.
    thresholds = np.r_[np.unique(scores) - 0.5, scores.max() + 1]
    tpr = np.array([(scores[labels] > t).mean() for t in thresholds])
    fpr = np.array([(scores[~labels] > t).mean() for t in thresholds])
    area = float(np.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2))
    assert shots.roc_auc(scores, labels) == pytest.approx(area, abs=1e-12)
    assert shots.roc_auc([1, 2, 3], [0, 1, 1]) == 1.0
    assert shots.roc_auc([3, 2, 1], [0, 1, 1]) == 0.0
    assert math.isnan(shots.roc_auc([1, 2], [1, 1]))


def test_alarm_scores_ignore_the_warning_time():
    outputs = [np.array([0.1, 0.2, 0.9]), np.array([0.7, 0.1, 0.1, 0.95])]
    np.testing.assert_allclose(shots.alarm_scores(outputs), [0.9, 0.95])
    np.testing.assert_allclose(shots.alarm_scores(outputs, warning_steps=1), [0.2, 0.7])
    np.testing.assert_allclose(shots.alarm_scores(outputs, warning_steps=9), [0.1, 0.7])


def test_synthetic_shots():
    data = shots.generate_shots(400, min_length=50, max_length=90, horizon=20, seed=3)
    again = shots.generate_shots(400, min_length=50, max_length=90, horizon=20, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(data.signals, again.signals))
    assert 50 <= data.lengths.min() and data.lengths.max() <= 90
    assert 0.08 < data.disruptive.mean() < 0.25  # rare, like real disruptions
    for signal, target, disruptive in zip(data.signals, data.targets, data.disruptive):
        assert signal.shape == (len(target), 6) and signal.dtype == np.float32
        assert target.sum() == (20 if disruptive else 0)
        assert not disruptive or target[-20:].all()
    profiled = shots.generate_shots(8, min_length=30, max_length=30, profile_points=16)
    assert profiled.stacked().shape == (8, 30, 22) and profiled.profile_points == 16


# -- the examples -----------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.slow
def test_disruption_predictor_two_ranks():
    result = run_mpi(
        2, str(EXAMPLES / "disruption_predictor.py"), "--quick", timeout=180
    )
    assert result.returncode == 0, result.describe()
    assert result.stdout.count("test AUC:") == 1, result.describe()  # rank 0 only
    assert "ranks 2," in result.stdout
    assert 0.0 <= metric(result.stdout, "test AUC") <= 1.0


@pytest.mark.slow
def test_disruption_predictor_conv_front_end_mixed_float16():
    out = run_python(
        "disruption_predictor.py", "--quick", "--conv", "--policy", "mixed_float16"
    )
    assert "TimeDistributed" in out and "policy mixed_float16" in out
    assert 0.0 <= metric(out, "test AUC") <= 1.0


@pytest.mark.slow
@needs_eeg
def test_disruption_predictor_on_eeg():
    out = run_python(
        "disruption_predictor.py", "--quick", "--data", EEG, "--lstm", "keras"
    )
    assert "34 training shots" in out
    assert 0.0 <= metric(out, "test AUC") <= 1.0


def write_tiny_imdb(path, reviews=96, vocabulary=60, seed=0):
    """An .npz in the layout of Keras's imdb.npz: object arrays of index lists."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split in ("train", "test"):
        labels = rng.integers(0, 2, size=reviews)
        x = np.empty(reviews, dtype=object)
        for i, label in enumerate(labels):
            words = rng.integers(1, vocabulary, size=int(rng.integers(5, 30)))
            # Index 7 means "good", 8 "bad": the sentiment is learnable.
            words[rng.random(len(words)) < 0.3] = 7 if label else 8
            x[i] = words.tolist()
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, labels
    np.savez(path, **arrays)


def test_imdb_lstm_on_a_local_file(tmp_path):
    data = tmp_path / "imdb.npz"
    write_tiny_imdb(data)
    out = run_python(
        "imdb_lstm.py", "--data", data, "--max-features", 64, "--maxlen", 24,
        "--embedding", 8, "--units", 4, "--epochs", 1, "--batch-size", 16,
        "--lstm", "kmp",
    )  # fmt: skip
    assert "(96 reviews, 1 ranks, policy float32)" in out
    assert 0.0 <= metric(out, "validation accuracy") <= 1.0


def test_imdb_lstm_on_a_folder_with_load_py(tmp_path):
    # The layout of ../shared/data/imdb: a load.py whose load_data(num_words=...)
    # is a drop-in for keras.datasets.imdb.load_data.
    write_tiny_imdb(tmp_path / "tiny.npz", reviews=80)
    (tmp_path / "load.py").write_text(
        "import os, numpy as np\n"
        "def load_data(num_words=None, **_):\n"
        "    f = np.load(os.path.join(os.path.dirname(__file__), 'tiny.npz'),\n"
        "                allow_pickle=True)\n"
        "    return (f['x_train'], f['y_train']), (f['x_test'], f['y_test'])\n"
    )
    out = run_python(
        "imdb_lstm.py", "--data", tmp_path, "--max-features", 64, "--maxlen", 24,
        "--embedding", 8, "--units", 4, "--epochs", 1, "--batch-size", 16,
    )  # fmt: skip
    assert "(80 reviews, 1 ranks, policy float32)" in out


# -- the convergence scripts ------------------------------------------------------


@pytest.mark.slow
def test_scaling_study_smoke(tmp_path):
    out_json = tmp_path / "scaling.json"
    out = run_python("convergence/scaling.py", "--smoke", "--out", out_json)
    assert "final test AUC" in out
    import json

    result = json.loads(out_json.read_text())
    assert {(r["workers"], r["rule"]) for r in result["runs"]} == {
        (1, "none"),
        (4, "none"),
        (4, "linear"),
    }
    for row in result["runs"]:
        assert 0.0 <= row["test_auc"] <= 1.0
    # N workers of batch b take N times fewer steps than one.
    steps = {(r["workers"], r["rule"]): r["steps"] for r in result["runs"]}
    assert steps[(1, "none")] == 4 * steps[(4, "linear")]


# -- the GPU scripts, on a machine without a GPU -----------------------------------


def test_gpu_bench_smoke(tmp_path):
    """The prepared GPU measurement runs end to end on a CPU (tiny sizes):
    every speed configuration and the drift test, one JSON."""
    import json

    out_json = tmp_path / "gpu_bench.json"
    run_python("benchmarks/gpu_bench.py", "--smoke", "--out", out_json, timeout=900)
    summary = json.loads(out_json.read_text())
    assert not summary["errors"] and not summary["skipped"], summary
    speed = {r["config"]: r for r in summary["results"] if r["part"] == "speed"}
    assert set(speed) == {
        "keras-f16",
        "keras-f32-tf32",
        "keras-f32-notf32",
        "ours",
        "ours-rec-split",
        "ours-rec-compute",
        "ours-in-compute",
        "ours-notf32",
        "ours-tf32x3",
    }
    for r in speed.values():
        assert r["step_s"] > 0 and math.isfinite(r["loss"]), r
    assert speed["ours"]["recurrence_path"] == "loop"  # no GPU here
    assert set(summary["step_time_over_keras_f16"]) == set(speed)
    drift = [r for r in summary["results"] if r["part"] == "drift"]
    assert {(r["layer"], r["T"]) for r in drift} == {("lstm", 32), ("gru", 32)}
    for r in drift:
        assert all(math.isfinite(e) for e in r["err_vs_f32_notf32"].values()), r


@pytest.mark.mpi
def test_gpu_check_reports_a_correct_allreduce_path():
    result = run_mpi(2, str(EXAMPLES / "gpu_check.py"), timeout=120)
    reports = result.ok()
    assert [r["rank"] for r in reports] == [0, 1], result.describe()
    for r in reports:
        assert r["correct"] is True and r["path"] in ("host", "device"), r


@pytest.mark.mpi
@pytest.mark.slow
def test_peer_comparison_smoke(tmp_path):
    """One tiny round of the peer comparison: every configuration runs."""
    import json

    out_json = tmp_path / "peers.json"
    run_python(
        "benchmarks/peers.py",
        "--rounds",
        "1",
        "--steps",
        "3",
        "--policies",
        "float32",
        "--out",
        out_json,
        timeout=400,
    )
    result = json.loads(out_json.read_text())["policies"]["float32"]
    for config, figures in result["samples_per_s"].items():
        assert len(figures) == 1 and figures[0] > 0, (config, figures)
    assert {"plain", "pinned", "ours2"} <= set(result["samples_per_s"])
    assert result["median_ratios"]["ours2_over_2x_pinned (scaling efficiency)"] > 0


# -- the README's main job ----------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_main_job_trains_on_two_ranks(policy):
    """`mpirun -np 2 python examples/train_keras.py`, smaller: the loss falls."""
    result = run_mpi(
        2,
        str(EXAMPLES / "train_keras.py"),
        "--epochs",
        "3",
        "--samples",
        "2048",
        "--timesteps",
        "32",
        "--policy",
        policy,
        timeout=180,
    )
    assert result.returncode == 0, result.describe()
    out = result.stdout
    assert out.count("training loss per epoch:") == 1, result.describe()  # rank 0
    assert f"ranks: 2  policy: {policy}" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("training loss"))
    losses = [float(v) for v in line.split(":", 1)[1].split(",")]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert 0.0 <= metric(out, "final validation accuracy") <= 1.0


# -- benchmark scripts that stand in for library functions -------------------------


@pytest.mark.mpi
def test_collective_cost_smoke(tmp_path):
    """collective_cost.py replaces the library's collectives with local
    copies for its `*_local` layers; a change of their signatures must not
    break it silently (it did once: `alltoall_into`'s `block_bytes`)."""
    import json

    out_json = tmp_path / "cost.json"
    run_python(
        "benchmarks/collective_cost.py",
        "--ranks",
        "2",
        "--rounds",
        "1",
        "--calls",
        "2",
        "--reps",
        "1",
        "--out",
        out_json,
        timeout=300,
    )
    result = json.loads(out_json.read_text())
    (job,) = result["results"]["2"]
    assert {"float32_local", "float16_local", "float16_wire"} <= set(job["layers"])
    for layer in job["layers"].values():
        assert 0 < layer["median_us"] < 60e6
