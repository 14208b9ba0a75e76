"""The timeline and the scaling report: report math on synthetic records, the
recorder in one process, and real `mpirun -np 2` / `-np 3` fits."""

import json
import os

import numpy as np
import pytest
from mpi_launch import run_mpi

from keras_mpfp16.runtime import trace as timeline
from keras_mpfp16.runtime.trace import scaling

# -- report math ------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 5, 50, 95, 99, 100])
def test_percentile_matches_numpy_linear(q):
    rng = np.random.default_rng(q)
    for n in (1, 2, 7, 100):
        xs = rng.exponential(size=n).tolist()
        assert scaling.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert np.isnan(scaling.percentile([], 50))


def test_bus_bandwidth_is_the_nccl_tests_definition():
    alg, bus = scaling.bus_bandwidth(1e9, 0.5, 4)
    assert alg == 2e9
    assert bus == pytest.approx(2e9 * 2 * 3 / 4)
    assert scaling.bus_bandwidth(8, 1.0, 2) == (8.0, 8.0)  # 2(N-1)/N = 1 at N=2
    assert all(np.isnan(v) for v in scaling.bus_bandwidth(8, 0.0, 2))


def test_union_length_counts_overlaps_once():
    assert scaling.union_length([]) == 0
    assert scaling.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert scaling.union_length([(5, 6), (0, 10)]) == 10


MS = 1_000_000  # ns


def bucket(enter, exit_, nbytes=4000, payload=3996):
    return ("bucket", "gradient allreduce", enter * MS, exit_ * MS, nbytes, payload)


def test_epoch_report_on_synthetic_records():
    # Two ranks, two steps of 10 ms. Step 0: rank 1 arrives 2 ms late at the
    # only bucket (rank 0 waits 2 ms of its 3 ms in it); step 1: both arrive
    # together at two buckets.
    r0 = [
        (0, 0, 0, 10 * MS, (bucket(5, 8),)),
        (1, 0, 10 * MS, 20 * MS, (bucket(12, 13), bucket(15, 17))),
    ]
    r1 = [
        (0, 0, 0, 10 * MS, (bucket(7, 8),)),
        (1, 0, 10 * MS, 20 * MS, (bucket(12, 13), bucket(15, 17))),
    ]
    e = scaling.epoch_report([r0, r1], skips=1)
    assert e["steps"] == 2
    assert e["step_ms_median"] == pytest.approx(10)
    # in a call: rank 0: 3+1+2 ms, rank 1: 1+1+2 ms, of 40 ms of steps;
    # waited: 2 ms (rank 0, step 0)
    assert e["wait_share"] == pytest.approx(2 / 40)
    assert e["reduction_share"] == pytest.approx((6 + 4 - 2) / 40)
    assert e["compute_share"] == pytest.approx(1 - 10 / 40)
    # bytes: the step of rank 0 listed last (step 1: two buckets)
    assert e["bytes_per_step"] == 2 * 3996 and e["buckets"] == 2
    # transfer time, after the last arrival: step 0 1 ms on each rank,
    # step 1 1 + 2 ms on each rank; 6 bucket calls of 4000 bytes
    xfer_s = (1 + 1 + 3 + 3) * 1e-3
    assert e["algbw_gbps"] == pytest.approx(6 * 4000 / xfer_s / 1e9)
    assert e["busbw_gbps"] == pytest.approx(e["algbw_gbps"])  # N=2
    assert e["slowest_rank"] == 1
    assert e["slowest_late_ms"] == pytest.approx(2 / 2)  # 2 ms over 2 steps
    assert e["others_late_ms"] == pytest.approx(0)
    # overlap: step 1 on each rank: bucket 1 (1 ms) ran before bucket 2
    # started; of 3 + 3 (rank 0) + 1 + 3 (rank 1) ms in buckets
    assert e["overlap_max"] == pytest.approx(2 / 10)
    assert e["loss_scale_skips"] == 1
    line = scaling.epoch_line(0, e)
    assert "epoch 1" in line and "slowest rank 1" in line
    assert "epoch" in scaling.table([{"epoch": 0, **e}])


def test_hidden_share_is_the_bucket_time_before_the_ready_mark():
    # The communication thread's steps: a "ready" mark (the last bucket was
    # handed over) that may come between the buckets' records in a
    # different place on each rank; it is no collective.
    ready = ("ready", "gradients ready", 6 * MS, 6 * MS, 0, 0)
    r0 = [(0, 0, 0, 10 * MS, (bucket(2, 4), ready, bucket(5, 9)))]
    r1 = [(0, 0, 0, 10 * MS, (bucket(3, 4), bucket(4, 7), ready))]
    e = scaling.epoch_report([r0, r1])
    # before 6 ms: rank 0 2 + 1 of 6 ms, rank 1 1 + 2 of 4 ms
    assert e["hidden"] == pytest.approx((3 + 3) / (6 + 4))
    # the mark is not a call: two buckets, aligned by index across ranks
    assert e["buckets"] == 2 and e["wait_share"] == pytest.approx((1 + 1) / 20)
    assert "hidden under backprop 60%" in scaling.epoch_line(0, e)
    assert "hidden" in scaling.table([{"epoch": 0, **e}])
    # Without marks (the synchronous path) there is no measurement.
    plain = scaling.epoch_report([[(0, 0, 0, 10 * MS, (bucket(2, 4),))]] * 2)
    assert plain["hidden"] is None
    assert "hidden" not in scaling.epoch_line(0, plain)


def test_epoch_report_steps_missing_on_a_rank_are_left_out():
    r0 = [(0, 0, 0, 10 * MS, ()), (1, 0, 10 * MS, 30 * MS, ())]
    r1 = [(0, 0, 0, 12 * MS, ())]
    e = scaling.epoch_report([r0, r1])
    assert e["steps"] == 1
    assert e["step_ms_median"] == pytest.approx(12)  # the slowest rank's
    assert e["slowest_rank"] is None  # no calls to compare arrivals at


# -- windows, env, part files ----------------------------------------------------------


def test_window_forms():
    w = timeline.Window("100-200")
    assert 100 in w and 200 in w and 99 not in w and 201 not in w
    assert 5 in timeline.Window(5) and 6 not in timeline.Window(5)
    assert 3 in timeline.Window((2, 4))
    e = timeline.Window(every=10)
    assert 0 in e and 20 in e and 5 not in e
    assert 30 in timeline.Window("every:15")
    d = timeline.Window()
    assert 0 in d and 19 in d and 20 not in d


@pytest.mark.parametrize("bad", ["200-100", "a-b", "1-2-3", -1, (1,), 1.5, "every:x"])
def test_window_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="steps|every"):
        timeline.Window(bad)


def test_window_rejects_both_and_bad_every():
    with pytest.raises(ValueError, match="not both"):
        timeline.Window("1-2", every=3)
    with pytest.raises(ValueError, match="every"):
        timeline.Window(every=0)


def test_env_settings(monkeypatch):
    for name in (timeline.PATH_ENV, timeline.STEPS_ENV, timeline.REPORT_ENV):
        monkeypatch.delenv(name, raising=False)
    assert timeline.env_settings() is None
    monkeypatch.setenv(timeline.PATH_ENV, "t.json")
    monkeypatch.setenv(timeline.STEPS_ENV, "5-9")
    assert timeline.env_settings() == {
        "path": "t.json",
        "steps": "5-9",
        "report": False,
    }
    monkeypatch.setenv(timeline.REPORT_ENV, "table")
    assert timeline.env_settings()["report"] == "table"
    monkeypatch.delenv(timeline.PATH_ENV)
    monkeypatch.setenv(timeline.REPORT_ENV, "1")
    assert timeline.env_settings() == {"path": None, "steps": "5-9", "report": True}
    monkeypatch.setenv(timeline.REPORT_ENV, "loud")
    with pytest.raises(ValueError, match="KERAS_MPFP16_TIMELINE_REPORT='loud'"):
        timeline.env_settings()


def test_recorder_part_file_is_readable_unterminated(tmp_path):
    part = str(tmp_path / "t.json.rank0")
    rec = timeline.Recorder(0, 1, "h", timeline.Window("1-2"), part)
    for step in range(4):
        rec.begin_step(step, 0)
        with rec.reduction(
            "gradient allreduce, bucket 1/1",
            bucket=1,
            nbytes=8,
            payload_bytes=8,
            wire="float32",
            path="host",
        ):
            rec.collective("inner", 0, 1)
        rec.end_step()
    # No close: as a crashed process leaves it. Chrome's JSON array format
    # without the closing bracket; closing it makes it plain JSON.
    text = open(part).read()
    assert text.startswith("[\n") and text.rstrip().endswith(",")
    events = json.loads(text.rstrip().rstrip(",") + "]")
    assert events == timeline.read_events(part)
    steps = [e for e in events if e.get("cat") == "step"]
    assert [e["args"]["step"] for e in steps] == [1, 2]
    assert all(e["dur"] > 0 for e in events if e["ph"] == "X")
    assert len([e for e in events if e.get("cat") == "reduction"]) == 2
    assert len(rec.take_records()) == 4  # every step counts in the report
    # A last line cut mid-write is dropped, the rest still read.
    with open(part, "a") as f:
        f.write('{"name":"cut')
    assert timeline.read_events(part) == events
    rec.close()


def test_wait_spans_from_arrivals():
    def call(pid, ts, dur):
        return {"ph": "X", "pid": pid, "tid": 1, "ts": ts, "dur": dur,
                "args": {"step": 3, "call": 0}}  # fmt: skip

    waits = timeline.wait_spans([call(0, 100.0, 50.0), call(1, 130.0, 20.0)])
    assert len(waits) == 1
    assert waits[0]["pid"] == 0 and waits[0]["dur"] == 30.0
    assert waits[0]["args"] == {"step": 3, "slowest_rank": 1}


def test_timeline_callback_validates_arguments():
    import keras_mpfp16 as kmp

    with pytest.raises(ValueError, match="report"):
        kmp.callbacks.Timeline("t.json", report="loud")
    with pytest.raises(ValueError, match="path"):
        kmp.callbacks.Timeline(3)
    with pytest.raises(ValueError, match="steps"):
        kmp.callbacks.Timeline("t.json", steps="9-1")


def test_off_by_default():
    assert timeline.active() is None


# -- real jobs -------------------------------------------------------------------------


def _by(events, pid, cat):
    return [e for e in events if e["pid"] == pid and e.get("cat") == cat]


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3])
def test_timeline_of_a_real_fit(np_, tmp_path):
    # np=3 also covers the 16-bit wire (Alltoall + Allgather in a py_function)
    style, wire = ("epoch", "float32") if np_ == 2 else ("table", "float16")
    result = run_mpi(
        np_,
        "timeline_fit.py",
        str(tmp_path),
        "ok",
        style,
        wire,
        timeout=420,
        env={
            "KERAS_MPFP16_STALL_TIMEOUT": "1",
            "TIMELINE_TEST_PINGPONG": "1" if np_ == 3 else "",
        },
    )
    records = result.ok()
    assert [r["rank"] for r in records] == list(range(np_))
    path = tmp_path / "trace.json"
    assert records[0]["written"] == str(path)
    assert not list(tmp_path.glob("trace.json.rank*"))  # merged, parts removed
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    plan = records[0]["plan_bytes"]
    slow = np_ - 1

    # Clocks: one machine, so the true offset is 0; at np=3 the ranks align
    # by ping-pong with rank 0 (as across hosts) and must be within the bound.
    clock = doc["otherData"]["keras_mpfp16"]["clock"]
    assert clock[0] == {"offset_ns": 0, "bound_us": 0.0, "same_clock": True}
    for c in clock[1:]:
        assert c["same_clock"] == (np_ == 2), clock
        assert abs(c["offset_ns"]) <= c["bound_us"] * 1e3 + 1, clock

    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == list(range(np_))
    assert all(names[r].startswith(f"rank {r} (") for r in names)
    for e in events:
        assert e["ph"] in ("X", "i", "M"), e
        if e["ph"] == "X":
            assert e["dur"] > 0 and isinstance(e["ts"], float), e

    for r in range(np_):
        steps = sorted(_by(events, r, "step"), key=lambda e: e["ts"])
        assert [e["args"]["step"] for e in steps] == list(range(2, 12))
        for a, b in zip(steps, steps[1:]):
            assert a["ts"] + a["dur"] <= b["ts"], (a, b)  # a rank's steps never overlap
        buckets = _by(events, r, "reduction")
        assert len(buckets) == 10 * len(plan)
        for e in buckets:
            a = e["args"]
            assert a["wire_dtype"] == wire
            assert a["path"] == ("host" if wire == "float32" else "host (DLPack)")
            assert a["payload_bytes"] == plan[a["bucket"] - 1]
            # float32: payload (+ slots); 16-bit: half of it + row headers
            if wire == "float32":
                assert a["bytes"] >= a["payload_bytes"]
            else:
                assert a["payload_bytes"] / 2 <= a["bytes"] < a["payload_bytes"]
            step = next(s for s in steps if s["args"]["step"] == a["step"])
            assert (
                step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]
            )
        # nested MPI calls: Allreduce, or Alltoall + Allgather
        calls = 1 if wire == "float32" else 2
        assert len(_by(events, r, "mpi")) == 10 * len(plan) * calls
        assert len(_by(events, r, "validation")) == 2
        assert len(_by(events, r, "broadcast")) == 1
        assert _by(events, r, "loss_scale"), "growth_interval=3: grows in the window"
    assert len(_by(events, 0, "checkpoint")) == 2  # rank 0 writes, each epoch
    assert not any(_by(events, r, "checkpoint") for r in range(1, np_))
    assert [e["name"] for e in _by(events, 0, "stall")][:1] == ["stall warning"]

    # The straggler: at step 10 every other rank waited ~3 s for it.
    waits = [e for e in events if e.get("cat") == "wait" and e["args"]["step"] == 10]
    for r in range(np_ - 1):
        mine = [e for e in waits if e["pid"] == r]
        assert max(e["dur"] for e in mine) > 2.5e6, mine
        assert {e["args"]["slowest_rank"] for e in mine if e["dur"] > 1e6} == {slow}

    # The report: the same on every rank, bytes per step = the bucket plan.
    report = records[0]["report"]
    assert all(r["report"] == report for r in records)
    assert report["ranks"] == np_ and len(report["epochs"]) == 2
    assert doc["otherData"]["keras_mpfp16"]["report"] == report
    for e in report["epochs"]:
        assert e["steps"] == 8
        assert e["bytes_per_step"] == sum(plan) and e["buckets"] == len(plan)
        assert e["wire_bytes_per_step"] >= sum(plan) / (1 if wire == "float32" else 2)
        total = e["compute_share"] + e["reduction_share"] + e["wait_share"]
        assert total == pytest.approx(1.0)
        assert e["step_ms_p95"] >= e["step_ms_median"] > 0
        assert e["busbw_gbps"] > 0 and 0 <= e["overlap_max"] <= 1
        assert e["loss_scale_skips"] == 0
    second = report["epochs"][1]  # steps 8-15: the straggler's epoch
    assert second["slowest_rank"] == slow
    assert second["slowest_late_ms"] > 3000 / 8 * 0.8  # 3 s late once in 8 steps
    assert second["wait_share"] > 0
    out = result.stdout
    if style == "epoch":
        assert out.count("keras_mpfp16 timeline: epoch") == 2
    else:
        assert "keras_mpfp16 timeline: scaling report, 3 ranks" in out
    # Printed on rank 0 only
    assert out.count("timeline: epoch 1") + out.count("scaling report") == 1


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 3])
def test_a_crashed_rank_leaves_readable_traces(np_, tmp_path):
    path = tmp_path / "trace.json"
    result = run_mpi(
        np_,
        "timeline_fit.py",
        str(tmp_path),
        "crash",
        timeout=420,
        env={"KERAS_MPFP16_TIMELINE": str(path)},  # the env var turns it on
    )
    assert result.returncode != 0, result.describe()
    assert "deliberate failure at step 5" in result.stderr
    assert not path.exists()
    for r in range(np_):
        part = tmp_path / f"trace.json.rank{r}"
        text = part.read_text()
        assert text.startswith("[\n")
        events = timeline.read_events(str(part))
        assert events, r
        steps = sorted(e["args"]["step"] for e in events if e.get("cat") == "step")
        # Every step before the failure (default window 0-19); the failing
        # rank finished step 5 before its callback raised.
        assert steps[:5] == [0, 1, 2, 3, 4], (r, steps)
        assert all(e["dur"] > 0 for e in events if e["ph"] == "X")
        assert any(e.get("cat") == "reduction" for e in events)
        assert os.path.getsize(part) > 0


def test_graph_is_the_same_with_and_without_a_recorder(tmp_path):
    """The reduction's graph never depends on the timeline: on or off, the
    same ops; the host function alone looks at the recorder, at run time."""
    import tensorflow as tf

    from keras_mpfp16.backend import tf_gradients

    grads = [tf.ones([300]), tf.ones([20, 10])]

    def graph_ops():
        @tf.function
        def step():
            out, finite = tf_gradients.allreduce_gradients(
                grads,
                shapes=[(300,), (20, 10)],
                op="average",
                wire_dtype="float32",
                bucket_bytes=1024,
                step=tf.constant(7, tf.int64),
            )
            return out, finite

        graph = step.get_concrete_function().graph
        # (names of captured inputs and py_func tokens differ per trace)
        return [op.type for op in graph.get_operations()], step

    off, _ = graph_ops()
    rec = timeline.Recorder(0, 1, "h", timeline.Window("0-9"), None)
    timeline.activate(rec)
    try:
        on, step = graph_ops()
        rec.begin_step(0, 0)
        out, finite = step()
        rec.end_step()
    finally:
        timeline.activate(None)
    assert on == off
    assert bool(finite) and np.allclose(out[0].numpy(), 1.0)
    (record,) = rec.take_records()
    buckets = [c for c in record[4] if c[0] == "bucket"]
    # 1 KB buckets, last variable first: (20, 10) then (300,)
    assert [c[5] for c in buckets] == [800, 1200]
    spans = [e for e in rec.events if e.get("cat") == "reduction"]
    assert [e["args"]["bucket"] for e in spans] == [1, 2]


def test_one_process_fit_writes_a_trace_and_report(tmp_path, capsys):
    import keras

    import keras_mpfp16 as kmp

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    path = tmp_path / "t.json"
    tl = kmp.callbacks.Timeline(path, steps="1-3", report="table")
    x = np.zeros((40, 3), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, callbacks=[tl])
    assert tl.written == str(path) and not list(tmp_path.glob("t.json.rank*"))
    events = timeline.read_events(str(path))
    steps = [e["args"]["step"] for e in events if e.get("cat") == "step"]
    assert steps == [1, 2, 3]
    assert [e["steps"] for e in tl.report["epochs"]] == [5, 5]
    assert tl.report["epochs"][0]["busbw_gbps"] is None  # no reduction at N=1
    assert "scaling report, 1 ranks" in capsys.readouterr().out
    assert timeline.active() is None


def test_report_only_without_a_path(tmp_path, capsys, monkeypatch):
    import keras

    import keras_mpfp16 as kmp

    monkeypatch.chdir(tmp_path)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=kmp.DistributedOptimizer("sgd"), loss="mse")
    tl = kmp.callbacks.Timeline(report=True)
    x = np.zeros((16, 3), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, callbacks=[tl])
    assert tl.written is None and not list(tmp_path.iterdir())
    assert [e["steps"] for e in tl.report["epochs"]] == [2, 2]
    out = capsys.readouterr().out
    assert out.count("keras_mpfp16 timeline: epoch") == 2
