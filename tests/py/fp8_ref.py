"""The tests' reference quantizer for fp8_e4m3_block128, written apart from
tessera's C (proto/fp8.c) and sharing none of its code or method.

Usage: fp8_ref.py ROWS COLS IN.bf16 OUT.fp8 OUT.scale

IN holds ROWS x COLS little-endian BF16 values, row-major. OUT.fp8 gets the
float8_e4m3fn bytes, OUT.scale the FP32 scale_inv tensor, ceil(ROWS/128) x
ceil(COLS/128), row-major. Rule (the issue's): per 128 x 128 block, scale =
amax / 448 in FP32 (1 for a block of zeros); q = x / scale in FP32, then the
nearest float8_e4m3fn value, ties to the even code, saturated to +-448.

Method: where C rounds bit fields, this enumerates every finite E4M3 value
exactly and picks the nearest one by search. Exit status 3 when the input
holds a NaN or an infinity (the exporter must refuse it).
"""
import sys

import numpy as np

BLOCK = 128


def e4m3_table():
    """Codes 0..0x7e and their exact values (non-negative, increasing)."""
    codes = np.arange(0x7F, dtype=np.int64)
    exp = codes >> 3
    man = codes & 7
    vals = np.where(exp == 0, man * 2.0 ** -9, (8 + man) * np.exp2(exp - 10.0))
    return codes, vals


CODES, VALS = e4m3_table()
assert VALS[-1] == 448.0 and np.all(np.diff(VALS) > 0)


def to_e4m3(y):
    """float32 array -> uint8 codes, nearest value, ties to even code."""
    mag = np.abs(y.astype(np.float64))
    hi = np.clip(np.searchsorted(VALS, mag, side="left"), 0, len(VALS) - 1)
    lo = np.clip(hi - 1, 0, len(VALS) - 1)
    dlo = np.abs(mag - VALS[lo])
    dhi = np.abs(VALS[hi] - mag)
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (CODES[hi] % 2 == 0))
    code = np.where(pick_hi, CODES[hi], CODES[lo])
    code = np.where(mag >= 448.0, 0x7E, code)
    sign = np.signbit(y).astype(np.int64) << 7
    return (code | sign).astype(np.uint8)


def quantize(x):
    """x: float32 (rows, cols) -> (uint8 (rows, cols), float32 scales)."""
    rows, cols = x.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    q = np.zeros((rows, cols), dtype=np.uint8)
    s = np.zeros((br, bc), dtype=np.float32)
    for i in range(br):
        for j in range(bc):
            blk = x[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = np.float32(np.max(np.abs(blk))) if blk.size else np.float32(0)
            scale = np.float32(1.0) if amax == 0 else np.float32(amax) / np.float32(448.0)
            s[i, j] = scale
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = to_e4m3(
                (blk / scale).astype(np.float32))
    return q, s


def main():
    rows, cols = int(sys.argv[1]), int(sys.argv[2])
    raw = np.fromfile(sys.argv[3], dtype="<u2")
    if raw.size != rows * cols:
        print(f"fp8_ref: {sys.argv[3]}: {raw.size} values, want {rows * cols}",
              file=sys.stderr)
        return 2
    x = (raw.astype(np.uint32) << 16).view(np.float32).reshape(rows, cols)
    if not np.all(np.isfinite(x)):
        print("fp8_ref: a NaN or an infinity in the input", file=sys.stderr)
        return 3
    with np.errstate(all="ignore"):
        q, s = quantize(x)
    q.tofile(sys.argv[4])
    s.astype("<f4").tofile(sys.argv[5])
    return 0


if __name__ == "__main__":
    sys.exit(main())
