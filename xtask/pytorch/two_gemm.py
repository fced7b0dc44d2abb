"""PyTorch's fastest CPU forms of a sketched linear layer, timed like `cargo xtask bench`.

The comparison the README's CPU table quotes: the layer `y = x·A·B / (2T) + bias` with
`A = [S1 | U2]` (`[d_in, 2Tk]`) and `B = [U1; S2]` (`[2Tk, d_out]`) written as two GEMMs,
`torch.addmm(bias, x @ A, B)`, the fastest form a PyTorch user can write. Three variants:

- `forward`: the factors packed once, outside the timed call (inference on fixed weights);
- `forward_packing`: `A` and `B` concatenated from the four factors on every call, as a
  training step must (S1 and S2 are separate parameters) and as our forward does;
- `train`: forward with packing plus backward of `y.sum()`, gradients for `x`, `S1`, `S2` and
  the bias (the bench's "fwd+bwd").

Timing matches the Rust bench: every sample runs the call enough times to last about 2 ms,
the variants alternate in rounds after an untimed call each, and the median is reported.

    python xtask/pytorch/two_gemm.py --threads 2 --runs 20 --json out.json

The project does not depend on PyTorch; this script is for the comparison only.
"""

import argparse
import json
import statistics
import time

import torch

POINTS = [
    # (d_in, d_out, terms, rank, batch)
    (4096, 4096, 1, 64, 256),
    (8192, 8192, 1, 16, 256),
    (4096, 4096, 4, 16, 256),
]


def point_id(d_in, d_out, terms, rank, batch):
    return f"d{d_in}x{d_out}-t{terms}-k{rank}-b{batch}"


def make_ops(d_in, d_out, terms, rank, batch):
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    x = rand(batch, d_in)
    s1 = rand(terms, d_in, rank).requires_grad_()
    s2 = rand(terms, rank, d_out).requires_grad_()
    u1 = rand(terms, rank, d_out).sign()
    u2 = rand(terms, d_in, rank).sign()
    bias = rand(d_out).requires_grad_()
    scale = 1.0 / (2 * terms)

    def pack():
        a = torch.cat([s1.permute(1, 0, 2).reshape(d_in, -1),
                       u2.permute(1, 0, 2).reshape(d_in, -1)], dim=1)
        b = torch.cat([u1.reshape(-1, d_out), s2.reshape(-1, d_out)], dim=0)
        return a, b

    with torch.no_grad():
        a_fixed, b_fixed = pack()
        b_fixed = b_fixed * scale

    def forward():
        with torch.no_grad():
            return torch.addmm(bias, x @ a_fixed, b_fixed)

    def forward_packing():
        with torch.no_grad():
            a, b = pack()
            return torch.addmm(bias, x @ a, b, alpha=scale)

    def train():
        xg = x.clone().requires_grad_()
        a, b = pack()
        y = torch.addmm(bias, xg @ a, b, alpha=scale)
        y.sum().backward()
        return xg.grad

    return {"forward": forward, "forward_packing": forward_packing, "train": train}


def time_together(ops, warmup, runs, sample_ms=2.0):
    names = list(ops)
    for _ in range(warmup):
        for name in names:
            ops[name]()
    # Calls per sample: enough to last about `sample_ms`.
    reps = {}
    for name in names:
        start = time.perf_counter()
        ops[name]()
        once = time.perf_counter() - start
        reps[name] = max(1, int(sample_ms / 1e3 / max(once, 1e-9)))
    samples = {name: [] for name in names}
    for _ in range(runs):
        for name in names:
            ops[name]()
            start = time.perf_counter()
            for _ in range(reps[name]):
                ops[name]()
            samples[name].append((time.perf_counter() - start) / reps[name] * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    print("| point | fwd (packed once) ms | fwd (packing) ms | fwd+bwd ms |")
    print("|---|---|---|---|")
    for point in POINTS:
        medians = time_together(make_ops(*point), args.warmup, args.runs)
        row = {"point": point_id(*point), "torch": torch.__version__,
               "threads": args.threads, **{f"{k}_ms": v for k, v in medians.items()}}
        rows.append(row)
        print(f"| {row['point']} | {row['forward_ms']:.2f} | {row['forward_packing_ms']:.2f} "
              f"| {row['train_ms']:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
