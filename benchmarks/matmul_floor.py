"""The matrix products of one training step of the benchmark's model, alone;
and with the loss and the optimizer's update, the other work every
implementation of the model must do.

A training step of an encoder-decoder Transformer is mostly matrix products,
and any implementation of the same model does the same ones: every
projection, the two products of each attention (QKᵀ and the weighted sum of
V, §3.2.1), the feed-forward layers (§3.3) and the output projection, forward,
and two more for each in the backward pass (the gradient of each operand).
Running just those, with the backend's own matmul and nothing between them,
times the floor under any implementation's step: keras-hub's step over this
floor is the most any model with these products could beat keras-hub's
layers by, however little it did besides.

The products are run as plain ``keras.ops.matmul`` of operands laid out the
way each one needs (the backward pass' transposes cost nothing here, as they
cost nothing in a GEMM call with a transpose flag), in the dtype policy's
compute dtype, compiled the way ``model.fit`` compiles a step on each backend
(``jax.jit`` on JAX, a ``tf.function`` without XLA on TensorFlow, eager on
PyTorch).

``step_floor`` adds two things no implementation can skip either: the loss
(softmax cross-entropy over the float32 logits, forward and its gradient,
written as one expression) and Adam's update of the variables of our model
(which ties the output projection to the target embedding, so it has fewer
than keras-hub's). What it leaves out (layer norms, residual adds, the
attention softmax, dropout, ReLU, embedding look-ups and their gradients,
casts) is what implementations can do more or less of.
"""


def forward_products(s):
    """``(a_shape, b_shape)`` of each forward product of the benchmark's
    model with setting ``s`` (``training_speed.Setting``)."""
    d, f, h = s.d_model, s.d_ff, s.num_heads
    n = s.batch_size * s.source_length  # source tokens
    m = s.batch_size * s.target_length  # target tokens
    heads = s.batch_size * h
    d_k = d // h
    products = []

    def dense(tokens, d_in, d_out):
        products.append(((tokens, d_in), (d_in, d_out)))

    def attention(l_q, l_k):
        products.append(((heads, l_q, d_k), (heads, d_k, l_k)))  # Q Kᵀ
        products.append(((heads, l_q, l_k), (heads, l_k, d_k)))  # weights · V

    for _ in range(s.num_layers):  # §3.1, encoder
        for _ in range(4):  # Q, K, V, output
            dense(n, d, d)
        attention(s.source_length, s.source_length)
        dense(n, d, f)
        dense(n, f, d)
    for _ in range(s.num_layers):  # §3.1, decoder
        for _ in range(4):
            dense(m, d, d)
        attention(s.target_length, s.target_length)
        dense(m, d, d)  # cross-attention: queries from the decoder,
        dense(n, d, d)  # keys and values from the encoder's output
        dense(n, d, d)
        dense(m, d, d)
        attention(s.target_length, s.source_length)
        dense(m, d, f)
        dense(m, f, d)
    dense(m, d, s.vocab_size)  # §3.4, the pre-softmax projection
    return products


def step_products(s):
    """``(a_shape, b_shape)`` of every product of a training step: each
    forward ``A·B = C`` and its backward ``dC·Bᵀ`` and ``Aᵀ·dC``."""
    out = []
    for a, b in forward_products(s):
        *batch, p, q = a
        r = b[-1]
        out.append((a, b))
        out.append(((*batch, p, r), (*batch, r, q)))  # gradient of A
        out.append(((*batch, q, p), (*batch, p, r)))  # gradient of B
    return out


def step_flops(s):
    """Floating-point operations of ``step_products(s)`` (2 per multiply-add)."""
    import math

    return sum(2 * math.prod(a) * b[-1] for a, b in step_products(s))


def step_operands(s):
    """Random float32 NumPy operands ``(a, b)`` for ``step_products(s)``."""
    import numpy as np

    rng = np.random.default_rng(s.seed)
    return [
        (rng.standard_normal(a, "float32"), rng.standard_normal(b, "float32"))
        for a, b in step_products(s)
    ]


def _compiled(function):
    """``function`` compiled the way ``model.fit`` compiles a step on this
    backend, returning its outputs once they are computed."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        compiled = jax.jit(function)
        return lambda *args: jax.block_until_ready(compiled(*args))
    if backend == "tensorflow":
        import tensorflow as tf

        # Eager TensorFlow returns from a function once it has run.
        return tf.function(function, jit_compile=False)
    import torch

    def run(*args):
        with torch.no_grad():  # PyTorch runs on the CPU synchronously
            return function(*args)

    return run


def products_step(s):
    """A function that runs all of a step's products once, in the compute
    dtype of ``s.dtype_policy``, and returns them when they are done."""
    import keras

    dtype = keras.DTypePolicy(s.dtype_policy).compute_dtype
    operands = [
        tuple(keras.ops.convert_to_tensor(x, dtype) for x in pair)
        for pair in step_operands(s)
    ]

    def products(operands):
        return [keras.ops.matmul(a, b) for a, b in operands]

    compiled = _compiled(products)
    return lambda: compiled(operands)


def loss_and_gradient(logits, labels):
    """Mean softmax cross-entropy of ``labels`` (ids) under ``logits``, and
    its gradient ``(softmax(logits) - onehot(labels)) / N``."""
    from keras import ops

    vocab = logits.shape[-1]
    log_probs = ops.log_softmax(logits, axis=-1)
    picked = ops.take_along_axis(log_probs, labels[..., None], axis=-1)
    count = ops.cast(ops.size(labels), logits.dtype)
    target = ops.equal(ops.arange(vocab, dtype="int32"), labels[..., None])
    gradient = ops.exp(log_probs) - ops.cast(target, logits.dtype)
    return -ops.sum(picked) / count, gradient / count


def step_floor(s):
    """A function that runs a step's products, its loss and gradient, and
    Adam's update of our model's variables, once each."""
    import keras
    import numpy as np

    from benchmarks import training_speed as benchmark

    products = products_step(s)
    rng = np.random.default_rng(s.seed + 1)
    shape = (s.batch_size, s.target_length)
    logits = keras.ops.convert_to_tensor(
        rng.standard_normal((*shape, s.vocab_size), "float32")
    )
    labels = keras.ops.convert_to_tensor(rng.integers(0, s.vocab_size, shape), "int32")
    loss = _compiled(loss_and_gradient)

    variables = benchmark.build_ours(s).trainable_variables
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(variables)
    grads = [
        keras.ops.convert_to_tensor(
            1e-3 * rng.standard_normal(v.shape, "float32"), v.dtype
        )
        for v in variables
    ]
    update = _optimizer_update(optimizer, variables, grads)

    def run():
        """The step's work; returns the variables' new values."""
        products()
        loss(logits, labels)
        return update()

    return run


def _optimizer_update(optimizer, variables, grads):
    """Adam's update of ``variables`` by ``grads``, as ``model.fit`` runs it."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        # fit's JAX step is stateless: values in, new values out.
        apply = jax.jit(optimizer.stateless_apply)
        state = {
            "optimizer": [v.value for v in optimizer.variables],
            "trainable": [v.value for v in variables],
        }

        def update():
            new_trainable, new_optimizer = apply(
                state["optimizer"], grads, state["trainable"]
            )
            jax.block_until_ready(new_trainable)
            state.update(optimizer=new_optimizer, trainable=new_trainable)
            return new_trainable

        return update
    apply = _compiled(lambda: optimizer.apply(grads, variables))

    def update():
        apply()
        return [v.value for v in variables]

    return update
