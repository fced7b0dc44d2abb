"""The PyTorch reference of the `embed` example (examples/pretrained/examples/embed.rs): a
sentence-transformers model (all-MiniLM-L6-v2) run by transformers' `AutoModel` and
`AutoTokenizer` on a list of texts, in three forms, each timed on the same work as the Rust
side's:

- f32: the checkpoint as loaded (eval mode, transformers' default attention);
- int8: `torch.ao.quantization.quantize_dynamic` of every `nn.Linear` to `qint8` (weights per
  tensor, activations quantized per batch at run time);
- bf16: the f32 model under `torch.autocast("cpu", dtype=torch.bfloat16)`.

Embeddings are sentence-transformers' formula: the mean of the last hidden state over the
attention mask (the count clamped at 1e-9), then divided by its L2 norm (at least 1e-12). The
texts are sorted by their UTF-8 length (a stable sort, as `SentenceEncoder::embed_all`) and
cut into batches of `--batch`, each padded to its longest and truncated at `--max-length`
tokens, so that both sides do the same work; the time of a form covers tokenizing, the
forward and pooling, after one untimed pass over the first `--warm` texts.

Output (`--json`): the versions, the settings, and per form `available`, `reason`,
`seconds`, `sentences_per_s` and `embeddings`, which names a file beside the JSON holding the
rows as little-endian `f32` (`rows` × `dim`, in the order of the input), since the vectors of
ten thousand texts as JSON numbers would weigh hundreds of megabytes. A form that fails is
reported unavailable with its reason. Progress goes to stderr.

    python3 xtask/pytorch/embed.py --model /tmp/minilm --texts texts.json --json out.json
"""

import argparse
import json
import os
import sys
import time
import traceback

FORMS = ["f32", "int8", "bf16"]


def pooled(model, tokenizer, texts, max_length, autocast):
    """Unit-length mean-pooled embeddings of `texts`, one padded batch, as float32."""
    import torch
    import torch.nn.functional as F

    encoded = tokenizer(
        texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model(**encoded).last_hidden_state
    else:
        hidden = model(**encoded).last_hidden_state
    hidden = hidden.float()
    mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    count = mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize(summed / count, p=2, dim=1, eps=1e-12)


def embed_all(model, tokenizer, texts, batch, max_length, autocast):
    """Rows in the input's order, computed in batches of texts sorted by UTF-8 length."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i].encode("utf-8")))
    rows = [None] * len(texts)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        out = pooled(model, tokenizer, [texts[i] for i in chunk], max_length, autocast)
        for row, i in zip(out, chunk):
            rows[i] = row
    return torch.stack(rows) if rows else torch.zeros(0, 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--texts", required=True, help="a JSON list of strings")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warm", type=int, default=64, help="texts of the untimed pass")
    parser.add_argument("--forms", type=str, default=",".join(FORMS))
    parser.add_argument("--json", required=True, help="the output; embeddings go beside it")
    args = parser.parse_args()
    if args.batch < 1:
        sys.exit("--batch is at least 1")

    import warnings

    # quantize_dynamic is deprecated in favour of torchao, which this reference does not
    # use: its warnings would bury the progress lines.
    warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated.*")
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated.*")
    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        sys.exit(f"{args.texts}: not a JSON list of strings")

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    base = AutoModel.from_pretrained(args.model).eval()
    stem = os.path.splitext(args.json)[0]
    result = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": args.threads,
        "batch": args.batch,
        "max_length": args.max_length,
        "texts": len(texts),
        "warm": min(args.warm, len(texts)),
        "forms": {},
    }
    for form in [f for f in args.forms.split(",") if f]:
        entry = {"form": form}
        try:
            if form == "f32":
                model, autocast = base, False
            elif form == "int8":
                model = torch.ao.quantization.quantize_dynamic(
                    base, {torch.nn.Linear}, dtype=torch.qint8
                )
                autocast = False
            elif form == "bf16":
                model, autocast = base, True
            else:
                raise ValueError(f"unknown form {form}")
            with torch.inference_mode():
                print(f"pytorch {form}: warm-up on {result['warm']} texts", file=sys.stderr, flush=True)
                embed_all(model, tokenizer, texts[: args.warm], args.batch, args.max_length, autocast)
                print(f"pytorch {form}: embedding {len(texts)} texts", file=sys.stderr, flush=True)
                start = time.perf_counter()
                rows = embed_all(model, tokenizer, texts, args.batch, args.max_length, autocast)
                seconds = time.perf_counter() - start
            path = os.path.abspath(f"{stem}-{form}.f32")
            rows.numpy().astype("<f4").tofile(path)
            entry.update(
                available=True,
                reason=None,
                seconds=seconds,
                sentences_per_s=len(texts) / seconds if seconds > 0 else None,
                embeddings={"file": path, "rows": int(rows.shape[0]), "dim": int(rows.shape[1]), "dtype": "f32le"},
            )
            print(f"pytorch {form}: {seconds:.2f} s", file=sys.stderr, flush=True)
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            msg = str(e).splitlines()[0] if str(e) else ""
            entry.update(available=False, reason=f"{type(e).__name__}: {msg}", seconds=None, embeddings=None)
        result["forms"][form] = entry
        # Let OpenMP's worker threads stop spinning (KMP_BLOCKTIME, 200 ms) before the next
        # form is timed, as the Rust side pauses between its own and these.
        time.sleep(0.3)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
