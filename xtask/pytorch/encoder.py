"""The peer of `encoder_bench` (examples/examples/encoder_bench.rs): the same BERT-class
encoder (all-MiniLM-L6-v2's shapes) as Hugging Face's `BertModel`, timed in PyTorch's and ONNX
Runtime's forms on the same inputs' shapes, so that the bench can put Burn's forward beside
them in one run.

The model is built from a `BertConfig` with seeded random weights (no download), in eval mode,
without the pooler (the output is the last hidden state, as Burn's encoder returns). Inputs:
seeded random token ids, and an attention mask whose sentences have the lengths `--lengths`
gives (the bench's), or lengths drawn between seq/2 and seq.

Forms:
- torch-f32-eager: attn_implementation="eager";
- torch-f32-sdpa: attn_implementation="sdpa";
- torch-bf16-autocast: sdpa under torch.autocast("cpu", dtype=torch.bfloat16);
- torch-int8-dynamic: torch.ao.quantization.quantize_dynamic on nn.Linear, qint8;
- ort-f32: torch.onnx.export at the run's shapes, an InferenceSession (intra-op threads as
  --threads, inter-op 1, graph optimisations ALL);
- ort-int8: onnxruntime.quantization.quantize_dynamic of that export, QInt8 weights.

A form that fails (an export, a missing package) is reported as unavailable with its reason.
Each form warms up, then the rounds alternate between the forms (one forward of each per
round), all under torch.inference_mode(). Output: one JSON object per form, a list, to --json
(or stdout).

With --serve, the rounds are the caller's: once every form is built and warmed up, the script
writes `@@encoder {"ready": ...}` on stdout, then runs one round per `round` line on stdin and
answers `@@encoder {form: ms, ...}`, until `end` (then it writes --json as above). The bench
uses it to alternate Burn's rounds with the peer's, so that a busy spell of the machine falls
on both sides. Everything else the script or its libraries print goes to stderr.

    python3 xtask/pytorch/encoder.py --batch 32 --seq 128 --rounds 10 --json out.json
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import traceback

FORMS = [
    "torch-f32-eager",
    "torch-f32-sdpa",
    "torch-bf16-autocast",
    "torch-int8-dynamic",
    "ort-f32",
    "ort-int8",
]


def config(attn):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        attn_implementation=attn,
    )


def build(attn, seed):
    """The same seeded weights for every attention implementation."""
    import torch
    from transformers import BertModel

    torch.manual_seed(seed)
    model = BertModel(config(attn), add_pooling_layer=False)
    return model.eval()


def inputs(batch, seq, lengths, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 30522, (batch, seq), generator=g)
    if lengths is None:
        rng = random.Random(seed)
        lengths = [rng.randint(max(1, seq // 2), seq) for _ in range(batch)]
    mask = torch.zeros(batch, seq, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return ids, mask, lengths


def torch_runner(form, seed, ids, mask):
    import torch

    if form == "torch-f32-eager":
        model = build("eager", seed)
        return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state
    if form == "torch-f32-sdpa":
        model = build("sdpa", seed)
        return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state
    if form == "torch-bf16-autocast":
        model = build("sdpa", seed)

        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(input_ids=ids, attention_mask=mask).last_hidden_state

        return run
    if form == "torch-int8-dynamic":
        model = torch.ao.quantization.quantize_dynamic(
            build("sdpa", seed), {torch.nn.Linear}, dtype=torch.qint8
        )
        return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state
    raise ValueError(form)


class Export:
    """The f32 model exported to ONNX once per run (at the run's shapes), shared by the two
    ONNX Runtime forms; `notes` says how it was exported."""

    def __init__(self, seed, ids, mask, directory):
        self.seed, self.ids, self.mask, self.dir = seed, ids, mask, directory
        self.path, self.error, self.notes = None, None, ""

    def get(self):
        if self.path is None and self.error is None:
            try:
                self.path = self._export()
            except Exception as e:  # reported as the ORT forms' reason
                self.error = f"torch.onnx.export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if self.error:
            raise RuntimeError(self.error)
        return self.path

    def _export(self):
        import torch

        errors = []
        # The dynamo exporter first (torch's default), then the TorchScript one; the sdpa
        # model first, then eager attention.
        for attn in ("sdpa", "eager"):
            for dynamo in (True, False):
                path = os.path.join(self.dir, f"encoder-{attn}-{'dynamo' if dynamo else 'ts'}.onnx")
                model = build(attn, self.seed)
                try:
                    kwargs = dict(
                        input_names=["input_ids", "attention_mask"],
                        output_names=["last_hidden_state"],
                        opset_version=18,
                        dynamo=dynamo,
                    )
                    if dynamo:
                        kwargs["external_data"] = False
                    with torch.inference_mode(False), torch.no_grad():
                        torch.onnx.export(model, (self.ids, self.mask), path, **kwargs)
                    self.notes = f"{attn} attention, {'dynamo' if dynamo else 'TorchScript'} exporter, fixed shapes"
                    return path
                except Exception as e:
                    errors.append(f"{attn}/{'dynamo' if dynamo else 'ts'}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        raise RuntimeError("; ".join(errors))


def ort_runner(form, export, threads, ids, mask):
    import onnxruntime as ort

    path = export.get()
    if form == "ort-int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantized = path.replace(".onnx", "-int8.onnx")
        quantize_dynamic(path, quantized, weight_type=QuantType.QInt8)
        path = quantized
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = {}
    for name in names:
        if "mask" in name:
            feed[name] = mask.numpy()
        else:
            feed[name] = ids.numpy()
    return lambda: session.run(None, feed)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lengths", type=str, default=None, help="comma list, one per row")
    parser.add_argument("--forms", type=str, default=",".join(FORMS))
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--serve", action="store_true", help="rounds on request, see above")
    args = parser.parse_args()

    # The protocol's lines go to the real stdout; anything else printed goes to stderr.
    protocol = sys.stdout
    sys.stdout = sys.stderr

    def say(obj):
        protocol.write("@@encoder " + json.dumps(obj) + "\n")
        protocol.flush()

    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else None
    if lengths is not None and len(lengths) != args.batch:
        sys.exit(f"--lengths has {len(lengths)} values for --batch {args.batch}")
    ids, mask, lengths = inputs(args.batch, args.seq, lengths, args.seed)
    forms = [f for f in args.forms.split(",") if f]
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except Exception:
        ort_version = None
    import transformers

    results, runners = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        export = Export(args.seed, ids, mask, directory)
        for form in forms:
            base = {
                "form": form,
                "batch": args.batch,
                "seq": args.seq,
                "threads": args.threads,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnxruntime": ort_version,
            }
            try:
                if form.startswith("torch-"):
                    run = torch_runner(form, args.seed, ids, mask)
                elif form.startswith("ort-"):
                    run = ort_runner(form, export, args.threads, ids, mask)
                    base["export"] = export.notes
                else:
                    raise ValueError(f"unknown form {form}")
                with torch.inference_mode():
                    for _ in range(args.warmup):
                        run()
                runners[form] = run
                base.update(available=True, reason=None, times_ms=[])
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                msg = str(e).splitlines()[0] if str(e) else ""
                base.update(available=False, reason=f"{type(e).__name__}: {msg}", times_ms=[], median_ms=None)
            results[form] = base

        def one_round():
            times = {}
            with torch.inference_mode():
                for form, run in runners.items():
                    start = time.perf_counter()
                    run()
                    times[form] = (time.perf_counter() - start) * 1e3
                    results[form]["times_ms"].append(times[form])
            return times

        # Rounds alternate between the forms: a slow spell of the machine hits them all.
        if args.serve:
            say({"ready": True, "unavailable": {f: r["reason"] for f, r in results.items() if not r["available"]}})
            for line in sys.stdin:
                command = line.strip()
                if command == "round":
                    say(one_round())
                elif command == "end":
                    break
        else:
            for _ in range(args.rounds):
                one_round()
    for form in runners:
        times = sorted(results[form]["times_ms"])
        if not times:
            results[form]["median_ms"] = None
            continue
        # The upper middle for an even count, as examples::stats::median.
        results[form]["median_ms"] = times[len(times) // 2]
        results[form]["mean_ms"] = statistics.fmean(times)
    out = [results[f] for f in forms]
    text = json.dumps(out, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        protocol.write(text + "\n")


if __name__ == "__main__":
    main()
