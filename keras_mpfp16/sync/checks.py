"""Checks that every rank trains the same model the same number of steps.

Each check is one small collective that every rank calls at the same point,
and each raises on every rank together (never on one rank alone, which
would leave the others waiting in their next collective):

- `check_signatures` / `check_same_variables`: the model signature (count,
  shapes and dtypes of the variables) is rank 0's on every rank;
- `check_equal_steps`: every rank runs the same number of training steps
  per epoch.
"""

from __future__ import annotations

import numpy as np

from keras_mpfp16.runtime.mpi import collectives, world

UNSEEDED_CHOICE_HINT = (
    "The usual cause: a random choice made on every rank without a common "
    "seed - a hyperparameter search's tuner (e.g. KerasTuner's RandomSearch "
    "without seed=...), random.choice / np.random in the script. Fix: seed it "
    "alike on every rank (the tuner's seed=..., or "
    "keras.utils.set_random_seed(...) before the choice), or draw the choice "
    "on rank 0 and send it to the others (keras_mpfp16.broadcast(choice)). "
    "See docs/frameworks.md."
)


def variable_signature(variables) -> list[tuple]:
    """`(path, shape, dtype)` of each variable: what `check_signatures` compares."""
    return [(v.path, tuple(v.shape), str(v.dtype)) for v in variables]


def check_signatures(mine: list[tuple], what: str = "trainable variables") -> None:
    """All ranks must hold the same variables (count, shapes, dtypes).

    One allreduce of a digest of the `(shape, dtype)` list (O(1) bytes per
    rank at any N); only when the ranks differ is every rank's list
    allgathered, for the message. Variable names may differ between ranks
    (build order); shapes and dtypes may not.

    Args:
        mine: This rank's `variable_signature(...)`.
        what: What the variables are, for the message.

    Raises:
        ValueError: on every rank, naming the first variable that differs from
            rank 0's and the counts on both ranks.
    """
    shapes = [tuple(s[1:]) for s in mine]
    if collectives.same_on_all_ranks(shapes, name="model signature check"):
        return
    everyone = collectives.allgather_object(mine, name="model signatures")
    ref = everyone[0]
    for r, sig in enumerate(everyone[1:], start=1):
        if [s[1:] for s in sig] == [s[1:] for s in ref]:
            continue
        for i in range(max(len(sig), len(ref))):
            a = ref[i] if i < len(ref) else None
            b = sig[i] if i < len(sig) else None
            if a is None or b is None or a[1:] != b[1:]:

                def show(v):
                    return "nothing" if v is None else f"{v[0]!r} shape {v[1]} {v[2]}"

                raise ValueError(
                    "keras_mpfp16: ranks are training different models (model "
                    f"signature check): rank 0 has {len(ref)} {what}, rank {r} has "
                    f"{len(sig)}; first difference at #{i}: rank 0 has {show(a)}, "
                    f"rank {r} has {show(b)}. Build the same model on every rank. "
                    + UNSEEDED_CHOICE_HINT
                )


def check_same_variables(variables, what: str = "trainable variables") -> None:
    """`check_signatures` of `variables` (every rank must call it)."""
    if world.size() > 1:
        check_signatures(variable_signature(variables), what)


def check_equal_steps(steps) -> None:
    """Raises on every rank when ranks would run different training steps.

    Args:
        steps: This rank's steps per epoch (Keras's `params["steps"]`), or
            None when unknown (then no rank's count is compared).
    """
    mine = -1 if steps is None else int(steps)
    if collectives.same_on_all_ranks(mine, name="equal steps check"):
        return  # O(1) bytes per rank; the table only when ranks differ
    table = collectives.allgather(np.int64(mine))
    if (table >= 0).all() and len(set(table.tolist())) > 1:
        raise ValueError(
            "Ranks would run different numbers of training steps per epoch: "
            + ", ".join(f"rank {r}: {s}" for r, s in enumerate(table.tolist()))
            + ". Every rank must run the same number of steps; shard the "
            "training data with keras_mpfp16.shard(...) (drop_remainder=True)."
        )
