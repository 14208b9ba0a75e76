"""Refusing a second distribution engine around a `DistributedOptimizer`.

A model compiled with a `DistributedOptimizer` is distributed by MPI: one
process per device, each running Keras as in one process. Built under a
`tf.distribute` strategy's scope (MirroredStrategy, MultiWorkerMirrored, TPU,
...) or with a `keras.distribution` set (DataParallel, ModelParallel), the
same model would also be replicated *inside* each process, and every replica
would make its own MPI calls: the ranks' collectives would no longer match
one to one. Nothing warns about that at run time, so the optimizer's
constructor (in a strategy scope) and `fit` and `evaluate` (of a model built
or run in one) refuse it, naming the engine and the two ways out. (Not
`compile`: wrapping `keras.Model.compile` would make Keras skip compiling a
loaded model, `Model.compile_from_config`.)
"""

from __future__ import annotations

import keras

from keras_mpfp16 import backend as backends


def other_engine(model=None) -> str | None:
    """A description of another distribution engine active now, or for `model`
    (the strategy it was built under), or None."""
    distribution = keras.distribution.distribution()
    if distribution is not None:
        return (
            f"the Keras distribution {type(distribution).__name__} "
            "(keras.distribution.set_distribution)"
        )
    if keras.backend.backend() != "tensorflow":
        return None
    strategy = backends.bridge().distribution_strategy(model)
    if strategy is not None:
        return f"tf.distribute.{strategy} (the model was built or is run in its scope)"
    return None


def check_no_other_engine(model, what: str) -> None:
    """Raises when a `DistributedOptimizer` (or `model`, compiled with one) is
    also distributed by `tf.distribute` or `keras.distribution`.

    Args:
        model: A model compiled with a `keras_mpfp16.DistributedOptimizer`,
            or None (only the engine active now is checked).
        what: What is refused, e.g. `"fit() of a model compiled with a
            DistributedOptimizer"`.

    Raises:
        ValueError: naming the engine and what to do instead.
    """
    engine = other_engine(model)
    if engine is None:
        return
    raise ValueError(
        f"keras_mpfp16: {what} under {engine}. Both would distribute the training: every replica "
        "of that engine would make its own MPI calls, and the ranks' "
        "collectives would not match. Use one of them: either the "
        "DistributedOptimizer without a strategy or distribution (build and "
        "compile the model outside any strategy scope, with "
        "keras.distribution.set_distribution(None); run one process per "
        "device under mpirun, e.g. `mpirun -np 4 python train.py`), or the "
        f"{engine.split(' (')[0]} with a plain Keras optimizer instead of "
        "keras_mpfp16.DistributedOptimizer."
    )
