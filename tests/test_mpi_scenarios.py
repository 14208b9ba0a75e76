"""Several checks per job (tests/mpi_scripts/scenarios.py, `run_scenarios`
in tests/mpi_launch.py): a scenario that raises fails only its own reading,
with its own traceback from every rank; the scenarios after it run, each
with the environment and Keras state a fresh script finds."""

import pytest
from mpi_launch import run_scenarios

pytestmark = pytest.mark.mpi


def test_a_failing_scenario_fails_alone_and_the_next_start_fresh(tmp_path):
    job = run_scenarios(
        2,
        {
            "first": ("scenario_probe.py", "look"),
            "fails": ("scenario_probe.py", "raise"),
            "leaks": ("scenario_probe.py", "leak"),
            "after": ("scenario_probe.py", "look", "x"),
        },
        tmp_path,
        timeout=300,
    )
    assert job.result.returncode == 0, job.result.describe()
    with pytest.raises(AssertionError) as failed:
        job.records("fails")
    for rank in (0, 1):
        assert f"ValueError: the probe fails on rank {rank}" in str(failed.value)
    assert "scenario_probe.py" in str(failed.value)  # the traceback's frames
    first, leaks, after = (job.records(n) for n in ("first", "leaks", "after"))
    assert [r["rank"] for r in after] == [0, 1]
    assert all(r["policy"] == "float32" and r["leak"] is None for r in first)
    assert all(r["policy"] == "mixed_float16" and r["leak"] == "1" for r in leaks)
    # What the previous scenario changed is undone; its own arguments.
    assert all(r["policy"] == "float32" and r["leak"] is None for r in after)
    assert all(r["argv"] == ["look", "x"] for r in after)
