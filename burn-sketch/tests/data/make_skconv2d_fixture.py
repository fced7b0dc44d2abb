"""Writes `skconv2d.safetensors`: a Panther `SKConv2d` state dict and the output of Panther's
forward pass for a fixed input, computed with NumPy in float64 from Panther's formulas, so
that the Rust test checks our layer against Panther's math independently of our code.

Layer: 3 → 4 channels, 3 × 3 kernel, stride 1, padding 1, T = 2 terms, k = 2.
Panther's `SKConv2d.forward`: pad; unfold the windows with features ordered (channel, kernel
row, kernel column) and positions row-major; `(x·Σ_t S1_t·U1_t)/T + (x·Σ_t U2_tᵀ·S2_t)/T`,
plus the bias twice (once inside the first term, once at the end); back to NCHW.

Keys: `S1s` `[2, 27, 2]`, `S2s` `[2, 18, 4]`, `U1s` `[2, 2, 4]` (±1/√2), `U2s` `[2, 18, 27]`
(±1/√18), `bias` `[4]`, `input` `[1, 3, 6, 5]`, `output` `[1, 4, 6, 5]`.

    python3 make_skconv2d_fixture.py   # needs numpy and safetensors
"""

import numpy as np
from safetensors.numpy import save_file

rng = np.random.default_rng(20261127)
C, O, KH, KW, T, K, PAD = 3, 4, 3, 3, 2, 2, 1
window = KH * KW


def signs(shape, rank):
    return rng.choice([-1.0, 1.0], size=shape) / np.sqrt(rank)


s1s = rng.normal(size=(T, C * window, K)) * 0.3
s2s = rng.normal(size=(T, K * window, O)) * 0.3
u1s = signs((T, K, O), K)
u2s = signs((T, K * window, C * window), K * window)
bias = rng.normal(size=(O,)) * 0.1
x = rng.normal(size=(1, C, 6, 5))

padded = np.pad(x, ((0, 0), (0, 0), (PAD, PAD), (PAD, PAD)))
h_out = padded.shape[2] - KH + 1
w_out = padded.shape[3] - KW + 1
rows = []
for i in range(h_out):
    for j in range(w_out):
        rows.append(padded[0, :, i:i + KH, j:j + KW].reshape(-1))
windows = np.array(rows)  # [positions, C·kh·kw]
first = sum(s1s[t] @ u1s[t] for t in range(T)) / T
second = sum(u2s[t].T @ s2s[t] for t in range(T)) / T
out = windows @ first + bias + windows @ second + bias
out = out.reshape(1, h_out, w_out, O).transpose(0, 3, 1, 2)

f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
save_file(
    {
        "S1s": f32(s1s), "S2s": f32(s2s), "U1s": f32(u1s), "U2s": f32(u2s), "bias": f32(bias),
        "input": f32(x), "output": f32(out),
    },
    "skconv2d.safetensors",
    metadata={"format": "pt"},
)
