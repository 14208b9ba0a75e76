"""Multi-process `fit` and `evaluate` of models compiled with a DistributedOptimizer.

`import keras_mpfp16` installs two thin wrappers on `keras.Model` (see
`model_hooks`); they act only for models compiled with a
`keras_mpfp16.DistributedOptimizer` and more than one process:

- `replica`: one model on every rank, all of its state, from the first step;
- `run`: global logs, split validation and evaluation, safe callbacks;
- `files`: stock file-writing callbacks with one atomic writer;
- `predict`: `split_predict`, one input's predictions shared by all ranks.
"""

from keras_mpfp16.training.model_hooks import install, uses_distributed_optimizer
from keras_mpfp16.training.predict import split_predict

__all__ = ["install", "split_predict", "uses_distributed_optimizer"]
