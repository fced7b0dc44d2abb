"""Writes burn-pretrained's test fixture: a small random BERT in Hugging Face's exact layout,
and what transformers computes with it, so that the crate's tests check key names, transposes,
tokenization and pooling against the reference without downloading anything.

    /tmp/venv/bin/python xtask/pytorch/hf_fixture.py            # (any Python with torch,
    # transformers, tokenizers and safetensors) writes burn-pretrained/tests/fixtures/tiny-bert/

Rerun it only to change the fixture: its output is committed, seeded and deterministic up to
the libraries' versions, and no test runs it or fetches anything.

Files written:
- config.json: `BertConfig` (hidden 32, 2 layers, 4 heads, intermediate 64, 16 positions so
  that truncation is easy to reach, 2 token types, the tokenizer's vocabulary), as
  `save_pretrained` writes it;
- model.safetensors: a seeded `BertModel` (pooler included) saved by `save_pretrained`, its
  layer norms moved away from 1 and 0 and its linear biases away from 0, so that a lost or
  misplaced parameter shows, and its feed-forward weights' singular values decaying
  geometrically (as trained weights' do, so that a higher rank keeps more), plus
  `embeddings.position_ids` (int64) when this transformers version does not save it, as real
  checkpoints have it;
- tokenizer.json: a BERT WordPiece tokenizer built with `tokenizers` (BertNormalizer with
  lowercasing, BertPreTokenizer, `##` continuations, `[CLS] $A [SEP]`, `[PAD]` = 0);
- expected.json: token ids of odd texts (transformers' fast tokenizer, truncation at 16), and
  for a padded batch of sentences of different lengths the last hidden state at real positions
  and the mean-pooled unit embeddings (sentence-transformers' formula), plus one sentence pair
  with token types 1; the feed-forward weights' singular values. Floats are the float32
  values written in their shortest exact form.
"""

import json
import os
import re
import string

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import BertConfig, BertModel, BertTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "burn-pretrained", "tests", "fixtures", "tiny-bert")
MAX_POSITIONS = 16
SEED = 20240601

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her
long make thing see him two has look more day could go come did number sound no most people my
over know water than call first who may down side been now find any new work part take get
place made live where after back little only round man year came show every good me give our
under name very through just form sentence great think say help low line differ turn cause much
mean before move right boy old too same tell does set three want air well also play small end
children music morning dog earth sea home river town city love hello world near
""".split()
# Characters BERT's normalizer keeps: é only matters without accent stripping (kept to show
# that it is stripped to e), ß and CJK characters are their own tokens.
NON_ASCII = ["é", "ß", "東", "京"]

# Texts whose ids the tests compare: empty, whitespace only, accents, CJK, emoji (unknown),
# longer than the 16 positions, and normal sentences.
ODD_TEXTS = [
    "",
    "   \t\n  ",
    "Café au lait, naïve résumé!",
    "東京 is a city.",
    "I love music 🎵 and dogs 🐕",
    "The quick brown fox jumps over the lazy dog while the people of the town watch the river run by",
    "Hello, world.",
    "unbelievable tokenization",
]
# The batch whose states the tests compare: three lengths, so that two are padded.
BATCH = [
    "The children play music in the morning.",
    "A dog.",
    "Water is the most common thing on the earth, and the sea is its home.",
]
PAIR = ("Where is the river?", "The river is near the town.")


def vocabulary():
    chars = list(string.ascii_lowercase) + list(string.digits) + list(string.punctuation)
    chars += NON_ASCII
    vocab = list(SPECIALS) + chars + ["##" + c for c in chars]
    # Words, then a few word pieces so that WordPiece splits some words into several.
    for token in WORDS + ["##ed", "##ing", "##ly", "##tion", "##able", "un", "##ize", "##iz"]:
        if token not in vocab:
            vocab.append(token)
    return {token: i for i, token in enumerate(vocab)}


def build_tokenizer(vocab):
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens(SPECIALS)
    return tokenizer


# The feed-forward weights, whose low-rank conversions the tests compare.
FFN_WEIGHT = re.compile(r"encoder\.layer\.\d+\.(intermediate|output)\.dense\.weight$")
# Their singular values: sigma_i = sigma_0 * DECAY^i. A random matrix's are nearly flat, so that
# every rank below full loses about as much and the order of low ranks is noise; trained
# weights' decay, which is what makes a low-rank layer worth having.
DECAY = 0.88


def decaying_spectrum(weight):
    """`weight` with its singular vectors and Frobenius norm, and singular values decaying."""
    u, s, vt = torch.linalg.svd(weight, full_matrices=False)
    decayed = DECAY ** torch.arange(len(s), dtype=weight.dtype)
    decayed *= s.norm() / decayed.norm()
    return u @ torch.diag(decayed) @ vt


def f32_list(array):
    """float32 values as Python floats of their shortest exact decimal form."""
    return [float(np.format_float_positional(v, unique=True, trim="-")) for v in array.ravel()]


def main():
    os.makedirs(OUT, exist_ok=True)
    vocab = vocabulary()
    tokenizer = build_tokenizer(vocab)
    tokenizer_path = os.path.join(OUT, "tokenizer.json")
    tokenizer.save(tokenizer_path)

    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        hidden_act="gelu",
        # Wider than BERT's 0.02 so that every layer moves the states (a conversion shows).
        initializer_range=0.15,
        pad_token_id=vocab["[PAD]"],
    )
    model = BertModel(config, add_pooling_layer=True).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm.weight" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            elif "LayerNorm.bias" in name:
                param.copy_(0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                # BERT initialises linear biases to 0: nonzero ones test their mapping too.
                param.copy_(0.1 * torch.randn_like(param))
            elif FFN_WEIGHT.search(name):
                param.copy_(decaying_spectrum(param))
    model.save_pretrained(OUT, safe_serialization=True)

    weights_path = os.path.join(OUT, "model.safetensors")
    with safe_open(weights_path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    if "embeddings.position_ids" not in tensors:
        tensors["embeddings.position_ids"] = torch.arange(MAX_POSITIONS, dtype=torch.int64)[None, :]
        save_file(tensors, weights_path, metadata=metadata or {"format": "pt"})

    # The reference: the model as saved, reloaded, and transformers' fast tokenizer on the file.
    model = BertModel.from_pretrained(OUT).eval()
    hf_tokenizer = BertTokenizerFast(tokenizer_file=tokenizer_path, model_max_length=MAX_POSITIONS)
    encode = lambda texts: hf_tokenizer(texts, truncation=True, max_length=MAX_POSITIONS)

    expected = {
        "max_length": MAX_POSITIONS,
        "hidden_size": config.hidden_size,
        "odd_texts": [
            {"text": text, "ids": ids} for text, ids in zip(ODD_TEXTS, encode(ODD_TEXTS)["input_ids"])
        ],
    }

    with torch.no_grad():
        batch = hf_tokenizer(BATCH, padding=True, truncation=True, max_length=MAX_POSITIONS, return_tensors="pt")
        state = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1)
        lengths = batch["attention_mask"].sum(1).tolist()
        expected["batch"] = {
            "texts": BATCH,
            "ids": batch["input_ids"].tolist(),
            "lengths": lengths,
            # Real positions only: padding positions' states are meaningless.
            "last_hidden_state": [f32_list(state[i, :n].numpy()) for i, n in enumerate(lengths)],
            "embeddings": [f32_list(e.numpy()) for e in embeddings],
        }

        pair = hf_tokenizer(*PAIR, truncation=True, max_length=MAX_POSITIONS, return_tensors="pt")
        assert pair["token_type_ids"].sum() > 0
        pair_state = model(**pair).last_hidden_state
        expected["pair"] = {
            "texts": list(PAIR),
            "ids": pair["input_ids"][0].tolist(),
            "type_ids": pair["token_type_ids"][0].tolist(),
            "last_hidden_state": f32_list(pair_state[0].numpy()),
        }

    # Each feed-forward weight's singular values as saved (float64 SVD of the float32 values):
    # the best rank-r weight's squared error is the sum of the squares past the r-th.
    with safe_open(weights_path, "np") as f:
        expected["ffn_singular_values"] = {
            key: [float(v) for v in np.linalg.svd(f.get_tensor(key).astype(np.float64), compute_uv=False)]
            for key in sorted(f.keys())
            if FFN_WEIGHT.search(key)
        }

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
    # sentence-transformers' pipeline files for the embeddings above: mean pooling, then unit
    # length (what `Pooling::from_dir` reads).
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    with open(os.path.join(OUT, "modules.json"), "w") as f:
        json.dump(modules, f, indent=2)
    os.makedirs(os.path.join(OUT, "1_Pooling"), exist_ok=True)
    with open(os.path.join(OUT, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": config.hidden_size, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                   "pooling_mode_mean_sqrt_len_tokens": False}, f, indent=2)
        f.write("\n")

    sizes = {name: os.path.getsize(os.path.join(OUT, name)) for name in sorted(os.listdir(OUT))}
    print(json.dumps({"dir": os.path.normpath(OUT), "vocab": config.vocab_size, "bytes": sizes,
                      "total": sum(sizes.values())}))


if __name__ == "__main__":
    main()
