"""Writes the Panther `RandMultiHeadAttention` fixtures, with outputs computed by Panther's math.

PyTorch and Panther are not needed: the state dict is drawn with numpy under Panther's names
and layouts, and the expected outputs come from a float64 numpy transcription of Panther's
forward pass (pawX's `rmha_forward`: linear projections, `softmax_kernel_transform` or
`relu_kernel_transform`, the non-causal or prefix-sum numerator and denominator, the output
projection), so that the Rust tests check our module against Panther's formulas, computed
independently of our code.

State dict, under the prefix `attn.` (embed_dim 8, 2 heads, 6 random features):
- `Wq`, `Wk`, `Wv`, `W0`: `[8, 8]`, PyTorch's `[out, in]` layout (`F.linear(x, W, b)`);
- `bq`, `bk`, `bv`, `b0`: `[8]`;
- `projection_matrix`: `[6, 4]`, orthogonal blocks of 4 rows (the second one partial), each
  row scaled by the norm of a Gaussian vector, as Panther's `create_projection_matrix` draws it.

Files:
- `performer.safetensors`: the state dict (float32), plus `expected.x` (`[2, 5, 8]`, the
  input) and `expected.<kernel>[_causal]` (the outputs for kernel `softmax` or `relu`,
  non-causal and causal, in float32).
- `performer.pt`: the same state dict as a PyTorch `torch.save` zip archive, built to the
  format's description as `make_pytorch_fixture.py` does.

Needs `pip install numpy safetensors`. Run from this directory:
`python3 make_performer_fixture.py`.
"""

import collections
import io
import pickle
import sys
import types
import zipfile

import numpy as np
from safetensors.numpy import save_file

E, H, M, B, L = 8, 2, 6, 2, 5
D = E // H
EPS = 1e-5
rng = np.random.default_rng(20240601)


def projection_matrix(m, d):
    blocks = []
    for start in range(0, m, d):
        q, _ = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append(q.T[: min(d, m - start)])
    rows = np.vstack(blocks)
    return np.linalg.norm(rng.standard_normal((m, d)), axis=1)[:, None] * rows


bound = np.sqrt(6.0 / (2 * E))
state = collections.OrderedDict()
for name in ("Wq", "Wk", "Wv", "W0"):
    state[name] = rng.uniform(-bound, bound, (E, E))
for name in ("bq", "bk", "bv", "b0"):
    state[name] = rng.uniform(-0.1, 0.1, (E,))
state["projection_matrix"] = projection_matrix(M, D)
# C order: safetensors writes an array's buffer as it lies in memory.
state = collections.OrderedDict(
    (k, np.ascontiguousarray(v, dtype=np.float32)) for k, v in state.items()
)
x = rng.standard_normal((B, L, E)).astype(np.float32)


def softmax_features(data, w, is_query):
    """Panther's softmax_kernel_transform on [B, L, H, D]."""
    data = data / np.sqrt(np.sqrt(data.shape[-1]))
    dash = data @ w.T
    diag = (data**2).sum(-1, keepdims=True) / 2.0
    stab = dash.max(-1, keepdims=True)
    if not is_query:
        stab = stab.max(-3, keepdims=True)
    return (np.exp(dash - diag - stab) + EPS) / np.sqrt(w.shape[0])


def relu_features(data, w, is_query):
    """Panther's relu_kernel_transform on [B, L, H, D]."""
    return np.maximum(data @ w.T / np.sqrt(w.shape[0]), 0.0) + EPS


def rmha(x, p, kernel, causal):
    """Panther's rmha_forward for self-attention without mask, in float64."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    heads = lambda t: t.reshape(B, L, H, D)
    q = heads(x @ p["Wq"].T + p["bq"])
    k = heads(x @ p["Wk"].T + p["bk"])
    v = heads(x @ p["Wv"].T + p["bv"])
    features = softmax_features if kernel == "softmax" else relu_features
    qp = features(q, p["projection_matrix"], True)
    kp = features(k, p["projection_matrix"], False)
    if causal:
        num = np.zeros_like(v)
        den = np.zeros((B, L, H))
        for i in range(L):
            kv = np.einsum("bjhm,bjhd->bhmd", kp[:, : i + 1], v[:, : i + 1])
            num[:, i] = np.einsum("bhm,bhmd->bhd", qp[:, i], kv)
            den[:, i] = np.einsum("bhm,bhm->bh", qp[:, i], kp[:, : i + 1].sum(1))
    else:
        kv = np.einsum("bjhm,bjhd->bhmd", kp, v)
        num = np.einsum("bihm,bhmd->bihd", qp, kv)
        den = np.einsum("bihm,bhm->bih", qp, kp.sum(1))
    out = (num / den[..., None]).reshape(B, L, E)
    return out @ p["W0"].T + p["b0"]


tensors = {"attn." + k: v for k, v in state.items()}
tensors["expected.x"] = x
for kernel in ("softmax", "relu"):
    for causal in (False, True):
        name = "expected." + kernel + ("_causal" if causal else "")
        tensors[name] = np.ascontiguousarray(rmha(x, state, kernel, causal), dtype=np.float32)
save_file(tensors, "performer.safetensors", metadata={"format": "pt"})

# The same state dict as `torch.save` writes it (zip archive, protocol-2 pickle), with
# stand-ins registered under PyTorch's module names so that pickle records those names.
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args):
    raise RuntimeError("only for pickling")


class FloatStorage:
    pass


_rebuild_tensor_v2.__module__ = "torch._utils"
FloatStorage.__module__ = "torch"
torch_utils._rebuild_tensor_v2 = _rebuild_tensor_v2
torch.FloatStorage = FloatStorage
torch._utils = torch_utils
sys.modules["torch"] = torch
sys.modules["torch._utils"] = torch_utils


class Storage:
    def __init__(self, key, array):
        self.key, self.array = key, array


class TorchTensor:
    def __init__(self, storage):
        self.storage = storage

    def __reduce_ex__(self, protocol):
        shape = self.storage.array.shape
        stride = tuple(s // 4 for s in self.storage.array.strides)
        args = (self.storage, 0, shape, stride, False, collections.OrderedDict())
        return (_rebuild_tensor_v2, args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", FloatStorage, obj.key, "cpu", obj.array.size)
        return None


storages = [Storage(str(i), np.ascontiguousarray(v)) for i, v in enumerate(state.values())]
pt_state = collections.OrderedDict(
    ("attn." + name, TorchTensor(s)) for name, s in zip(state, storages)
)
buffer = io.BytesIO()
Pickler(buffer, protocol=2).dump(pt_state)
with zipfile.ZipFile("performer.pt", "w", zipfile.ZIP_STORED) as archive:
    archive.writestr("archive/data.pkl", buffer.getvalue())
    archive.writestr("archive/byteorder", "little")
    for s in storages:
        archive.writestr("archive/data/" + s.key, s.array.astype("<f4").tobytes())
    archive.writestr("archive/version", "3\n")
