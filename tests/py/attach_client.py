"""Serving-side check of the tessera Python package, driven by tests/test_attach.c.

argv: socket replica rank table-json. Attaches, checks the tensor table and
that every tensor's bytes are version 1's, pins v1 and says "pinned 1"; on
"go" (the node has switched to v2) checks the pinned views still read v1,
acquires v2 and checks it, releases, and says "ok numpy" or "ok memoryview".
TESSERA_NO_NUMPY=1 hides numpy to test the memoryview path.
"""
import json
import os
import sys

if os.environ.get("TESSERA_NO_NUMPY"):
    sys.modules["numpy"] = None  # import numpy now raises ImportError

import tessera  # noqa: E402

try:
    import numpy
except ImportError:
    numpy = None


def pattern(v, i):
    return (i * 31 + v * 101 + (i >> 8)) & 0xFF


def check(client, pin, v):
    assert pin.version == v, (pin.version, v)
    for t in client.tensors:
        view = pin.tensor(t.name)
        if numpy is not None:
            assert isinstance(view, numpy.ndarray)
            assert view.shape == t.shape, (view.shape, t.shape)
            assert view.dtype == numpy.dtype(tessera.numpy_dtype(t.dtype))
            assert not view.flags.owndata and not view.flags.writeable  # a view, no copy
            raw = view.tobytes()
        else:
            assert isinstance(view, memoryview) and view.readonly
            raw = bytes(view)
        want = bytes(pattern(v, t.offset + i) for i in range(t.nbytes))
        if raw != want:
            raise AssertionError("tensor %s differs from v%d" % (t.name, v))


def main():
    sock, replica, rank, table = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    try:
        tessera.Client(sock, "not-" + replica, rank)
        raise AssertionError("a foreign replica was accepted")
    except tessera.TesseraError as e:
        assert "serves replica %s rank %d" % (replica, rank) in str(e), str(e)

    with tessera.Client(sock, replica, rank, timeout_ms=30000) as c:
        got = [[t.name, t.dtype, list(t.shape), t.offset] for t in c.tensors]
        assert got == table, (got, table)
        assert c.wait_version(1, 30000) == 1
        assert c.store == "host"
        assert c.version_info(1)["cuda_device"] == -1
        old = c.acquire()
        check(c, old, 1)
        print("pinned 1", flush=True)
        assert sys.stdin.readline().strip() == "go"
        seen = []
        c.on_version(lambda new, prev: seen.append((new, prev)))
        while c.active < 2:
            c.poll(1000)
        assert seen == [(2, 1)], seen
        check(c, old, 1)  # the pinned request still reads its version
        with c.acquire() as new:
            check(c, new, 2)
            check(c, old, 1)
            # Each request can say which version it ran on, and when.
            rec_old, rec_new = old.record(), new.record()
            assert rec_old["version"] == 1 and rec_new["version"] == 2, (rec_old, rec_new)
            assert rec_new["replica"] == replica and rec_new["rank"] == rank, rec_new
            assert rec_new["manifest_digest"] == c.version_info(2)["digest"], rec_new
            assert 0 < rec_old["acquired_ms"] <= rec_new["acquired_ms"], (rec_old, rec_new)
        old.release()
    print("ok " + ("numpy" if numpy is not None else "memoryview"), flush=True)


if __name__ == "__main__":
    main()
