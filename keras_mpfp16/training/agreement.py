"""One decision per job from the callback lists of every rank.

Scripts ported from Horovod keep its habit `if hvd.rank() == 0:
callbacks.append(ModelCheckpoint(...))` (or wrap a callback in
`kmp.callbacks.root_only`), so the lists `fit` receives differ between
ranks. Whatever the library decides from a list - is there a
`BackupAndRestore` to restore from and write a preemption's backup into, or
must it install its own backup; is there a `Timeline` (its clock alignment
and per-epoch report are collectives); is the equal-steps check on - is
decided once for the job, from rank 0's list, so no rank makes a collective
the others do not make:

- each rank describes the decision-relevant part of its list (`describe`);
  one allreduce of a digest says whether the descriptions are equal (the
  usual case: nothing else happens); if not, they are gathered and
  `agree` returns rank 0's, after checking that the difference can be
  reconciled;
- reconcilable: file writers (`ModelCheckpoint`, `CSVLogger`, `TensorBoard`,
  `RemoteMonitor`, `BackupAndRestore`) on rank 0 only, or wrapped in
  `root_only` (only rank 0 writes anyway; a rank without rank 0's
  `BackupAndRestore` gets a stand-in that writes nothing), a `Timeline` on
  rank 0 only (the other ranks record with rank 0's settings), a
  `GlobalMetrics(check_steps=...)` on some ranks (rank 0's setting);
- the settings that decide which collectives the train step makes
  (`same_on_every_rank` in `keras_mpfp16._settings`: the 16-bit wire's
  schedule and pipeline segment, the communication thread) travel in the
  same description, so ranks that differ stop with `SettingsDiffer` on every
  rank, naming each rank's value, instead of hanging in mismatched
  collectives (a launcher that does not pass the variable to other nodes,
  a `kmp.config.set` on one rank);
- not reconcilable (`CallbacksDiffer` on every rank, naming the callback and
  the ranks): a callback that changes training (`EarlyStopping`,
  `ReduceLROnPlateau`, ...) on some ranks only, a file writer on a rank
  other than 0 but not on rank 0 (it would write nothing), a different
  number of `Timeline`s.
"""

from __future__ import annotations

import os

import keras

from keras_mpfp16 import _settings
from keras_mpfp16.callbacks.lr_scaler import LearningRateScaler
from keras_mpfp16.callbacks.root_only import RootOnly
from keras_mpfp16.callbacks.timeline import Timeline
from keras_mpfp16.runtime.mpi import collectives

# Written by rank 0 only, whatever the list of the other ranks holds.
WRITER_TYPES = (
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.TensorBoard,
    keras.callbacks.RemoteMonitor,
    keras.callbacks.BackupAndRestore,
)
# Change training (stop it, change the learning rate or the weights): every
# rank must run them, on the same (global) logs.
TRAINING_TYPES = tuple(
    t
    for t in (
        keras.callbacks.EarlyStopping,
        keras.callbacks.ReduceLROnPlateau,
        keras.callbacks.TerminateOnNaN,
        keras.callbacks.LearningRateScheduler,
        getattr(keras.callbacks, "SwapEMAWeights", None),
        LearningRateScaler,
    )
    if t is not None
)


class CallbacksDiffer(ValueError):
    """Raised on every rank at the start of `fit` when the ranks' callback
    lists differ in a way the library cannot reconcile."""


class SettingsDiffer(ValueError):
    """Raised on every rank at the start of `fit` when the ranks' values of a
    setting that must be the same on every rank differ."""


def _agreed_settings() -> list:
    """`[name, value]` of each setting the ranks must agree on, as this rank
    has it now (`fit` traces its step after this, reading the same values)."""
    return [
        [s.name, _settings.get(s.key)]
        for s in _settings.settings()
        if s.same_on_every_rank
    ]


def _unwrapped(callback) -> tuple[keras.callbacks.Callback, bool]:
    """`(callback, rank 0 only)`: a `root_only` stand-in is its callback,
    marked as running on rank 0 only."""
    if isinstance(callback, RootOnly):
        return callback.callback, True
    return callback, False


def _kind(callback, types) -> str | None:
    for t in types:
        if isinstance(callback, t):
            return t.__name__
    return None


def _timeline(timeline: Timeline) -> list:
    window = timeline.window
    return [
        timeline.path,
        window.every,
        window.first,
        window.last,
        timeline.report_style or False,
    ]


def describe(
    callbacks: list, timelines: list, check_steps: bool, own_backup: bool
) -> dict:
    """What the library decides from this rank's list, in plain values.

    Args:
        callbacks: The user's callbacks as given (before `make_safe`),
            without `Timeline`s and `GlobalMetrics`.
        timelines: The `Timeline`s this `fit` records with (the user's, or
            the one `KERAS_MPFP16_TIMELINE` asks for).
        check_steps: Whether the equal-steps check runs.
        own_backup: Whether the library installs its own preemption backup
            when there is no `BackupAndRestore`.
    """
    writers: dict[str, int] = {}
    training: dict[str, int] = {}
    root_only: list[str] = []
    backup = None
    for cb in callbacks:
        inner, wrapped = _unwrapped(cb)
        writer = _kind(inner, WRITER_TYPES)
        if writer is not None:
            writers[writer] = writers.get(writer, 0) + 1
            if backup is None and isinstance(inner, keras.callbacks.BackupAndRestore):
                backup = {
                    "backup_dir": os.fspath(inner.backup_dir),
                    "save_freq": inner.save_freq,
                    "delete_checkpoint": bool(inner.delete_checkpoint),
                }
            continue
        changes = _kind(inner, TRAINING_TYPES)
        if changes is None:
            continue
        if wrapped:
            root_only.append(changes)
        else:
            training[changes] = training.get(changes, 0) + 1
    return {
        "writers": sorted(writers.items()),
        "training": sorted(training.items()),
        "root_only": sorted(root_only),
        "timelines": [_timeline(t) for t in timelines],
        "backup": backup,
        "check_steps": bool(check_steps),
        "own_backup": bool(own_backup),
        "settings": _agreed_settings(),
    }


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def settings_problems(descriptions: list[dict]) -> list[str]:
    """The settings whose values differ between the ranks' descriptions
    (pure), each named with every rank's value."""
    out = []
    named = [dict(map(tuple, d.get("settings", []))) for d in descriptions]
    for name in sorted({n for d in named for n in d}):
        values = [d.get(name) for d in named]
        if len({repr(v) for v in values}) == 1:
            continue
        shown = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
        out.append(
            f"{name} differs between ranks ({shown}). It decides which "
            "collectives the train step makes, so it must be the same on "
            "every rank: set it in the environment every rank starts with "
            "(Open MPI: `mpirun -x " + name + "`; Hydra: `-genv " + name + " "
            "VALUE`; Slurm exports it by default) or with "
            "`kmp.config.set(...)` on every rank."
        )
    return out


def problems(descriptions: list[dict]) -> list[str]:
    """What cannot be reconciled between the ranks' descriptions (pure)."""
    root = descriptions[0]
    out = []
    root_writers = dict(root["writers"])
    missing: dict[str, list[int]] = {}
    for rank, d in enumerate(descriptions[1:], start=1):
        for name, _ in d["writers"]:
            if name not in root_writers:
                missing.setdefault(name, []).append(rank)
    for name, ranks in sorted(missing.items()):
        out.append(
            f"{name} is passed to fit on {_ranks(ranks)} but not on rank 0. "
            "Only rank 0 writes files, so it would write nothing: pass it on "
            "every rank, or on rank 0 only."
        )
    names = sorted(
        {name for d in descriptions for name, _ in d["training"]}
        | {name for d in descriptions for name in d["root_only"]}
    )
    for name in names:
        counts = [dict(d["training"]).get(name, 0) for d in descriptions]
        if len(set(counts)) == 1:
            continue
        most = max(counts)
        having = [r for r, c in enumerate(counts) if c == most]
        lacking = [r for r, c in enumerate(counts) if c != most]
        wrapped = [r for r, d in enumerate(descriptions) if name in d["root_only"]]
        how = (
            f" ({_ranks(wrapped)} got it wrapped in kmp.callbacks.root_only)"
            if wrapped
            else ""
        )
        out.append(
            f"{name} is passed to fit on {_ranks(having)} but not on "
            f"{_ranks(lacking)}{how}. It changes training (stops it, or "
            "changes the learning rate or the weights), so every rank must "
            "run it on the same global logs: pass it on every rank, not inside "
            "`if kmp.rank() == 0:` and not wrapped in root_only."
        )
    counts = [len(d["timelines"]) for d in descriptions]
    if len({c for c in counts if c}) > 1 or (counts[0] == 0 and any(counts)):
        out.append(
            "Timeline: ranks pass different numbers of Timeline callbacks "
            f"({', '.join(f'rank {r}: {c}' for r, c in enumerate(counts))}). A "
            "Timeline records on every rank together: pass the same one on every "
            "rank, or on rank 0 only."
        )
    return out


def agree(mine: dict) -> dict:
    """Rank 0's description, once every rank knows it is safe to follow.

    One allreduce of a digest when the descriptions are equal (the usual
    case); otherwise they are gathered and checked (`problems`), and every
    rank raises the same `CallbacksDiffer` when they cannot be reconciled.
    """
    if collectives.same_on_all_ranks(mine, "callback lists"):
        return mine
    descriptions = collectives.allgather_object(mine, "callback lists")
    differ = settings_problems(descriptions)
    if differ:
        raise SettingsDiffer("keras_mpfp16: " + " ".join(differ))
    found = problems(descriptions)
    if found:
        raise CallbacksDiffer(
            "keras_mpfp16: the callbacks passed to fit differ between ranks in "
            "a way that cannot be reconciled: " + " ".join(found)
        )
    return descriptions[0]


def timeline_from(description: list) -> Timeline:
    """A `Timeline` with rank 0's settings, for a rank that has none."""
    path, every, first, last, report = description
    if every is not None:
        return Timeline(path, every=every, report=report)
    return Timeline(path, steps=(first, last), report=report)
