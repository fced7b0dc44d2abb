"""Writes `sklinear.pt`: a Panther SKLinear state dict in PyTorch's `torch.save` format.

PyTorch is not needed (nor installable on CI): the file is built to the format's description,
a zip archive holding `archive/data.pkl` (a protocol-2 pickle of an OrderedDict whose tensors
are `torch._utils._rebuild_tensor_v2` calls on persistent storage ids) and one raw
little-endian buffer per storage under `archive/data/`. The module names that pickle records
are those of real PyTorch, so readers see exactly what `torch.save(layer.state_dict(), f)`
writes for float32 tensors.

Values: entry `i` (row-major) of the tensor named N is `(i + offset[N]) * 0.25`, which the
Rust test recomputes. Run from this directory: `python3 make_pytorch_fixture.py`.
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


FloatStorage.__module__ = "torch"
torch.FloatStorage = FloatStorage
torch._utils = torch_utils
sys.modules["torch"] = torch
sys.modules["torch._utils"] = torch_utils


class Storage:
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class Tensor:
    def __init__(self, storage, shape):
        self.storage, self.shape = storage, shape

    def __reduce_ex__(self, protocol):
        stride, step = [], 1
        for dim in reversed(self.shape):
            stride.insert(0, step)
            step *= dim
        args = (self.storage, 0, tuple(self.shape), tuple(stride), False, collections.OrderedDict())
        return (_rebuild_tensor_v2, args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", FloatStorage, obj.key, "cpu", obj.numel)
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

state = collections.OrderedDict()
buffers = {}
for index, (name, shape) in enumerate(SHAPES.items()):
    numel = 1
    for dim in shape:
        numel *= dim
    key = str(index)
    state[name] = Tensor(Storage(key, numel), shape)
    values = [(i + OFFSETS[name]) * 0.25 for i in range(numel)]
    buffers[key] = struct.pack("<%df" % numel, *values)

pkl = io.BytesIO()
Pickler(pkl, protocol=2).dump(state)

with zipfile.ZipFile("sklinear.pt", "w", zipfile.ZIP_STORED) as archive:
    archive.writestr("archive/data.pkl", pkl.getvalue())
    archive.writestr("archive/byteorder", "little")
    for key, data in buffers.items():
        archive.writestr("archive/data/" + key, data)
    archive.writestr("archive/version", "3\n")
