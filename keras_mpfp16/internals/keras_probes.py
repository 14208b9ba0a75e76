"""Probes of the Keras seam: each accessor exercised on a tiny object.

`check()` runs every probe at the installed Keras and reports, per accessor
of `internals/keras.py`'s `REGISTRY`, None (works as keras_mpfp16 needs) or
what went wrong. `tests/test_internals.py` runs it at both ends of the
tested range in CI (`keras_mpfp16.internals.keras_probes.check()`).
Each probe uses only the accessors (and public Keras): a probe that reached
around them would not test what the package runs.
"""

from __future__ import annotations

import warnings

import keras

from keras_mpfp16.internals.keras import (
    ARRAY_DATASET,
    AUTOCAST_SCOPE,
    BACKUP_PATHS,
    BASE_OPTIMIZER_BUILD,
    CACHED_EVAL_DATASET_KWARG,
    CALLBACK_LIST_ATTRIBUTE,
    CALLBACK_LIST_EDITABLE,
    DATA_ADAPTER,
    EPOCH_ITERATOR,
    FIT_VALIDATION_EVALUATE,
    FLATTEN_LAYERS,
    FUSED_RNN,
    GET_METRICS_RESULT,
    INITIAL_EPOCH,
    INTERACTIVE_LOGGING,
    METRICS_RESULT_AT_END,
    METRICS_RESULT_OR_LOGS,
    MODEL_CHECKPOINT_HOOKS,
    MODEL_CHECKPOINT_SAVE_METHOD,
    MODEL_SUPPORTS_JIT,
    OPTIMIZER_LEARNING_RATE,
    OPTIMIZER_TRAINABLE_VARIABLES,
    OPTIMIZER_VARIABLE_INDEX,
    REGISTRY,
    RNN_LOOP,
    STEP_FUNCTIONS,
    SYMBOLIC_BUILD,
    TRAIN_VALIDATION_SPLIT,
    WEIGHTS_SNAPSHOT,
    array_data_adapter,
    array_datasets_without_autotune,
    autocast_scope,
    backup_paths,
    build_optimizer_base,
    checkpoint_bookkeeping_only,
    checkpoint_file_path,
    checkpoint_should_save,
    fit_data_adapter,
    flatten_layers,
    fused_rnn,
    gate_interactive_logging,
    get_initial_epoch,
    get_learning_rate_slot,
    optimizer_trainable_variables,
    optimizer_variable_index,
    original_metrics_result_or_logs,
    override_metrics_result_or_logs,
    read_uncast,
    reset_step_functions,
    rnn_loop,
    set_backup_paths,
    set_initial_epoch,
    set_learning_rate_slot,
    skip_steps_of_next_epoch,
    snapshot_weights,
    symbolic_build,
    train_validation_split,
    trainer_module,
    write_weights_snapshot,
)


def _probe_rnn_loop() -> None:
    from keras import ops

    def step(x, states):
        h = states[0] + x
        return h, [h]

    last, outputs, states = rnn_loop(
        step,
        ops.ones((1, 3, 2)),
        [ops.zeros((1, 2))],
        go_backwards=False,
        mask=None,
        unroll=False,
        input_length=3,
        time_major=False,
        zero_output_for_mask=False,
        return_all_outputs=True,
    )
    got = ops.convert_to_numpy(last).tolist()
    if got != [[3.0, 3.0]] or tuple(outputs.shape) != (1, 3, 2):
        raise AssertionError(f"summing 3 ones gave {got}, outputs {outputs.shape}")


def _probe_fused_rnn() -> None:
    """The fused kernels take Keras's arguments: they run (a GPU) or raise
    NotImplementedError (no fused kernel here), nothing else."""
    from keras import activations, ops

    units, features = 2, 3
    common = {
        "activation": activations.tanh,
        "recurrent_activation": activations.sigmoid,
        "return_sequences": True,
        "go_backwards": False,
        "unroll": False,
    }
    x = ops.ones((1, 4, features))
    h = ops.zeros((1, units))
    calls = {
        "lstm": lambda: fused_rnn("lstm")(
            x,
            h,
            h,
            None,
            kernel=ops.zeros((features, 4 * units)),
            recurrent_kernel=ops.zeros((units, 4 * units)),
            bias=ops.zeros((4 * units,)),
            **common,
        ),
        "gru": lambda: fused_rnn("gru")(
            x,
            h,
            None,
            kernel=ops.zeros((features, 3 * units)),
            recurrent_kernel=ops.zeros((units, 3 * units)),
            bias=ops.zeros((2, 3 * units)),
            reset_after=True,
            **common,
        ),
    }
    for kind, call in calls.items():
        if fused_rnn(kind) is None:
            raise AssertionError(f"no fused {kind}")
        try:
            _, outputs, _ = call()
        except NotImplementedError:
            continue
        if tuple(outputs.shape) != (1, 4, units):
            raise AssertionError(f"fused {kind} outputs {outputs.shape}")


def _probe_read_uncast() -> None:
    variable = keras.Variable([1.0, 2.0], dtype="float32")
    with autocast_scope("float16"):
        cast = keras.backend.standardize_dtype(variable.value.dtype)
        raw = keras.backend.standardize_dtype(read_uncast(variable).dtype)
    if (cast, raw) != ("float16", "float32"):
        raise AssertionError(f"autocast read {cast}, read_uncast {raw}")


def _tiny_model() -> keras.Model:
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    return model


def _probe_model_supports_jit() -> None:
    seen = []
    trainer = trainer_module()
    original = trainer.model_supports_jit

    def refuse(model):
        seen.append(model)
        return False

    trainer.model_supports_jit = refuse
    try:
        model = _tiny_model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras: "doesn't support jit_compile"
            model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    finally:
        trainer.model_supports_jit = original
    if model not in seen or model.jit_compile:
        raise AssertionError(
            "compile(jit_compile=True) did not consult model_supports_jit "
            f"(consulted: {model in seen}, jit_compile={model.jit_compile})"
        )


def _probe_learning_rate_slot() -> None:
    optimizer = keras.optimizers.SGD(0.5)
    slot = get_learning_rate_slot(optimizer)
    if not isinstance(slot, keras.Variable):
        raise AssertionError(f"a float learning rate is held as {type(slot)}")
    set_learning_rate_slot(optimizer, lambda: 0.25)
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    set_learning_rate_slot(optimizer, slot)
    if rate != 0.25:
        raise AssertionError(f"a callable in the slot gave learning_rate {rate}")
    if not any(v is slot for v in optimizer.variables):
        raise AssertionError("the learning-rate variable was untracked")


def _probe_optimizer_variables() -> None:
    a = keras.Variable([1.0, 2.0])
    b = keras.Variable([3.0])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build([a, b])
    if [id(v) for v in optimizer_trainable_variables(optimizer)] != [id(a), id(b)]:
        raise AssertionError("_trainable_variables is not the built list")
    if (
        optimizer_variable_index(optimizer, a),
        optimizer_variable_index(optimizer, b),
    ) != (
        0,
        1,
    ):
        raise AssertionError("_get_variable_index does not give the build order")


def _probe_build_optimizer_base() -> None:
    a = keras.Variable([1.0, 2.0])
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    build_optimizer_base(optimizer, [a])
    if not optimizer.built:
        raise AssertionError("Optimizer.build did not mark the optimizer built")


def _probe_checkpoint_hooks() -> None:
    import os
    import tempfile

    saved = []

    class Probe(keras.callbacks.ModelCheckpoint):
        pass

    def save(self, epoch, batch, logs):
        path = checkpoint_file_path(self, epoch, batch, logs)
        if checkpoint_should_save(self, epoch, batch, logs, path):
            saved.append(path)

    setattr(Probe, MODEL_CHECKPOINT_SAVE_METHOD, save)
    with tempfile.TemporaryDirectory() as tmp:
        callback = Probe(tmp + "/m-{epoch:02d}.keras", save_best_only=True)
        callback.set_model(_tiny_model())
        for epoch, loss in enumerate([1.0, 2.0, 0.5]):
            callback.on_epoch_end(epoch, {"val_loss": loss})
        want = [tmp + "/m-01.keras", tmp + "/m-03.keras"]
        if saved != want:
            raise AssertionError(f"saved {saved}, expected {want}")
        # Bookkeeping only: the best value moves, no file is written.
        stock = keras.callbacks.ModelCheckpoint(
            tmp + "/sub/n-{epoch:02d}.keras", save_best_only=True
        )
        stock.set_model(_tiny_model())
        with checkpoint_bookkeeping_only(stock):
            for epoch, loss in enumerate([1.0, 2.0, 0.5]):
                stock.on_epoch_end(epoch, {"val_loss": loss})
        if stock.best != 0.5 or os.path.exists(tmp + "/sub"):
            raise AssertionError(
                f"bookkeeping only: best {stock.best}, wrote "
                f"{os.path.exists(tmp + '/sub')}"
            )
        if MODEL_CHECKPOINT_SAVE_METHOD in vars(stock):
            raise AssertionError("checkpoint_bookkeeping_only left its hook behind")


def _probe_step_functions() -> None:
    import numpy as np

    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((2, 2), "float32"), np.zeros((2, 1), "float32")
    model.train_on_batch(x, y)
    calls = []
    own = model.train_step

    def train_step(data):
        calls.append(1)
        return own(data)

    model.train_step = train_step
    reset_step_functions(model)
    model.train_on_batch(x, y)
    if not calls:
        raise AssertionError("the rebuilt train function did not call train_step")


def _probe_flatten_layers() -> None:
    model = _tiny_model()
    if model not in flatten_layers(model) or len(flatten_layers(model)) < 2:
        raise AssertionError("flatten_layers did not list the model and its layers")


def _probe_symbolic_build() -> None:
    import numpy as np

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    model = Net()
    model.compile(optimizer="sgd", loss="mse")
    symbolic_build(model, (np.zeros((2, 4), "float32"), np.zeros((2, 3), "float32")))
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    if shapes != [(4, 3), (3,)] or not model.optimizer.built:
        raise AssertionError(
            f"symbolic_build left variables {shapes}, optimizer built: "
            f"{model.optimizer.built}"
        )


def _probe_fit_data_adapter() -> None:
    if keras.backend.backend() != "tensorflow":
        return
    import numpy as np

    x, y = np.zeros((10, 3), "float32"), np.zeros((10, 1), "float32")
    for batch, want in ((5, 5), (4, None)):  # full batches / a partial one
        spec = fit_data_adapter(x, y, None, batch).get_tf_dataset().element_spec
        shapes = [tuple(s.shape) for s in spec]
        if shapes != [(want, 3), (want, 1)]:
            raise AssertionError(f"batch {batch}: element spec shapes {shapes}")


def _probe_interactive_logging_gate() -> None:
    import contextlib
    import io

    was_on = keras.config.is_interactive_logging_enabled()
    keras.config.enable_interactive_logging()
    try:
        printed = []
        for gate in (lambda: False, None):
            gate_interactive_logging(gate)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                keras.utils.Progbar(1, verbose=2).update(1, finalize=True)
            printed.append(out.getvalue())
        if printed[0] or not printed[1]:
            raise AssertionError(f"gated / ungated stdout: {printed!r}")
    finally:
        gate_interactive_logging(None)
        if not was_on:
            keras.config.disable_interactive_logging()


def _probe_initial_epoch() -> None:
    model = _tiny_model()
    before = get_initial_epoch(model)
    set_initial_epoch(model, 3)
    if get_initial_epoch(model) != 3:
        raise AssertionError("_initial_epoch did not round-trip")
    set_initial_epoch(model, before)


def _probe_backup_paths() -> None:
    import os
    import shutil
    import tempfile

    directory = tempfile.mkdtemp()
    callback = keras.callbacks.BackupAndRestore(directory)
    weights, metadata = backup_paths(callback)
    if os.path.dirname(weights) != directory or os.path.dirname(metadata) != directory:
        raise AssertionError(f"unexpected backup paths {weights!r}, {metadata!r}")
    # The redirected paths are the ones the callback writes.
    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse")
    callback.set_model(model)
    elsewhere = tempfile.mkdtemp()
    staged = [os.path.join(elsewhere, os.path.basename(p)) for p in (weights, metadata)]
    set_backup_paths(callback, *staged)
    callback.on_epoch_end(0)
    if not all(os.path.exists(p) for p in staged):
        raise AssertionError("BackupAndRestore did not write to the redirected paths")
    for d in (directory, elsewhere):
        shutil.rmtree(d, ignore_errors=True)


def _probe_weights_snapshot() -> None:
    import os
    import tempfile

    import numpy as np

    model = _tiny_model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    snapshot = snapshot_weights(model)
    before = [np.array(v) for v in model.variables + model.optimizer.variables]
    model.fit(np.ones((4, 2)), np.zeros((4, 1)), verbose=0)  # changes everything
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "s.weights.h5")
    write_weights_snapshot(snapshot, path)
    model.load_weights(path)
    after = [np.array(v) for v in model.variables + model.optimizer.variables]
    if len(before) != len(after) or any(
        not np.array_equal(a, b) for a, b in zip(before, after)
    ):
        raise AssertionError("a written snapshot did not restore the copied state")
    os.remove(path)
    os.rmdir(directory)


def _probe_metrics_result_or_logs() -> None:
    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse")
    calls = []

    def fn(logs):
        calls.append(logs)
        return original_metrics_result_or_logs(model, logs)

    override_metrics_result_or_logs(model, fn)
    import numpy as np

    model.evaluate(np.zeros((2, 2), "float32"), np.zeros((2, 1)), verbose=0)
    override_metrics_result_or_logs(model, None)
    if not calls:
        raise AssertionError("evaluate did not call _get_metrics_result_or_logs")


def _probe_train_validation_split() -> None:
    import numpy as np

    x = np.arange(8.0)
    (train, _, _), (val, _, _) = train_validation_split((x, None, None), 0.25)
    if not (np.array_equal(train, x[:6]) and np.array_equal(val, x[6:])):
        raise AssertionError(f"unexpected split {train!r} / {val!r}")


def _probe_array_datasets() -> None:
    if keras.backend.backend() != "tensorflow":
        return
    import numpy as np

    adapter_class = array_data_adapter()
    before = adapter_class.get_tf_dataset
    autotune = []  # per dataset Keras built from arrays while active
    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32")
    with array_datasets_without_autotune():
        patched = adapter_class.get_tf_dataset

        def spy(adapter):
            dataset = patched(adapter)
            autotune.append(dataset.options().autotune.enabled)
            return dataset

        adapter_class.get_tf_dataset = spy
        try:
            model.evaluate(x, y, batch_size=2, verbose=0)
        finally:
            adapter_class.get_tf_dataset = patched
    if autotune != [False]:
        raise AssertionError(
            "evaluate on arrays built its tf.data pipeline through "
            f"ArrayDataAdapter.get_tf_dataset {len(autotune)} times "
            f"(autotune enabled: {autotune}); expected once, disabled"
        )
    if adapter_class.get_tf_dataset is not before:
        raise AssertionError("ArrayDataAdapter.get_tf_dataset was not restored")


def _probe_skip_steps() -> None:
    import numpy as np

    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse")
    x = np.arange(8, dtype="float32").reshape(4, 2)
    y = np.zeros((4, 1), "float32")
    seen = []

    class Batches(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    with skip_steps_of_next_epoch():
        skip_steps_of_next_epoch.arm(3)
        model.fit(
            x,
            y,
            batch_size=1,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[Batches()],
        )
    if seen != [3, 0, 1, 2, 3]:
        raise AssertionError(f"steps run {seen}, expected [3, 0, 1, 2, 3]")
    if int(model.optimizer.iterations.numpy()) != 5:
        raise AssertionError("the skipped steps were trained")


# -- undocumented behaviour of public Keras API ---------------------------------


def _probe_fit_validation_evaluate() -> None:
    import numpy as np

    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32")
    seen = []
    own = model.evaluate

    def evaluate(*args, **kwargs):
        seen.append(kwargs.get(CACHED_EVAL_DATASET_KWARG))
        return own(*args, **kwargs)

    model.evaluate = evaluate
    try:
        model.fit(x, y, batch_size=2, epochs=1, validation_data=(x, y), verbose=0)
    finally:
        del model.evaluate
    if seen != [True]:
        raise AssertionError(
            "fit(validation_data=...) called evaluate with "
            f"{CACHED_EVAL_DATASET_KWARG}={seen} (one value per call); "
            "expected one call with True"
        )


def _probe_get_metrics_result_at_end() -> None:
    import numpy as np

    events = []

    class Events(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            events.append("train batch")

        def on_epoch_end(self, epoch, logs=None):
            events.append("epoch end")

        def on_test_batch_end(self, batch, logs=None):
            events.append("test batch")

        def on_test_end(self, logs=None):
            events.append("test end")

    model = _tiny_model()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x, y = np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32")
    own = type(model).get_metrics_result

    def get_metrics_result():
        events.append("get_metrics_result")
        return own(model)

    setattr(model, GET_METRICS_RESULT, get_metrics_result)
    try:
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[Events()])
        model.evaluate(x, y, batch_size=2, verbose=0, callbacks=[Events()])
    finally:
        delattr(model, GET_METRICS_RESULT)
    for last, end in (("train batch", "epoch end"), ("test batch", "test end")):
        stop = events.index(end)
        after = max(i for i in range(stop) if events[i] == last)
        if "get_metrics_result" not in events[after + 1 : stop]:
            raise AssertionError(
                f"the instance's {GET_METRICS_RESULT} was not called between the "
                f"last {last} and {end} (events: {events})"
            )


def _probe_callback_list_editable() -> None:
    events = []

    class Named(keras.callbacks.Callback):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def on_epoch_begin(self, epoch, logs=None):
            events.append((self.name, "epoch"))

        def on_train_batch_end(self, batch, logs=None):
            events.append((self.name, "batch"))

    first, second = _tiny_model(), _tiny_model()
    callbacks = keras.callbacks.CallbackList([Named("user")], model=first)
    listed = getattr(callbacks, CALLBACK_LIST_ATTRIBUTE)
    ours = [Named("before"), *listed, Named("after")]
    listed[:] = ours
    callbacks.set_model(second)
    callbacks.on_train_begin()
    callbacks.on_epoch_begin(0)
    callbacks.on_train_batch_begin(0)
    callbacks.on_train_batch_end(0, {"loss": 0.0})
    callbacks.on_epoch_end(0, {"loss": 0.0})
    callbacks.on_train_end()
    names = ("before", "user", "after")
    want = [(n, "epoch") for n in names] + [(n, "batch") for n in names]
    if events != want:
        raise AssertionError(f"the edited CallbackList dispatched {events}")
    if any(cb.model is not second for cb in ours):
        raise AssertionError("set_model did not reach every callback of the list")


PROBES = {
    RNN_LOOP.accessor: _probe_rnn_loop,
    FUSED_RNN.accessor: _probe_fused_rnn,
    AUTOCAST_SCOPE.accessor: _probe_read_uncast,
    MODEL_SUPPORTS_JIT.accessor: _probe_model_supports_jit,
    OPTIMIZER_LEARNING_RATE.accessor: _probe_learning_rate_slot,
    OPTIMIZER_TRAINABLE_VARIABLES.accessor: _probe_optimizer_variables,
    OPTIMIZER_VARIABLE_INDEX.accessor: _probe_optimizer_variables,
    BASE_OPTIMIZER_BUILD.accessor: _probe_build_optimizer_base,
    MODEL_CHECKPOINT_HOOKS.accessor: _probe_checkpoint_hooks,
    STEP_FUNCTIONS.accessor: _probe_step_functions,
    FLATTEN_LAYERS.accessor: _probe_flatten_layers,
    SYMBOLIC_BUILD.accessor: _probe_symbolic_build,
    INITIAL_EPOCH.accessor: _probe_initial_epoch,
    DATA_ADAPTER.accessor: _probe_fit_data_adapter,
    INTERACTIVE_LOGGING.accessor: _probe_interactive_logging_gate,
    BACKUP_PATHS.accessor: _probe_backup_paths,
    WEIGHTS_SNAPSHOT.accessor: _probe_weights_snapshot,
    ARRAY_DATASET.accessor: _probe_array_datasets,
    METRICS_RESULT_OR_LOGS.accessor: _probe_metrics_result_or_logs,
    TRAIN_VALIDATION_SPLIT.accessor: _probe_train_validation_split,
    EPOCH_ITERATOR.accessor: _probe_skip_steps,
    FIT_VALIDATION_EVALUATE.accessor: _probe_fit_validation_evaluate,
    METRICS_RESULT_AT_END.accessor: _probe_get_metrics_result_at_end,
    CALLBACK_LIST_EDITABLE.accessor: _probe_callback_list_editable,
}


def check() -> dict[str, str | None]:
    """Exercises every accessor on small objects.

    Returns:
        `{accessor: None}` for each one that works as the package needs, or
        `{accessor: "what went wrong"}`.
    """
    results: dict[str, str | None] = {}
    for accessor in REGISTRY:
        try:
            PROBES[accessor]()
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            results[accessor] = f"{type(exc).__name__}: {exc}"
        else:
            results[accessor] = None
    return results


__all__ = ["PROBES", "check"]
