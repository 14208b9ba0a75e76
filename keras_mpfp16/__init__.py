"""keras-mpfp16: mixed-precision data-parallel training of Keras 3 models over MPI.

Add three lines to a Keras script and launch it with `mpirun -np N`:

```python
import keras_mpfp16 as kmp

x, y = kmp.shard(x, y)
model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss=...)
```

Importing the package registers its Keras objects for `.keras` files. The
`runtime` subpackage itself never imports Keras.
"""

# The one source of the version (pyproject.toml reads it from here).
__version__ = "0.2.0"

import sys as _sys

# `python -m <one of these> ...`: processes that supervise a launcher and
# need neither Keras nor TensorFlow nor MPI.
_SUPERVISOR_MODULES = (
    "keras_mpfp16.runtime.launch",
    "keras_mpfp16.runtime.supervision.launch_wrapper",
)


# The console script of `[project.scripts]` that runs the launch wrapper.
_SUPERVISOR_SCRIPTS = ("kmp-launch",)


def _started_as_supervisor() -> bool:
    """True while `python -m keras_mpfp16.runtime.launch ...` or the
    `kmp-launch` console script starts.

    Python imports a `-m` module's parent packages (this one first) while
    `sys.argv[0]` is still `"-m"`; `sys.orig_argv` names the module. A
    console script imports its module while `sys.argv[0]` is the script's
    path.
    """
    if _sys.argv and _sys.argv[0].rsplit("/", 1)[-1] in _SUPERVISOR_SCRIPTS:
        return True
    if _sys.argv[:1] != ["-m"]:
        return False
    argv = list(getattr(_sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1] in _SUPERVISOR_MODULES
        if arg.startswith("-m"):
            return arg[2:] in _SUPERVISOR_MODULES
    return False


if _started_as_supervisor():
    # The launch wrapper: no Keras, TensorFlow or MPI in the supervisor (it
    # lives as long as the job). The public names load on first use.
    def __getattr__(name: str):
        import importlib
        import importlib.util

        # A submodule (`from keras_mpfp16 import runtime`, `kmp.config`):
        # that module, and nothing more.
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
        if name.startswith("_"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        api = importlib.import_module(f"{__name__}._api")  # the full import
        globals().update({n: getattr(api, n) for n in api.__all__})
        globals()["__all__"] = api.__all__
        return getattr(api, name)

else:
    # Everything else: the full import, with its guarantees (see _api).
    from keras_mpfp16 import _api
    from keras_mpfp16._api import *  # noqa: F403

    __all__ = list(_api.__all__)
