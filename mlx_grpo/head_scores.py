"""An LM head's log-probs of the completion tokens without holding the whole [positions, vocab] logits: in
chunks of positions, or streamed a block of the vocabulary at a time (a frozen plain head, the default under
LoRA and for every reference pass), with the gradient through custom VJPs. update.py scores completions with
these; the streamed block is `models/families.py:vocab_block` rows, which plan.py sizes too."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .extras import token_entropy
from .models.cpu_kernels import shifted_exp
from .models.families import vocab_block
from .models.policy import project_to_vocab


def _logprob_parts(logits: mx.array, targets: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """(log-prob of each target, exp(logits - row max), its row sum) of float32 logits [..., V]. One
    exponential over the vocabulary, whose result the backward pass reuses as the softmax; shifting by
    the row maximum keeps large logits from losing digits."""
    shifted = logits - mx.stop_gradient(logits.max(axis=-1, keepdims=True))
    unnormalised = mx.exp(shifted)
    total = unnormalised.sum(axis=-1, keepdims=True)
    picked = mx.take_along_axis(shifted, targets[..., None], axis=-1)
    return (picked - mx.log(total)).squeeze(-1), unnormalised, total


def _logits_cotangent(unnormalised: mx.array, total: mx.array, targets: mx.array, cotangent: mx.array) -> mx.array:
    """d logp(target) / d logits times the cotangent: cotangent * (one_hot(target) - softmax)."""
    grad = unnormalised * (-cotangent[..., None] / total)
    at_target = mx.take_along_axis(grad, targets[..., None], axis=-1) + cotangent[..., None]
    return mx.put_along_axis(grad, targets[..., None], at_target, axis=-1)


def target_logprobs(logits: mx.array, targets: mx.array) -> mx.array:
    """`grpo.token_logprobs` of float32 logits, differentiated by hand: the backward pass reuses the
    forward's exponentials (one exp over the vocabulary per pass, where autodiff of a log-softmax
    takes a second one, the costliest operation on a 152k vocabulary) and writes the target's term in
    place instead of scattering a one-hot into a second [N, T, V] array."""
    def forward(z):
        return _logprob_parts(z, targets)

    scores = mx.custom_function(forward)
    # one input: MLX hands the primal over as the array itself, not in a tuple
    scores.vjp(lambda primal, cotangents, outputs: _logits_cotangent(outputs[1], outputs[2], targets,
                                                                     cotangents[0]))
    return scores(logits)[0]


def scaled(hidden: mx.array, temperature: float) -> mx.array:
    """Hidden states whose logits are the model's over `temperature`: a head without a bias is linear,
    so scaling its [N, T, H] input spares a pass over the [N, T, V] logits."""
    return hidden if temperature == 1.0 else hidden * (1.0 / temperature)


def _head_weight(head: nn.Module) -> mx.array | None:
    """The head's weight when it is one plain trainable matrix (full fine-tuning); None when the head
    is frozen (LoRA), which saves the [V, H] weight gradient."""
    trainable = dict(tree_flatten(head.trainable_parameters()))
    if not trainable:
        return None
    if set(trainable) != {"weight"} or isinstance(head, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        raise NotImplementedError
    return head.weight


def _after(x: mx.array, *dependencies: mx.array) -> mx.array:
    """`x` plus an exact zero computed from `dependencies`. MLX evaluates independent branches side by
    side, so without this the logits of every chunk would exist at once; chained through the chunks,
    each chunk waits for the one before it and its logits are freed before the next ones are built."""
    zero = sum(mx.isnan(d.reshape(-1)[0]).astype(x.dtype) for d in dependencies) * 0
    return x + zero


def chunked_head_logprobs(hidden: mx.array, targets: mx.array, head: nn.Module, chunk: int) -> mx.array:
    """`target_logprobs` of the head's logits over `chunk` positions at a time, forward and backward: at
    most one chunk's [N, chunk, V] logits (and their exponentials) exist at any moment; the backward
    pass recomputes them."""
    width = targets.shape[1]
    starts = range(0, width, chunk)
    weight = _head_weight(head)

    def logits_of(h: mx.array, w: mx.array | None = None) -> mx.array:
        return (h @ w.T if w is not None else project_to_vocab(head, h)).astype(mx.float32)

    def forward(h: mx.array, w: mx.array | None) -> mx.array:
        parts: list[mx.array] = []
        for s in starts:
            part = h[:, s:s + chunk] if not parts else _after(h[:, s:s + chunk], parts[-1])
            parts.append(_logprob_parts(logits_of(part, w), targets[:, s:s + chunk])[0])
        return mx.concatenate(parts, axis=1)

    def backward(h: mx.array, w: mx.array | None, cotangent: mx.array) -> tuple[mx.array, mx.array | None]:
        d_hidden: list[mx.array] = []
        d_weight = None
        for s in starts:
            part = h[:, s:s + chunk]
            if d_hidden:
                part = _after(part, d_hidden[-1], *([] if d_weight is None else [d_weight]))
            inputs = [part] if w is None else [part, w]
            _, unnormalised, total = _logprob_parts(logits_of(*inputs), targets[:, s:s + chunk])
            d_logits = _logits_cotangent(unnormalised, total, targets[:, s:s + chunk], cotangent[:, s:s + chunk])
            # the vjp's own forward output is never used, so never computed
            _, grads = mx.vjp(logits_of, inputs, [d_logits])
            d_hidden.append(grads[0])
            if w is not None:
                d_weight = grads[1] if d_weight is None else d_weight + grads[1]
        return mx.concatenate(d_hidden, axis=1), d_weight

    # A single input or output reaches the vjp as the array itself, not in a tuple.
    if weight is None:
        scores = mx.custom_function(lambda h: forward(h, None))
        scores.vjp(lambda primal, cotangent, output: backward(primal, None, cotangent)[0])
        return scores(hidden)
    scores = mx.custom_function(forward)
    scores.vjp(lambda primals, cotangent, output: backward(primals[0], primals[1], cotangent))
    return scores(hidden, weight)



def streams_head(head: nn.Module) -> bool:
    """Whether the streamed head serves this head: frozen (LoRA, or a reference pass) and without a bias."""
    if "bias" in head:
        return False
    try:
        return _head_weight(head) is None
    except NotImplementedError:
        return False


def _head_rows(head: nn.Module, rows) -> mx.array:
    """Rows of the head's [V, H] weight (a slice or an index array), dequantized for a quantized head."""
    if isinstance(head, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        biases = head.biases[rows] if "biases" in head else None
        return mx.dequantize(head.weight[rows], head.scales[rows], biases, head.group_size, head.bits,
                             mode=getattr(head, "mode", "affine"))
    return head.weight[rows]


def block_exponentials(logits: mx.array, top: mx.array | None,
                       traced: bool = False) -> tuple[mx.array, mx.array, mx.array]:
    """The streamed head's elementwise work on one block of float32 logits [P, block], given the running
    maximum of the blocks before it (None for the first): (the new running maximum, exp(logits - it), their
    row sums). The row sums are a matrix-vector product: the BLAS reads the block with vector loads on
    every core, about four times faster than MLX's CPU sum, whose loop is scalar. `traced`: under mx.grad,
    as the update runs it (`shifted_exp`; there the matrix-vector product measured no faster)."""
    block_top = logits.max(axis=-1)
    new_top = block_top if top is None else mx.maximum(top, block_top)
    unnormalised = shifted_exp(logits, new_top[:, None], traced)
    total = unnormalised.sum(axis=-1) if traced else unnormalised @ mx.ones((logits.shape[-1],), mx.float32)
    return new_top, unnormalised, total


def _streamed_head(hidden: mx.array, target_rows: mx.array, head: nn.Module, expected: bool):
    """One pass over the vocabulary in blocks, each block's logits freed before the next is built: the
    log-sum-exp of every position's logits (a running maximum rescales the running sum), and with
    `expected` the softmax-weighted mean of the head's rows, E_p[w], [P, H]. Returns (log-prob of each
    target, entropy, E_p[w] or None), for hidden [P, H] and the targets' rows of the weight [P, H]."""
    vocab = head.weight.shape[0]
    block = vocab_block(*hidden.shape)
    h32 = hidden.astype(mx.float32)
    picked = (h32 * target_rows.astype(mx.float32)).sum(axis=-1)
    if hidden.dtype != mx.float32:  # rounded as the blocks' half-precision logits are
        picked = picked.astype(hidden.dtype).astype(mx.float32)
    top = total = mean_row = None
    for start in range(0, vocab, block):
        rows = _head_rows(head, slice(start, min(start + block, vocab)))
        # each block waits for the one before it (its running sum and mean row), so one block's logits
        # exist at a time: MLX evaluates independent branches side by side
        part = hidden if top is None else _after(hidden, total, *([mean_row] if expected else []))
        new_top, unnormalised, block_sum = block_exponentials((part @ rows.T).astype(mx.float32), top, expected)
        block_mean = unnormalised @ (rows if rows.dtype == mx.float32 else rows.astype(mx.float32)) \
            if expected else None
        if top is None:
            total, mean_row = block_sum, block_mean
        else:
            rescale = shifted_exp(top, new_top, expected)
            total = total * rescale + block_sum
            if expected:
                mean_row = mean_row * rescale[:, None] + block_mean
        top = new_top
    log_total = top + mx.log(total)
    if expected:
        mean_row = mean_row / total[:, None]
    # H = logsumexp(z) - E_p[z], and E_p[z] = h . E_p[w] for a head without a bias
    entropy = None if mean_row is None else log_total - (h32 * mean_row).sum(axis=-1)
    return picked - log_total, entropy, mean_row


def streamed_head_scores(hidden: mx.array, targets: mx.array, head: nn.Module,
                         gradient: bool = True) -> tuple[mx.array, mx.array | None]:
    """Log-probs of `targets` under a frozen head's logits of `hidden` [N, T, H] without the [N, T, V] logits
    ever existing (`streams_head`): one block of the vocabulary at a time, forward, and no pass over the
    vocabulary backward. The gradient of log p(y) with respect to the hidden state is w_y - E_p[w], so the
    forward pass keeps E_p[w] ([N, T, H]) and the backward pass is one subtraction. With `gradient`, also
    returns the entropy at every position (free given E_p[w]); without, only log-probs (the reference pass:
    one matmul, no E_p[w])."""
    n, t, width = hidden.shape
    flat = hidden.reshape(n * t, width)
    target_rows = _head_rows(head, targets.reshape(-1))
    if not gradient:
        return _streamed_head(flat, target_rows, head, expected=False)[0].reshape(n, t), None

    def forward(h):
        logp, entropy, mean_row = _streamed_head(h, target_rows, head, expected=True)
        return logp, mx.stop_gradient(entropy), mean_row

    scores = mx.custom_function(forward)
    # one input: MLX hands the primal over as the array itself
    scores.vjp(lambda primal, cotangents, outputs: (
        cotangents[0][:, None] * (target_rows.astype(mx.float32) - outputs[2])).astype(primal.dtype))
    logp, entropy, _ = scores(flat)
    return logp.reshape(n, t), entropy.reshape(n, t)


def head_token_stats(hidden: mx.array, head: nn.Module, chunk: int) -> dict[str, mx.array]:
    """entropy_logging's per-token arrays from the head's logits, `chunk` positions at a time (0: all)."""
    width = hidden.shape[1]
    chunk = chunk if 0 < chunk < width else width
    parts: list[dict[str, mx.array]] = []
    for s in range(0, width, chunk):
        part = hidden[:, s:s + chunk] if not parts else _after(hidden[:, s:s + chunk], *parts[-1].values())
        parts.append(token_entropy.token_stats(project_to_vocab(head, part).astype(mx.float32)))
    return {key: mx.concatenate([p[key] for p in parts], axis=1) for key in token_entropy.TOKEN_KEYS}
