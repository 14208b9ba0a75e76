"""The in-step gradient reduction on real `mpirun -np 2` and `-np 3` jobs.

wire_checks.py: 16-bit wires encoded in the graph (accuracy, bitwise agreement
between ranks, no float16 overflow or flush, non-finite detection), the DLPack
buffer path (forced on CPU), the step check carried in the first bucket, and
MPI calls per Keras train step. sparse_fit.py: Embedding gradients reduced by
allgather equal the dense reduction.

The two sparse-gradient checks of a size share one job
(tests/mpi_scripts/scenarios.py; a failing one fails only its test);
wire_checks.py counts MPI calls and keeps a job of its own.
"""

import pytest
from mpi_launch import SharedJobs, ok, run_mpi

pytestmark = pytest.mark.mpi


def scenario_of(item):
    """The (np, scenario, command) a test of this file reads, or None."""
    script = {
        "test_embedding_trained_with_sparse_gradients_equals_dense": "sparse_fit.py",
        "test_gathered_embedding_gradients_train_like_one_process_with_adam": (
            "sparse_equivalence.py"
        ),
    }.get(item.originalname)
    if script is None:
        return None
    return item.callspec.params["np_"], script, (script,)


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    return SharedJobs.for_module(request, tmp_path_factory, scenario_of, 500)


WIRES = ("float32", "float16", "bfloat16")
TOL = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}


def same_everywhere(recs, keys):
    return all({k: r[k] for k in keys} == {k: recs[0][k] for k in keys} for r in recs)


@pytest.mark.parametrize("np_", [2, 3])
def test_in_step_reduction_wires_paths_step_check_and_call_counts(np_):
    recs = ok(run_mpi(np_, "wire_checks.py", timeout=300))
    assert len(recs) == np_
    for r in recs:
        assert r["path_host"] == "host" and r["path_dlpack"] == "device"
        for path in ("host", "dlpack"):
            for wire in WIRES:
                key, tol = f"{path}_{wire}", TOL[wire]
                assert r[f"{key}_finite"] and r[f"{key}_identical"], key
                assert r[f"{key}_rel_err"] < tol, (key, r[f"{key}_rel_err"])
                # float16 sums that would overflow, values float16 would flush.
                for label in ("tiny", "huge"):
                    assert r[f"{key}_{label}_max_rel_err"] < tol, (key, label, r)
                # Sparse rows travel as float32 on every wire.
                assert r[f"{key}_sparse_rel_err"] < 1e-6, key
                if path == "dlpack" and wire != "float32":
                    continue
                assert r[f"{key}_average_rel_err"] < tol, key
                # One rank's NaN/Inf makes every rank's finite flag False.
                assert r[f"{key}_nan_dense_finite"] is False, key
                assert r[f"{key}_nan_sparse_finite"] is False, key
        # The forced path handed the float32 buckets to MPI through DLPack too.
        assert r["dlpack_dlpack_calls"] > r["host_dlpack_calls"] > 0
        assert r["cupy_imported"] is False  # DLPack straight into mpi4py
        for wire in WIRES:
            assert r[f"paths_bitwise_equal_{wire}"], wire
        for wire in ("float16", "bfloat16"):
            # Small rows: numpy between the collectives (it ran: owner's sums
            # counted), the same bits as eager TensorFlow (forced: none).
            assert r[f"small_rows_numpy_owner_sums_{wire}"] > 0, r
            assert r[f"small_rows_eager_owner_sums_{wire}"] == 0, r
            assert r[f"small_rows_numpy_equal_{wire}"], wire
            assert r[f"small_rows_eager_equal_{wire}"], wire
        for path in ("host", "dlpack"):
            for wire in ("float16", "bfloat16"):
                # Ring allgather: same bytes as MPI's Allgather; it ran at 3+.
                assert r[f"ring_equal_{path}_{wire}"], (path, wire)
                sendrecv = r[f"ring_sendrecv_{path}_{wire}"]
                assert (sendrecv > 0) if np_ >= 3 else (sendrecv == 0), (path, wire)
                # Ring reduce-scatter: agreement, accuracy, the numpy codec's bits.
                key, tol = f"rs_{path}_{wire}", TOL[wire]
                assert r[f"{key}_finite"] and r[f"{key}_identical"], key
                assert r[f"{key}_rel_err"] < tol, (key, r[f"{key}_rel_err"])
                for label in ("tiny", "huge"):
                    assert r[f"{key}_{label}_max_rel_err"] < tol, (key, label)
                assert r[f"{key}_sparse_rel_err"] < 1e-6, key
                assert r[f"{key}_alltoall_numpy_equal"], key
                assert r[f"{key}_ring_numpy_equal"], key
                if np_ >= 3:  # the ring ran: no Alltoall, N Sendrecv per bucket
                    assert r[f"{key}_sendrecv"] > 0 and r[f"{key}_alltoall"] == 0, key
                else:  # 2 ranks: the Alltoall (the same numbers)
                    assert r[f"{key}_sendrecv"] == 0 and r[f"{key}_alltoall"] > 0, key
            steps = ", ".join(
                f"rank {i}: train step {11 if i == 1 else 10}" for i in range(np_)
            )
            epochs = ", ".join(
                f"rank {i}: train step 10 (epoch {i})" for i in range(np_)
            )
            for path in ("host", "dlpack") if wire == "float32" else ("host",):
                err = r[f"step_error_{path}_{wire}"]
                assert err and "ranks are out of step" in err, (path, wire, err)
                assert "their train steps differ" in err and steps in err, err
                assert "batches" in err
                err = r[f"epoch_error_{path}_{wire}"]
                assert err and "different epochs at the same train step" in err, err
                assert epochs in err and "batches" not in err, err
        # One gradient call per train step: the step check rides in the bucket.
        assert r["calls_dense_float32"] == {"Allreduce": 1.0}, r
        assert r["calls_embedding_float32"] == {"Allgatherv": 1.0, "Allreduce": 1.0}
        # One crossing into Python per collective of the step: the gradient
        # bucket's and the metrics' (the epoch is read in the graph, not by a
        # numpy_function of its own: issue 40).
        assert r["crossings_dense_float32"] == {"numpy_function": 2.0}, r
        for wire in ("float16", "bfloat16"):
            assert r[f"crossings_dense_{wire}"] == {
                "numpy_function": 1.0,
                "py_function": 1.0,
            }, r
            assert r[f"calls_dense_{wire}"] == {"Allgather": 1.0, "Alltoall": 1.0}
            assert r[f"calls_embedding_{wire}"] == {
                "Allgather": 1.0,
                "Allgatherv": 1.0,
                "Alltoall": 1.0,
            }
    flags = [k for k in recs[0] if k.endswith(("_identical", "_finite"))]
    assert same_everywhere(recs, flags)


@pytest.mark.parametrize("np_", [2, 3])
def test_embedding_trained_with_sparse_gradients_equals_dense(np_, jobs):
    recs = jobs.get(np_).records("sparse_fit.py")
    assert len(recs) == np_
    for policy in ("float32", "mixed_float16"):
        for r in recs:
            assert r[f"{policy}_moved"] > 1e-3  # training changed the weights
            for mode in ("sparse", "auto"):
                # Summation order differs; float16 compute amplifies it.
                tol = 1e-5 if policy == "float32" else 1e-4
                assert r[f"{policy}_{mode}_vs_dense"] < tol, (policy, mode, r)
                # 6 steps, one allgather each: auto picked the gather here.
                assert r[f"{policy}_{mode}_allgathers"] == 6
                for what in ("skipped", "scale"):
                    assert r[f"{policy}_{mode}_{what}"] == r[f"{policy}_dense_{what}"]
            assert r[f"{policy}_dense_allgathers"] == 0
        for mode in ("dense", "sparse", "auto"):
            assert len({r[f"{policy}_{mode}_digest"] for r in recs}) == 1
    assert len({r["float16_wire_auto_digest"] for r in recs}) == 1
    assert all(r["float16_wire_auto_allgathers"] == 6 for r in recs)
    assert all(r["float16_wire_auto_vs_dense"] < 1e-2 for r in recs)


def test_allreduce_benchmark_cli_measures_every_wire_in_graph(tmp_path):
    """`python -m keras_mpfp16.benchmark allreduce` keeps working (tiny sizes)."""
    import json
    from pathlib import Path

    import keras_mpfp16

    main = Path(keras_mpfp16.__file__).parent / "benchmark" / "__main__.py"
    out = tmp_path / "allreduce.json"
    result = run_mpi(
        2,
        str(main),
        "allreduce",
        "--sizes",
        "65536",
        "--rounds",
        "1",
        "--out",
        str(out),
        timeout=180,
    )
    assert result.returncode == 0, result.describe()
    records = json.loads(out.read_text())["records"]
    variants = {r["variant"] for r in records}
    assert {f"ours_graph_{w}" for w in WIRES} <= variants, variants
    assert all(r["seconds"] > 0 for r in records)


@pytest.mark.parametrize("np_", [2, 3])
def test_gathered_embedding_gradients_train_like_one_process_with_adam(np_, jobs):
    recs = jobs.get(np_).records("sparse_equivalence.py")
    assert len(recs) == np_
    assert recs[0]["moved"] > 1e-2  # training did change the weights
    assert recs[0]["max_rel_diff"] < 1e-5, recs[0]
