"""Real multi-process runs: `mpirun -np 2` and `-np 3`, each under a timeout.

The checks that only read what their script prints share one job per size
(tests/mpi_scripts/scenarios.py: the scripts one after another, each
scenario's output and traceback its own, so a failing one fails only its
test); the jit check reads the job's stderr and has a job of its own."""

import pytest
from mpi_launch import SharedJobs, ok, run_mpi

pytestmark = pytest.mark.mpi

POLICIES_FP16_WIRE = (
    "--wire",
    "float16",
    "--accum",
    "2",
    "--policies",
    "mixed_float16",
)


def scenario_of(item):
    """The (np, scenario, command) a test of this file reads, or None."""
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    return {
        "test_runtime_collectives": lambda: (
            params["np_"],
            "collectives",
            ("collectives.py",),
        ),
        "test_fit_all_policies_identical_weights_and_falling_loss": lambda: (
            params["np_"],
            "policies",
            ("fit_policies.py",),
        ),
        "test_low_precision_wire_and_accumulation_train_identically": lambda: (
            3,
            "fp16-wire-accumulation",
            ("fit_policies.py", *POLICIES_FP16_WIRE),
        ),
        "test_two_ranks_equal_one_process_with_double_batch": lambda: (
            2,
            f"equivalence-{params['accum']}",
            ("equivalence.py", "--accum", str(params["accum"])),
        ),
        "test_overflow_on_one_rank_is_skipped_by_all": lambda: (
            2,
            "overflow",
            ("overflow_one_rank.py",),
        ),
    }.get(item.originalname, lambda: None)()


@pytest.fixture(scope="module")
def jobs(request, tmp_path_factory):
    return SharedJobs.for_module(request, tmp_path_factory, scenario_of, 540)


@pytest.mark.parametrize("np_", [2, 3])
def test_runtime_collectives(np_, jobs):
    recs = jobs.get(np_).records("collectives")
    assert len(recs) == np_
    for r in recs:
        assert r["size"] == np_ and r["local_size"] == np_
        mean = sum(range(np_)) / np_
        assert r["average"] == [i + mean for i in range(6)]
        assert r["sum"] == [np_ * i + sum(range(np_)) for i in range(6)]
        assert r["max"] == np_ - 1 and r["int_average"] == mean
        assert r["allgather"] == [[k, k] for k in range(np_) for _ in range(k + 1)]
        assert r["allgather_scalar"] == [float(k) for k in range(np_)]
        assert r["bcast_obj"] == {"from": np_ - 1, "list": [1, 2]}
        assert r["bcast_array"] == [0.0, 2.0, 4.0, 6.0, 8.0]
        assert r["bcast_arrays"] == [0.0, [[0, 0], [0, 0]]]
        for wire, tol in (("float32", 1e-6), ("float16", 2e-3), ("bfloat16", 1e-2)):
            assert r[f"wire_{wire}_identical"], wire
            assert r[f"wire_{wire}_rel_err"] < tol, (wire, r[f"wire_{wire}_rel_err"])
            assert r[f"wire_{wire}_tiny_rel_err"] < tol, (wire, r)
            assert r[f"wire_{wire}_huge_rel_err"] < tol, (wire, r)
        # Ring allgather: MPI's bytes. Large rows with WIRE_SCHEDULE=ring: the
        # ring from 3 ranks on, as accurate; at 2 ranks the same numbers.
        assert r["ring_allgather_equal"]
        assert r["ring_wire_used"] == ("ring" if np_ >= 3 else "alltoall")
        for schedule in ("ring", "alltoall"):
            assert r[f"big_{schedule}_rel_err"] < 1e-3, (schedule, r)
        if np_ == 2:
            assert r["big_ring_crc"] == r["big_alltoall_crc"]
        assert "one of 'average', 'sum', 'min', 'max'" in r["bad_op"]
        assert f"[0, {np_ - 1}]" in r["bad_root"]
        assert r["bad_gather"] and "rank 1" in r["bad_gather"]
    # Every rank computed exactly the same results.
    assert all(
        {k: v for k, v in r.items() if "rank" not in k}
        == {k: v for k, v in recs[0].items() if "rank" not in k}
        for r in recs
    )


@pytest.mark.parametrize("np_", [2, 3])
def test_fit_all_policies_identical_weights_and_falling_loss(np_, jobs):
    """float32, mixed_float16, mixed_bfloat16 one after another in one process.

    Models start from different seeds per rank; the script allgathers weight
    digests after every epoch and fails if they differ.
    """
    recs = jobs.get(np_).records("policies")
    assert len(recs) == np_
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        digests = {r["results"][policy]["digest"] for r in recs}
        assert len(digests) == 1, policy
        for r in recs:
            res = r["results"][policy]
            assert res["loss"][-1] < res["loss"][0], (policy, res["loss"])
            assert res["scaling"] == (policy == "mixed_float16")
            assert res["skipped"] == 0


def test_low_precision_wire_and_accumulation_train_identically(jobs):
    recs = jobs.get(3).records("fp16-wire-accumulation")
    assert len(recs) == 3
    assert len({r["results"]["mixed_float16"]["digest"] for r in recs}) == 1
    loss = recs[0]["results"]["mixed_float16"]["loss"]
    assert loss[-1] < loss[0]


@pytest.mark.parametrize("accum", [1, 2])
def test_two_ranks_equal_one_process_with_double_batch(accum, jobs):
    recs = jobs.get(2).records(f"equivalence-{accum}")
    assert recs[0]["moved"] > 1e-2  # training did change the weights
    assert recs[0]["max_rel_diff"] < 1e-5, recs[0]


def test_overflow_on_one_rank_is_skipped_by_all(jobs):
    recs = jobs.get(2).records("overflow")
    a, b = recs
    assert a["digest"] == b["digest"]
    assert a["scales"] == b["scales"] == [1024.0, 1024.0, 512.0, 512.0, 512.0, 512.0]
    assert a["skipped"] == b["skipped"] == 1
    assert a["iterations"] == b["iterations"] == 5
    assert a["finite_weights"] and b["finite_weights"]


def test_jit_compile_true_warns_once_and_trains():
    result = run_mpi(
        2,
        "fit_policies.py",
        "--jit",
        "--policies",
        "float32",
        "--epochs",
        "2",
        timeout=240,
    )
    recs = ok(result)
    assert all(r["results"]["float32"]["jit"] is False for r in recs)
    assert len({r["results"]["float32"]["digest"] for r in recs}) == 1
    # One warning per job (rank 0's: every rank made the same choice),
    # naming the reason.
    assert result.stderr.count("XLA compilation (jit_compile) is turned off") == 1
