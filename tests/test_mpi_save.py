"""`model.save` / `save_weights` on every rank after `fit` (issue 19, item 5).

Every rank saving the same path used to raise `BlockingIOError: unable to
lock file` on some ranks (HDF5) and abort a finished job. Now each rank's
save is atomic (its own temporary file, renamed over the target), so the
file is always one rank's complete copy of the same model. Real
`mpirun -np 2` / `-np 3`; the job is tests/mpi_scripts/save_after_fit.py.
"""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("np_", [2, 3])
def test_every_rank_saving_the_same_file_after_fit(np_, tmp_path):
    result = run_mpi(np_, "save_after_fit.py", str(tmp_path), timeout=300)
    recs = result.ok(np_)
    for r in recs:
        assert r["errors"] == [], r
        assert r["weights_file_matches"] and r["model_file_matches"], r
        assert r["loaded_optimizer"] == "DistributedOptimizer", r
        assert r["loaded_iterations"] == r["iterations"] > 0, r
        assert r["root_file_matches"] and r["last_file_matches"], r
        # No temporary file left behind.
        assert r["files"] == [
            "final.keras",
            "final.weights.h5",
            "last.weights.h5",
            "root.keras",
        ], r["files"]
