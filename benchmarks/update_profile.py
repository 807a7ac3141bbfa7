"""Where the reference and update passes spend their time, operation by operation, next to a bare
`value_and_grad` + AdamW over the same tokens.

A random-weight preset (mlx_grpo/planning/presets.py) cut to `--layers` blocks, LoRA, `--prompts` x `--group-size`
completions of `--completion` tokens after `--prompt`-token prompts, float32. Every timed operation runs
once per repetition, interleaved with the others, so load on a shared machine hits them alike; each is
reported as the fastest repetition's wall and CPU seconds (CPU time, summed over threads, is the steadier
figure when other jobs share the cores). "old" rows time the formulation the update used before it was
rewritten (autodiff of a shifted log-softmax, full-vocabulary entropy at every position), so before and
after come from the same process.

    python benchmarks/update_profile.py --preset qwen2.5-0.5b --layers 2 --completion 256
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from mlx_grpo.planning.blas import reexec_with_openblas

if __name__ == "__main__":
    reexec_with_openblas([__file__, *sys.argv[1:]])

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
import numpy as np  # noqa: E402

from mlx_grpo import (
    grpo,  # noqa: E402
    head_scores,
)
from mlx_grpo.config.train_config import load_config  # noqa: E402
from mlx_grpo.head_scores import shifted_exp, streamed_head_scores, target_logprobs
from mlx_grpo.models.families import entropy_stride
from mlx_grpo.models.policy import apply_adapters, lm_head, make_reference  # noqa: E402
from mlx_grpo.planning.presets import preset_model  # noqa: E402
from mlx_grpo.rollout import Rollout  # noqa: E402
from mlx_grpo.trainer import make_optimizer  # noqa: E402
from mlx_grpo.update import build_train_batch, completion_states, make_loss_fn, reference_logprobs, update_policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=21)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=0, help="0: the whole batch in one pass")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="time only these rows")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)

    config = load_config(None, {"use_lora": True, "lora_rank": 8, "beta": 0.04, "learning_rate": 1e-5,
                                "max_generation_steps": args.completion, "micro_batch_size": args.micro_batch_size})
    mx.random.seed(0)
    model = preset_model(args.preset, args.layers)
    apply_adapters(model, config)
    reference = make_reference(model, config)
    optimizer = make_optimizer(config)
    vocab = model.args.vocab_size
    rng = np.random.default_rng(0)
    n = args.prompts * args.group_size
    prompts = [rng.integers(1, vocab, args.prompt).tolist() for _ in range(args.prompts)]
    completions = [rng.integers(1, vocab, args.completion).tolist() for _ in range(n)]
    rollout = Rollout([p for p in prompts for _ in range(args.group_size)], completions,
                      [[0.0] * args.completion] * n, [False] * n, 0.0)
    batch = build_train_batch(rollout, pad_id=0)
    advantages = mx.array(rng.normal(size=n), dtype=mx.float32)
    loss_and_grad = nn.value_and_grad(model, make_loss_fn(config))
    ref_logp = reference_logprobs(reference, batch, config)
    targets = mx.take_along_axis(batch.targets, batch.positions, axis=1)
    head = lm_head(model)
    model.train()
    hidden = completion_states(model, batch, targets, hidden=True)
    logits = head.as_linear(hidden)
    mx.eval(ref_logp, hidden, logits)
    stride = entropy_stride(args.completion)

    # the bare ceiling: masked cross-entropy over the completion positions of the whole sequences
    start = args.prompt - 1
    ceiling_optimizer = optim.AdamW(learning_rate=1e-5)

    def ceiling_loss(m):
        out = m(batch.inputs)[:, start:, :]
        losses = nn.losses.cross_entropy(out, batch.targets[:, start:], reduction="none")
        return (losses * batch.mask).sum() / batch.mask.sum()

    ceiling_grad = nn.value_and_grad(model, ceiling_loss)

    def ceiling():
        loss, grads = ceiling_grad(model)
        ceiling_optimizer.update(model, grads)
        return loss, model.parameters(), ceiling_optimizer.state

    body_grad = nn.value_and_grad(model, lambda m: completion_states(m, batch, targets, hidden=True).sum())

    def body_backward():
        return body_grad(model)

    flat_logits = logits.reshape(-1, vocab)
    shifted = flat_logits - flat_logits.max(axis=-1, keepdims=True)
    mx.eval(shifted)

    def with_exp(run, exp):
        """`run` with the streamed head's exponential replaced: mx.exp (before the polynomial), or none at
        all (what the head costs without its exponentials)."""
        def replaced():
            head_scores.shifted_exp = lambda x, shift, traced=False: exp(x - shift)
            try:
                return run()
            finally:
                head_scores.shifted_exp = shifted_exp
        return replaced

    def streamed_reference():
        return streamed_head_scores(hidden, targets, head, gradient=False)[0]

    def streamed_update():
        return mx.grad(lambda h: streamed_head_scores(h, targets, head)[0].sum())(hidden)

    def head_grad(logprobs):
        return mx.grad(lambda h: logprobs(head.as_linear(h), targets).sum())(hidden)

    rows = {
        "ceiling: value_and_grad + AdamW": ceiling,
        "reference pass (ours)": lambda: reference_logprobs(reference, batch, config),
        "update_policy (ours)": lambda: update_policy(model, optimizer, loss_and_grad, batch, advantages, ref_logp,
                                                      config).loss,
        "body forward, shared prompt": lambda: completion_states(model, batch, targets, hidden=True),
        "body forward + LoRA backward": body_backward,
        "head matmul [N,T,H] x [H,V]": lambda: head.as_linear(hidden),
        "exp over the [N*T, V] logits, mx.exp": lambda: mx.exp(shifted),
        "exp over the [N*T, V] logits, polynomial (ours)": lambda: shifted_exp(shifted, mx.array(0.0)),
        "streamed head, log-probs (reference's head)": streamed_reference,
        "streamed head, log-probs, mx.exp": with_exp(streamed_reference, mx.exp),
        "streamed head, log-probs, exp skipped": with_exp(streamed_reference, lambda x: x),
        "streamed head + backward (update's head)": streamed_update,
        "streamed head + backward, mx.exp": with_exp(streamed_update, mx.exp),
        "streamed head + backward, exp skipped": with_exp(streamed_update, lambda x: x),
        "log-probs forward, ours": lambda: target_logprobs(logits, targets),
        "log-probs forward, old": lambda: grpo.token_logprobs(logits, targets),
        "log-probs + head backward, ours": lambda: head_grad(target_logprobs),
        "log-probs + head backward, old": lambda: head_grad(grpo.token_logprobs),
        "cross-entropy + head backward": lambda: head_grad(
            lambda z, t: -nn.losses.cross_entropy(z, t, reduction="none")),
        f"entropy, every {stride}th position (ours)": lambda: grpo.token_entropy(head.as_linear(hidden[:, ::stride])),
        "entropy, every position (old)": lambda: grpo.token_entropy(logits),
        "GRPO loss + KL on log-probs": lambda: mx.grad(lambda lp: grpo.grpo_loss(
            lp, None, ref_logp, advantages, batch.mask, beta=0.04))(ref_logp),
        "policy statistics": lambda: grpo.policy_stats(ref_logp, None, ref_logp, advantages, batch.mask, beta=0.04),
        "AdamW step on the LoRA weights": lambda: (optimizer.update(model, model.trainable_parameters()),
                                                   model.parameters(), optimizer.state),
    }
    if args.only:
        rows = {name: run for name, run in rows.items() if any(word in name for word in args.only)}
    wall: dict[str, list[float]] = {name: [] for name in rows}
    cpu: dict[str, list[float]] = {name: [] for name in rows}
    for rep in range(args.repetitions + 1):  # the first is a warm-up
        for name, run in rows.items():
            gc.collect()
            w, c = time.perf_counter(), time.process_time()
            mx.eval(run())
            if rep:
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)
    load = __import__("os").getloadavg()[0]
    print(f"{args.preset} cut to {args.layers} layers, LoRA r8, {args.prompts} x {args.group_size} x "
          f"({args.prompt} + {args.completion}) tokens, micro-batch {args.micro_batch_size or 'all'}, float32; "
          f"fastest of {args.repetitions}; load average {load:.1f}")
    print(f"{'operation':44s} {'wall s':>8s} {'CPU s':>8s}")
    results = {}
    for name in rows:
        results[name] = {"wall_s": min(wall[name]), "cpu_s": min(cpu[name])}
        print(f"{name:44s} {min(wall[name]):8.2f} {min(cpu[name]):8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "load_average": load, "rows": results}, f, indent=2)


if __name__ == "__main__":
    main()
