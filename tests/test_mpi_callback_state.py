"""Stock file-writing callbacks hold the same state on every rank (issue 19).

A one-process script that reads `float(ck.best)` after `fit` used to abort
on rank 1 (`best` was None there: a stand-in ran instead of the user's
object). Now ranks other than 0 run the user's `ModelCheckpoint` /
`CSVLogger` with their writes switched off. The job is
tests/mpi_scripts/callback_state.py, under real `mpirun -np 2` / `-np 3`.
"""

import pytest
from mpi_launch import run_mpi

pytestmark = pytest.mark.mpi

PATHS = ("filepath", "filename", "backup_dir")
# Callbacks whose every attribute (private counters included) must match
# rank 0's and one process's. BackupAndRestore keeps private bookkeeping on
# rank 0 only (rank 0 alone restores and writes); its public attributes match.
WHOLE_STATE = ("best", "batchly", "csv", "remote", "atomic", "wrapped", "early")
# Global logs equal one process's up to float rounding (the README's 1e-6
# relative), so values taken from logs (`best` of ModelCheckpoint and
# EarlyStopping) are compared with that tolerance against one process, and
# exactly between ranks.
RTOL = 1e-6


def close(got, want, what: str) -> None:
    """`got == want`, floats within RTOL relative (recursively)."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert got == want or abs(got - want) <= RTOL * abs(want), (what, got, want)
    elif isinstance(want, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(want), (what, sorted(got), sorted(want))
        for key in want:
            close(got[key], want[key], f"{what}.{key}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), (what, got, want)
        for k, (a, b) in enumerate(zip(got, want)):
            close(a, b, f"{what}[{k}]")
    else:
        assert got == want, (what, got, want)


def without_paths(attrs: dict) -> dict:
    return {k: v for k, v in attrs.items() if k not in PATHS and "path" not in k}


@pytest.mark.parametrize("np_", [2, 3])
def test_callback_state_is_rank_0s_on_every_rank(np_, tmp_path):
    result = run_mpi(np_, "callback_state.py", str(tmp_path), timeout=400)
    recs = result.ok(np_)
    r0 = recs[0]
    # float(ck.best) worked on every rank (the script did it), with one value.
    assert len({r["best"] for r in recs}) == 1, [r["best"] for r in recs]
    for r in recs:
        assert r["public"] == r0["public"], r["rank"]
        for name in WHOLE_STATE:
            assert r["private"][name] == r0["private"][name], (name, r["rank"])
    # The state is what one process's callbacks hold (same data and initial
    # weights; global logs equal the one-process logs up to rounding).
    pub, ref = r0["public"], r0["ref_public"]
    close(pub["best"]["best"], ref["best"]["best"], "best.best")
    assert abs(pub["atomic"]["best"] - pub["best"]["best"]) == 0
    assert pub["wrapped"]["best"] == pub["best"]["best"]
    assert pub["best"]["best"] is not None
    for name in WHOLE_STATE:
        close(without_paths(pub[name]), without_paths(ref[name]), name)
        close(
            without_paths(r0["private"][name]),
            without_paths(r0["ref_private"][name]),
            f"{name} (private)",
        )
    assert pub["csv"]["keys"] == ["loss", "val_loss"]
    assert pub["csv"]["append_header"] is False  # appended to an existing header
    # Rank 0 alone wrote: one header (the earlier run's) and one row per
    # epoch in the CSV; every checkpoint once.
    written = r0["written"]
    lines = written["csv_lines"]
    assert lines[0] == "epoch,loss,val_loss" and len(lines) == 1 + 4, lines
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1", "2", "3"]
    val_losses = [float(line.split(",")[2]) for line in lines[1:]]
    assert min(val_losses) == pytest.approx(pub["best"]["best"])
    for name in ("best.keras", "atomic.keras", "wrapped.keras", "b-1.weights.h5"):
        assert name in written["files"], written["files"]
    assert not [f for f in written["files"] if ".tmp-" in f], written["files"]
