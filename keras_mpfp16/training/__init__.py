"""Multi-process `fit` and `evaluate` of models compiled with a DistributedOptimizer.

`import keras_mpfp16` installs the Keras patches (`patches`; opt out with
`KERAS_MPFP16_PATCH_KERAS=0`); the wrappers act only for models compiled
with a `keras_mpfp16.DistributedOptimizer` and more than one process:

- `sessions`: one collective `fit`/`evaluate` as a context manager
  (`distributed_fit`, `distributed_evaluate`: the explicit path for code
  that calls Keras's `fit` itself);
- `model_hooks`: the wrappers of `keras.Model.fit` / `evaluate` built on it;
- `run`: global logs, split validation and evaluation, safe callbacks;
- `files`: stock file-writing callbacks with one atomic writer;
- `preemption`: the agreed stop and the mid-epoch resume;
- `predict`: `split_predict`, one input's predictions shared by all ranks.
"""

from keras_mpfp16._deprecation import moved_names
from keras_mpfp16.training.patches import install, installed, uninstall
from keras_mpfp16.training.predict import split_predict
from keras_mpfp16.training.sessions import (
    distributed_evaluate,
    distributed_fit,
)

__all__ = [
    "distributed_evaluate",
    "distributed_fit",
    "install",
    "installed",
    "split_predict",
    "uninstall",
]

# In 0.2's `__all__`, internal: importable until 0.4, with a warning.
__getattr__ = moved_names(
    __name__,
    {
        "uses_distributed_optimizer": "keras_mpfp16.training.sessions",
    },
)
