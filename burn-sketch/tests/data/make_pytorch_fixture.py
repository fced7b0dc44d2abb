"""Writes the PyTorch `torch.save` fixtures: a Panther SKLinear state dict, good and damaged.

PyTorch is not needed (nor installable on CI): the files are built to the format's
description. A zip archive (PyTorch >= 1.6) holds `archive/data.pkl`, a protocol-2 pickle of an
OrderedDict whose tensors are `torch._utils._rebuild_tensor_v2(storage, offset, shape, stride,
...)` calls on persistent storage ids `('storage', FloatStorage, key, 'cpu', numel)`, and one
raw little-endian buffer per storage under `archive/data/`. The legacy format (before 1.6) is
one stream: pickles of a magic number, the protocol version, system info, the state dict and
the sorted storage keys, then each storage as its element count (u64) and its bytes. The module
names the pickles record are those of real PyTorch, so readers see what `torch.save` writes.

Values: entry `i` (row-major, in the tensor's logical order) of the tensor named N is
`(i + OFFSETS[N]) * 0.25`, which the Rust tests recompute.

Files:
- `sklinear.pt`: every tensor contiguous at offset 0.
- `sklinear_legacy.pt`: the same state dict in the legacy format.
- `sklinear_views.pt`: the same values, stored as views: `S1s` is a transpose (its storage holds
  `[T, K, D_IN]` and its strides walk it as `[T, D_IN, K]`), `S2s` starts 5 elements into its
  storage, `bias` reads every other element of a longer storage.
- `sklinear_f64.pt`: `S2s` in a DoubleStorage holding 1e300, beyond f32's range.
- Damaged files, each with one fault: `sklinear_short_storage.pt` (`S1s`'s storage declares
  fewer elements than its shape), `sklinear_short_data.pt` (`S2s`'s data file is shorter than
  its storage), `sklinear_offset_past_end.pt` (`U1s` starts past its storage),
  `sklinear_missing_data.pt` (`U2s`'s data file is not in the archive), `sklinear_huge.pt`
  (a layer 10^9 wide whose storages declare 10^9 elements but hold a few), and
  `sklinear_legacy_truncated.pt` (the legacy file cut inside its last storage),
  `sklinear_broadcast.pt` (`bias` a stride-0 view of one element).

Run from this directory: `python3 make_pytorch_fixture.py`.
"""

import collections
import io
import pickle
import struct
import sys
import types
import zipfile

# Stand-ins registered under PyTorch's module names, so that pickle records those names.
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args):
    raise RuntimeError("only for pickling")


_rebuild_tensor_v2.__module__ = "torch._utils"
torch_utils._rebuild_tensor_v2 = _rebuild_tensor_v2


class FloatStorage:
    pass


class DoubleStorage:
    pass


for cls in (FloatStorage, DoubleStorage):
    cls.__module__ = "torch"
    setattr(torch, cls.__name__, cls)
torch._utils = torch_utils
sys.modules["torch"] = torch
sys.modules["torch._utils"] = torch_utils


def contiguous(shape):
    stride, step = [], 1
    for dim in reversed(shape):
        stride.insert(0, step)
        step *= dim
    return stride


class Storage:
    """A storage: its key, declared element count, class and packed bytes."""

    def __init__(self, key, numel, data, cls=FloatStorage, legacy=False):
        self.key, self.numel, self.data, self.cls, self.legacy = key, numel, data, cls, legacy


class Tensor:
    def __init__(self, storage, shape, offset=0, stride=None):
        self.storage, self.shape, self.offset = storage, shape, offset
        self.stride = stride if stride is not None else contiguous(shape)

    def __reduce_ex__(self, protocol):
        args = (
            self.storage,
            self.offset,
            tuple(self.shape),
            tuple(self.stride),
            False,
            collections.OrderedDict(),
        )
        return (_rebuild_tensor_v2, args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            pid = ("storage", obj.cls, obj.key, "cpu", obj.numel)
            return pid + (None,) if obj.legacy else pid
        return None


T, D_IN, K, D_OUT = 2, 3, 2, 4
SHAPES = {
    "fc.S1s": [T, D_IN, K],
    "fc.S2s": [T, K, D_OUT],
    "fc.U1s": [T, K, D_OUT],
    "fc.U2s": [T, D_IN, K],
    "fc.bias": [D_OUT],
}
OFFSETS = {"fc.S1s": 0, "fc.S2s": 100, "fc.U1s": 200, "fc.U2s": 300, "fc.bias": 400}


def numel(shape):
    n = 1
    for dim in shape:
        n *= dim
    return n


def values(name):
    return [(i + OFFSETS[name]) * 0.25 for i in range(numel(SHAPES[name]))]


def f32(xs):
    return struct.pack("<%df" % len(xs), *xs)


def contiguous_state(legacy=False):
    state = collections.OrderedDict()
    for index, (name, shape) in enumerate(SHAPES.items()):
        data = f32(values(name))
        state[name] = Tensor(Storage(str(index), numel(shape), data, legacy=legacy), shape)
    return state


def dump(state):
    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump(state)
    return buffer.getvalue()


def storages(state):
    return {t.storage.key: t.storage.data for t in state.values()}


def write_zip(path, state, data=None, skip=()):
    data = storages(state) if data is None else data
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", dump(state))
        archive.writestr("archive/byteorder", "little")
        for key, buffer in data.items():
            if key not in skip:
                archive.writestr("archive/data/" + key, buffer)
        archive.writestr("archive/version", "3\n")


def legacy_bytes(state):
    out = io.BytesIO()
    pickle.dump(0x1950A86A20F9469CFC6C, out, protocol=2)
    pickle.dump(1001, out, protocol=2)
    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"int": 4}}
    pickle.dump(sys_info, out, protocol=2)
    Pickler(out, protocol=2).dump(state)
    data = storages(state)
    keys = sorted(data)
    pickle.dump(keys, out, protocol=2)
    for key in keys:
        out.write(struct.pack("<q", len(data[key]) // 4))
        out.write(data[key])
    return out.getvalue()


write_zip("sklinear.pt", contiguous_state())
legacy = legacy_bytes(contiguous_state(legacy=True))
with open("sklinear_legacy.pt", "wb") as f:
    f.write(legacy)
with open("sklinear_legacy_truncated.pt", "wb") as f:
    f.write(legacy[:-6])

# Views: a transpose, an offset, a step.
views = contiguous_state()
s1s = values("fc.S1s")  # logical [T, D_IN, K], row-major
transposed = [0.0] * len(s1s)
for t in range(T):
    for i in range(D_IN):
        for j in range(K):
            # The storage is [T, K, D_IN] row-major.
            transposed[t * K * D_IN + j * D_IN + i] = s1s[t * D_IN * K + i * K + j]
views["fc.S1s"] = Tensor(
    Storage("0", len(transposed), f32(transposed)),
    SHAPES["fc.S1s"],
    stride=[K * D_IN, 1, D_IN],
)
s2s = [-1.0] * 5 + values("fc.S2s")
views["fc.S2s"] = Tensor(Storage("1", len(s2s), f32(s2s)), SHAPES["fc.S2s"], offset=5)
bias = [v for b in values("fc.bias") for v in (b, -1.0)]
views["fc.bias"] = Tensor(Storage("4", len(bias), f32(bias)), [D_OUT], stride=[2])
write_zip("sklinear_views.pt", views)

# An f64 tensor with a value f32 cannot hold.
wide = contiguous_state()
s2s = values("fc.S2s")
s2s[3] = 1e300
wide["fc.S2s"] = Tensor(
    Storage("1", len(s2s), struct.pack("<%dd" % len(s2s), *s2s), cls=DoubleStorage),
    SHAPES["fc.S2s"],
)
write_zip("sklinear_f64.pt", wide)

# One fault per file.
short_storage = contiguous_state()
short_storage["fc.S1s"].storage.numel = 6
short_storage["fc.S1s"].storage.data = f32(values("fc.S1s")[:6])
write_zip("sklinear_short_storage.pt", short_storage)

short_data = contiguous_state()
data = storages(short_data)
data["1"] = data["1"][:40]
write_zip("sklinear_short_data.pt", short_data, data)

past_end = contiguous_state()
past_end["fc.U1s"].offset = 1000
write_zip("sklinear_offset_past_end.pt", past_end)

write_zip("sklinear_missing_data.pt", contiguous_state(), skip=("3",))

WIDE = 10**9
huge = collections.OrderedDict()
for index, (name, shape) in enumerate(
    [("fc.S1s", [1, WIDE, 1]), ("fc.S2s", [1, 1, 4]), ("fc.U1s", [1, 1, 4]), ("fc.U2s", [1, WIDE, 1])]
):
    huge[name] = Tensor(Storage(str(index), numel(shape), f32([0.5] * 4)), shape)
write_zip("sklinear_huge.pt", huge)

broadcast = contiguous_state()
broadcast["fc.bias"] = Tensor(Storage("4", 1, f32([0.5])), [D_OUT], stride=[0])
write_zip("sklinear_broadcast.pt", broadcast)
