"""`wire_dtype="auto"`: the decision, its agreement over ranks, the pin.

One process: the decision rule (`wire_tuner.decide`), the drift watch, the
argument and setting errors. Real `mpirun` at np=2 and 3: ranks that
measure different times still apply one decision (rank 0's, from the
slowest rank's numbers), the step is re-traced with the chosen wire, the
timeline shows the decision, a pinned wire is respected without measuring,
a sparse-only model stays on float32, the real probe runs, and a second
`fit` of the same model neither measures nor re-traces.
"""

import json
import os

import pytest
from mpi_launch import run_mpi

from keras_mpfp16 import config
from keras_mpfp16.runtime.mpi import wire_tuner


def timings(f32, f16, sizes=(10,)):
    return {s: {"float32": list(f32), "float16": list(f16)} for s in sizes}


def test_decision_takes_the_slowest_rank_and_favours_float32_on_ties():
    fast16 = timings([1.0, 1.0, 1.0], [0.5, 0.5, 0.5])
    slow16 = timings([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert wire_tuner.decide([fast16], [10]).wire_dtype == "float16"
    # One rank for which float16 is slower decides for everyone.
    both = wire_tuner.decide([fast16, slow16], [10])
    assert both.wire_dtype == "float32"
    assert both.seconds == {"float32": 1.0, "float16": 2.0}
    # Within the margin: float32 (exact) wins.
    close = timings([1.0] * 3, [1.0 - wire_tuner.MARGIN / 2] * 3)
    assert wire_tuner.decide([close], [10]).wire_dtype == "float32"
    # Repeated bucket sizes count once per bucket; medians, not means.
    d = wire_tuner.decide(
        [{**timings([1, 1, 9], [2, 2, 2]), **timings([5] * 3, [1] * 3, (20,))}],
        [10, 20, 20],
    )
    assert d.seconds == {"float32": 11.0, "float16": 4.0}
    assert d.wire_dtype == "float16"
    assert [b["count"] for b in d.buckets] == [1, 2]
    assert "float32 11000.0 ms, float16 4000.0 ms" in d.reason


def test_drift_watch_fires_on_a_change_of_the_median_step_time():
    watch = wire_tuner.DriftWatch(every=4, drift=0.25)
    fired = [watch.step(1.0) for _ in range(8)]  # baseline, then steady
    assert not any(fired)
    fired = [watch.step(1.5) for _ in range(4)]
    assert fired == [False, False, False, True]
    watch.reset()
    assert watch.baseline is None


def test_trial_steps_fit_the_steps_left_or_leave_the_reductions_to_decide():
    assert wire_tuner.trial_steps(None, 1) == wire_tuner.TRIAL_STEPS
    assert wire_tuner.trial_steps(100, 1) == wire_tuner.TRIAL_STEPS
    assert wire_tuner.trial_steps(9, 1) == 4  # a 10-step fit decided at step 1
    assert wire_tuner.trial_steps(7, 1) == wire_tuner.MIN_TRIAL_STEPS
    assert wire_tuner.trial_steps(6, 1) == 0
    assert wire_tuner.trial_steps(6, 0) == wire_tuner.MIN_TRIAL_STEPS


def test_wire_dtype_and_pin_errors_name_the_value_and_the_choices():
    import keras_mpfp16 as kmp

    with pytest.raises(ValueError, match=r"wire_dtype.*'auto'.*'fast'"):
        kmp.DistributedOptimizer("sgd", wire_dtype="fast")
    assert kmp.DistributedOptimizer("sgd", wire_dtype="auto").wire_dtype == "auto"
    with pytest.raises(ValueError, match=r"KERAS_MPFP16_WIRE_AUTO.*float8"):
        config.set("wire_auto", "float8")
    config.set("wire_auto", "bfloat16")
    try:
        assert wire_tuner.pinned() == "bfloat16"
    finally:
        config.reset("wire_auto")
    assert wire_tuner.pinned() is None


def _run(np_, mode, tmp_path, env=None, timeout=300):
    res = run_mpi(np_, "wire_auto.py", str(tmp_path), mode, timeout=timeout, env=env)
    recs = res.ok(np_)
    return recs, res


def _trace(tmp_path):
    with open(os.path.join(tmp_path, "trace.json")) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3])
def test_ranks_measuring_different_times_apply_one_decision(np_, tmp_path):
    recs, res = _run(np_, "split", tmp_path)
    # Rank 0 alone measured float16 faster; the last rank slower: float32.
    assert {r["effective"] for r in recs} == {"float32"}
    decisions = [r["decision"] for r in recs]
    assert all(d == decisions[0] for d in decisions)
    assert decisions[0]["seconds"]["float16"] > decisions[0]["seconds"]["float32"]
    assert len({r["weights_bytes"] for r in recs}) == 1
    assert res.stderr.count("wire_dtype='auto' chose float32") == 1  # rank 0, once


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3])
def test_a_float16_decision_retraces_the_step_and_shows_in_the_timeline(np_, tmp_path):
    recs, _ = _run(np_, "f16", tmp_path)
    assert {r["effective"] for r in recs} == {"float16"}
    assert {r["config_wire"] for r in recs} == {"auto"}
    assert len({json.dumps(r["decision"], sort_keys=True) for r in recs}) == 1
    assert len({r["weights_bytes"] for r in recs}) == 1
    events = _trace(tmp_path)
    said = [e for e in events if e["name"] == "wire auto: float16"]
    assert len(said) == np_ and said[0]["ph"] == "i"
    assert "float16 is faster" in said[0]["args"]["reason"]
    assert "float16 confirmed" in said[0]["args"]["reason"]
    steps = recs[0]["decision"]["step_seconds"]
    assert steps["float16"] < steps["float32"]
    # Reductions before the decision ran float32, after it float16.
    buckets = [
        e for e in events if e.get("pid") == 0 and e["name"].startswith("bucket")
    ]
    wires = [e["args"]["wire_dtype"] for e in sorted(buckets, key=lambda e: e["ts"])]
    assert wires[0] == "float32" and wires[-1] == "float16"


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3])
def test_whole_steps_overrule_the_reductions(np_, tmp_path):
    # The reductions favour float16; whole train steps (injected, different
    # on every rank) favour float32: one float32 decision everywhere, after
    # float16 steps ran in the trial.
    recs, res = _run(np_, "steps32", tmp_path)
    assert {r["effective"] for r in recs} == {"float32"}
    d = recs[0]["decision"]
    assert all(r["decision"] == d for r in recs)
    assert d["wire_dtype"] == "float32"
    assert d["seconds"]["float16"] < d["seconds"]["float32"]  # the reductions
    # The slowest rank's step times: float32 0.010 + 0.001 (N-1) s.
    assert d["step_seconds"]["float32"] == pytest.approx(0.010 + 0.001 * (np_ - 1))
    assert "the whole step decides" in d["reason"]
    assert len({r["weights_bytes"] for r in recs}) == 1
    assert res.stderr.count("wire_dtype='auto' chose float32") == 1
    events = _trace(tmp_path)
    buckets = [
        e for e in events if e.get("pid") == 0 and e["name"].startswith("bucket")
    ]
    wires = [e["args"]["wire_dtype"] for e in sorted(buckets, key=lambda e: e["ts"])]
    assert "float16" in wires and wires[0] == wires[-1] == "float32"


@pytest.mark.mpi
def test_pinned_wire_is_used_without_measuring(tmp_path):
    recs, _ = _run(2, "pin", tmp_path, env={"KERAS_MPFP16_WIRE_AUTO": "bfloat16"})
    assert {r["effective"] for r in recs} == {"bfloat16"}
    assert all(r["measured_sizes"] == [] for r in recs)
    assert "pinned" in recs[0]["decision"]["reason"]


@pytest.mark.mpi
def test_sparse_only_model_stays_on_float32_without_measuring(tmp_path):
    recs, _ = _run(2, "sparse", tmp_path)
    assert {r["effective"] for r in recs} == {"float32"}
    assert all(r["measured_sizes"] == [] for r in recs)
    assert "no dense gradients" in recs[0]["decision"]["reason"]


@pytest.mark.mpi
def test_real_probe_measures_both_wires_and_agrees(tmp_path):
    recs, _ = _run(2, "real", tmp_path)
    d = recs[0]["decision"]
    assert d["buckets"] and set(d["seconds"]) == {"float32", "float16"}
    assert all(r["decision"] == d for r in recs)
    assert {r["effective"] for r in recs} == {d["wire_dtype"]}


@pytest.mark.mpi
@pytest.mark.parametrize(
    "warmup, trial",
    # 10 steps: the trial (4 steps per wire) ends inside the warm-up fit and
    # whole steps return it to float32, whose function is installed again
    # (traced once). 4 steps: too few for a trial; the reductions' float16
    # is applied and traced at once, inside the warm-up.
    [(10, True), (4, False)],
)
def test_a_second_fit_neither_measures_nor_retraces(warmup, trial, tmp_path):
    res = run_mpi(2, "wire_auto_refit.py", str(warmup), "6", timeout=300)
    recs = res.ok(2)
    for r in recs:
        first, second = r["fits"]
        assert first["measured"] == 1
        # The first trace runs twice (it creates the optimizer's variables),
        # then float16 once (trial or decision); float32 is not traced again.
        assert first["traced"] == 3
        assert len(first["wires"]) == warmup
        # The second fit: no measurement, no trial, no trace, one wire.
        assert "measured" not in second and "confirmed" not in second
        assert "traced" not in second, second
        assert len(set(second["wires"])) == 1
        if trial:
            assert first["confirmed"] == 1
            # 1 + 4 steps on float32, 1 (the trace) + 4 on float16; the
            # callback recording them runs before the decision's.
            assert first["wires"] == ["float32"] * 5 + ["float16"] * 5
            assert r["decision"]["wire_dtype"] == "float32"
            assert "4 per wire" in r["decision"]["reason"]
        else:
            assert "confirmed" not in first
            assert first["wires"][1:] == ["float16"] * (warmup - 1)
            assert r["decision"]["wire_dtype"] == "float16"
            assert "too few steps left" in r["decision"]["reason"]
        assert set(second["wires"]) == {r["decision"]["wire_dtype"]}
    assert recs[0]["decision"] == recs[1]["decision"]
    assert recs[0]["weights_bytes"] == recs[1]["weights_bytes"]
