"""DistributedOptimizer: synchronous data parallelism with global loss scaling."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_mpfp16 import _validate
from keras_mpfp16 import backend as backends
from keras_mpfp16.backend.buckets import DEFAULT_BUCKET_MB
from keras_mpfp16.internals import keras as keras_internals
from keras_mpfp16.optimizer.engines import check_no_other_engine
from keras_mpfp16.optimizer.loss_scale import (
    LossScaleConfig,
    LossScaleState,
    transition,
)
from keras_mpfp16.runtime.mpi import wire, wire_tuner, world
from keras_mpfp16.sync.checks import check_signatures, variable_signature


def _resolve_optimizer(optimizer) -> keras.optimizers.Optimizer:
    if isinstance(optimizer, DistributedOptimizer):
        raise TypeError(
            "The optimizer is already a DistributedOptimizer; wrap the plain "
            "optimizer only once."
        )
    if isinstance(optimizer, (str, dict)):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except ValueError as exc:
            raise ValueError(
                f"Unknown optimizer identifier {optimizer!r}: {exc}"
            ) from exc
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a keras.optimizers.Optimizer instance or an "
            f"identifier string such as 'adam'; received an object of type "
            f"{type(optimizer).__name__}."
        )
    return optimizer


@keras.saving.register_keras_serializable(package="keras_mpfp16")
class DistributedOptimizer(keras.optimizers.LossScaleOptimizer):
    """Wraps a Keras optimizer to train one model synchronously on all MPI ranks.

    On every update step inside `model.fit` the gradients of all ranks are
    averaged (fused into buckets, one MPI call per bucket), then a single
    decision is taken from the *reduced* gradients, so it is identical on every
    rank: if they are finite the step is applied, otherwise it is skipped and
    the loss scale backs off. Before the first step of `fit`, rank 0's value
    of every model and optimizer variable is broadcast, so ranks that built
    their models from different random seeds train one model; non-trainable
    state that training changes (BatchNormalization statistics) is averaged
    every step; logs are global and validation is split over the ranks (see
    `keras_mpfp16.training`). In a custom training loop (no `fit`), the
    broadcast happens inside the first update instead.

    It subclasses `keras.optimizers.LossScaleOptimizer`, so `compile()` under
    the `mixed_float16` policy uses it as it is instead of wrapping it again.
    Loss scaling is dynamic under `mixed_float16` (`loss_scale="auto"`) and off
    under `float32` and `mixed_bfloat16`, where non-finite steps are still
    skipped and `max_consecutive_nonfinite` of them in a row stop training.

    With one process there are no MPI calls in the train step. Creating,
    building and loading it (`keras.models.load_model`), and `evaluate` or
    `predict` of a model compiled with it on one rank alone, make no MPI call
    either: collectives happen only where all ranks train together.

    Args:
        optimizer: A Keras optimizer instance or identifier (`"adam"`). A
            `keras.optimizers.LossScaleOptimizer` is unwrapped (its scale
            settings are kept unless given here). Its
            `gradient_accumulation_steps` is taken over: gradients are
            accumulated locally and reduced once per update step.
        op: `"average"` (default) or `"sum"` of the ranks' gradients.
        wire_dtype: `"float32"` (default), `"float16"`, `"bfloat16"` or
            `"auto"`: the format gradients cross the network in. 16-bit
            formats halve the bytes; the sum is always accumulated in float32
            (see `keras_mpfp16.runtime.mpi.wire`). `"auto"` times the float32
            and the float16 wire on this job's links after the first step of
            `fit` and uses the faster, the same on every rank (rank 0
            decides; `keras_mpfp16.runtime.mpi.wire_tuner`,
            `KERAS_MPFP16_WIRE_AUTO` pins it).
        bucket_size_mb: Size of the fused reduction buckets in megabytes
            (float32 bytes). Gradients that fit in one bucket need one MPI call
            per step; smaller buckets let communication start earlier.
        loss_scale: `"auto"` (scale under the `mixed_float16` policy only),
            `True` or `False`.
        initial_scale: Starting loss scale.
        growth_interval: Finite steps in a row before the scale grows.
        growth_factor: Growth multiplier (> 1).
        backoff_factor: Backoff multiplier in (0, 1).
        hysteresis: Non-finite steps in a row tolerated before backing off.
        min_scale: Lowest scale; a backoff due at this scale stops training
            with an error naming the step and the scale.
        max_scale: Highest scale.
        max_consecutive_nonfinite: Without loss scaling, non-finite steps in a
            row that stop training.
        gradient_accumulation_steps: Alternative to setting it on the inner
            optimizer.
        check_replicas_every: Divergence guard, off by default. Every this
            many update steps, a checksum of every model and optimizer
            variable (trainable and not) is compared across ranks and
            training stops, naming the ranks, if replicas differ.
        non_trainable_sync: When non-trainable variables that training
            changes (BatchNormalization moving statistics) are averaged over
            ranks: `"step"` (default; every step, in the same MPI call as the
            metrics, so they are identical on every rank at all times) or
            `"epoch"` (at the end of every epoch, before validation and at
            the end of `fit`: fewer bytes per step for models with large
            running statistics).
        name: Optional name.

    Example:

    ```python
    import keras
    import keras_mpfp16 as kmp

    model.compile(optimizer=kmp.DistributedOptimizer("adam"), loss="mse")
    model.fit(*kmp.shard(x, y), batch_size=64, epochs=3)
    ```
    """

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer | str,
        op: str = "average",
        wire_dtype: str = "float32",
        bucket_size_mb: float = DEFAULT_BUCKET_MB,
        loss_scale: str | bool = "auto",
        initial_scale: float | None = None,
        growth_interval: int | None = None,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        hysteresis: int = 1,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        max_consecutive_nonfinite: int = 10,
        gradient_accumulation_steps: int | None = None,
        check_replicas_every: int = 0,
        non_trainable_sync: str = "step",
        name: str | None = None,
    ):
        # In a tf.distribute scope or with a keras.distribution set, every
        # replica would make its own MPI calls: refuse before anything else.
        check_no_other_engine(None, "keras_mpfp16.DistributedOptimizer created")
        inner = _resolve_optimizer(optimizer)
        if isinstance(inner, keras.optimizers.LossScaleOptimizer):
            if initial_scale is None:
                initial_scale = inner.initial_scale
            if growth_interval is None:
                growth_interval = inner.dynamic_growth_steps
            inner = inner.inner_optimizer
        op = _validate.one_of("op", op, ("average", "sum"))
        wire_dtype = wire.validate_wire_dtype(wire_dtype, also=(wire_tuner.AUTO,))
        bucket_size_mb = _validate.number(
            "bucket_size_mb", bucket_size_mb, minimum=0, min_inclusive=False
        )
        loss_scale = _validate.one_of("loss_scale", loss_scale, ("auto", True, False))
        accum = _resolve_accumulation(gradient_accumulation_steps, inner)
        check_replicas_every = _validate.non_negative_int(
            "check_replicas_every", check_replicas_every
        )
        non_trainable_sync = _validate.one_of(
            "non_trainable_sync", non_trainable_sync, ("step", "epoch")
        )
        config = LossScaleConfig(
            enabled=True,  # "auto" is resolved once, see `loss_scaling`
            initial_scale=float(2.0**15 if initial_scale is None else initial_scale),
            growth_interval=2000 if growth_interval is None else growth_interval,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            hysteresis=hysteresis,
            min_scale=min_scale,
            max_scale=max_scale,
            max_consecutive_nonfinite=max_consecutive_nonfinite,
        )
        # No MPI, no output settings here: `load_model` calls this on whatever
        # ranks load (maybe one). The runtime starts at the first collective.
        # We accumulate ourselves so gradients are reduced once per update;
        # the inner optimizer then only ever sees update steps.
        inner.gradient_accumulation_steps = None
        super().__init__(
            inner,
            initial_scale=config.initial_scale,
            dynamic_growth_steps=config.growth_interval,
            name=name,
        )
        self.loss_scale_config = config
        self.op = op
        self.wire_dtype = wire_dtype
        self.bucket_size_mb = float(bucket_size_mb)
        self.loss_scale = loss_scale
        self.accumulation_steps = accum
        self.check_replicas_every = check_replicas_every
        self.non_trainable_sync = non_trainable_sync
        self._policy_at_init = keras.config.dtype_policy().name
        self._loss_scaling: bool | None = None  # resolved once, see loss_scaling
        self._refs = _References()

    # -- state -----------------------------------------------------------------

    @property
    def loss_scaling(self) -> bool:
        """Whether the loss is scaled.

        Resolved once, at the first of `build` and `scale_loss`, and fixed
        from then on: scaling the loss and unscaling the gradients always
        agree, whatever happens to the global dtype policy later. `"auto"`
        means: scale when the `mixed_float16` policy was active when the
        optimizer was created or when it is first used.
        """
        if self._loss_scaling is None:
            if self.loss_scale == "auto":
                self._loss_scaling = "mixed_float16" in (
                    self._policy_at_init,
                    keras.config.dtype_policy().name,
                )
            else:
                self._loss_scaling = bool(self.loss_scale)
        return self._loss_scaling

    def build(self, var_list):
        if self.built:
            return
        cfg = self.loss_scale_config
        self.loss_scale_config = LossScaleConfig(
            **{**cfg.to_dict(), "enabled": self.loss_scaling}
        )
        init = self.loss_scale_config.initial_state()

        def scalar(name, value, dtype):
            return self.add_variable(
                shape=(),
                dtype=dtype,
                initializer=keras.initializers.Constant(value),
                aggregation="none",
                name=name,
            )

        # Names of the first two match keras.optimizers.LossScaleOptimizer.
        self.dynamic_scale = scalar("dynamic_scale", init.scale, "float32")
        self.step_counter = scalar("step_counter", 0, "int32")
        self.hysteresis_left = scalar("hysteresis_left", init.hysteresis_left, "int32")
        self.nonfinite_streak = scalar("nonfinite_streak", 0, "int32")
        self.skipped_steps = scalar("skipped_steps", 0, "int64")
        if self.accumulation_steps:
            self.micro_step = scalar("micro_step", 0, "int64")
            self._accumulators = [
                self.add_variable_from_reference(v, name="gradient_accumulator")
                for v in var_list
            ]
        self.inner_optimizer.build(var_list)
        keras_internals.build_optimizer_base(self, var_list)
        self._refs.trained = list(var_list)
        if self.accumulation_steps:
            self._refs.accumulator_of = {
                id(v): a for v, a in zip(var_list, self._accumulators)
            }
        # Raises now, not mid-step, on a backend without a bridge. No MPI
        # here: the model signature is checked where ranks train together.
        backends.bridge()

    def scale_loss(self, loss):
        if not self.loss_scaling:
            return loss
        scale = (
            self.dynamic_scale
            if self.built
            else self.loss_scale_config.initial_state().scale
        )
        return ops.multiply(loss, ops.cast(scale, loss.dtype))

    def set_replica_variables(self, variables) -> None:
        """Every variable `check_replicas_every` compares across ranks.

        `fit` passes the whole model's and this optimizer's (see
        `keras_mpfp16.training`); by default the trained variables and this
        optimizer's.
        """
        self._refs.replica_variables = list(variables)

    # -- the train-step hot path --------------------------------------------------

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            self.build(trainable_variables)
        variables = (
            list(trainable_variables)
            if trainable_variables is not None
            else list(self._refs.trained)
        )
        grads = list(grads)
        if world.size() > 1:
            # Training loops outside `fit` (which syncs before its first
            # step): rank 0's weights, optimizer state and loss scale
            # everywhere before the first update, after the model signature
            # check. Inside the step because on the TensorFlow backend the
            # optimizer (and a subclassed model) may be built while the train
            # function is traced, when variables have no values yet.
            signature = variable_signature(variables)
            backends.bridge().sync_on_first_step(
                self,
                variables + self.variables,
                check=lambda: check_signatures(signature),
            )
        if not self.accumulation_steps:
            self._reduce_and_apply(grads, variables)
            return
        k = self.accumulation_steps
        accs = [self._refs.accumulator_of[id(v)] for v in variables]

        def update():
            total = [None if g is None else (g + a) / k for g, a in zip(grads, accs)]
            self._reduce_and_apply(total, variables)
            for a in accs:
                a.assign(ops.zeros_like(a))

        def accumulate():
            for g, a in zip(grads, accs):
                if g is not None:
                    a.assign_add(g)

        # The condition depends only on a counter that is equal on all ranks,
        # so all ranks take the same branch and call MPI together.
        ops.cond(ops.equal((self.micro_step + 1) % k, 0), update, accumulate)
        self.micro_step.assign_add(1)

    def _reduce_and_apply(self, grads, variables):
        bridge = backends.bridge()
        passthrough = [
            bool(getattr(v, "overwrite_with_gradient", False)) for v in variables
        ]
        # What the reduced sum is divided by, folded into the unscaling pass
        # below instead of costing a pass of its own on the host.
        divisor = 1.0
        if world.size() > 1:
            if bridge.in_xla_context():
                raise RuntimeError(
                    "DistributedOptimizer cannot run inside an XLA-compiled function: "
                    "the gradient allreduce is an MPI call from the host. Compile "
                    "the model with jit_compile=False."
                )
            to_reduce = [None if p else g for g, p in zip(grads, passthrough)]
            shapes = [tuple(v.shape) for v in variables]
            if self.wire_dtype == wire_tuner.AUTO:
                self._refs.auto_sizes = bridge.dense_bucket_sizes(
                    to_reduce, shapes, int(self.bucket_size_mb * 2**20)
                )
            reduced, finite = bridge.allreduce_gradients(
                to_reduce,
                shapes=shapes,
                op="sum",
                wire_dtype=self.effective_wire_dtype,
                bucket_bytes=int(self.bucket_size_mb * 2**20),
                step=self._train_step(),
            )
            grads = [g if p else r for g, r, p in zip(grads, reduced, passthrough)]
            if self.op == "average":
                divisor = float(world.size())
        else:
            finite = self.check_finite(grads)

        cfg = self.loss_scale_config
        state = LossScaleState(
            ops.convert_to_tensor(self.dynamic_scale),
            ops.convert_to_tensor(self.step_counter),
            ops.convert_to_tensor(self.hysteresis_left),
            ops.convert_to_tensor(self.nonfinite_streak),
        )
        new_state, apply, failed = transition(state, finite, cfg, ops)
        # Train steps so far, applied or skipped (0-based, like `iterations`).
        step = ops.add(
            ops.cast(self.iterations, "int64"),
            ops.convert_to_tensor(self.skipped_steps),
        )
        if cfg.enabled:
            message = (
                "keras_mpfp16: gradients were non-finite on train step {} and the "
                "loss scale is already at its minimum {} (min_scale); training cannot "
                "proceed. Check the inputs and the model for NaN/Inf, or lower min_scale."
            )
            bridge.raise_if(failed, message, step, state.scale)
        else:
            message = (
                "keras_mpfp16: gradients were non-finite on {} consecutive steps "
                "(up to train step {}); training stops instead of applying NaN/Inf. "
                "Check the inputs and the model, or raise max_consecutive_nonfinite."
            )
            bridge.raise_if(failed, message, new_state.nonfinite_streak, step)

        scale = state.scale

        def apply_update():
            if cfg.enabled:
                inv = ops.divide(1.0, ops.multiply(scale, divisor))
            elif divisor != 1.0:
                inv = ops.convert_to_tensor(1.0 / divisor, "float32")
            else:
                inv = None
            unscaled = [
                # ops.multiply keeps a gathered IndexedSlices sparse (the
                # slices one process would hand the inner optimizer); `*`
                # would densify it and change Adam's second moment.
                g
                if g is None or p or inv is None
                else ops.multiply(g, ops.cast(inv, g.dtype))
                for g, p in zip(grads, passthrough)
            ]
            self.inner_optimizer.apply(unscaled, trainable_variables=variables)

        ops.cond(apply, apply_update, lambda: None)
        self.dynamic_scale.assign(new_state.scale)
        self.step_counter.assign(new_state.good_steps)
        self.hysteresis_left.assign(new_state.hysteresis_left)
        self.nonfinite_streak.assign(new_state.nonfinite_streak)
        self.skipped_steps.assign_add(ops.cast(ops.logical_not(apply), "int64"))
        if self.check_replicas_every and world.size() > 1:
            everything = self._refs.replica_variables or (variables + self.variables)
            bridge.check_replicas(everything, step, self.check_replicas_every)

    @property
    def effective_wire_dtype(self) -> str:
        """The wire the train step traces with: `wire_dtype`, or under
        `"auto"` the decision (float32 until there is one)."""
        if self.wire_dtype != wire_tuner.AUTO:
            return self.wire_dtype
        decision = self._refs.wire_decision
        return "float32" if decision is None else decision.wire_dtype

    @property
    def wire_decision(self) -> wire_tuner.Decision | None:
        """Under `wire_dtype="auto"`, the last decision (None before one)."""
        return self._refs.wire_decision

    def tune_wire(self) -> wire_tuner.Decision | None:
        """Measures and decides the wire (`wire_dtype="auto"` only; None
        otherwise, with one process, or before the first train step traced
        the bucket plan). Collective: every rank calls it at the same step.
        The caller re-traces the train step when the wire changed."""
        if self.wire_dtype != wire_tuner.AUTO or world.size() == 1:
            return None
        sizes = self._refs.auto_sizes
        if sizes is None:
            return None
        bridge = backends.bridge()
        decision = wire_tuner.agree(
            sizes,
            lambda distinct: bridge.probe_wire(
                distinct, wire_tuner.CANDIDATES, wire_tuner.PAIRS
            ),
        )
        self._refs.wire_decision = decision
        return decision

    def set_wire_decision(self, decision: wire_tuner.Decision) -> None:
        """Applies `decision` (`wire_dtype="auto"`): the wire of the next
        trace of the train step. The caller re-traces; every rank must set
        the same decision (`wire_tuner.agree`/`confirm` return rank 0's)."""
        self._refs.wire_decision = decision

    def _train_step(self):
        """Update steps so far, applied or skipped (0-based, like `iterations`)."""
        return ops.add(
            ops.cast(self.iterations, "int64"),
            ops.convert_to_tensor(self.skipped_steps),
        )

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise NotImplementedError(
            "DistributedOptimizer runs on the TensorFlow backend (stateful apply); "
            "stateless_apply (JAX) is not supported yet."
        )

    # -- serialization --------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        cfg = self.loss_scale_config
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "op": self.op,
            "wire_dtype": self.wire_dtype,
            "bucket_size_mb": self.bucket_size_mb,
            "loss_scale": self.loss_scale,
            "initial_scale": cfg.initial_scale,
            "growth_interval": cfg.growth_interval,
            "growth_factor": cfg.growth_factor,
            "backoff_factor": cfg.backoff_factor,
            "hysteresis": cfg.hysteresis,
            "min_scale": cfg.min_scale,
            "max_scale": cfg.max_scale,
            "max_consecutive_nonfinite": cfg.max_consecutive_nonfinite,
            "gradient_accumulation_steps": self.accumulation_steps,
            "check_replicas_every": self.check_replicas_every,
            "non_trainable_sync": self.non_trainable_sync,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)


class _References:
    """Plain references the optimizer keeps to variables it does not own.

    A holder object, because Keras's optimizer tracks every variable (and
    list of variables) assigned to one of its attributes as its own state.
    """

    def __init__(self):
        self.trained: list = []  # the variables `build` was given
        self.accumulator_of: dict = {}  # id(variable) -> gradient accumulator
        self.replica_variables: list | None = None  # see set_replica_variables
        self.auto_sizes: list | None = None  # wire_dtype="auto": dense buckets
        self.wire_decision = None  # wire_dtype="auto": wire_tuner.Decision


def _resolve_accumulation(steps, inner) -> int | None:
    inner_steps = inner.gradient_accumulation_steps
    if steps is not None:
        steps = _validate.positive_int("gradient_accumulation_steps", steps)
        if inner_steps and inner_steps != steps:
            raise ValueError(
                f"gradient_accumulation_steps={steps} conflicts with the inner "
                f"optimizer's gradient_accumulation_steps={inner_steps}."
            )
    steps = steps or inner_steps
    return steps if steps and steps > 1 else None


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Makes `variables` equal on all ranks by copying `root_rank`'s values.

    The DistributedOptimizer syncs the model and its own state before the
    first update by itself; call this after changing weights on some ranks
    only (for example `load_weights` on rank 0).

    Args:
        variables: Keras variables (e.g. `model.variables`).
        root_rank: The rank whose values win.

    Example:

    ```python
    if kmp.rank() == 0:
        model.load_weights("best.weights.h5")
    kmp.broadcast_variables(model.variables)
    ```
    """
    backends.bridge().broadcast_variables(variables, root=root_rank)
