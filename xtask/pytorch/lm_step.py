"""The language-model study's dense arm as PyTorch builds it: one training step in f32 and
in bf16 autocast, timed in the same process, so that the study's bf16 / f32 step ratio can be
read beside PyTorch's own on the same machine.

The model is the study's (examples/src/lm.rs): token and learned position embeddings, pre-norm
transformer blocks (causal softmax attention, a GELU MLP of 4 × d_model), a final layer norm
and a dense head, cross-entropy over every position; Adam; no dropout (the study's default).

    python3 xtask/pytorch/lm_step.py --threads 2 --json out.json
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 1 + 95 + 1


class Lm(nn.Module):
    def __init__(self, d_model, heads, blocks, context):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, d_model)
        self.positions = nn.Embedding(context, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model,
            heads,
            4 * d_model,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False
        )

    def forward(self, inputs, targets):
        positions = torch.arange(inputs.shape[1])
        x = self.tokens(inputs) + self.positions(positions)
        x = self.blocks(x, mask=self.mask, is_causal=True)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def step_times(model, optim, batch, context, steps, warmup, autocast):
    times = []
    for i in range(warmup + steps):
        inputs = torch.randint(0, VOCAB, (batch, context))
        targets = torch.randint(0, VOCAB, (batch, context))
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(inputs, targets)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write the medians here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {"torch": torch.__version__, "threads": args.threads}
    for name, autocast in [("f32", False), ("bf16_autocast", True)]:
        model = Lm(args.d_model, args.heads, args.blocks, args.context)
        optim = torch.optim.Adam(model.parameters(), lr=3e-3)
        result[name + "_ms"] = step_times(
            model, optim, args.batch, args.context, args.steps, args.warmup, autocast
        )
    result["bf16_over_f32"] = result["bf16_autocast_ms"] / result["f32_ms"]
    print(
        f"PyTorch {result['torch']}, {args.threads} threads, batch {args.batch} x "
        f"{args.context}, d_model {args.d_model}: step f32 {result['f32_ms']:.2f} ms, "
        f"bf16 autocast {result['bf16_autocast_ms']:.2f} ms "
        f"(bf16 / f32 = {result['bf16_over_f32']:.2f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
