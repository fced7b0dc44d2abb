"""Real clients against a running `serve_encoder`: OpenAI's own Python client, a TEI-style JSON
client, and Triton's HTTP client sending texts as BYTES, each compared with
sentence-transformers on the same model directory; then Triton's client sending good and bad
requests at the same moment (no good one may fail).

    serve_encoder --port 8000 &          # the server under test
    python xtask/pytorch/embed_clients.py --url http://127.0.0.1:8000 --model DIR [--json F]

Prints a table and, with --json, the same numbers as JSON. Exits non-zero when a client's
embeddings fall below the cosine target or a good request fails.
"""

import argparse
import json
import sys
import threading
import urllib.request

import numpy as np


def cosines(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def post(url, body, key=None):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served Hugging Face directory")
    parser.add_argument("--name", default="minilm", help="the served model's name")
    parser.add_argument("--target", type=float, default=0.99999)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    texts = [
        "A sentence to embed.",
        "",
        "Ωμέγα ☃ naïve café",
        "The quick brown fox jumps over the lazy dog. " * 3,
        "Short.",
        "Batch servers group requests; each must still get its own answer.",
    ]
    reference = SentenceTransformer(args.model, device="cpu").encode(texts)
    rows = []

    # OpenAI's client: base64 by default (it decodes), and float.
    import openai

    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key="unused")
    for fmt in ["base64", "float"]:
        kwargs = {} if fmt == "base64" else {"encoding_format": "float"}
        answer = client.embeddings.create(input=texts, model=args.name, **kwargs)
        got = [item.embedding for item in answer.data]
        c = cosines(got, reference)
        rows.append({"client": f"openai ({fmt})", "texts": len(texts), "min_cosine": float(c.min()),
                     "prompt_tokens": answer.usage.prompt_tokens})

    # TEI's JSON shape.
    status, got = post(f"{args.url}/embed", {"inputs": texts})
    assert status == 200, (status, got)
    c = cosines(got, reference)
    rows.append({"client": "TEI /embed", "texts": len(texts), "min_cosine": float(c.min())})

    # Triton's client, texts as BYTES (binary tensor data).
    import tritonclient.http as triton

    host = args.url.split("://", 1)[1]
    tc = triton.InferenceServerClient(url=host)
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    result = tc.infer(args.name, [tensor])
    got = result.as_numpy("embeddings")
    c = cosines(got, reference)
    rows.append({"client": "tritonclient BYTES", "texts": len(texts), "min_cosine": float(c.min())})

    # Good and bad requests at the same moment: 24 good texts, 4 ids outside the vocabulary.
    good_failed = bad_refused = good = bad = 0
    lock = threading.Lock()
    for _ in range(args.rounds):
        barrier = threading.Barrier(28)

        def send(i):
            nonlocal good_failed, bad_refused, good, bad
            client = triton.InferenceServerClient(url=host)
            if i % 7 == 3:
                ids = np.zeros((1, 256), dtype=np.int64)
                ids[0, :3] = [101, 10_000_000, 102]
                tensor = triton.InferInput("input_ids", [1, 256], "INT64")
                tensor.set_data_from_numpy(ids)
            else:
                tensor = triton.InferInput("text", [1], "BYTES")
                tensor.set_data_from_numpy(np.array([texts[i % len(texts)].encode()], dtype=np.object_))
            barrier.wait()
            try:
                client.infer(args.name, [tensor])
                ok = True
            except Exception:
                ok = False
            with lock:
                if i % 7 == 3:
                    bad += 1
                    bad_refused += not ok
                else:
                    good += 1
                    good_failed += not ok

        threads = [threading.Thread(target=send, args=(i,)) for i in range(28)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    print(f"{'client':<22} {'texts':>5} {'least cosine':>14}")
    for row in rows:
        print(f"{row['client']:<22} {row['texts']:>5} {row['min_cosine']:>14.7f}")
    print(f"mixed: {good} good requests, {good_failed} failed; {bad} bad, {bad_refused} refused")
    report = {"clients": rows, "mixed": {"good": good, "good_failed": good_failed, "bad": bad,
                                         "bad_refused": bad_refused}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    failed = [r for r in rows if r["min_cosine"] < args.target]
    if failed or good_failed or bad_refused != bad:
        print("FAILED", failed, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
