"""An FP8 replica's rank, read through the attach API, holds the numpy
reference quantizer's output of the version's BF16; driven by
tests/test_fp8_net.c.

argv: socket replica rank version checkpoint.safetensors

Attaches, pins the version, and for every local tensor compares each
piece's bytes with the checkpoint's tensor, quantized by tests/py/fp8_ref.py
where the tensor is FP8 (its scales for a "_scale_inv" piece), as it is
otherwise. Checks the description too: an FP8 tensor names its scales, its
numpy view is uint8, the scales' float32. Prints "ok <tensors> <bytes>".
"""
import json
import os
import struct
import sys

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_ref  # noqa: E402
import tessera  # noqa: E402


def checkpoint(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "BF16", t
        a, b = t["data_offsets"]
        out[name] = numpy.frombuffer(data[a:b], dtype="<u2").reshape(t["shape"])
    return out


def main():
    sock, replica, rank, version, ckpt = sys.argv[1:6]
    rank, version = int(rank), int(version)
    raw = checkpoint(ckpt)
    quant = {}

    def quantized(name):
        if name not in quant:
            x = (raw[name].astype(numpy.uint32) << 16).view(numpy.float32)
            quant[name] = fp8_ref.quantize(x)
        return quant[name]

    c = tessera.Client(sock, replica, rank, timeout_ms=30000)
    c.wait_version(version, 30000)
    pin = c.acquire()
    assert pin.version == version, pin.version
    checked = nbytes = nfp8 = 0
    for t in c.tensors:
        view = pin.tensor(t.name)
        if t.dtype == "fp8_e4m3":
            nfp8 += 1
            assert t.scale == t.name + "_scale_inv", (t.name, t.scale)
            assert view.dtype == numpy.uint8, view.dtype
            s = c.tensor(t.scale)
            assert s.dtype == "fp32" and pin.tensor(t.scale).dtype == numpy.float32
            assert s.shape == tuple(-(-d // 128) for d in t.shape), (s.shape, t.shape)
        else:
            assert t.scale is None, t.name
        scales = t.name.endswith("_scale_inv") and t.dtype == "fp32" and \
            all(p.name.endswith("_scale_inv") and p.name not in raw for p in t.pieces)
        for p in t.pieces:
            if scales:
                ref = quantized(p.name[: -len("_scale_inv")])[1]
            elif t.dtype == "fp8_e4m3":
                ref = quantized(p.name)[0]
            else:
                ref = raw[p.name]
            want = ref[tuple(slice(lo, hi) for lo, hi in zip(p.lo, p.hi))]
            v = view.reshape(t.shape)
            if t.concat_dim == 0:
                r0 = p.base // (t.shape[1] if len(t.shape) > 1 else 1)
                got = v[r0:r0 + want.shape[0]]
            else:
                got = v[:, p.base:p.base + want.shape[1]]
            if got.tobytes() != numpy.ascontiguousarray(want).tobytes():
                print("mismatch in %s piece %s" % (t.name, p), flush=True)
                return 1
            checked += 1
            nbytes += want.nbytes
    assert nfp8 > 0
    pin.release()
    print("ok %d %d" % (checked, nbytes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
