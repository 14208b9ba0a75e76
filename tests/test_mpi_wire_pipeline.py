"""The pipelined 16-bit reduction on real `mpirun -np 2` and `-np 3` jobs
(tests/mpi_scripts/wire_pipeline.py)."""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi

TOL = {"float16": 2e-3, "bfloat16": 1e-2}


@pytest.mark.parametrize("np_", [2, 3])
def test_pipelined_wire_is_exact_identical_and_pipelined(np_):
    result = run_mpi(np_, "wire_pipeline.py", timeout=400)
    assert result.returncode == 0, result.describe()
    recs = result.records()
    assert len(recs) == np_
    for r in recs:
        for wire, tol in TOL.items():
            for segment in (0, 1000):
                key = f"{wire}_{segment}"
                assert r[f"{key}_finite"] and r[f"{key}_identical"], key
                assert r[f"{key}_numpy_identical"], key
                assert r[f"{key}_numpy_equal"], key  # TF codec == numpy codec
                assert r[f"{key}_rel_err"] < tol, (key, r[f"{key}_rel_err"])
                assert r[f"{key}_numpy_rel_err"] < tol, key
                assert r[f"{key}_tiny"] < tol and r[f"{key}_huge"] < tol, (key, r)
                assert r[f"{key}_nan_finite"] is False, key
                assert "step" in (r[f"{key}_step_error"] or ""), (key, r)
            # Off: one blocking Alltoall per bucket, nothing non-blocking.
            assert r[f"{wire}_0_ialltoall"] == 0 and r[f"{wire}_0_alltoall"] > 0
            # On: the buckets whose owner's row exceeds 1000 values go
            # segment by segment (one Ialltoall and Iallgather each).
            on = f"{wire}_1000"
            assert r[f"{on}_ialltoall"] >= 2 * 2, r
            assert r[f"{on}_ialltoall"] == r[f"{on}_iallgather"], r
        # bfloat16 rows are unscaled: the pipeline changes no bit.
        assert r["bfloat16_same_as_unpipelined"]
    # Every rank saw the same calls and the same results.
    keys = [k for k in recs[0] if k != "rank"]
    assert all({k: x[k] for k in keys} == {k: recs[0][k] for k in keys} for x in recs)
