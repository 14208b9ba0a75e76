"""`python -m keras_mpfp16 doctor`: check an installation and a launch before a long job.

Run it the way the training will run (`srun --mpi=pmix ... python -m
keras_mpfp16 doctor`, `mpirun -np N python -m keras_mpfp16 doctor`) or alone.
It reports the versions (library, Keras, TensorFlow, mpi4py, the MPI library),
the MPI thread level, MPI's world size against the launcher's, per rank the
host, local rank, CPU binding, visible GPUs and thread settings, CUDA-aware
MPI support, the GPUs TensorFlow computes on (it fails when the node has
GPUs that a rank's TensorFlow does not use, or a rank is bound to GPUs its
TensorFlow cannot see), a timed small and large allreduce, and a verdict. Only rank 0
prints. The exit status is 1 when something would fail or be slow, with a
fix for each problem, 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from keras_mpfp16.backend import devices
from keras_mpfp16.runtime.mpi import collectives, cuda, world
from keras_mpfp16.runtime.process import gpus, threads
from keras_mpfp16.runtime.process import launcher_env as launcher
from keras_mpfp16.runtime.supervision import stall

_THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


@dataclass
class Report:
    """What the doctor found; `problems` are (what, fix) pairs."""

    info: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def problem(self, what: str, fix: str) -> None:
        self.problems.append((what, fix))


def _version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def cpu_ranges(cpus: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `"0-2,5"`."""
    out, start, prev = [], None, None
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(out)


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _rank_row() -> dict[str, Any]:
    launch = launcher.detect()
    node_gpus = gpus.node_gpus()
    return {
        "rank": world.rank(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": world.local_rank(),
        "local_size": world.local_size(),
        "launcher_local_rank": launch.local_rank if launch else None,
        "cpus": _affinity(),
        "node_cores": threads.node_cores(),
        "gpus": node_gpus,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Which physical GPUs (UUID, PCI bus id): the sharing check compares
        # these, not CUDA_VISIBLE_DEVICES, which is "0" on every task that a
        # launcher bound to a GPU of its own.
        "gpu_identity": gpus.gpu_identities() if node_gpus else None,
        "threads": {k: os.environ.get(k) for k in _THREAD_VARS},
        "threads_by_kmp": sorted(threads.applied),
        # What the framework computes on: asked of TensorFlow itself (through
        # the backend layer's seam), not read from the driver.
        "framework_gpus": devices.framework_gpus(),
        "framework_cuda_build": devices.framework_built_with_cuda(),
    }


def check_devices(rows: list[dict[str, Any]], report: Report) -> None:
    """Flags ranks that would compute on the CPU of a GPU node.

    Two failures, per rank: the node has GPUs (the driver lists them), the
    rank does not hide them (`CUDA_VISIBLE_DEVICES` unset or naming
    devices), yet TensorFlow sees no GPU - it would train on the CPU without
    a word; and the rank is bound to N devices but TensorFlow sees fewer.
    Rows without TensorFlow (`framework_gpus` None) are not judged.
    """
    unused: list[dict[str, Any]] = []
    invisible: list[tuple[dict[str, Any], int, int]] = []
    for r in rows:
        seen = r.get("framework_gpus")
        if seen is None or not r.get("gpus"):
            continue
        visible = gpus.parse_visible(r.get("cuda_visible_devices"))
        if visible == []:
            continue  # CUDA_VISIBLE_DEVICES="": the user chose the CPU
        if not seen:
            unused.append(r)
        elif visible is not None and len(seen) < len(visible):
            invisible.append((r, len(visible), len(seen)))
    if unused:
        ranks = ", ".join(str(r["rank"]) for r in unused)
        hosts = ", ".join(sorted({r["host"] for r in unused}))
        no_cuda = [r for r in unused if r.get("framework_cuda_build") is False]
        if no_cuda:
            fix = (
                "this TensorFlow is built without CUDA (tensorflow-cpu, or "
                "TensorFlow on macOS): `pip uninstall tensorflow-cpu && pip "
                'install "keras-mpfp16[tensorflow-gpu]"` (TensorFlow\'s '
                "`tensorflow[and-cuda]`, which brings CUDA and cuDNN)"
            )
        else:
            fix = (
                "TensorFlow is built with CUDA but found no usable GPU: the "
                'CUDA/cuDNN libraries are missing or too old (`pip install "keras-'
                'mpfp16[tensorflow-gpu]"` installs them as wheels), or the '
                "driver is too old; TF_CPP_MIN_LOG_LEVEL=0 shows TensorFlow's reason"
            )
        report.problem(
            f"ranks {ranks} on {hosts}: the node has GPUs but TensorFlow sees "
            "none, so these ranks would train on the CPU",
            fix,
        )
    for r, bound, seen in invisible:
        report.problem(
            f"rank {r['rank']} on {r['host']}: bound to {bound} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']}) but TensorFlow "
            f"sees {seen}",
            "check that every entry of CUDA_VISIBLE_DEVICES names a GPU of "
            "this node (`nvidia-smi -L`), and that bind_gpus()/srun bound the "
            "rank before TensorFlow started",
        )


def check_sharing(rows: list[dict[str, Any]], report: Report) -> None:
    """Flags ranks of one host whose threads outnumber the cores they share."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_host.setdefault(row["host"], []).append(row)
    for host, group in by_host.items():
        # Ranks whose masks overlap compete for the union of their cores.
        clusters: list[tuple[set[int], list[dict[str, Any]]]] = []
        for row in group:
            cpus = set(row["cpus"])
            merged = [c for c in clusters if c[0] & cpus]
            for c in merged:
                clusters.remove(c)
                cpus |= c[0]
            members = [row] + [r for c in merged for r in c[1]]
            clusters.append((cpus, members))
        for cpus, members in clusters:
            if len(members) < 2:
                continue
            counts = []
            for r in members:
                intra = r["threads"].get("TF_NUM_INTRAOP_THREADS")
                counts.append(
                    int(intra) if intra and intra.isdigit() else len(r["cpus"])
                )
            if sum(counts) > len(cpus):
                ranks = ", ".join(
                    str(r["rank"]) for r in sorted(members, key=lambda r: r["rank"])
                )
                report.problem(
                    f"host {host}: ranks {ranks} share cores {cpu_ranges(sorted(cpus))} "
                    f"({len(cpus)} cores) and run {sum(counts)} compute threads "
                    f"({'+'.join(map(str, counts))}): oversubscribed, slow",
                    "bind each rank to its own cores (`srun --cpu-bind=cores`, "
                    "`mpirun --bind-to core --map-by ppr:K:node:PE=C`), start fewer "
                    "ranks per node, or set KERAS_MPFP16_THREADS=INTRA,INTER",
                )
        if group[0]["gpus"] and len(group) > 1:
            _check_gpu_sharing(host, group, report)


def _gpu_name(identity: dict[str, str]) -> str:
    uuid, bus = identity.get("uuid"), identity.get("pci_bus_id")
    return f"{uuid} (PCI {bus})" if uuid and bus else (uuid or bus or "?")


def _check_gpu_sharing(host: str, group: list[dict[str, Any]], report: Report) -> None:
    """Ranks of one host computing on one physical GPU.

    Each rank computes on its first visible GPU. Compared by the GPU's
    identity (UUID, else PCI bus id) when every rank could ask the driver:
    `CUDA_VISIBLE_DEVICES=0` on every task is one GPU each when a launcher
    bound each task to its own (`srun --gpus-per-task=1`), and ranks on
    different hosts never share. Only without identities (no driver to ask)
    are the `CUDA_VISIBLE_DEVICES` strings compared, unset meaning all.
    """
    seen: dict[str, list[int]] = {}
    if all(r.get("gpu_identity") is not None for r in group):
        names: dict[str, str] = {}
        for r in group:
            if not r["gpu_identity"]:
                continue  # every GPU hidden: the CPU, by choice
            first = r["gpu_identity"][0]
            key = first.get("uuid") or first.get("pci_bus_id") or "?"
            names[key] = _gpu_name(first)
            seen.setdefault(key, []).append(r["rank"])
        shared = {names[k]: v for k, v in seen.items() if len(v) > 1}
        what = "; ".join(f"ranks {v} compute on GPU {k}" for k, v in shared.items())
    else:
        for r in group:
            visible = r["cuda_visible_devices"]
            seen.setdefault("all" if visible is None else visible, []).append(r["rank"])
        shared = {k: v for k, v in seen.items() if len(v) > 1}
        what = "; ".join(f"ranks {v} see GPUs {k}" for k, v in shared.items())
    if shared:
        report.problem(
            f"host {host}: {what}: they would all compute on one GPU",
            "call kmp.bind_gpus() before building the model, or "
            "`srun --gpus-per-task=1`",
        )


def _time_allreduce(comm, MPI, nbytes: int, repeats: int) -> tuple[float, bool]:
    import numpy as np

    n = max(1, nbytes // 4)
    send = np.full(n, float(comm.Get_rank() + 1), dtype=np.float32)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, op=MPI.SUM)  # warm-up (connections, buffers)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        times.append(time.perf_counter() - start)
    size = comm.Get_size()
    expected = size * (size + 1) / 2
    # The slowest rank's median is the job's.
    median = sorted(times)[len(times) // 2]
    median = comm.allreduce(median, op=MPI.MAX)
    correct = bool(np.all(recv == expected))
    correct = bool(comm.allreduce(int(correct), op=MPI.MIN))
    return median, correct


def _versions(report: Report) -> None:
    from keras_mpfp16 import __version__

    info = report.info
    info["keras_mpfp16"] = __version__
    info["python"] = sys.version.split()[0]
    info["keras"] = _version("keras")
    info["tensorflow"] = _version("tensorflow", "tensorflow-cpu", "tf-nightly")
    info["mpi4py"] = _version("mpi4py")
    try:
        import keras

        info["keras_backend"] = keras.backend.backend()
    except Exception as exc:  # a broken Keras install is a finding, not a crash
        report.problem(f"Keras cannot be imported ({exc})", "pip install keras")


def diagnose(large_bytes: int = 64 << 20) -> Report:
    """Runs every check on every rank; rank 0's report holds every rank's rows."""
    report = Report()
    _versions(report)
    try:
        MPI = world._import_mpi()
    except RuntimeError as exc:
        report.problem(str(exc), "see above")
        return report
    info = report.info
    info["mpi_library"] = (
        MPI.Get_library_version().strip().splitlines()[0].split(", package")[0]
    )
    info["mpi_standard"] = "{}.{}".format(*MPI.Get_version())
    level = MPI.Query_thread()
    names = {
        MPI.THREAD_SINGLE: "SINGLE",
        MPI.THREAD_FUNNELED: "FUNNELED",
        MPI.THREAD_SERIALIZED: "SERIALIZED",
        MPI.THREAD_MULTIPLE: "MULTIPLE",
    }
    info["thread_level"] = names.get(level, str(level))
    if level < MPI.THREAD_MULTIPLE:
        report.problem(
            f"MPI provides thread level {info['thread_level']}, below MULTIPLE: "
            "the stall inspector, heartbeats and evaluate rendezvous are off (a "
            "lost node is never detected; evaluate on every rank is not split)",
            stall.THREAD_LEVEL_FIX,
        )
    launch = launcher.detect()
    mpi_size = MPI.COMM_WORLD.Get_size()
    info["mpi_world_size"] = mpi_size
    info["launcher"] = (
        f"{launch.launcher}: {launch.size} processes ({', '.join(launch.variables)})"
        if launch
        else "none detected (a process started alone)"
    )
    try:
        launcher.check_world_size(mpi_size, info["mpi_library"])
    except launcher.WorldSizeMismatchError as exc:
        report.problem(str(exc).removeprefix("keras_mpfp16: "), "see above")
        info["cpus"] = cpu_ranges(_affinity())
        return report  # alone in a world of one: nothing collective to test
    world.init()
    comm = world.mpi_comm()
    aware, reason = cuda.detection()
    info["cuda_aware_mpi"] = f"{aware} ({reason})"
    small, small_ok = _time_allreduce(comm, MPI, 4, 50)
    large, large_ok = _time_allreduce(comm, MPI, large_bytes, 3)
    info["allreduce_4B_us"] = round(small * 1e6, 1)
    info["allreduce_large_bytes"] = large_bytes
    info["allreduce_large_s"] = round(large, 4)
    info["allreduce_large_GBps"] = (
        round(large_bytes / large / 1e9, 3) if large else None
    )
    if not (small_ok and large_ok):
        report.problem(
            "an allreduce returned a wrong sum",
            "report this with the output of `python -m mpi4py --mpi-lib-version`",
        )
    rows = comm.gather(_rank_row(), root=0)
    if comm.Get_rank() == 0:
        report.ranks = rows
        check_sharing(rows, report)
        check_devices(rows, report)
    return report


def _computes_on(seen: list[str] | None) -> str:
    if seen is None:
        return "(no TensorFlow)"
    if not seen:
        return "CPU"
    return f"{len(seen)} GPU(s)"


def format_report(report: Report) -> str:
    lines = ["keras_mpfp16 doctor", ""]
    width = max((len(k) for k in report.info), default=0)
    lines += [f"  {k:<{width}}  {v}" for k, v in report.info.items()]
    if report.ranks:
        table = [
            (
                "rank",
                "host",
                "local",
                "cpus",
                "intra,inter",
                "CUDA_VISIBLE_DEVICES",
                "TF computes on",
            )
        ]
        for r in report.ranks:
            t = r["threads"]
            visible = r["cuda_visible_devices"]
            table.append(
                (
                    str(r["rank"]),
                    r["host"],
                    f"{r['local_rank']}/{r['local_size']}",
                    cpu_ranges(r["cpus"]),
                    f"{t['TF_NUM_INTRAOP_THREADS'] or '-'},"
                    f"{t['TF_NUM_INTEROP_THREADS'] or '-'}",
                    "(unset)" if visible is None else visible,
                    _computes_on(r.get("framework_gpus")),
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines.append("")
        for row in table:
            cells = "  ".join(c.ljust(w) for c, w in zip(row, widths))
            lines.append(f"  {cells}".rstrip())
    lines.append("")
    if not report.problems:
        lines.append("verdict: OK")
    else:
        lines.append(f"verdict: {len(report.problems)} problem(s)")
        for what, fix in report.problems:
            lines.append(f"  - {what}")
            lines.append(f"    fix: {fix}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m keras_mpfp16 doctor",
        description="Checks the installation and the launch (run it under "
        "mpirun/srun like the training, or alone).",
    )
    parser.add_argument(
        "--large-mb",
        type=float,
        default=64,
        help="size of the large timed allreduce, in MB (default 64)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.large_mb <= 0:
        parser.error(f"--large-mb must be > 0; received {args.large_mb}")
    report = diagnose(int(args.large_mb * (1 << 20)))
    if not world.is_initialized() or world.rank() == 0:
        if args.json:
            print(
                json.dumps(
                    {
                        "info": report.info,
                        "ranks": report.ranks,
                        "problems": [{"what": w, "fix": f} for w, f in report.problems],
                        "ok": not report.problems,
                    }
                ),
                flush=True,
            )
        else:
            print(format_report(report), flush=True)
    # Every rank exits with rank 0's verdict.
    status = 1 if report.problems else 0
    if world.is_initialized() and world.size() > 1:
        status = world.mpi_comm().bcast(status, root=0)
        if status:
            _exit_together(status)
    return status


def _exit_together(status: int) -> None:
    """Every rank leaves with the agreed non-zero status, without an abort.

    A non-zero exit normally makes the library abort the job (so that other
    ranks do not wait for this one); here all ranks agreed on the status and
    meet in a barrier first, so each can simply end its process (the
    launcher then reports the status).
    """
    collectives.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
