"""A Python trainer exports versions that a Python serving client reads back,
driven by tests/test_trainer.c.

argv: control-socket node-socket replica ntrainer-ranks. The publisher runs
with --trainer over a model of BF16 tensors; the node serves the replica as
one TP1 rank (whole tensors). Every logical element of tensor `name` at
step s is the 16-bit value expected(name, s)[index]. Each trainer rank fills
its shard (the boxes the publisher's table names), exports; the serving
client must then read exactly those values through numpy views. Refusals
(wrong rank, size, dtype, a held rank, mismatched steps, a wrong fill) are
checked on the way. Prints "ok" at the end.
"""
import os
import sys
import threading
import time
import zlib

import numpy

import tessera


def expected(name, shape, step):
    n = 1
    for d in shape:
        n *= d
    base = (zlib.crc32(name.encode()) + step * 40503) & 0xFFFF
    idx = numpy.arange(n, dtype=numpy.uint64)
    return ((idx * 7 + base) & 0xFFFF).astype(numpy.uint16).reshape(shape)


def refused(fn, reason):
    try:
        fn()
    except tessera.TesseraError as e:
        if reason not in str(e):
            raise AssertionError("refused with %r, want %r" % (str(e), reason))
        return
    raise AssertionError("not refused (want %r)" % reason)


def fill(tr, shapes, step):
    for t in tr.tensors:
        assert t.start is not None, "%s is not one box of its tensor" % t.name
        full = expected(t.name, shapes[t.name], step)
        box = full[tuple(slice(a, a + n) for a, n in zip(t.start, t.shape))]
        tr.fill(t.name, box)


def export_all(trainers, step):
    out, errs = {}, []

    def run(tr):
        try:
            out[tr.rank] = tr.export(step)
        except Exception as e:  # reported below
            errs.append(e)

    threads = [threading.Thread(target=run, args=(tr,)) for tr in trainers]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    if errs:
        raise errs[0]
    versions = set(out.values())
    assert len(out) == len(trainers) and len(versions) == 1, out
    # Every rank's answer is the version (an int) with what was sent.
    for p in out.values():
        assert isinstance(p, tessera.Published) and p.version == int(p), repr(p)
        assert p.kind in ("anchor", "delta") and 0 < p.wire_bytes <= p.anchor_bytes, repr(p)
        assert p.created_ms > 0 and p.encode_us >= 0, repr(p)
    return versions.pop()


def check_served(client, shapes, step, version):
    client.wait_version(version, timeout_ms=120000)
    with client.acquire() as pin:
        assert pin.version == version, (pin.version, version)
        for t in client.tensors:
            got = pin.tensor(t.name)
            want = expected(t.name, shapes[t.name], step)
            assert got.dtype == numpy.uint16 and got.shape == want.shape, (t.name, got.dtype, got.shape)
            if not numpy.array_equal(got, want):
                raise AssertionError("tensor %s of version %d differs from step %d" % (t.name, version, step))


def main():
    ctl, node_sock, replica, nranks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    # The programs start in the background: wait (bounded) for their sockets.
    deadline = time.monotonic() + 120
    while not (os.path.exists(ctl) and os.path.exists(node_sock)):
        if time.monotonic() > deadline:
            raise AssertionError("no sockets at %s and %s after 120 s" % (ctl, node_sock))
        time.sleep(0.05)

    # Refusals, each with its reason.
    # A socket that is not there: the error names it.
    missing = ctl + ".missing"
    try:
        tessera.Trainer(missing, 0)
        raise AssertionError("connected to %s" % missing)
    except FileNotFoundError as e:
        assert missing in str(e), str(e)
    refused(lambda: tessera.Trainer(ctl, nranks), "is not a rank of the trainer layout")
    t0 = tessera.Trainer(ctl, 0)
    refused(lambda: tessera.Trainer(ctl, 0), "is held by another trainer connection")
    size0 = t0.size
    t0.close()
    refused(lambda: tessera.Trainer(ctl, 0, nbytes=size0 + 2), "holds %d bytes" % size0)
    refused(lambda: tessera.Trainer(ctl, 0, dtype="fp32"), "is bf16, not fp32")

    # What a rank declares, when right, is taken.
    trainers = [tessera.Trainer(ctl, 0, nbytes=size0, dtype="bf16")]
    trainers += [tessera.Trainer(ctl, r) for r in range(1, nranks)]
    t = trainers[0].tensors[0]
    refused(lambda: trainers[0].fill(t.name, numpy.zeros(t.shape, dtype=numpy.float32)), "is bf16")
    refused(lambda: trainers[0].fill(t.name, numpy.zeros((1,) + t.shape, dtype=numpy.uint16)),
            "has shape")

    # Steps must agree across ranks. Rank 0's command is known to be taken
    # once the publisher answered the one after it.
    if nranks > 1:
        trainers[0]._send("export 5")
        trainers[0]._send("trainer 0")
        assert trainers[0]._line().startswith("error this connection is trainer rank 0")
        refused(lambda: trainers[1].export(6), "exports step 6 while other ranks export step 5")
        # Rank 0 leaves while waiting: its export is withdrawn, its rank free.
        trainers[0].close()
        trainers[0] = tessera.Trainer(ctl, 0)

    client = tessera.Client(node_sock, replica, 0)
    shapes = {c.name: c.shape for c in client.tensors}
    for step in (100, 200):
        for tr in trainers:
            fill(tr, shapes, step)
        v = export_all(trainers, step)
        check_served(client, shapes, step, v)
        print("served step %d as version %d" % (step, v), file=sys.stderr)
    client.close()
    for tr in trainers:
        tr.close()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
