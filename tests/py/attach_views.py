"""A view kept past its pin never reads another version; driven by tests/test_attach.c.

argv: socket mode ("rotation" or "in-place"). Pins v1, keeps a numpy view
and a memoryview of it, releases the pin (a TesseraWarning says so; the
memoryview raises; the pin hands out nothing more) and says "kept 1". On
"go" the node has written a later version into v1's memory (rotation: v3 in
v1's reused slot; in place: v2 over v1): a read through the kept numpy view
must fault (tried in a child process) instead of returning those bytes.
Then a new pin reads the new version, and the script says "ok".
"""
import os
import signal
import sys
import warnings

import numpy

import tessera


def pattern(v, n, start=0):
    i = numpy.arange(start, start + n, dtype=numpy.int64)
    return ((i * 31 + v * 101 + (i >> 8)) & 0xFF).astype(numpy.uint8)


def raw(view):
    return numpy.frombuffer(view.tobytes(), dtype=numpy.uint8)


def main():
    sock, mode = sys.argv[1], sys.argv[2]
    c = tessera.Client(sock, "A", 0, timeout_ms=30000)
    c.wait_version(1, 30000)
    # Where each tensor comes from, as the node said.
    wq = c.tensor("layers.0.wq")
    assert [(p.name, p.lo, p.hi, p.base) for p in wq.pieces] == \
        [("layers.0.q", (0, 0), (16, 48), 0), ("layers.0.k", (0, 0), (16, 48), 16 * 48)], wq.pieces
    assert c.tensor("norm").pieces[0].shape == (200, 1)

    pin = c.acquire()
    assert pin.version == 1
    embed = c.tensor("embed")
    kept = pin.tensor("embed")
    mv = pin.tensor("norm", as_numpy=False)
    copy = pin.tensor("embed", copy=True)
    assert (raw(kept) == pattern(1, embed.nbytes, embed.offset)).all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pin.release()
    assert any(issubclass(w.category, tessera.TesseraWarning) and "v1" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    try:
        mv[0]
        raise AssertionError("a kept memoryview read after release")
    except ValueError:
        pass
    try:
        pin.tensor("embed")
        raise AssertionError("a released pin handed out a view")
    except tessera.TesseraError as e:
        assert "released" in str(e), str(e)
    print("kept 1", flush=True)

    assert sys.stdin.readline().strip() == "go"
    newest = 3 if mode == "rotation" else 2
    c.wait_version(newest, 30000)
    pid = os.fork()
    if pid == 0:
        # Any byte of the kept view: it must not be readable any more.
        got = raw(kept)
        os._exit(10 + int((got == pattern(newest, embed.nbytes, embed.offset)).all()))
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGSEGV:
        what = {10: "bytes", 11: "the bytes of v%d" % newest}.get(os.WEXITSTATUS(status), "?")
        raise AssertionError("a view kept past its pin read %s (status %d)" % (what, status))
    # The copy is the caller's own: still v1.
    assert (raw(copy) == pattern(1, embed.nbytes, embed.offset)).all()
    with c.acquire() as now:
        assert now.version == newest, now.version
        assert (raw(now.tensor("embed")) == pattern(newest, embed.nbytes, embed.offset)).all()
    c.close()
    print("ok", flush=True)


main()
