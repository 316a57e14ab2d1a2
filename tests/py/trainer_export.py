"""A Python trainer exports versions that a Python serving client reads back,
driven by tests/test_trainer.c.

argv: control-socket node-socket replica ntrainer-ranks. The publisher runs
with --trainer over a model of BF16 tensors; the node serves the replica as
one TP1 rank (whole tensors). Every logical element of tensor `name` at
step s is the 16-bit value expected(name, s)[index]. Each trainer rank fills
its shard (the boxes the publisher's table names), exports; the serving
client must then read exactly those values through numpy views. Refusals
(wrong rank, size, dtype, a held rank, mismatched steps, a wrong fill) and a
timeout naming the rank that has not exported are checked on the way; the
ranks export from one thread (Trainer.export_all) and from one thread each.

With node-socket "-" no node runs: the timeouts must name the missing rank,
the serving layout no node registered and the busy publisher; and a fake
publisher checks the client's side of "status" (bad answers, an old
publisher, one that says nothing, an answer that comes meanwhile). Every
state a timeout is asked in cannot end by itself, so the short timeouts
cannot be lucky or unlucky. Prints "ok" at the end.
"""
import errno
import os
import socket
import sys
import tempfile
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


def timed_out(fn, cause, *texts):
    """fn() must raise ExportTimeout (a TimeoutError) with that cause and
    message parts; returns it."""
    try:
        fn()
    except tessera.ExportTimeout as e:
        assert isinstance(e, TimeoutError) and isinstance(e, tessera.TesseraError), repr(e)
        if e.cause != cause or not all(t in str(e) for t in texts):
            raise AssertionError("timed out with cause %r: %s (want %r, %r)" % (e.cause, e, cause, texts))
        return e
    raise AssertionError("did not time out (want %r)" % (texts,))


def check_published(got):
    """Every rank's answer is the same version (an int) with what was sent."""
    versions = set(got)
    assert len(versions) == 1, got
    for p in got:
        assert isinstance(p, tessera.Published) and p.version == int(p), repr(p)
        assert p.kind in ("anchor", "delta") and 0 < p.wire_bytes <= p.anchor_bytes, repr(p)
        assert p.created_ms > 0 and p.encode_us >= 0, repr(p)
    return versions.pop()


def export_threads(trainers, step):
    """export(step) of each rank on a thread of its own."""
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
    assert len(out) == len(trainers), out
    return check_published(list(out.values()))


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


def not_exported(nranks, step, ranks):
    """The publisher's words for the ranks that have not exported step."""
    if len(ranks) == 1:
        return "rank %d of %d has not exported step %d" % (ranks[0], nranks, step)
    return "ranks %s of %d have not exported step %d" % (", ".join(map(str, ranks)), nranks, step)


def serve_and_export(ctl, node_sock, replica, nranks, trainers):
    """Versions that a node serves: a rank alone times out naming the
    others; after the timeout the export is still asked and completes; then
    every rank from one thread, then one thread each."""
    client = tessera.Client(node_sock, replica, 0)
    shapes = {c.name: c.shape for c in client.tensors}
    for tr in trainers:
        fill(tr, shapes, 100)
    if nranks > 1:
        e = timed_out(lambda: trainers[0].export(100, timeout=0.3), "ranks",
                      "export of step 100 timed out after 0.3 s: " +
                      not_exported(nranks, 100, list(range(1, nranks))))
        assert e.step == 100 and e.version is None and e.errno == errno.ETIMEDOUT, repr(e)
        refused(lambda: trainers[0].export(101), "step 100's export is still unanswered")
        snap = tessera.Trainer.export_all(trainers[1:], 100, wait="snapshot")
        v = check_published([tr.published() for tr in trainers])
        assert v == snap, (v, snap)
        check_served(client, shapes, 100, v)
    for step in (200, 300):
        for tr in trainers:
            fill(tr, shapes, step)
        if step == 200:  # every rank from this one thread
            v = check_published([tessera.Trainer.export_all(trainers, step)])
        else:
            v = export_threads(trainers, step)
        check_served(client, shapes, step, v)
        print("served step %d as version %d" % (step, v), file=sys.stderr)
    client.close()


def no_node(ctl, nranks):
    """Without a node, each wait names what it waits for: a rank no one
    holds, the serving layout no node registered, the busy publisher."""
    assert nranks == 2, nranks
    t0 = tessera.Trainer(ctl, 0)
    timed_out(lambda: t0.export(1, timeout=0.3), "ranks",
              "export of step 1 timed out after 0.3 s: rank 1 of 2 has not exported step 1 "
              "(no trainer connection holds rank 1)")
    t1 = tessera.Trainer(ctl, 1)
    v = t1.export(1, wait="snapshot", timeout=120)  # the snapshot needs no node
    layouts = ("export of step 1 (version %d) timed out after 0.3 s: no node has registered a "
               "serving layout yet" % v)
    # Until the tracker first answers that no layout is registered, the
    # publisher says it asks the tracker (bounded: the wait cannot end).
    deadline = time.monotonic() + 120
    while True:
        try:
            t0.published(timeout=0.3)
            raise AssertionError("version %d published without a node" % v)
        except tessera.ExportTimeout as e:
            if e.cause == "layouts":
                assert layouts in str(e) and e.version == v, str(e)
                break
            assert e.cause == "tracker" and time.monotonic() < deadline, str(e)
    timed_out(lambda: t1.published(timeout=0.3), "layouts", layouts)
    # New connections for the ranks: step 2 queues behind version v. Rank 1
    # exports once rank 0's export is known to be in (its timeout said so):
    # the publisher reads the two connections in no set order.
    t0.close()
    t1.close()
    t0, t1 = tessera.Trainer(ctl, 0), tessera.Trainer(ctl, 1)
    timed_out(lambda: t0.export(2, timeout=0.3), "ranks", not_exported(2, 2, [1]))
    busy = ("the publisher is busy exporting version %d: no node has registered a serving "
            "layout yet" % v)
    e = timed_out(lambda: t1.export(2, timeout=0.3), "busy",
                  "export of step 2 timed out after 0.3 s: " + busy)
    assert e.step == 2 and e.version is None, repr(e)
    timed_out(lambda: t0.published(timeout=0.3), "busy", busy)
    t0.close()
    t1.close()


def status_parser():
    """Bad answers to "status" are refused; good ones parse."""
    parse = tessera.trainer._parse_status
    assert parse("status idle") is None
    assert parse("status 7 - ranks rank 1 of 2 has not exported step 7") == \
        (7, None, "ranks", "rank 1 of 2 has not exported step 7")
    assert parse("status - 3 working taking a snapshot") == (None, 3, "working", "taking a snapshot")
    for bad in ["", "status", "status idle now", "status 7", "status 7 - ranks", "status 7 - ranks  ",
                "status x - ranks why", "status 7 x ranks why", "status -1 - ranks why",
                "status 7 -3 ranks why", "status 7 - RANKS why", "status 7 - ra1nks why",
                "status 7 - r\u00e4nks why", "status \u0667 - ranks why", "status 7 - - why",
                "state 7 - ranks why", "status 7 - ranks\twhy"]:
        refused(lambda: parse(bad), "want 'status STEP VERSION CAUSE WHY' or 'status idle'")


class FakePublisher:
    """A control socket that hands 'trainer 0' a 4096-byte buffer, never
    answers an export, and answers each 'status' with the next of answers
    (None: nothing); with none left it closes the connection."""

    def __init__(self, path, answers):
        self.path, self.answers = path, list(answers)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.srv.accept()
        with conn, conn.makefile("rb") as f:
            for raw in f:
                line = raw.decode().strip()
                if line.startswith("trainer "):
                    fd = os.memfd_create("fake-trainer-rank0")
                    os.ftruncate(fd, 4096)
                    socket.send_fds(conn, [b"buffer 0 4096 0\n"], [fd])
                    os.close(fd)
                elif line == "status" and not self.answers:
                    return
                elif line == "status":
                    a = self.answers.pop(0)
                    if a is not None:
                        conn.sendall(a.encode())

    def close(self):
        self.thread.join(10)
        self.srv.close()


def client_side_of_status(tmp):
    """What the client does with what it hears after a timeout: an answer
    that came meanwhile is taken; an old publisher, a bad answer, none at
    all and a closed socket each raise, naming the cause or the path."""
    path = os.path.join(tmp, "fake.sock")
    fake = FakePublisher(path, [
        "snapshot 5 9\nstatus 5 - working taking a snapshot\n",
        "error unknown command 'status' (want export, trainer or quit)\n",
        "status 5 9 Bad cause\n",
        None,
    ])
    saved, tessera.trainer._STATUS_WAIT_S = tessera.trainer._STATUS_WAIT_S, 0.3
    try:
        tr = tessera.Trainer(path, 0)
        # The snapshot came while asking: taken; then the old publisher cannot say why.
        e = timed_out(lambda: tr.export(5, timeout=0.3), None,
                      "export of step 5 (version 9) timed out after 0.3 s: the publisher cannot "
                      "say why (it predates the control socket's status command)")
        assert e.version == 9, repr(e)
        refused(lambda: tr.published(timeout=0.3), "publisher said 'status 5 9 Bad cause'")
        timed_out(lambda: tr.published(timeout=0.3), None,
                  "timed out after 0.3 s: the publisher did not say why within 0.3 s")
        refused(lambda: tr.published(timeout=0.3), "the publisher closed the control socket " + path)
        tr.close()
    finally:
        tessera.trainer._STATUS_WAIT_S = saved
        fake.close()
    # Not a socket: the OS error names the path.
    plain = os.path.join(tmp, "plain")
    open(plain, "w").close()
    try:
        tessera.Trainer(plain, 0)
        raise AssertionError("connected to %s" % plain)
    except OSError as e:
        assert e.filename == plain and plain in str(e), str(e)


def main():
    ctl, node_sock, replica, nranks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sockets = [ctl] if node_sock == "-" else [ctl, node_sock]

    # The programs start in the background: wait (bounded) for their sockets.
    deadline = time.monotonic() + 120
    while not all(os.path.exists(p) for p in sockets):
        if time.monotonic() > deadline:
            raise AssertionError("no sockets at %s after 120 s" % " and ".join(sockets))
        time.sleep(0.05)

    if node_sock == "-":
        status_parser()
        with tempfile.TemporaryDirectory() as tmp:
            client_side_of_status(tmp)
        no_node(ctl, nranks)
        print("ok", flush=True)
        return

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

    serve_and_export(ctl, node_sock, replica, nranks, trainers)
    for tr in trainers:
        tr.close()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
