"""The explicit path for code that drives Keras itself, under real mpirun.

`kmp.distributed_fit` / `kmp.distributed_evaluate` must give exactly the run
the patched `model.fit` / `model.evaluate` give (same history, evaluation,
CSV log and final state, bitwise, on every rank), whether Keras's method is
called through a framework's captured reference, through `super().fit`
(the patched method passing through), or with the patches off. A custom
training loop matches one process. The job is tests/mpi_scripts/explicit_fit.py.
"""

import pytest
from mpi_launch import ok, run_mpi

pytestmark = pytest.mark.mpi  # every test here runs the module's mpirun jobs

PATCHED = ("wrapped", "framework", "super", "callbacklist", "bypass")


def _run(np_, tmp_path, modes, env=None):
    recs = ok(
        run_mpi(
            np_, "explicit_fit.py", str(tmp_path), ",".join(modes), env=env, timeout=400
        )
    )
    assert len(recs) == np_ * len(modes)
    return {m: [r for r in recs if r["mode"] == m] for m in modes}


@pytest.fixture(scope="module", params=[2, 3], ids=["np2", "np3"])
def runs(request, tmp_path_factory):
    np_ = request.param
    out = _run(np_, tmp_path_factory.mktemp(f"patched{np_}"), PATCHED)
    out.update(
        _run(
            np_,
            tmp_path_factory.mktemp(f"nopatch{np_}"),
            ("nopatch", "loop"),
            env={"KERAS_MPFP16_PATCH_KERAS": "0"},
        )
    )
    return np_, out


def test_explicit_path_gives_the_wrapped_run(runs):
    _, runs = runs
    reference = runs["wrapped"]
    # The reference itself: one model on every rank, global logs.
    assert len({r["digest"] for r in reference}) == 1
    assert len({repr(r["history"]) for r in reference}) == 1
    assert all(all(r["patches"].values()) for r in reference)
    for mode in ("framework", "super", "callbacklist", "nopatch"):
        for mine, ref in zip(runs[mode], reference):
            assert mine["digest"] == ref["digest"], mode
            assert mine["history"] == ref["history"], mode
            assert mine["evaluate"] == ref["evaluate"], mode
            assert mine["csv"] == ref["csv"], mode
    assert not any(any(r["patches"].values()) for r in runs["nopatch"])
    # Without the explicit path, such a framework gets per-rank logs and
    # unsplit validation: what this test would see if the path did nothing.
    bypass = runs["bypass"]
    assert len({repr(r["history"]) for r in bypass}) > 1
    assert bypass[0]["history"] != reference[0]["history"]


def test_custom_training_loop_matches_one_process(runs):
    np_, runs = runs
    recs = runs["loop"]
    assert len({r["digest"] for r in recs}) == 1, "ranks diverged"
    for r in recs:
        assert r["steps"] == 96 // (8 * np_)
        assert r["max_abs_diff"] < 1e-5, r
