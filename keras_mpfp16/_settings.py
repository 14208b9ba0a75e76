"""Every `KERAS_MPFP16_*` setting, in one registry.

Each setting is registered once below with its type, default, meaning and
when the package reads it. Its value comes from, in order:

1. `keras_mpfp16.config.set(name, value)` in this process (for settings read
   after import);
2. the environment variable `KERAS_MPFP16_<NAME>`;
3. the default.

Readers call `get("NAME")`; nothing else in the package reads a
`KERAS_MPFP16_*` variable. `docs/configuration.md` is generated from this
registry (`python tools/configuration_doc.py`) and a test checks
that it is current and that every such name in the package is registered.

Adding a setting is one `register(...)` call:

```python
register("MY_SETTING", "bool", False, read="per call",
         doc="What it does, in a sentence or two.")
value = get("MY_SETTING")
```

Nothing here imports Keras (or MPI).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PREFIX = "KERAS_MPFP16_"
TYPES = ("bool", "float", "int", "str", "choice")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

_UNSET = object()


@dataclass(frozen=True)
class Setting:
    """One registered setting.

    Attributes:
        key: the name without the prefix, e.g. `"EVALUATE_WAIT"`.
        type: one of `TYPES`.
        default: the value when nothing sets it (`None` = "decide
            automatically", explained in `doc`).
        doc: what the setting does (Markdown, one paragraph).
        read: when the package reads it, e.g. `"at import"`, `"at init()"`,
            `"per call"`: a value set later has no effect until then.
        choices: the allowed values of a `"choice"` setting.
        minimum: the smallest allowed value of a number.
        parse: for `"str"` settings, a function that validates the text and
            returns the value (raising `ValueError` naming the setting).
        python: whether `keras_mpfp16.config.set` may set it (False for
            settings read at import, before any Python code could set them).
        value_doc: how a value is written, for the reference table (defaults
            to the type).
        same_on_every_rank: the ranks must agree on it (it decides which
            collectives the train step makes): `fit` checks this at its
            start and stops on every rank when they differ, instead of the
            job hanging in mismatched collectives.
    """

    key: str
    type: str
    default: Any
    doc: str
    read: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    parse: Callable[[str], Any] | None = None
    python: bool = True
    value_doc: str = ""
    same_on_every_rank: bool = False

    @property
    def name(self) -> str:
        """The environment variable, e.g. `KERAS_MPFP16_EVALUATE_WAIT`."""
        return PREFIX + self.key


_registry: dict[str, Setting] = {}
_overrides: dict[str, Any] = {}


def register(
    key: str,
    type: str,
    default: Any,
    *,
    doc: str,
    read: str,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    parse: Callable[[str], Any] | None = None,
    python: bool = True,
    value_doc: str = "",
    same_on_every_rank: bool = False,
) -> Setting:
    """Registers a setting (see `Setting` for the arguments).

    Returns:
        The `Setting`. Registering the same key twice raises `ValueError`.
    """
    key = key.upper()
    if key.startswith(PREFIX):
        key = key[len(PREFIX) :]
    if key in _registry:
        raise ValueError(f"setting {PREFIX}{key} is registered twice.")
    if type not in TYPES:
        raise ValueError(
            f"Invalid type for {PREFIX}{key}: {type!r}. Allowed: {', '.join(TYPES)}."
        )
    if type == "choice" and default not in choices:
        raise ValueError(f"{PREFIX}{key}: default {default!r} not in {choices}.")
    setting = Setting(
        key,
        type,
        default,
        doc,
        read,
        tuple(choices),
        minimum,
        parse,
        python,
        value_doc,
        same_on_every_rank,
    )
    _registry[key] = setting
    return setting


def setting(name: str) -> Setting:
    """The `Setting` called `name` (`"evaluate_wait"` or the full variable name)."""
    key = str(name).upper()
    if key.startswith(PREFIX):
        key = key[len(PREFIX) :]
    try:
        return _registry[key]
    except KeyError:
        known = ", ".join(s.key.lower() for s in settings())
        raise ValueError(
            f"Unknown keras_mpfp16 setting {name!r}. Allowed: {known}."
        ) from None


def settings() -> tuple[Setting, ...]:
    """Every registered setting, sorted by name."""
    return tuple(sorted(_registry.values(), key=lambda s: s.key))


def parse_bool(text: str, name: str) -> bool:
    """`1/true/yes/on` -> True, `0/false/no/off` -> False (any case), else ValueError."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(
        f"{name}={text!r} is not understood; use 1 or 0 (also true/false, "
        "yes/no, on/off), or unset it."
    )


def _parse(s: Setting, text: str) -> Any:
    """The value of `text` for setting `s` (text is stripped and non-empty)."""
    if s.type == "bool":
        return parse_bool(text, s.name)
    if s.type in ("float", "int"):
        try:
            value = float(text) if s.type == "float" else int(text)
        except ValueError:
            what = "a number of seconds" if s.type == "float" else "an integer"
            raise ValueError(f"{s.name}={text!r} is not {what}.") from None
        return _check_minimum(s, value, repr(text))
    if s.type == "choice":
        word = text.lower()
        if word not in s.choices:
            raise ValueError(
                f"{s.name}={text!r} is not understood; allowed values are "
                f"{', '.join(s.choices)}."
            )
        return word
    return s.parse(text) if s.parse is not None else text


def _check_minimum(s: Setting, value, shown: str):
    if s.minimum is not None and value < s.minimum:
        unit = " seconds" if s.type == "float" else ""
        raise ValueError(f"{s.name} must be >= {s.minimum:g}{unit}; received {shown}.")
    return value


def raw(name: str) -> str | None:
    """The environment variable's text, or None when unset or empty."""
    text = os.environ.get(setting(name).name)
    if text is None or text.strip() == "":
        return None
    return text.strip()


def get(name: str) -> Any:
    """The value of setting `name`: set in Python, else from the environment,
    else the default. Raises `ValueError` naming the variable for a bad value."""
    s = setting(name)
    if s.key in _overrides:
        return _overrides[s.key]
    text = raw(s.key)
    return s.default if text is None else _parse(s, text)


def source(name: str) -> str:
    """Where `get(name)`'s value comes from, for messages: `"NAME=value"`
    (the environment), `"keras_mpfp16.config.set('name', value)"` or
    `"default"`."""
    s = setting(name)
    if s.key in _overrides:
        return f"{s.name}={_overrides[s.key]!r} (keras_mpfp16.config.set)"
    text = raw(s.key)
    return "default" if text is None else f"{s.name}={text}"


def set(name: str, value: Any) -> None:
    """Sets `name` in this process; it wins over the environment variable.

    `value=None` removes the setting again (as `reset(name)`).
    """
    s = setting(name)
    if value is None:
        _overrides.pop(s.key, None)
        return
    if not s.python:
        raise ValueError(
            f"{s.name} is read {s.read}, before Python code can set it: set the "
            "environment variable before the process starts."
        )
    _overrides[s.key] = _validate(s, value)


def reset(name: str | None = None) -> None:
    """Forgets what `set` set: for `name`, or for every setting."""
    if name is None:
        _overrides.clear()
    else:
        _overrides.pop(setting(name).key, None)


def _validate(s: Setting, value: Any) -> Any:
    if isinstance(value, str):
        return _parse(s, value.strip())
    if s.type == "bool":
        if isinstance(value, bool):
            return value
    elif s.type in ("float", "int") and not isinstance(value, bool):
        if isinstance(value, int | float):
            if s.type == "int" and value != int(value):
                raise ValueError(f"{s.name} must be an integer; received {value!r}.")
            value = float(value) if s.type == "float" else int(value)
            return _check_minimum(s, value, repr(value))
    raise ValueError(
        f"Invalid value for {s.name}: {value!r} ({type(value).__name__}). "
        f"Expected {_EXPECTED.get(s.type, 'its text, as in the variable')}."
    )


_EXPECTED = {
    "bool": "True or False",
    "float": "a number (seconds)",
    "int": "an integer",
    "choice": "one of the allowed words",
}


# -- the registry -----------------------------------------------------------------


def parse_threads(value: str) -> tuple[int, int] | None:
    """Parses `KERAS_MPFP16_THREADS`; None means "leave the backend alone"."""
    value = value.strip().lower()
    if value in ("off", "none", "0", "false"):
        return None
    parts = value.split(",")
    if len(parts) == 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts):
        return int(parts[0]), int(parts[1])
    raise ValueError(
        f"KERAS_MPFP16_THREADS={value!r} is not understood; use 'off' or "
        "'INTRA,INTER' with positive integers, e.g. '4,2'."
    )


_threads = parse_threads


register(
    "ABORT_ON_EXCEPTION",
    "bool",
    True,
    read="at init()",
    doc="An unhandled exception (or Ctrl-C, or a non-zero `sys.exit`) on one "
    "rank ends the whole job with that rank's traceback (`MPI_Abort`). `0` "
    "keeps Python's default behaviour, e.g. under a debugger. "
    "See [Reliability](reliability.md).",
)
register(
    "ALL_RANKS_OUTPUT",
    "bool",
    False,
    read="at import, and at each distributed `fit`/`evaluate`",
    doc="`1` keeps Keras's console output (progress bars, `fit` lines, "
    "`summary()`) on every rank; by default ranks other than 0 are silent. "
    "Set from Python it applies from the next `fit`/`evaluate` on, so "
    "output before that (e.g. `summary()`) follows the environment variable.",
)
register(
    "CUDA_AWARE",
    "bool",
    None,
    read="once, at the first gradient reduction",
    value_doc="`1` / `0` / unset",
    doc="Whether MPI takes GPU buffers. Unset: asked of the MPI library "
    "(`keras_mpfp16.cuda_aware()`). `1` hands tensors to MPI where they live "
    "(through DLPack; on a CPU-only machine this exercises the same path on "
    "host memory); `0` stages gradients through host memory.",
)
register(
    "EVALUATE_WAIT",
    "float",
    5.0,
    minimum=0.0,
    read="at init()",
    value_doc="seconds",
    doc="How long rank 0 waits for every rank to call `evaluate` before the "
    "ranks that called it evaluate alone (their own data, no collective). "
    "Rank 0's value is used on every rank.",
)
register(
    "HANG_TIMEOUT",
    "float",
    1800.0,
    minimum=0.0,
    read="at init()",
    value_doc="seconds",
    doc="End a job that makes no progress for this long: a collective has "
    "kept ranks waiting this many seconds, because a rank never arrives (a "
    "step, callback or input pipeline that never returns) or the collective "
    "itself never completes. One message names the rank that did not arrive, "
    "its host and what it was last doing. The default, 30 minutes, is far "
    "above any legitimate wait measured or reported (a first XLA compile, a "
    "large evaluation or a slow checkpoint on one rank: minutes); `0` never "
    "ends a hang. Needs the stall inspector (`KERAS_MPFP16_STALL_TIMEOUT` "
    "not `0`). Rank 0's value is used on every rank. See "
    "[Reliability](reliability.md#a-hung-job-ends).",
)
register(
    "HEARTBEAT_TIMEOUT",
    "float",
    30.0,
    minimum=0.0,
    read="at init()",
    value_doc="seconds",
    doc="Seconds of silence after which the stall inspector declares a rank "
    "lost (its node, process or link died) and ends the job. `0` turns the "
    "heartbeats off. Rank 0's value is used on every rank.",
)
register(
    "STARTUP_TIMEOUT",
    "float",
    600.0,
    minimum=0.0,
    read="at launch (`kmp-launch`)",
    value_doc="seconds",
    doc="The launch wrapper's start-up watchdog (`kmp-launch`): once a rank "
    "has started MPI, this many seconds with no rank's start-up moving on and "
    "not every rank up end the launch; the listed hosts none of whose ranks "
    "started are declared lost (a restart without them, or status 69). It "
    "covers a node lost before or during `MPI_Init`, before the heartbeats "
    "run. The default, 10 minutes, leaves room for ranks that reach `init` "
    "far apart (one rank preparing data first, imports from a busy shared "
    "filesystem); a node lost at start-up is then noticed after that long. "
    "`0` turns the watchdog off.",
)
register(
    "END_LAUNCHER_AFTER",
    "float",
    10.0,
    minimum=0.0,
    read="when a rank declares another one lost",
    value_doc="seconds",
    doc="Seconds after a rank declared another one lost (heartbeats) before "
    "it ends its local Open MPI launcher process (`mpirun`/`prterun` on the "
    "launcher's node, `prted` elsewhere) if that is still running, so that a "
    "plain `mpirun` exits (non-zero) instead of waiting for the lost node's "
    "daemon forever. `0` turns it off.",
)
register(
    "WIRE_AUTO",
    "choice",
    "measure",
    choices=("measure", "float32", "float16", "bfloat16"),
    read="when `fit` starts",
    doc='What `wire_dtype="auto"` does: `measure` times the float32 and the '
    "float16 wire on this job's links during the first steps of `fit` and "
    "uses the faster (rank 0 decides, every rank applies its decision); "
    "`float32`, `float16` or `bfloat16` pins that wire without measuring. "
    "Rank 0's value is used on every rank. No effect on an explicit "
    "`wire_dtype`.",
)
register(
    "WIRE_SCHEDULE",
    "choice",
    "alltoall",
    choices=("alltoall", "ring"),
    read="when the train step is traced (numpy callers: per call)",
    same_on_every_rank=True,
    doc="How the 16-bit wires bring the rows to each owner's float32 sum. "
    "`alltoall`: one `Alltoall`; every input is rounded to 16 bits once. "
    "`ring`: from 3 ranks on, rows of at least 1 MiB go around a ring "
    "(N-1 `Sendrecv` steps, each rank adding its row to the running sum in "
    "float32 and passing the sum on in 16 bits): neighbours only, but N-1 "
    "small sums per bucket and N-2 more 16-bit roundings of partial sums. "
    "On 4 emulated nodes it did not pay in whole steps (1 Gbit/s: even; "
    "unlimited link: 1.14x slower), so it is off by default. Must be the "
    "same on every rank. "
    "See [Benchmarks](benchmarks.md#four-emulated-nodes-what-bounds-the-16-bit-wire).",
)
register(
    "WIRE_PIPELINE_SEGMENT",
    "int",
    0,
    minimum=0,
    read="when the train step is traced (numpy callers: per call)",
    same_on_every_rank=True,
    doc="Pipelines the 16-bit wires' reduction: a bucket whose owner's row "
    "is longer than this many values is cut into segments (each row with "
    "its own float16 exponent), and segment s+1's `Ialltoall` is on the "
    "wire while segment s is summed (in float32, as always) and gathered "
    "(`Iallgather`). `0` (default): off, one `Alltoall` + allgather per "
    "bucket. A fixed schedule: must be the same on every rank. Not used "
    "with `WIRE_SCHEDULE=ring` or on the device (GPU) buffer path. "
    "Measured on a loaded 2-core machine: `262144` made the dense model's "
    "step 0.87x at 4 emulated nodes and 1 Gbit/s, but 1.03-1.15x at 10 "
    "Gbit/s, at 2 nodes and on one box (the sums' extra cost where there is "
    "little transfer to hide them under), so it is off by default; try it "
    "on TCP clusters of 4+ nodes whose links bound the step. "
    "See [Benchmarks](benchmarks.md#the-pipelined-16-bit-reduction).",
)
register(
    "OVERLAP",
    "bool",
    False,
    read="when the train step is traced",
    same_on_every_rank=True,
    doc="Reduces the dense gradient buckets on one communication thread per "
    "rank while the backward pass runs (Horovod's design): each bucket is "
    "handed over as soon as its gradients exist and reduced in bucket order, "
    "the same on every rank; the optimizer waits for each result. The same "
    "bits as the synchronous path. Needs MPI_THREAD_MULTIPLE on every rank "
    "(else a warning and the synchronous path); not used on the GPU buffer "
    "path. Must be the same on every rank. `0` (default): off: on a loaded "
    "2-core machine (one core per rank) it hid 72% of the communication "
    "(two inter-op threads) but the step was not measurably faster, at np=2 "
    "on one box or at 2 emulated nodes (the thread shares the rank's core "
    "with backprop); try it where ranks have a spare core or the transfer "
    "runs on other hardware. "
    "See [Timeline](timeline.md#communication-hidden-under-the-backward-pass) "
    "and [Benchmarks](benchmarks.md#the-communication-thread-keras_mpfp16_overlap-issue-40-loaded).",
)
register(
    "SPARSE_GRADIENTS",
    "choice",
    "auto",
    choices=("auto", "dense", "sparse"),
    read="when the train step is traced",
    doc="How `IndexedSlices` gradients (embeddings) are reduced: `auto` "
    "gathers rows when that moves fewer bytes than a dense allreduce, "
    "`dense` always densifies, `sparse` always gathers. The optimizer's "
    "`sparse=` argument wins over this.",
)
register(
    "STALL_ABORT",
    "float",
    0.0,
    minimum=0.0,
    read="at init()",
    value_doc="seconds",
    doc="End a job whose ranks have waited in a collective this long (`0`: "
    "never end a mere stall, only warn). Rank 0's value is used on every rank.",
)
register(
    "STALL_TIMEOUT",
    "float",
    60.0,
    minimum=0.0,
    read="at init()",
    value_doc="seconds",
    doc="Seconds a collective may wait before the stall inspector prints which "
    "ranks wait where. `0` turns the inspector and the heartbeats off. The "
    "inspector needs `MPI_THREAD_MULTIPLE`. Rank 0's value is used on every "
    "rank; `keras_mpfp16.runtime.configure_stall` changes it later.",
)
register(
    "PATCH_KERAS",
    "bool",
    True,
    read="at import",
    doc="`0` installs none of the library's Keras patches at `import "
    "keras_mpfp16`: the rows of the patch table "
    "(`keras_mpfp16.training.patches`) that change Keras for every model, "
    "the wrappers of `keras.Model.fit`, `evaluate`, `save`, `save_weights` "
    "and of Keras's XLA decision (see `docs/custom_loops.md`). Training "
    "code then calls `kmp.distributed_fit` / `kmp.distributed_evaluate` "
    "itself; `kmp.install_keras_patches()` installs them later. The other "
    "rows stay, each with its own setting, as they do not change how Keras "
    "trains: the output gate on ranks other than 0 (`ALL_RANKS_OUTPUT`), "
    "stdout redirection (`ROOT_STDOUT_ONLY`), the thread and GPU "
    "environment (`THREADS`, `BIND_GPUS`), autotuning of Keras's array "
    "pipelines inside a collective call (`TFDATA_AUTOTUNE`), the job-ending"
    " hooks (`ABORT_ON_EXCEPTION`); the epoch-iterator and "
    "preemption-signal patches are scoped to a collective `fit`, which then"
    " only `kmp.distributed_fit` starts.",
)
register(
    "TFDATA_AUTOTUNE",
    "bool",
    False,
    read="per `fit`/`evaluate` call",
    doc="`1` keeps Keras's tf.data pipelines for array inputs autotuned. By "
    "default autotuning is off inside the distributed `fit`/`evaluate`: it "
    "stalled for up to 60 s each time an epoch's iterator was destroyed.",
)
register(
    "THREADS",
    "str",
    None,
    parse=_threads,
    python=False,
    read="at import",
    value_doc="`off` or `INTRA,INTER`",
    doc="Per-rank thread pools for ranks that share a node. Unset: each rank "
    "gets its share of the cores (`TF_NUM_INTRAOP_THREADS`, "
    "`TF_NUM_INTEROP_THREADS`, `OMP_NUM_THREADS`, never overwriting ones you "
    "set). `off` leaves the backend's defaults; `4,2` chooses.",
)


def _timeline_report(text: str) -> bool | str:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    if word in ("epoch", "table"):
        return word
    raise ValueError(
        f"{PREFIX}TIMELINE_REPORT={text!r} is not understood; allowed values are "
        "0, 1, epoch, table."
    )


register(
    "TIMELINE",
    "str",
    None,
    read="at each distributed `fit`",
    value_doc="a file path",
    doc="Write a Chrome trace-event timeline of every multi-process `fit` to "
    "this file (each `fit` rewrites it), as `kmp.callbacks.Timeline(path)` "
    "does. See [Timeline and scaling report](timeline.md).",
)
register(
    "TIMELINE_STEPS",
    "str",
    None,
    read="at each distributed `fit`",
    value_doc="`first-last`, one step, or `every:K`",
    doc="Which train steps the timeline traces, counted over the whole `fit`; "
    "unset: steps 0-19.",
)
register(
    "TIMELINE_REPORT",
    "str",
    False,
    read="at each distributed `fit`",
    parse=_timeline_report,
    value_doc="`0` / `1` (or `epoch`) / `table`",
    doc="Print the scaling report on rank 0: one line per epoch (`1`, "
    "`epoch`) or a table at the end (`table`). Set without "
    "`KERAS_MPFP16_TIMELINE`, the report is computed and no trace written.",
)


register(
    "ALLOW_SIZE_MISMATCH",
    "bool",
    False,
    read="at init()",
    doc="`1` switches off the check that MPI's world size equals the size the "
    "launcher announced (`srun`'s step, `mpirun`'s variables, `PMI_SIZE`). "
    "Only for the rare job that launches a different number of processes on "
    "purpose; a mismatch otherwise means N independent one-process trainings. "
    "See [Running jobs](launching.md).",
)
register(
    "BIND_GPUS",
    "bool",
    False,
    read="at import",
    python=False,
    doc="`1` makes `import keras_mpfp16` call `keras_mpfp16.bind_gpus()` (in "
    "its bootstrap, before Keras, TensorFlow, JAX or PyTorch loads): each "
    "local rank sees only its own GPU(s) through `CUDA_VISIBLE_DEVICES`, "
    "before the backend initialises CUDA.",
)


register(
    "ROOT_STDOUT_ONLY",
    "bool",
    False,
    read="at import",
    python=False,
    doc="`1` makes `import keras_mpfp16` send all standard output of ranks "
    "other than 0 to `os.devnull` (the user's `print`, C extensions, "
    "subprocesses), as `keras_mpfp16.root_stdout_only()` does; stderr is kept. "
    "See [Callbacks](callbacks.md).",
)


register(
    "PREEMPTION",
    "bool",
    True,
    read="at each distributed `fit`",
    doc="During a multi-process `fit`, SIGTERM or SIGUSR1 on any rank stops "
    "every rank at one agreed step, writes a backup and exits with status 75 "
    "(`keras_mpfp16.PREEMPTED_EXIT_CODE`); a relaunch resumes at that step. "
    "`0` leaves both signals alone. See [Reliability](reliability.md).",
)
register(
    "PREEMPTION_DIR",
    "str",
    None,
    read="at each distributed `fit`",
    value_doc="a directory",
    doc="Where the preemption backup goes when `fit` has no "
    "`BackupAndRestore` callback (one `fit-<n>` folder per `fit` call). "
    "Automatic: `keras_mpfp16_preemption/<script>` in the working directory "
    "the job was started from, `<script>` being the script's file name "
    "without `.py` (`interactive` without one).",
)
register(
    "PREEMPTION_RESUME",
    "choice",
    "same-job",
    choices=("same-job", "always", "fresh"),
    read="at each distributed `fit`",
    doc="Which of the library's own preemption backups a `fit` resumes from. "
    "`same-job`: only one written by the same job (script path and "
    "arguments, model, loss, optimizer, data fingerprint; not the number of "
    "ranks or the hosts); a backup of another job stops the `fit` with an "
    "error that names it. `always`: whatever backup is there (resume on "
    "purpose after changing the script). `fresh`: delete it and start over. "
    "See [Reliability](reliability.md#a-backup-belongs-to-one-job).",
)
register(
    "LAUNCH_VERDICT",
    "str",
    None,
    read="when a rank declares another lost",
    python=False,
    value_doc="a token",
    doc="Set by the launch wrapper (`python -m keras_mpfp16.runtime.launch "
    "mpirun ...`) for its ranks, not by users: a random token made for each "
    "launch. A rank whose heartbeats declare a rank or node lost writes a "
    "verdict line with it on its standard error, which the launcher forwards "
    "to the wrapper (no shared filesystem needed); the wrapper acts only on "
    "lines with its own token, ends the launcher and exits with status 69 "
    "(or restarts on the remaining hosts).",
)


# -- the reference page -----------------------------------------------------------


def _shown_default(s: Setting) -> str:
    if s.default is None:
        return "automatic"
    if s.type == "bool":
        return "`1`" if s.default else "`0`"
    if s.type == "float":
        return f"`{s.default:g}`"
    return f"`{s.default}`"


def _shown_type(s: Setting) -> str:
    if s.value_doc:
        return s.value_doc
    if s.type == "bool":
        return "`1` / `0`"
    if s.type == "choice":
        return " / ".join(f"`{c}`" for c in s.choices)
    return s.type


def markdown() -> str:
    """The table of `docs/configuration.md` (between its markers)."""
    lines = [
        "| Variable | Value | Default | Read | From Python |",
        "|---|---|---|---|---|",
    ]
    for s in settings():
        py = f'`kmp.config.set("{s.key.lower()}", ...)`' if s.python else "no"
        read = s.read
        if s.same_on_every_rank:
            read += "; must be the same on every rank (checked as `fit` starts)"
        lines.append(
            f"| `{s.name}` | {_shown_type(s)} | {_shown_default(s)} | {read} | {py} |"
        )
    lines.append("")
    for s in settings():
        lines += [f"### `{s.name}`", "", s.doc, ""]
    return "\n".join(lines).rstrip() + "\n"
