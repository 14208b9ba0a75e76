"""runtime.preemption in one process, with real signals: the handler records,
chains to the user's handler, keeps SIG_IGN, restores handlers, re-delivers a
signal that came too late to be agreed on; the request rides in the sum."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from package_tree import heavy_modules, imported_modules

from keras_mpfp16.runtime.supervision import preemption


def test_exit_code_is_distinct_and_documented():
    assert preemption.PREEMPTED_EXIT_CODE == 75
    exc = preemption.Preempted(signal.SIGTERM, 1, 7, "/tmp/b")
    assert isinstance(exc, SystemExit) and exc.code == 75
    assert "epoch 1, step 7" in str(exc) and "/tmp/b" in str(exc)


def test_signal_is_recorded_chained_and_handlers_restored():
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGUSR1, mine)
    try:
        with preemption.handling():
            assert preemption.requested() is None
            os.kill(os.getpid(), signal.SIGUSR1)
            assert preemption.requested() == signal.SIGUSR1
            assert seen == [signal.SIGUSR1]  # the user's handler ran too
            # The flag rides in the reduction (one process: the sum is ours).
            out = preemption.allreduce_carrying(np.arange(3.0))
            assert out.tolist() == [0.0, 1.0, 2.0]
            assert preemption.agreed()
        assert signal.getsignal(signal.SIGUSR1) is mine
        assert not preemption.agreed() and preemption.requested() is None
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_no_request_no_agreement_and_disabled_by_env(monkeypatch):
    with preemption.handling():
        preemption.allreduce_carrying(np.zeros(2))
        assert not preemption.agreed()
    monkeypatch.setenv(preemption.ENABLE_ENV, "0")
    before = signal.getsignal(signal.SIGTERM)
    with preemption.handling():
        assert signal.getsignal(signal.SIGTERM) is before
    assert preemption.settings()[0] is False
    monkeypatch.setenv(preemption.DIR_ENV, "/x/y")
    assert preemption.settings()[1] == "/x/y"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@pytest.mark.parametrize("late", [True, False])
def test_a_signal_not_agreed_on_is_delivered_again(late):
    """After the last reduction (late): SIGTERM's default action when the
    context ends, as if never caught. Agreed on: nothing more happens."""
    result = _run(
        f"""
        import os, signal, sys
        import numpy as np
        from keras_mpfp16.runtime.supervision import preemption
        with preemption.handling():
            os.kill(os.getpid(), signal.SIGTERM)
            if not {late}:
                preemption.allreduce_carrying(np.zeros(1))
        print("survived", flush=True)
        """
    )
    if late:
        assert result.returncode == -signal.SIGTERM, result
        assert "survived" not in result.stdout
    else:
        assert result.returncode == 0 and "survived" in result.stdout, result


def test_ignored_signal_stays_ignored():
    result = _run(
        """
        import os, signal
        from keras_mpfp16.runtime.supervision import preemption
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with preemption.handling():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            assert preemption.requested() is None
        print("ok", flush=True)
        """
    )
    assert result.returncode == 0 and "ok" in result.stdout, result


def test_launch_wrapper_starts_without_keras_tensorflow_or_mpi():
    """`python -m keras_mpfp16.runtime.launch` is a supervisor that lives as
    long as the job: it imports neither Keras nor TensorFlow nor mpi4py (seen
    with -X importtime, which lists every import of that process)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "keras_mpfp16.runtime.launch"]
        + [sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3, out.stderr[-2000:]  # the launcher's status
    imported = imported_modules(out.stderr)
    assert "keras_mpfp16.runtime.supervision.launch_wrapper" in imported
    assert not heavy_modules(imported), heavy_modules(imported)


def test_package_imported_for_the_launch_wrapper_loads_its_names_on_use():
    """`import keras_mpfp16` and the launch wrapper's module load nothing
    heavy, however Python was started (no sys.argv involved); the first
    public name used loads the whole package, with its import-time work."""
    code = (
        "import sys\n"
        "import keras_mpfp16 as kmp\n"
        "from keras_mpfp16.runtime.supervision import launch_wrapper\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'mpi4py') if m in sys.modules))\n"
        "from keras_mpfp16.training.patches import ROWS\n"
        "print(kmp.DistributedOptimizer.__name__, all(on for name, on in"
        " kmp.training.installed().items() if ROWS[name].keras_patch))\n"
        "print('keras' in sys.modules, len(kmp.__all__) > 10)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == [
        "[]",
        "DistributedOptimizer True",
        "True True",
    ], out.stdout


def test_launch_wrapper_passes_status_and_ends_a_launcher_that_lost_a_rank(
    tmp_path, capfd
):
    """runtime.launch with stand-in launchers (sh): the status passes through;
    a verdict written by a "rank" (report_lost: a line on its stderr with the
    token from the environment) makes it kill a launcher that does not end
    and exit 69 with the message."""
    from keras_mpfp16.runtime.supervision import launch_wrapper as launch

    assert launch.run(["sh", "-c", "exit 3"]) == 3
    assert launch.run(["sh", "-c", "kill -TERM $$"]) == 128 + signal.SIGTERM
    rank = (
        "import os, time; from keras_mpfp16.runtime.supervision.launch_wrapper import report_lost; "
        "report_lost('rank 2 (host n3) is unreachable'); time.sleep(120)"
    )
    started = time.monotonic()
    code = launch.run([sys.executable, "-c", rank], grace=1.0)
    assert code == launch.NODE_LOST_EXIT_CODE == 69
    assert time.monotonic() - started < 60
    err = capfd.readouterr().err
    assert "rank 2 (host n3) is unreachable" in err
    assert "did not end within 1s of the verdict and was killed" in err
    assert "keras_mpfp16-verdict" not in err  # taken out of the output
    # Launcher exits 0 after a verdict (mpirun with keepalive): still 69.
    rank0 = rank.replace("time.sleep(120)", "pass")
    assert launch.run([sys.executable, "-c", rank0]) == 69
    # Not under the wrapper: report_lost does nothing.
    os.environ.pop(launch.VERDICT_ENV, None)
    launch.report_lost("ignored")
