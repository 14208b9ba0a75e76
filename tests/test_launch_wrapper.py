"""The launch wrapper: the verdict token's variable passed the way the
launcher takes it (Open MPI's `-x VAR`; `-genv VAR VALUE` for MPICH / Intel
MPI's Hydra `mpiexec`, which rejects `-x`; nothing added for an unknown
launcher), the verdict channel through the ranks' forwarded standard error
(output passed through unchanged, forged verdicts refused, no shared
filesystem needed), restarts and the host list in Open MPI's and Hydra's
forms. Stand-in launchers (shell scripts) record their arguments; the real
launcher beside this Python (Open MPI's, or Hydra's in the `mpich` end) is
checked too."""

from __future__ import annotations

import re
import shutil
import sys

import pytest
from package_tree import heavy_modules, imported_modules

from keras_mpfp16.runtime.supervision import launch_wrapper

VERSIONS = {
    "open-mpi": "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/",
    "hydra": "HYDRA build details:\n    Version:                                 4.1.2\n",
    "intel": "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 "
    "(id: b44796a)\nCopyright 2003-2026, Intel Corporation.\n",
    "other": "some launcher 1.0\n",
}


def _stand_in(tmp_path, version: str):
    record = tmp_path / "argv"
    script = tmp_path / "mpiexec"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then cat <<"EOF"\n'
        f"{version.rstrip()}\nEOF\nexit 0; fi\n"
        f'printf "%s\\n" "$@" > {record}\n'
        f'[ -n "${launch_wrapper.VERDICT_ENV}" ] && echo env-set >> {record}\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return script, record


@pytest.mark.parametrize("kind", ["open-mpi", "hydra", "intel", "other"])
def test_verdict_variable_is_passed_as_the_launcher_takes_it(tmp_path, kind):
    script, record = _stand_in(tmp_path, VERSIONS[kind])
    expected = "hydra" if kind == "intel" else kind
    assert launch_wrapper.launcher_kind(str(script)) == expected
    assert launch_wrapper.run([str(script), "-np", "2", "python", "x.py"]) == 0
    args = record.read_text().split("\n")
    if kind == "open-mpi":
        assert args[:2] == ["-x", launch_wrapper.VERDICT_ENV], args
    elif expected == "hydra":
        assert args[:2] == ["-genv", launch_wrapper.VERDICT_ENV], args
        assert re.fullmatch("[0-9a-f]{32}", args[2]) and args[3:5] == ["-np", "2"], args
        assert "-x" not in args, args
    else:
        assert "-x" not in args and "-genv" not in args, args
        assert args[:2] == ["-np", "2"], args
    # The launcher's own environment has it either way (Hydra and srun pass
    # their environment on to the ranks).
    assert "env-set" in args


def test_the_real_mpirun_is_known():
    from mpi_launch import mpi_kind, mpirun_path

    kind = mpi_kind()  # the test helper's own reading
    assert kind in ("open-mpi", "hydra")
    assert launch_wrapper.launcher_kind(mpirun_path()) == kind
    assert launch_wrapper.launcher_kind(sys.executable) == "other"
    assert launch_wrapper.launcher_kind("/nonexistent/mpiexec") == "other"


def test_restarts_on_a_signal_or_a_lost_node_never_on_an_exception(tmp_path):
    """`run(..., max_restarts=K)` with stand-in launchers (sh): status 1 (a
    Python exception) is not retried; a launcher killed by a signal is run
    again as it was; a lost node's verdict drops the host and lowers -np."""
    count = tmp_path / "count"

    def runs():
        return len(count.read_text().splitlines()) if count.exists() else 0

    failing = f"echo run >> {count}; exit 1"
    assert launch_wrapper.run(["sh", "-c", failing], max_restarts=2) == 1
    assert runs() == 1
    count.unlink()
    marker = tmp_path / "marker"
    killed_once = (
        f"echo run >> {count}; [ -e {marker} ] && exit 0; touch {marker}; kill -KILL $$"
    )
    assert launch_wrapper.run(["sh", "-c", killed_once], max_restarts=1) == 0
    assert runs() == 2
    count.unlink()
    always_killed = f"echo run >> {count}; kill -KILL $$"
    assert launch_wrapper.run(["sh", "-c", always_killed], max_restarts=2) == 137
    assert runs() == 3


def test_lost_hosts_are_dropped_from_the_host_list_and_the_size(tmp_path):
    argv = ["mpirun", "-np", "6", "--host", "n1:2,n2:2,n3:2", "python", "t.py"]
    out, dropped = launch_wrapper.without_hosts(argv, ["n3"])
    assert out == ["mpirun", "-np", "4", "--host", "n1:2,n2:2", "python", "t.py"]
    assert dropped == 2
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    out, dropped = launch_wrapper.without_hosts(
        ["mpirun", "-n", "6", "--hostfile", str(hostfile), "python", "t.py"], ["n2"]
    )
    assert dropped == 2 and out[2] == "4"
    assert open(out[4]).read() == "n1 slots=2\nn3 slots=2\n"
    assert launch_wrapper.without_hosts(argv, ["elsewhere"]) == (argv, 0)


# -- the verdict channel: the ranks' forwarded standard error -----------------

TOKEN = "0123456789abcdef0123456789abcdef"


def _verdict(token=TOKEN, hosts=("n3",), message="rank 2 (host n3) is unreachable"):
    return launch_wrapper.verdict_line(token, message, list(hosts))


def _filtered(chunks, token=TOKEN):
    filt = launch_wrapper.VerdictFilter(token)
    out = b"".join(filt.feed(c) for c in chunks) + filt.finish()
    return out, filt


def test_verdict_filter_passes_every_other_byte_through_unchanged():
    """Output that is not this job's verdict comes out byte for byte, split
    anywhere (progress bars end in `\r`, lines arrive in pieces, binary and
    invalid UTF-8 included); this job's verdict lines are taken out, also
    split across reads and behind a launcher's per-line prefix."""
    plain = (
        b"Epoch 1/3\n\r 1/40 [>....] - ETA: 3s\r 2/40 [=>...]"
        b"\x00\xff\xfe not utf-8 \x1b[1mbold\x1b[0m\n"
        b"a line with a record separator \x1e but no marker\n"
        b"keras_mpfp16-verdict " + TOKEN.encode() + b" not a verdict: no 0x1e\n"
        b"no newline at the end"
    )
    out, filt = _filtered([plain])
    assert out == plain and filt.verdicts == [] and filt.refused == 0
    mixed = (
        b"before\n"
        + _verdict()
        + b"\r 3/40 [==>..]"
        + b"[1,2]<stderr>:"
        + _verdict(hosts=("n1",), message="rank 0 (host n1) is unreachable from x")
        + b"after\n"
    )
    expected = b"before\n\r 3/40 [==>..][1,2]<stderr>:\nafter\n"
    for size in (1, 2, 7, 4096):  # every way of splitting the stream
        chunks = [mixed[i : i + size] for i in range(0, len(mixed), size)]
        out, filt = _filtered(chunks)
        assert out == expected, (size, out)
        assert filt.verdicts == [
            launch_wrapper.Verdict("rank 2 (host n3) is unreachable", ["n3"]),
            launch_wrapper.Verdict("rank 0 (host n1) is unreachable from x", ["n1"]),
        ]


def test_verdict_filter_holds_back_only_after_a_record_separator():
    """Output reaches the wrapper's output as soon as it is read: only the
    bytes from a 0x1e byte to the end of its line wait (a verdict line is
    written whole, so in practice nothing waits)."""
    filt = launch_wrapper.VerdictFilter(TOKEN)
    assert filt.feed(b"\r 5/40 [====>") == b"\r 5/40 [====>"
    assert filt.feed(b"tail\x1ekeras_mp") == b"tail"
    assert filt.feed(b"fp16 something else\n") == b"\x1ekeras_mpfp16 something else\n"
    held = b"\x1e" + b"x" * (launch_wrapper._HELD_MAX + 1)
    assert filt.feed(held) == held  # never held without bound


def test_a_forged_or_stale_verdict_is_passed_on_and_not_acted_on():
    """A verdict line with another token (another job's, a forged one) or a
    body that does not parse is ordinary output: passed on, counted, not a
    verdict."""
    forged = _verdict(token="f" * 32)
    broken = launch_wrapper.MARK + TOKEN.encode() + b" {not json\n"
    short = launch_wrapper.MARK + TOKEN[:8].encode() + b' {"lost": [], "message": ""}\n'
    out, filt = _filtered([forged + broken + short])
    assert out == forged + broken + short
    assert filt.verdicts == [] and filt.refused == 3


def test_report_lost_writes_one_verdict_line_to_standard_error(monkeypatch, capfd):
    """A rank's `report_lost` writes one line (below PIPE_BUF, so one write
    reaches the pipe whole) that the filter reads back with the lost hosts;
    a long message keeps its first line; nothing without the wrapper's
    token."""
    monkeypatch.delenv(launch_wrapper.VERDICT_ENV, raising=False)
    launch_wrapper.report_lost("ignored", ["n9"])
    assert capfd.readouterr().err == ""
    monkeypatch.setenv(launch_wrapper.VERDICT_ENV, TOKEN)
    long = "rank 0 (host n1) is unreachable\n" + "  rank 1: waiting\n" * 1000
    launch_wrapper.report_lost(long, ["n1", "n1"])
    err = capfd.readouterr().err.encode()
    assert err.count(b"\n") == 1 and len(err) <= launch_wrapper._MAX_LINE
    out, filt = _filtered([err])
    assert out == b""
    assert filt.verdicts == [
        launch_wrapper.Verdict("rank 0 (host n1) is unreachable", ["n1"])
    ]


def _shell_launcher(tmp_path, body: str):
    """A stand-in launcher: records each run's argv, then runs `body`
    (sh), where `$V` is the job's token from the environment."""
    script = tmp_path / "launcher"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/runs\n'
        f'V="${launch_wrapper.VERDICT_ENV}"\n' + body
    )
    script.chmod(0o755)
    return str(script)


def _verdict_sh(hosts: str, message: str) -> str:
    body = f'{{"lost": [{hosts}], "message": "{message}"}}'
    return f"printf '\\036keras_mpfp16-verdict %s %s\\n' \"$V\" '{body}' >&2\n"


def _wrapper(*args, timeout=60):
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "keras_mpfp16.runtime.launch", *args],
        capture_output=True,
        timeout=timeout,
    )


def test_the_wrapper_forwards_output_unchanged_and_at_once(tmp_path):
    """Through the wrapper, the launcher's stdout and stderr come out byte
    for byte on the wrapper's, and a partial line (a progress bar) arrives
    while the launcher still runs."""
    import subprocess

    launcher = _shell_launcher(
        tmp_path,
        "printf 'out 1\\n\\r 1/9 [>..' ; printf 'err \\377 1\\n' >&2\n"
        f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n"
        "printf '\\r 2/9 [=>.]\\n'; printf 'err 2' >&2\n",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_mpfp16.runtime.launch", launcher],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    import os

    first = b""
    while len(first) < len(b"out 1\n\r 1/9 [>.."):
        data = os.read(proc.stdout.fileno(), 100)
        assert data, "the wrapper's output ended early"
        first += data
    assert first == b"out 1\n\r 1/9 [>.."  # before the launcher went on
    (tmp_path / "go").touch()
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert first + rest == b"out 1\n\r 1/9 [>..\r 2/9 [=>.]\n"
    assert err == b"err \xff 1\nerr 2"


def test_a_verdict_reaches_the_wrapper_with_no_shared_filesystem(tmp_path):
    """The launcher gets a token, not a path: a rank that writes the verdict
    line on stderr while running in its own mount namespace with an empty
    /tmp of its own (as on a node with node-local /tmp) ends the job: the
    wrapper kills a launcher that does not end and exits 69, even when the
    launcher would exit 0; the verdict line itself is not passed on."""
    import shutil
    import subprocess

    if (
        shutil.which("unshare") is None
        or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True
        ).returncode
    ):
        pytest.skip("unshare --mount is not permitted here")
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    rank = tmp_path / "rank.sh"  # read before /tmp is replaced
    rank.write_text(
        f'V="${launch_wrapper.VERDICT_ENV}"\necho "node /tmp: [$(ls -A /tmp)]"\n'
        + _verdict_sh('"n3"', "rank 2 (host n3) is lost")
    )
    launcher = _shell_launcher(
        tmp_path,
        "unshare --mount --propagation private sh -c "
        f"'r=$(cat {rank}); mount --bind {node_tmp} /tmp && eval \"$r\"'\n"
        "sleep 120\n",
    )
    res = _wrapper(launcher)
    assert res.stdout == b"node /tmp: []\n"  # the rank saw its own /tmp
    err = res.stderr.decode()
    assert res.returncode == launch_wrapper.NODE_LOST_EXIT_CODE, err
    assert "keras_mpfp16.runtime.launch: rank 2 (host n3) is lost" in err
    assert "did not end within 5s of the verdict and was killed" in err
    assert "keras_mpfp16-verdict" not in err
    # The launcher exits 0 after the verdict: still 69.
    (tmp_path / "runs").unlink()
    exits_0 = _shell_launcher(tmp_path, _verdict_sh('"n3"', "lost") + "exit 0\n")
    res = _wrapper(exits_0)
    assert res.returncode == 69, res.stderr.decode()
    assert "the launcher ended with status 0; exiting with status 69" in (
        res.stderr.decode()
    )


def test_a_forged_verdict_does_not_end_the_job(tmp_path):
    """A verdict line with a token that is not this launch's is output like
    any other: the launcher's status stands and nothing restarts."""
    launcher = _shell_launcher(
        tmp_path, "V=ffffffffffffffffffffffffffffffff\n" + _verdict_sh('"n1"', "x")
    )
    res = _wrapper("--max-restarts", "2", launcher)
    assert res.returncode == 0, res.stderr
    assert b"keras_mpfp16-verdict ffff" in res.stderr
    assert len((tmp_path / "runs").read_text().splitlines()) == 1


def test_a_verdict_naming_rank_0s_host_restarts_on_the_rest_until_none_left(
    tmp_path,
):
    """Rank 0's node lost (the survivors' verdict names it): the wrapper
    drops it from the host list and relaunches on the rest, even though the
    launcher exited 0; a launch that loses a node with no restart left ends
    with 69 and one line saying so."""
    launcher = _shell_launcher(
        tmp_path,
        f"if [ ! -e {tmp_path}/lost-once ]; then touch {tmp_path}/lost-once; "
        + _verdict_sh('"n1"', "rank 0 (host n1) is unreachable from rank 1").strip()
        + "; fi\nexit 0\n",
    )
    hosts = ["-np", "3", "--host", "n1:1,n2:1,n3:1", "python", "t.py"]
    res = _wrapper("--max-restarts", "1", launcher, *hosts)
    err = res.stderr.decode()
    assert res.returncode == 0, err
    runs = (tmp_path / "runs").read_text().splitlines()
    assert runs == [
        "-np 3 --host n1:1,n2:1,n3:1 python t.py",
        "-np 2 --host n2:1,n3:1 python t.py",
    ]
    assert "restart 1 of 1: the job lost a rank (rank 0 (host n1) is unreachable" in err
    assert err.rstrip().endswith("lost hosts: ['n1']; size: 2."), err
    # Lost every time: one restart, then 69 and one line.
    (tmp_path / "runs").unlink()
    always = _shell_launcher(tmp_path, _verdict_sh('"n3"', "n3 lost") + "exit 0\n")
    res = _wrapper("--max-restarts", "1", always, *hosts)
    err = res.stderr.decode()
    assert res.returncode == 69, err
    assert len((tmp_path / "runs").read_text().splitlines()) == 2
    assert err.count("keras_mpfp16.runtime.launch: the job lost a rank") == 2, err
    last = err.rstrip().splitlines()[-1]
    assert last == (
        "keras_mpfp16.runtime.launch: the job lost a rank (lost hosts: n3); the "
        "launcher ended with status 0; no restart left (--max-restarts 1); "
        "exiting with status 69."
    ), err
    # Every host lost: nothing to restart on.
    (tmp_path / "runs").unlink()
    res = _wrapper("--max-restarts", "3", always, "-np", "1", "--host", "n3:1", "x")
    assert res.returncode == 69
    assert len((tmp_path / "runs").read_text().splitlines()) == 1
    assert (
        res.stderr.decode()
        .rstrip()
        .endswith("no host is left to restart on without n3; exiting with status 69.")
    )


def test_hydra_host_lists_are_rewritten_too(tmp_path):
    """Hydra's (MPICH, Intel MPI) forms: `-hosts a,b` / `a:2,b:2`, `-ppn N`
    for hosts without a count, `-f hostfile` with `name:N` or bare names,
    `-n`/`-np`; the program's own arguments are left alone."""
    drop = launch_wrapper.without_hosts
    program = ["python", "t.py", "-n", "9", "-f", "config.yaml"]
    out, dropped = drop(
        ["mpiexec", "-n", "6", "-hosts", "n1:2,n2:2,n3:2", *program], ["n2"]
    )
    assert out == ["mpiexec", "-n", "4", "-hosts", "n1:2,n3:2", *program]
    assert dropped == 2
    out, dropped = drop(
        ["mpiexec", "-np", "8", "-ppn", "4", "-hosts", "n1,n2", *program], ["n1"]
    )
    assert out == ["mpiexec", "-np", "4", "-ppn", "4", "-hosts", "n2", *program]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1:2\nn2:2\nn3\n")
    out, dropped = drop(
        ["mpiexec", "-f", str(hostfile), "-n", "5", *program], ["n1", "n3"]
    )
    assert dropped == 3 and out[4] == "2", out
    assert open(out[2]).read() == "n2:2\n"
    assert out[5:] == program
    # `-f`, `-n` after the program are the program's: nothing to rewrite.
    argv = ["mpiexec", "-n", "2", "python", "t.py", "-f", "n3"]
    assert drop(argv, ["n3"]) == (argv, 0)


def test_an_executable_as_an_options_value_is_not_the_program():
    """An ssh stand-in given to the launcher (Hydra's `-launcher-exec PATH`,
    Open MPI's `--prtemca plm_ssh_agent PATH`) is an executable, but not
    the program: the host list after it is still the launcher's. (Found on
    the emulated cluster under Hydra: after node 3's loss the restart ran
    on `-hosts n1,n2,n3` again, and its proxy on node 3 could not connect.)"""
    drop = launch_wrapper.without_hosts
    agent = shutil.which("sh")
    program = ["python", "t.py"]
    argv = ["mpiexec", "-launcher", "ssh", "-launcher-exec", agent]
    out, dropped = drop([*argv, "-hosts", "n1,n2,n3", "-n", "3", *program], ["n3"])
    assert out == [*argv, "-hosts", "n1,n2", "-n", "2", *program]
    assert dropped == 1
    argv = ["mpirun", "--prtemca", "plm_ssh_agent", agent, "--mca", "btl", "tcp,self"]
    out, dropped = drop([*argv, "-np", "3", "--host", "n1,n2,n3", *program], ["n1"])
    assert out == [*argv, "-np", "2", "--host", "n2,n3", *program]
    out, _ = drop(["mpiexec", "-genv", "A", agent, "-hosts", "n1,n2", *program], ["n2"])
    assert out == ["mpiexec", "-genv", "A", agent, "-hosts", "n1", *program]


@pytest.mark.mpi
def test_settings_reach_the_ranks_through_the_real_launcher(tmp_path):
    """`pass_settings` with the launcher beside this Python (Open MPI's
    `-x`, Hydra's `-genv`): a variable the launcher's own environment lacks
    reaches every rank with the value given (Hydra) or the launcher's
    (Open MPI takes it from its environment, which the wrapper sets)."""
    import os
    import subprocess

    from mpi_launch import launch_command, mpi_env, mpi_kind

    name, value = "KERAS_MPFP16_TEST_PASSED", "through the launcher"
    argv = launch_command(2, *(["-genvnone"] if mpi_kind() == "hydra" else []))
    cmd = launch_wrapper.pass_settings(argv, {name: value}) + [
        sys.executable,
        "-c",
        # One write per rank: Hydra forwards each write as it comes, so
        # print()'s text and newline of two ranks could interleave.
        f"import os; os.write(1, (str(os.environ.get({name!r})) + chr(10)).encode())",
    ]
    env = mpi_env()
    if mpi_kind() == "open-mpi":
        env[name] = value  # -x NAME passes the launcher's own value
    else:
        env.pop(name, None)  # -genvnone: only what -genv passes arrives
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # Counted in the whole output, not by lines: the launcher may still
    # interleave the two ranks' output (seen under Hydra: "AA\n\n").
    assert out.stdout.count(value) == 2, (out.stdout, out.stderr[-2000:])
    assert "None" not in out.stdout, out.stdout
    assert os.environ.get(name) is None


def test_kmp_launch_console_script_runs_the_wrapper(tmp_path):
    """`kmp-launch` (pyproject's `[project.scripts]`) is the wrapper's
    `main`: the script pip installed beside the interpreter passes the
    launcher's status, parses `--max-restarts` and restarts a killed launcher,
    and like `python -m keras_mpfp16.runtime.launch` imports neither Keras
    nor TensorFlow nor mpi4py (seen with -X importtime)."""
    import subprocess
    import tomllib
    from importlib.metadata import entry_points
    from pathlib import Path

    from keras_mpfp16.runtime import launch

    root = Path(__file__).resolve().parent.parent
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"kmp-launch": "keras_mpfp16.runtime.launch:main"}
    installed = entry_points(group="console_scripts", name="kmp-launch")
    assert len(installed) == 1, "not installed: pip install -e . (re)creates it"
    assert next(iter(installed)).load() is launch.main
    script = Path(sys.executable).parent / "kmp-launch"
    assert script.is_file(), f"{script} missing: pip install -e . (re)creates it"

    def kmp_launch(*args, python_flags=()):
        return subprocess.run(
            [sys.executable, *python_flags, str(script), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    out = kmp_launch(
        sys.executable, "-c", "raise SystemExit(3)", python_flags=("-X", "importtime")
    )
    assert out.returncode == 3, out.stderr[-2000:]  # the launcher's status
    imported = imported_modules(out.stderr)
    assert "keras_mpfp16.runtime.supervision.launch_wrapper" in imported
    assert not heavy_modules(imported), heavy_modules(imported)

    bad = kmp_launch("--max-restarts", "two", "true")
    assert bad.returncode != 0
    assert "--max-restarts must be a whole number >= 0; received 'two'" in bad.stderr

    marker = tmp_path / "marker"
    killed_once = f"[ -e {marker} ] && exit 0; touch {marker}; kill -KILL $$"
    again = kmp_launch("--max-restarts", "1", "sh", "-c", killed_once)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "restart 1 of 1: the launcher ended with status 137" in again.stderr
    # Run directly (its own #! line), as a user types it.
    direct = subprocess.run(
        [str(script), "sh", "-c", "exit 4"], capture_output=True, timeout=120
    )
    assert direct.returncode == 4


def _start_sh(phase: str, host: str) -> str:
    body = f'{{"start": "{phase}", "host": "{host}"}}'
    return f"printf '\\036keras_mpfp16-verdict %s %s\\n' \"$V\" '{body}' >&2\n"


def test_a_host_whose_ranks_never_start_is_lost_at_start_up(tmp_path, monkeypatch):
    """Issue 39: a node lost before its rank starts MPI leaves the others in
    MPI_Init with no heartbeat. The wrapper's start-up watchdog: once a rank
    reported `boot`, the start-up timeout without a new report and
    not every rank `up`, the listed hosts none of whose ranks booted are lost: the
    launch is ended and relaunched without them; with no restart left, 69
    and one line. The reports are taken out of the output; a launch whose
    ranks all come up is left alone however long it runs."""
    monkeypatch.setenv("KERAS_MPFP16_STARTUP_TIMEOUT", "2")
    launcher = _shell_launcher(
        tmp_path,
        f"if [ ! -e {tmp_path}/once ]; then touch {tmp_path}/once\n"
        + _start_sh("boot", "n1")
        + _start_sh("boot", "n2")
        + "echo waiting in MPI_Init >&2; sleep 120; fi\n"
        + _start_sh("boot", "n1")
        + _start_sh("boot", "n2")
        + _start_sh("up", "n1")
        + _start_sh("up", "n2")
        + "sleep 3; exit 0\n",
    )
    hosts = ["-np", "3", "--host", "n1:1,n2:1,n3:1", "python", "t.py"]
    res = _wrapper("--max-restarts", "1", launcher, *hosts)
    err = res.stderr.decode()
    assert res.returncode == 0, err
    assert (tmp_path / "runs").read_text().splitlines() == [
        "-np 3 --host n1:1,n2:1,n3:1 python t.py",
        "-np 2 --host n1:1,n2:1 python t.py",
    ]
    assert (
        "restart 1 of 1: the job lost a rank (start-up did not complete: 0 of 3 "
        "ranks up, no rank's start-up moved on for 2s "
        "(KERAS_MPFP16_STARTUP_TIMEOUT); no rank on n3 started.); lost hosts: "
        "['n3']; size: 2." in err
    ), err
    assert "keras_mpfp16-verdict" not in err, err
    # No restart left: 69 and one line naming the host and the count.
    (tmp_path / "runs").unlink()
    (tmp_path / "once").unlink()
    res = _wrapper("--max-restarts", "0", launcher, *hosts)
    err = res.stderr.decode()
    assert res.returncode == 69, err
    assert err.rstrip().splitlines()[-1] == (
        "keras_mpfp16.runtime.launch: the job lost a rank (lost hosts: n3); the "
        "launcher was killed; exiting with status 69."
    ), err


def test_listed_hosts_reads_host_lists_and_files(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nb slots=2\nc:4\n\n")
    argv = ["mpirun", "--host", "a:1,b:1", "--hostfile", str(hostfile), "python"]
    assert launch_wrapper.listed_hosts(argv) == ["a", "b", "c"]
    assert launch_wrapper.listed_hosts(["mpirun", "-np", "2", "python"]) == []


def test_a_start_up_that_stops_with_no_host_to_name_ends_69(tmp_path, monkeypatch):
    """Every listed host's rank booted, then the start-up stopped (a node
    lost inside MPI_Init): no host can be named, and relaunching the same
    list would wait for the lost node's daemon before any rank reports, so
    the wrapper ends with 69 and one line, restarts left or not."""
    monkeypatch.setenv("KERAS_MPFP16_STARTUP_TIMEOUT", "2")
    launcher = _shell_launcher(
        tmp_path,
        "".join(_start_sh("boot", h) for h in ("n1", "n2", "n3")) + "sleep 120\n",
    )
    hosts = ["-np", "3", "--host", "n1:1,n2:1,n3:1", "python", "t.py"]
    res = _wrapper("--max-restarts", "2", launcher, *hosts)
    err = res.stderr.decode()
    assert res.returncode == 69, err
    assert len((tmp_path / "runs").read_text().splitlines()) == 1
    assert "every listed host's ranks started." in err, err
    assert err.rstrip().splitlines()[-1] == (
        "keras_mpfp16.runtime.launch: no lost host can be named in a start-up "
        "that stopped; not restarting on the same hosts; exiting with status 69."
    ), err
