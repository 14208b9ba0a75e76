"""`kmp.shard` refuses different data on different ranks (issue 19, item 2).

Real `mpirun -np 2` / `-np 3`; the job is tests/mpi_scripts/shard_check.py.
"""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("np_", [2, 3])
def test_shard_checks_the_data_is_the_same_on_every_rank(np_):
    result = run_mpi(np_, "shard_check.py", "caught", timeout=300)
    recs = result.ok(np_)
    every = list(range(np_))
    for r in recs:
        res = r["results"]
        # Unseeded data: an error on every rank, naming every rank (each
        # holds its own version) and the fix.
        err = res["unseeded"]["error"]
        assert err and "different data" in err, err
        assert "same shapes and dtypes, different contents" in err, err
        for i in every:
            assert f"{i} hold" in err, err
        assert "seed" in err and "check=False" in err, err
        # One value changed on the last rank only: the ranks are named.
        err = res["last_rank_differs"]["error"]
        others = ", ".join(map(str, range(np_ - 1)))
        assert err and f"{'rank' if np_ == 2 else 'ranks'} {others} hold" in err, err
        assert f"rank {np_ - 1} holds version 2" in err, err
        err = res["shapes_differ"]["error"]
        assert err and "shapes or dtypes differ" in err, err
        # tf.data shuffled without a seed before shard: caught from the first
        # element; seeded: fine.
        assert res["tf_data_unseeded_shuffle"]["error"], res
        assert "different data" in res["tf_data_unseeded_shuffle"]["error"]
        for case in (
            "seeded",
            "per_rank_opt_in",
            "tf_data_seeded_shuffle",
            "py_dataset",
        ):
            assert res[case]["error"] is None, (case, res[case])
        err = res["check_bad"]["error"]
        assert err and "check" in err and "'yes'" in err, err
    # Seeded data: disjoint rows that together are the data (minus the
    # remainder), as before.
    rows = [row for r in recs for row in r["results"]["seeded"]["rows"]]
    assert len(rows) == len(set(rows)) == 60 // np_ * np_
    # The opt-in really shards each rank's own data.
    for r in recs:
        assert (
            len(r["results"]["per_rank_opt_in"]["rows"]) == (40 + 4 * r["rank"]) // np_
        )


@pytest.mark.parametrize("np_", [2, 3])
def test_unseeded_script_ends_with_the_error(np_):
    result = run_mpi(np_, "shard_check.py", "uncaught", timeout=300)
    assert result.returncode != 0, result.describe()
    out = result.stdout + result.stderr
    assert "the ranks were given different data" in out, result.describe()
    assert "shard returned" not in out, result.describe()
