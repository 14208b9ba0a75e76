"""A preempted multi-process `fit` stops at one step, backed up, and resumes there.

While a multi-process `fit` of a `DistributedOptimizer` model runs, SIGTERM
and SIGUSR1 are recorded (`runtime.preemption`) and the record travels in
the next step's metric reduction, so every rank learns in the same step that
some rank was signalled. At the end of that step (or of the epoch, when the
signal came during validation) `Preemption`:

1. has rank 0 write a complete backup: into the directory of the user's
   `keras.callbacks.BackupAndRestore` when `fit` has one, else into the
   library's own (`KERAS_MPFP16_PREEMPTION_DIR`, default
   `./keras_mpfp16_preemption/<script>`, one `fit-<n>` directory per collective `fit`
   of the process); the backup records the step reached in the epoch and
   the epoch's metric state;
2. waits until the backup is on disk (a barrier), then raises
   `Preempted` (a `SystemExit` with status `PREEMPTED_EXIT_CODE`, 75) on
   every rank. `on_train_end` does not run, so the backup is kept.

The library's own backup belongs to the job that wrote it: it records
who wrote it (`job_identity`: the script and its arguments, the model's,
loss's and optimizer's signature, the data's fingerprint where `kmp.shard`
took one; and, not compared, the Slurm job id, host, time and number of
ranks). A `fit` of another job finding it stops with `BackupOfAnotherJob`
naming the backup, its writer and what differs, unless
`KERAS_MPFP16_PREEMPTION_RESUME` says `always` (resume on purpose) or
`fresh` (delete it and start over). The number of ranks and the hosts are
not part of the comparison: the same job relaunched on another allocation
resumes, also on another number of ranks, where the interrupted epoch
continues at the same part of the epoch (`step_at_new_size`), not at the
same step count.

Started again with the same script and arguments, `fit` restores rank 0
from the backup (the user's `BackupAndRestore` does, or the library's own
when its directory exists), every rank takes rank 0's state
(`sync.replica`), the epoch's metric state is restored and the steps
already trained are read from the input but not trained again. The result
is bitwise identical to an uninterrupted run when the batches of an epoch
do not depend on the process's history (`shuffle=False`, a `PyDataset`
whose order depends on the epoch only, a deterministic `tf.data`
pipeline). With `shuffle=True` the resumed epoch draws a new permutation,
as stock `BackupAndRestore` does at an epoch start. The library's own
backup is deleted when its `fit` ends normally.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import socket
import sys
import time

import keras
import numpy as np

from keras_mpfp16 import _settings as env
from keras_mpfp16.data.shard import fingerprints as shard_fingerprints
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.runtime import progress
from keras_mpfp16.runtime.mpi import collectives, world
from keras_mpfp16.runtime.supervision import atomic_files, preemption
from keras_mpfp16.sync.metric_reduction import metric_variables
from keras_mpfp16.training.files import SafeBackupAndRestore

_fits = {"count": 0}  # collective fits started by this process


# What must be equal for a backup to be resumed; the rest of a writer record
# (host, time, ranks, Slurm job id, pid) is recorded for the message only.
COMPARED = ("script", "arguments", "model", "loss", "optimizer", "data")


def _count(record: dict, key: str) -> int | None:
    """A positive integer of a backup's layout, or None when not recorded."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def step_at_new_size(steps_done: int, written: dict, now: dict) -> tuple[int, str]:
    """The step to resume an interrupted epoch at, on another number of ranks.

    A backup written `steps_done` steps into an epoch by `written["ranks"]`
    ranks resumes, on `now["ranks"]` ranks, at the step where the same part
    of the epoch has been reached, rounded down: no sample is counted as
    trained that was not, and at most one global batch (at the new size) is
    trained again. With `kmp.shard`'s round-robin rows and `shuffle=False`
    the samples skipped are then among those trained before the
    interruption (see docs/reliability.md).

    The part of the epoch is measured, by the first rule whose numbers both
    layouts hold:

    1. `"samples"`: global samples done, `steps_done * batch_size * ranks`
       (`batch_size` per rank, known for array inputs), divided by the new
       global batch;
    2. `"fraction"`: the fraction of the epoch's steps (`steps_per_epoch`,
       Keras's `params["steps"]`), times the new steps per epoch;
    3. `"ranks"`: the per-rank batch size assumed unchanged,
       `steps_done * ranks / new ranks`.

    The result is at most the new steps per epoch where that is known.

    Args:
        steps_done: Steps of the epoch trained when the backup was written.
        written: The backup's layout: `{"ranks", "steps_per_epoch",
            "batch_size"}`, each a positive int or missing/None.
        now: The same for the `fit` resuming.

    Returns:
        `(step, rule)`: rule `"same size"` (`steps_done` unchanged: same
        number of ranks, or a backup that does not record it) or one of the
        above.

    Example:

    >>> step_at_new_size(10, {"ranks": 3, "batch_size": 4}, {"ranks": 2, "batch_size": 4})
    (15, 'samples')
    >>> step_at_new_size(7, {"ranks": 2, "steps_per_epoch": 30}, {"ranks": 3, "steps_per_epoch": 20})
    (4, 'fraction')
    """
    steps_done = int(steps_done)
    if steps_done < 0:
        raise ValueError(f"steps_done must be >= 0; received {steps_done}.")
    old_n, new_n = _count(written, "ranks"), _count(now, "ranks")
    if old_n is None or new_n is None or old_n == new_n:
        return steps_done, "same size"
    old_b, new_b = _count(written, "batch_size"), _count(now, "batch_size")
    old_s, new_s = _count(written, "steps_per_epoch"), _count(now, "steps_per_epoch")
    if old_b is not None and new_b is not None:
        step, rule = (steps_done * old_b * old_n) // (new_b * new_n), "samples"
    elif old_s is not None and new_s is not None:
        step, rule = (steps_done * new_s) // old_s, "fraction"
    else:
        step, rule = (steps_done * old_n) // new_n, "ranks"
    if new_s is not None:
        step = min(step, new_s)
    return step, rule


def input_batch_size(arguments: dict) -> int | None:
    """The per-rank batch size of a `fit` on arrays (`batch_size`, Keras's
    default 32); None for a dataset, a `PyDataset` or a generator, which
    batch their data themselves."""
    x = arguments.get("x")
    if x is None:
        return None
    leaves = keras.tree.flatten(x)
    if not leaves or not all(
        hasattr(leaf, "shape") and len(getattr(leaf, "shape", ())) >= 1
        for leaf in leaves
    ):
        return None
    return int(arguments.get("batch_size") or 32)


class BackupOfAnotherJob(RuntimeError):
    """Raised on every rank by a `fit` that finds, in the library's own backup
    directory, a backup written by another job (see `job_identity`)."""


def _plain(value):
    """JSON-able, and free of memory addresses (they change every run)."""
    text = str(value)
    return type(value).__name__ if " at 0x" in text else text


def _digest(value) -> str:
    text = json.dumps(value, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _serialized(obj):
    try:
        return keras.saving.serialize_keras_object(obj)
    except Exception:  # noqa: BLE001 - any object: then its type
        return type(obj).__name__


def _without_names(value):
    """A configuration without `name` entries: Keras numbers the automatic
    names (`dense_1`) by what the process created before."""
    if isinstance(value, dict):
        return {k: _without_names(v) for k, v in value.items() if k != "name"}
    if isinstance(value, (list, tuple)):
        return [_without_names(v) for v in value]
    return value


def _model_signature(model) -> str:
    """The model's class, its layers' classes and configurations (names
    left out) and its variables' shapes and dtypes, as a digest."""
    layers = []
    for layer in keras_internals.flatten_layers(model):
        if layer is model:
            continue
        try:
            config = _without_names(layer.get_config())
        except Exception:  # noqa: BLE001 - a custom layer without one
            config = None
        layers.append([type(layer).__name__, config])
    weights = [(list(v.shape), str(v.dtype)) for v in model.weights]
    return _digest([type(model).__name__, layers, weights])


def _optimizer_signature(optimizer) -> tuple[str, str]:
    """`(readable name, digest)`: the wrapper and inner classes and the inner
    optimizer's settings without its learning rate (callbacks change that
    during training) and name."""
    names = [type(optimizer).__name__]
    inner = optimizer
    while getattr(inner, "inner_optimizer", None) is not None:
        inner = inner.inner_optimizer
        names.append(type(inner).__name__)
    try:
        config = dict(inner.get_config())
    except Exception:  # noqa: BLE001
        config = {}
    for key in ("learning_rate", "name"):
        config.pop(key, None)
    return "/".join(names), _digest([names, config])


def job_identity(model) -> dict:
    """Who this `fit` is, for the writer record of the library's own backup.

    Computed at the start of `fit`, before anything is restored, so the same
    script relaunched computes the same values. `compared` holds what must
    match for a resume (`COMPARED`); the rest is shown in messages.

    Returns:
        `{"compared": {...}, "command", "host", "time", "ranks",
        "slurm_job_id", "pid", "optimizer_name"}`.
    """
    optimizer = getattr(model, "optimizer", None)
    opt_name, opt_digest = (
        _optimizer_signature(optimizer) if optimizer is not None else ("", "")
    )
    prints = shard_fingerprints()
    script = sys.argv[0] if sys.argv else ""
    return {
        "compared": {
            "script": os.path.abspath(script) if script not in ("", "-c") else script,
            "arguments": list(sys.argv[1:]),
            "model": _model_signature(model),
            "loss": _digest(_serialized(getattr(model, "loss", None))),
            "optimizer": opt_digest,
            "data": _digest(prints) if prints else None,
        },
        "command": shlex.join(["python", *sys.argv]),
        "optimizer_name": opt_name,
        "host": socket.gethostname(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "ranks": world.size(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "pid": os.getpid(),
    }


def describe_writer(record: dict | None) -> str:
    """ "<command> at <time> on <host> (N ranks, Slurm job J)" for messages."""
    if not record:
        return "an unknown job (the backup carries no writer record)"
    extra = f"{record.get('ranks')} rank{'s' if record.get('ranks') != 1 else ''}"
    if record.get("slurm_job_id"):
        extra += f", Slurm job {record['slurm_job_id']}"
    return (
        f"`{record.get('command')}` at {record.get('time')} on "
        f"{record.get('host')} ({extra})"
    )


def differences(mine: dict, theirs: dict | None) -> list[str]:
    """What differs between two job identities, in words (empty: the same job)."""
    if not theirs or "compared" not in theirs:
        return ["no writer record (written by an older keras_mpfp16, or by hand)"]
    a, b = theirs["compared"], mine["compared"]
    out = []
    for key in COMPARED:
        if a.get(key) == b.get(key):
            continue
        if key == "script":
            out.append(f"script ({a.get(key)} vs this job's {b.get(key)})")
        elif key == "arguments":
            out.append(
                f"arguments ({shlex.join(a.get(key) or [])!r} vs this job's "
                f"{shlex.join(b.get(key) or [])!r})"
            )
        elif key == "optimizer":
            out.append(
                f"optimizer ({theirs.get('optimizer_name')} vs this job's "
                f"{mine.get('optimizer_name')}, or its settings)"
            )
        elif key == "data":
            out.append("data (the fingerprint kmp.shard took)")
        else:
            out.append(f"{key} (its configuration)")
    return out


def another_job_message(directory: str, mine: dict, theirs: dict | None) -> str:
    resume = env.setting("PREEMPTION_RESUME").name
    where = env.setting("PREEMPTION_DIR").name
    return (
        f"keras_mpfp16: the preemption backup in {directory} was written by "
        f"another job: {describe_writer(theirs)}. It differs from this job in: "
        f"{'; '.join(differences(mine, theirs))}. This fit does not resume from "
        f"it. To start this job fresh: delete {directory} (or set "
        f"{resume}=fresh, which deletes it), or give this job its own "
        f"directory with {where}. To resume from it on purpose (the same job, "
        f"changed): set {resume}=always."
    )


class OwnBackup(SafeBackupAndRestore):
    """The library's backup for a `fit` without `BackupAndRestore`: written
    only at a preemption, restored when its directory exists and holds a
    backup of the same job (`job_identity`), deleted at the end of a `fit`
    that ends normally."""

    def on_train_begin(self, logs=None):
        self.job = job_identity(self.model)
        found = world.is_root() and (
            os.path.isdir(self.backup_dir)
            or os.path.isdir(self._old)
            or os.path.isdir(self._new)
        )
        verdict = None
        if found:
            self.recover()
            verdict = self._verdict()
        verdict = collectives.broadcast(verdict)
        if verdict is None:
            return
        action, message = verdict
        if action == "refuse":
            raise BackupOfAnotherJob(message)
        if action == "fresh":
            if world.is_root():
                shutil.rmtree(self.backup_dir, ignore_errors=True)
                sys.stderr.write(message + "\n")
            return
        if world.is_root():
            self.callback.on_train_begin(logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if world.is_root() and not (env.get("PREEMPTION_DIR") or "").strip():
            # The default `keras_mpfp16_preemption/<script>`: leave no empty
            # folders behind (ours only; a folder the user named stays).
            for folder in (os.path.dirname(self.backup_dir), preemption.DEFAULT_DIR):
                try:
                    os.rmdir(folder)
                except OSError:
                    break

    def _verdict(self) -> tuple[str, str] | None:
        """Rank 0, after `recover`: `(action, message)` for the backup found."""
        if not os.path.isdir(self.backup_dir):
            return None
        policy = preemption.resume_policy()
        theirs = self.writer_record()
        if policy == "fresh":
            return (
                "fresh",
                f"keras_mpfp16: {env.setting('PREEMPTION_RESUME').name}=fresh: "
                f"deleted the preemption backup in {self.backup_dir} (written by "
                f"{describe_writer(theirs)}); this fit starts from the beginning.",
            )
        if policy == "same-job" and differences(self.job, theirs):
            return ("refuse", another_job_message(self.backup_dir, self.job, theirs))
        return ("resume", "")

    def writer_record(self) -> dict | None:
        """The writer record stored with the backup in `backup_dir`, if any."""
        _, metadata = keras_internals.backup_paths(self.callback)
        try:
            with open(metadata) as f:
                record = json.load(f).get("keras_mpfp16", {}).get("writer")
        except (OSError, ValueError, AttributeError):
            return None
        return record if isinstance(record, dict) else None

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._steps = epoch + 1, 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1


def _file_folders(callback) -> list[str]:
    """Folders a (possibly wrapped) callback writes files into."""
    while hasattr(callback, "callback") and callback.callback is not callback:
        callback = callback.callback
    out = []
    for attr in ("filepath", "filename", "backup_dir"):
        value = getattr(callback, attr, None)
        if isinstance(value, (str, os.PathLike)) and "://" not in os.fspath(value):
            path = os.fspath(value)
            out.append(path if attr == "backup_dir" else os.path.dirname(path))
    return out


def remove_stale_temporaries(callbacks: list, writer=None) -> list[str]:
    """Rank 0, at the start of a `fit`: deletes the temporary files that
    killed processes left (`runtime.supervision.atomic_files.remove_stale_temporaries`)
    in the working directory and in every folder this `fit` writes files
    into (checkpoints, CSV logs, backups).

    Returns:
        The paths removed.
    """
    folders = ["."]
    for cb in [*callbacks, writer]:
        if cb is not None:
            folders += _file_folders(cb)
    if writer is not None:
        folders.append(os.path.dirname(os.fspath(writer.backup_dir)))
    removed, seen = [], set()
    for folder in folders:
        key = os.path.abspath(folder or ".")
        if key in seen:
            continue
        seen.add(key)
        removed += atomic_files.remove_stale_temporaries(folder or ".")
    return removed


def own_backup_dir() -> str:
    """A new `fit-<n>` directory name under the library's backup directory."""
    _fits["count"] += 1
    _, base = preemption.settings()
    return os.path.join(base, f"fit-{_fits['count']}")


def own_backup_enabled() -> bool:
    """Whether a `fit` without `BackupAndRestore` gets the library's own
    backup (preemption handling on: `KERAS_MPFP16_PREEMPTION`)."""
    return bool(preemption.settings()[0])


def writer_for(
    callbacks: list, backup: dict | None = None, own: bool | None = None
) -> tuple[SafeBackupAndRestore | None, bool]:
    """The backup a preemption writes into, decided by rank 0's list.

    Args:
        callbacks: This rank's callbacks, already made safe.
        backup: Rank 0's (first) `BackupAndRestore` as described by
            `training.agreement.describe` (None: rank 0 has none).
        own: Rank 0's `own_backup_enabled()` (None: this rank's).

    Returns:
        `(writer, listed)`: this rank's (first) `BackupAndRestore` made safe
        (`listed` False: it is in the list already); where rank 0 has one
        and this rank not, a stand-in with rank 0's directory (it writes
        nothing here: only rank 0 writes); where rank 0 has none, a new
        `OwnBackup`; `(None, False)` when rank 0 has none and preemption
        handling is off.
    """
    if backup is not None or own is None:
        for cb in callbacks:
            if isinstance(cb, SafeBackupAndRestore):
                return cb, False
    if backup is not None:
        stand_in = keras.callbacks.BackupAndRestore(
            backup["backup_dir"],
            save_freq=backup["save_freq"],
            delete_checkpoint=backup["delete_checkpoint"],
        )
        return SafeBackupAndRestore(stand_in), True
    if not (own_backup_enabled() if own is None else own):
        return None, False
    directory = own_backup_dir()
    return OwnBackup(keras.callbacks.BackupAndRestore(directory)), True


class Preemption(keras.callbacks.Callback):
    """Stops every rank at the agreed step with a backup; resumes mid-epoch.

    Listed after every other callback of the collective `fit`.

    A backup written by another number of ranks resumes at the same part
    of the interrupted epoch (`step_at_new_size`), and rank 0 says so in
    one line.

    Args:
        writer: The backup to write and resume from.
        batch_size: The per-rank batch size (`input_batch_size`), or None
            when the input batches itself.
    """

    def __init__(self, writer: SafeBackupAndRestore, batch_size: int | None = None):
        super().__init__()
        self.writer = writer
        self.batch_size = batch_size
        self.front = ResumedMetrics()
        self._epoch = 0
        self._steps = 0
        self._resume: dict | None = None

    def set_model(self, model):
        super().set_model(model)
        # Looked up when a backup is written: Keras builds the compiled
        # metrics' variables in the first step.
        self.writer.metric_state = lambda: _flat_values(metric_variables(model))

    # -- resume ----------------------------------------------------------------

    def on_train_begin(self, logs=None):
        users = self.writer.job is None  # the user's BackupAndRestore
        if users:  # its writer is recorded only, never compared
            self.writer.job = job_identity(self.model)
        self.writer.layout = {
            "ranks": world.size(),
            "steps_per_epoch": (self.params or {}).get("steps"),
            "batch_size": self.batch_size,
        }
        progress.clear_resumed()
        record = self.writer.resume_point() if world.is_root() else None
        record = collectives.broadcast(record)
        start = keras_internals.get_initial_epoch(self.model) or 0
        if record and int(record.get("steps_done", 0)) > 0:
            if int(record.get("epoch", -1)) == start:
                self._resume = record
        resized = None
        if self._resume is not None:
            saved = int(self._resume["steps_done"])
            steps, rule = step_at_new_size(saved, self._resume, self.writer.layout)
            if rule != "same size":
                resized = (saved, steps, rule)
                self._resume = {**self._resume, "steps_done": steps}
            progress.set_resumed(start, steps, _count(self._resume, "ranks"))
        if record and world.is_root():
            steps = int(self._resume["steps_done"]) if self._resume else 0
            # One line that cannot be missed, also for an epoch-boundary backup.
            which = "backup" if users else "preemption backup"
            sys.stderr.write(
                f"keras_mpfp16: RESUMING from the {which} in "
                f"{self.writer.backup_dir}: epoch {start + 1}, step {steps} "
                f"(written by {describe_writer(record.get('writer'))})\n"
            )
            if resized is not None:
                sys.stderr.write(_resized_message(start, resized, record, self))
            sys.stderr.flush()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._steps = epoch, 0
        record, self._resume = self._resume, None
        progress.clear_resumed()  # read by the callbacks before this one
        if record is None:
            return
        steps = int(record["steps_done"])
        # The compiled metrics' variables exist only after the first step:
        # their saved state is added after it (`ResumedMetrics`).
        self.front.pending = record.get("metrics") or []
        keras_internals.skip_steps_of_next_epoch.arm(steps)
        self._steps = steps

    # -- stop --------------------------------------------------------------------

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        if preemption.agreed():
            self._stop(self._epoch, self._steps)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._steps = epoch + 1, 0
        if preemption.agreed():
            self._stop(epoch + 1, 0)

    def _stop(self, epoch: int, steps: int) -> None:
        if world.is_root():
            self.writer.write_now(epoch, steps)
        collectives.barrier()  # every rank leaves once the backup is complete
        preemption.mark_exiting()
        exc = preemption.Preempted(
            preemption.requested(), epoch, steps, self.writer.backup_dir
        )
        if world.is_root():
            sys.stderr.write(
                f"keras_mpfp16: {exc} (epoch {epoch + 1} resumes at step {steps} "
                "when the job is started again)\n"
            )
            sys.stderr.flush()
        raise exc


def _resized_message(epoch: int, resized: tuple, record: dict, stop) -> str:
    """Rank 0's line for a resume at another number of ranks."""
    saved, steps, rule = resized
    old_n, new_n = record.get("ranks"), world.size()
    old_s = _count(record, "steps_per_epoch")
    new_s = _count(stop.writer.layout, "steps_per_epoch")
    of_old = f" of {old_s}" if old_s else ""
    of_new = f" of {new_s}" if new_s else ""
    how = {
        "samples": (
            f"{saved * record['batch_size'] * old_n} global samples done, "
            f"{steps * stop.batch_size * new_n} skipped"
        ),
        "fraction": f"{saved}/{old_s} of the epoch's steps",
        "ranks": "per-rank batch size assumed unchanged",
    }[rule]
    fraction = (
        f", fraction {saved / old_s:.4g} -> {steps / new_s:.4g}"
        if (old_s and new_s)
        else ""
    )
    return (
        f"keras_mpfp16: resumed at {new_n} ranks (backup written at {old_n}): "
        f"epoch {epoch + 1}, step {saved}{of_old} at {old_n} ranks -> step "
        f"{steps}{of_new} at {new_n} ranks ({how}{fraction}; rounded down: at "
        "most one global batch is trained again)\n"
    )


class ResumedMetrics(keras.callbacks.Callback):
    """Adds a resumed epoch's saved metric state after its first step.

    Listed first, so every other callback sees the logs of that step with
    the whole epoch's state. The metric state is additive (the metric
    reduction's premise): the saved state plus the first step's is the
    state an uninterrupted run has, bit for bit (float addition commutes).
    """

    def __init__(self):
        super().__init__()
        self.pending: list | None = None

    def on_train_batch_end(self, batch, logs=None):
        values, self.pending = self.pending, None
        if not values:
            return
        variables = metric_variables(self.model)
        sizes = [int(np.prod(var.shape)) for var in variables]
        if sum(sizes) != len(values):
            return  # a different set of metrics: the epoch's logs restart
        offset = 0
        for var, size in zip(variables, sizes):
            saved = np.asarray(values[offset : offset + size], np.float64)
            saved = saved.reshape(var.shape).astype(var.dtype)
            var.assign(np.asarray(var) + saved)
            offset += size
        if isinstance(logs, dict):
            fresh = self.model.get_metrics_result()
            for key in logs:
                if key in fresh:
                    logs[key] = float(np.asarray(fresh[key]))


def _flat_values(variables) -> list[float]:
    return [
        float(v)
        for var in variables
        for v in np.asarray(var, dtype=np.float64).reshape(-1)
    ]
