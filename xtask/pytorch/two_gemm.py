"""PyTorch's fastest CPU forms of a sketched linear layer and of the dense layer it replaces,
in one precision, timed like `cargo xtask bench`: the peer our CPU numbers are held against.

The layer `y = x·A·B / (2T) + bias` with `A = [S1 | U2]` (`[d_in, 2Tk]`) and `B = [U1; S2]`
(`[2Tk, d_out]`) written as two GEMMs, `torch.addmm(bias, x @ A, B)`, the fastest form a
PyTorch user can write. In f32, bf16 and f16 (inputs, weights and outputs in that type; MKL
and oneDNN accumulate in f32):

- `forward`: the factors packed once, outside the timed call (inference on fixed weights);
- `forward_packing`: `A` and `B` concatenated from the four factors on every call, as a
  training step must (S1 and S2 are separate parameters);
- `train`: forward with packing plus backward of `y.sum()`, gradients for `x`, `S1`, `S2` and
  the bias (the bench's "fwd+bwd");
- `dense_forward`: `nn.functional.linear` with the dense `[d_out, d_in]` weight.

In int8, `torch.ao.quantization.quantize_dynamic` (int8 weights per output channel, activations
quantized at run time) of the same architectures: `forward` is the two-GEMM layer as two
`nn.Linear`s, `dense_forward` the dense `nn.Linear`.

With `--activation relu|gelu`, every form is followed by `torch.relu` or the exact
`torch.nn.functional.gelu` (seed 001's linear + activation; oneDNN fuses neither into MKL's
GEMM here, which is what `cargo xtask bench --activation` compares our fused epilogue with).

Timing: every sample runs the call enough times to last about 2 ms, the variants alternate in
rounds after an untimed call each, and the median is reported.

    python xtask/pytorch/two_gemm.py --dtype bf16 --threads 2 --runs 20 --json out.json

The project does not depend on PyTorch; this script is for the comparison only.
"""

import argparse
import warnings
import json
import re
import statistics
import time

import torch

POINTS = [
    # (d_in, d_out, terms, rank, batch)
    (4096, 4096, 1, 64, 256),
    (8192, 8192, 1, 16, 256),
    (4096, 4096, 4, 16, 256),
]

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def point_id(d_in, d_out, terms, rank, batch):
    return f"d{d_in}x{d_out}-t{terms}-k{rank}-b{batch}"


def parse_point(text):
    match = re.fullmatch(r"d(\d+)x(\d+)-t(\d+)-k(\d+)-b(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a point id: {text}")
    return tuple(int(v) for v in match.groups())


ACTIVATIONS = {"identity": lambda y: y, "relu": torch.relu,
               "gelu": torch.nn.functional.gelu}


def make_ops(d_in, d_out, terms, rank, batch, dtype, activation="identity"):
    act = ACTIVATIONS[activation]
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    scale = 1.0 / (2 * terms)
    if dtype == "int8":
        return make_int8_ops(d_in, d_out, terms, rank, batch, rand, scale, act)
    t = DTYPES[dtype]
    x = rand(batch, d_in).to(t)
    s1 = rand(terms, d_in, rank).to(t).requires_grad_()
    s2 = rand(terms, rank, d_out).to(t).requires_grad_()
    u1 = rand(terms, rank, d_out).sign().to(t)
    u2 = rand(terms, d_in, rank).sign().to(t)
    bias = rand(d_out).to(t).requires_grad_()
    weight = (rand(d_out, d_in) / d_in ** 0.5).to(t)

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
            return act(torch.addmm(bias, x @ a_fixed, b_fixed))

    def forward_packing():
        with torch.no_grad():
            a, b = pack()
            return act(torch.addmm(bias, x @ a, b, alpha=scale))

    def train():
        xg = x.clone().requires_grad_()
        a, b = pack()
        y = act(torch.addmm(bias, xg @ a, b, alpha=scale))
        y.sum().backward()
        return xg.grad

    def dense_forward():
        with torch.no_grad():
            return act(torch.nn.functional.linear(x, weight, bias))

    return {"forward": forward, "forward_packing": forward_packing, "train": train,
            "dense_forward": dense_forward}


def make_int8_ops(d_in, d_out, terms, rank, batch, rand, scale, act):
    from torch import nn
    from torch.ao.quantization import quantize_dynamic

    # quantize_dynamic is deprecated in favour of torchao, which PyPI's torch does not ship.
    warnings.filterwarnings("ignore", module="torch.ao")

    x = rand(batch, d_in)
    sketched = nn.Sequential(nn.Linear(d_in, 2 * terms * rank, bias=False),
                             nn.Linear(2 * terms * rank, d_out))
    dense = nn.Linear(d_in, d_out)
    sketched_q = quantize_dynamic(sketched, {nn.Linear}, dtype=torch.qint8)
    dense_q = quantize_dynamic(dense, {nn.Linear}, dtype=torch.qint8)

    def run(model):
        def call():
            with torch.inference_mode():
                return act(model(x))
        return call

    return {"forward": run(sketched_q), "dense_forward": run(dense_q),
            "forward_f32": run(sketched), "dense_forward_f32": run(dense)}


def mnist_mlp_ops(hidden, terms, rank, batch, rows):
    """`train_mnist`'s MLP (784 → hidden → 10, ReLU between), dense and with each hidden layer
    as its two-GEMM sketched form, in f32 and through `quantize_dynamic`: the logits of `rows`
    digits in batches of `batch`, as `train_mnist --int8` times them."""
    from torch import nn
    from torch.ao.quantization import quantize_dynamic

    warnings.filterwarnings("ignore", module="torch.ao")
    torch.manual_seed(0)
    widths = [784, *hidden]

    def mlp(sketched):
        layers = []
        for d_in, d_out in zip(widths, widths[1:]):
            if sketched:
                layers += [nn.Linear(d_in, 2 * terms * rank, bias=False),
                           nn.Linear(2 * terms * rank, d_out)]
            else:
                layers.append(nn.Linear(d_in, d_out))
            layers.append(nn.ReLU())
        layers.append(nn.Linear(widths[-1], 10))
        return nn.Sequential(*layers).eval()

    batches = [torch.rand(batch, 784) for _ in range(rows // batch)]

    def run(model):
        def call():
            with torch.inference_mode():
                for x in batches:
                    model(x)
        return call

    ops = {}
    for name, sketched in [("dense", False), ("sketched", True)]:
        model = mlp(sketched)
        ops[f"{name}_f32"] = run(model)
        ops[f"{name}_int8"] = run(quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8))
    return ops


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
    parser.add_argument("--dtype", choices=["f32", "bf16", "f16", "int8"], default="f32")
    parser.add_argument("--points", type=parse_point, nargs="*",
                        help="point ids (d4096x4096-t1-k64-b256); default: the three CPU points")
    parser.add_argument("--activation", choices=list(ACTIVATIONS), default="identity",
                        help="an activation after every form")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--mnist-mlp", action="store_true",
                        help="time train_mnist's MLP on its test set (2,000 digits in batches of 500) instead, f32 and int8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.mnist_mlp:
        medians = time_together(mnist_mlp_ops([512, 256], 1, 32, 500, 2_000),
                                args.warmup, args.runs)
        row = {"model": "mnist-mlp 784-512-256-10 (sketched T=1 k=32)", "batch": 500,
               "rows": 2_000, "torch": torch.__version__, "threads": args.threads,
               **{f"{k}_ms": v for k, v in medians.items()}}
        print(json.dumps(row))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(row, f, indent=2)
        return

    rows = []
    for point in args.points or POINTS:
        medians = time_together(make_ops(*point, args.dtype, args.activation), args.warmup,
                                args.runs)
        row = {"point": point_id(*point), "torch": torch.__version__, "dtype": args.dtype,
               "activation": args.activation,
               "threads": args.threads, **{f"{k}_ms": v for k, v in medians.items()}}
        rows.append(row)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
