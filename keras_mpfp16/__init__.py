"""keras-mpfp16: mixed-precision data-parallel training of Keras 3 models over MPI.

Add three lines to a Keras script and launch it with `mpirun -np N`:

```python
import keras_mpfp16 as kmp

x, y = kmp.shard(x, y)
model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss=...)
```

Importing the package registers its Keras objects for `.keras` files and
installs its Keras patches, by the time Keras is used: the import-time work
(`keras_mpfp16._bootstrap`) runs once, at `import keras_mpfp16` when Keras
is already imported, else at the first import of Keras or TensorFlow, of a
Keras-facing module of the package, or at the first public name used. A
process that only imports the light modules (the launch wrapper, `kmp.config`,
the `runtime` subpackage, which never imports Keras) loads none of it.
"""

# The one source of the version (pyproject.toml reads it from here).
__version__ = "0.3.0"

from typing import TYPE_CHECKING

from keras_mpfp16 import _bootstrap

if TYPE_CHECKING:  # the names, for type checkers and the API docs
    from keras_mpfp16._api import *  # noqa: F403
    from keras_mpfp16._api import __all__ as __all__


def __getattr__(name: str):
    """The public names (`keras_mpfp16._api`), bound by the bootstrap.

    A private name (`from keras_mpfp16 import _settings` asks here first) is
    left to the import system: only public names start the bootstrap.
    """
    if name.startswith("_") and name != "__all__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _bootstrap.bootstrap()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    _bootstrap.bootstrap()
    return sorted(globals())


_bootstrap.arm()
