"""The trainer's side: hand one rank's shard of each version to a publisher.

A publisher started with `tessera publish --trainer MODEL.json --control
PATH` gives each trainer rank a shared buffer (a memfd, passed over the
control socket) laid out as that rank's block of the trainer layout. The
trainer writes its shard into it, without any file, and calls export(step):

    import tessera
    with tessera.Trainer("/run/tessera/publish.sock", rank=0) as tr:
        for step in range(steps):
            optimizer.step()
            for name, param in model.named_parameters():
                tr.fill(name, param)   # a torch tensor (CPU or CUDA) or numpy array
            v = tr.export(step)     # every rank exports the same step

export(step) returns once every rank exported the step and the publisher
published it: the version number (an int) that also says what was sent
(Published: kind, wire_bytes, anchor_bytes, encode_us, created_ms); with
wait="snapshot" it returns as soon as the publisher has copied the buffer
(the trainer may write it again) and published() later gives that record.
A process holding several ranks (one Trainer, one connection each) exports
them all from one thread with Trainer.export_all(trainers, step). A wait
that times out raises ExportTimeout (a TimeoutError) saying what the
publisher waits for. Pure Python (the standard library); numpy is optional
(tensor() then hands out a writable memoryview).
"""

import errno
import mmap
import os
import socket
import sys
import time

# __init__ defines TesseraError before it imports this module.
from tessera import TesseraError

try:
    import numpy as _np
except ImportError:  # numpy is optional
    _np = None

__all__ = ["Trainer", "TrainerTensor", "Published", "ExportTimeout"]

_LINE_MAX = 4096
# How long a wait that timed out gives the publisher to say why ("status").
_STATUS_WAIT_S = 5.0


def _error(reason):
    return TesseraError(errno.EINVAL, reason)


def _with_path(e, path):
    """The OSError e again, naming path: "[Errno 2] No such file or
    directory: '/run/tessera/publish.sock'"."""
    return type(e)(e.errno, e.strerror or str(e), path)


def _dims(s):
    return () if s == "-" else tuple(int(d) for d in s.split("x"))


def _num(s):
    """A decimal field of a line, or None for "-"; ValueError else."""
    if s == "-":
        return None
    if not (s.isascii() and s.isdigit()):
        raise ValueError(s)
    return int(s)


def _parse_status(line):
    """The publisher's answer to "status": None for "status idle", else
    (step, version, cause, why), step and version None where it says "-".
    TesseraError for anything else."""
    f = line.split(" ", 4)
    if f == ["status", "idle"]:
        return None
    try:
        if len(f) != 5 or f[0] != "status" or not (f[3].isascii() and f[3].isalpha() and
                                                   f[3].islower()) or not f[4].strip():
            raise ValueError(line)
        return _num(f[1]), _num(f[2]), f[3], f[4]
    except ValueError:
        raise _error("publisher said %r, want 'status STEP VERSION CAUSE WHY' or "
                     "'status idle'" % line) from None


class ExportTimeout(TesseraError, TimeoutError):
    """An export's answer did not come in time. The message names what the
    publisher waits for; step, version (None before the snapshot), cause
    (the publisher's word: ranks, busy, layouts, tracker, working; None when
    it could not say), reason and timeout (seconds) give it in parts. The
    export stays asked: published() waits on for its answer."""

    def __init__(self, step, version, cause, reason, timeout):
        what = "export of step %d" % step
        if version is not None:
            what += " (version %d)" % version
        super().__init__(errno.ETIMEDOUT, "%s timed out after %g s: %s" % (what, timeout, reason))
        self.step, self.version, self.cause = step, version, cause
        self.reason, self.timeout = reason, timeout


class Published(int):
    """A published version: the version number (it is that int), with what
    the publisher said of it: kind ("anchor" or "delta"), wire_bytes (all
    parcels of all layouts), anchor_bytes (what it costs as an anchor),
    encode_us (a delta's encode) and created_ms (when the export was
    asked, wall clock)."""

    def __new__(cls, version, created_ms, kind, wire_bytes, anchor_bytes, encode_us):
        v = super().__new__(cls, version)
        v.version, v.created_ms, v.kind = int(version), created_ms, kind
        v.wire_bytes, v.anchor_bytes, v.encode_us = wire_bytes, anchor_bytes, encode_us
        return v

    def __repr__(self):
        return ("Published(version=%d, kind=%r, wire_bytes=%d, anchor_bytes=%d, encode_us=%d)" %
                (self.version, self.kind, self.wire_bytes, self.anchor_bytes, self.encode_us))


class TrainerTensor:
    """One local tensor of the trainer rank's block: its place and, when it
    is one box of the logical tensor `name`, where that box starts."""

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes", "start")

    def __init__(self, name, dtype, shape, offset, nbytes, start):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.offset, self.nbytes, self.start = offset, nbytes, start

    def __repr__(self):
        return "TrainerTensor(%r, %s, %r, start=%r)" % (self.name, self.dtype, self.shape, self.start)


class Trainer:
    """One trainer rank's connection to its publisher's control socket.

    nbytes and dtype, when given, are what this rank holds; the publisher
    refuses a size other than its shard of the trainer layout and a dtype
    other than its tensors' (TesseraError with the reason). timeout
    (seconds) bounds every wait for the publisher; export() and
    published() take their own.
    """

    def __init__(self, path, rank, nbytes=None, dtype=None, timeout=60.0):
        self.rank, self.path = rank, path
        self._timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buf = b""
        self._early = []   # answers read while asking "status", not yet taken
        self._owed = []    # the answers the last export still owes, in order
        self._step = self._version = None
        self._mm = None
        try:
            try:
                self._sock.connect(path)
            except OSError as e:
                raise _with_path(e, path) from None
            cmd = "trainer %d" % rank
            if nbytes is not None:
                cmd += " bytes %d" % nbytes
            if dtype is not None:
                cmd += " dtype %s" % dtype
            self._send(cmd)
            try:
                fd, line = self._line_with_fd()
            except socket.timeout:
                raise TimeoutError(errno.ETIMEDOUT, "the publisher did not answer '%s' within %g s"
                                   % (cmd, timeout), path) from None
            try:
                if line.startswith("error "):
                    raise _error(line[6:])
                f = line.split()
                if len(f) != 4 or f[0] != "buffer" or int(f[1]) != rank or fd is None:
                    raise _error("publisher said %r, want 'buffer %d ...' with a memfd" % (line, rank))
                self.size, n = int(f[2]), int(f[3])
                self._map(fd)
            finally:
                if fd is not None:
                    os.close(fd)
            self.tensors = []
            for _ in range(n):
                f = self._line().split(" ", 6)
                if len(f) != 7 or f[0] != "tensor":
                    raise _error("publisher sent a bad tensor line %r" % " ".join(f))
                off, nb = int(f[2]), int(f[3])
                if off + nb > self.size:
                    raise _error("tensor %s lies outside the buffer" % f[6])
                self.tensors.append(TrainerTensor(f[6], f[1], _dims(f[4]), off, nb,
                                                  None if f[5] == "-" else _dims(f[5])))
        except BaseException:
            self.close()
            raise
        self._by_name = {t.name: t for t in self.tensors}

    def _map(self, fd):
        """Maps the rank's buffer, the memfd fd; errors name it."""
        try:
            name = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            name = "memfd"
        where = "%s (trainer rank %d's buffer from %s)" % (name, self.rank, self.path)
        try:
            if os.fstat(fd).st_size != self.size:
                raise _error("%s is not %d bytes" % (where, self.size))
            if self.size > 0:
                self._mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
        except TesseraError:
            raise
        except OSError as e:
            raise _with_path(e, where) from None

    # ---- the line protocol ----

    def _send(self, line):
        try:
            self._sock.sendall(line.encode() + b"\n")
        except OSError as e:
            raise _with_path(e, self.path) from None

    def _line_with_fd(self, deadline=None):
        """The next line and the fd that rode on it (None if none).
        socket.timeout once deadline (time.monotonic(); None: the
        Trainer's timeout from now) passed."""
        fd = None
        if deadline is None:
            deadline = time.monotonic() + self._timeout
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                self._sock.settimeout(left)
                try:
                    data, fds, _flags, _addr = socket.recv_fds(self._sock, _LINE_MAX, 4)
                except socket.timeout:
                    raise
                except OSError as e:
                    raise _with_path(e, self.path) from None
                for extra in fds:
                    if fd is None:
                        fd = extra
                    else:
                        os.close(extra)
                if not data:
                    raise _error("the publisher closed the control socket %s" % self.path)
                self._buf += data
                if len(self._buf) > _LINE_MAX and b"\n" not in self._buf:
                    raise _error("the publisher sent an overlong line on %s" % self.path)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        line, self._buf = self._buf.split(b"\n", 1)
        return fd, line.decode(errors="replace")

    def _line(self, deadline=None, early=True):
        """The next line (an fd on it is closed); with early, one read
        meanwhile and put back first."""
        if early and self._early:
            return self._early.pop(0)
        fd, line = self._line_with_fd(deadline)
        if fd is not None:
            os.close(fd)
        return line

    # ---- the buffer ----

    def tensor(self, name, as_numpy=None):
        """The local tensor as a writable numpy array over the shared buffer
        (a memoryview without numpy or with as_numpy=False): no copy."""
        from tessera import numpy_dtype
        t = self._by_name.get(name)
        if t is None:
            raise KeyError("no tensor %r on trainer rank %d" % (name, self.rank))
        mv = memoryview(self._mm)[t.offset:t.offset + t.nbytes] if self._mm else memoryview(bytearray())
        use_np = _np is not None if as_numpy is None else as_numpy
        if not use_np:
            return mv
        return _np.frombuffer(mv, dtype=numpy_dtype(t.dtype)).reshape(t.shape)

    def fill(self, name, data):
        """Copies data (a numpy array of the tensor's shape and dtype, a torch
        tensor, CPU or CUDA, of its shape and torch dtype, or bytes of its
        size) into the tensor's place in the buffer."""
        torch = sys.modules.get("torch")  # data can be a torch tensor only once torch is loaded
        if torch is not None and isinstance(data, torch.Tensor):
            from tessera.torch import fill
            return fill(self, name, data)
        from tessera import numpy_dtype
        t = self._by_name.get(name)
        if t is None:
            raise KeyError("no tensor %r on trainer rank %d" % (name, self.rank))
        if _np is not None and isinstance(data, _np.ndarray):
            want = _np.dtype(numpy_dtype(t.dtype))
            if data.dtype != want:
                raise _error("tensor %s is %s (numpy %s), not %s" % (name, t.dtype, want, data.dtype))
            if tuple(data.shape) != t.shape:
                raise _error("tensor %s has shape %r on rank %d, not %r" %
                             (name, t.shape, self.rank, tuple(data.shape)))
            data = _np.ascontiguousarray(data).tobytes()
        data = memoryview(data).cast("B")
        if len(data) != t.nbytes:
            raise _error("tensor %s holds %d bytes on rank %d, not %d" %
                         (name, t.nbytes, self.rank, len(data)))
        self._mm[t.offset:t.offset + t.nbytes] = data

    def buffer(self):
        """The whole block as a writable memoryview."""
        return memoryview(self._mm) if self._mm else memoryview(bytearray())

    # ---- exporting ----

    def export(self, step, wait="published", timeout=None):
        """Says the buffer holds this rank's shard of training step `step`.
        wait="published" (default): returns the version once it is published;
        wait="snapshot": returns once the publisher copied the buffer (it may
        be written again), and published() gives the version later. The
        publisher answers once every rank exported the step: a process that
        holds several ranks calls export_all. Past timeout seconds (default:
        the Trainer's), ExportTimeout says what the publisher waits for."""
        return Trainer.export_all([self], step, wait, timeout)

    @staticmethod
    def export_all(trainers, step, wait="published", timeout=None):
        """export(step) of every Trainer in trainers (ranks of one publisher,
        each its own connection), from one thread: the step is said on each,
        then their answers are read. Returns what export returns (the same
        version for every rank); timeout (default: the smallest of theirs)
        bounds the whole call."""
        trainers = list(trainers)
        if wait not in ("published", "snapshot"):
            raise ValueError("wait is 'published' or 'snapshot'")
        if not trainers:
            raise ValueError("export_all wants at least one Trainer")
        if len({tr.rank for tr in trainers}) != len(trainers):
            raise ValueError("export_all got a trainer rank twice")
        for tr in trainers:
            if tr._owed:
                raise _error("trainer rank %d: step %d's export is still unanswered (call "
                             "published() first)" % (tr.rank, tr._step))
        if timeout is None:
            timeout = min(tr._timeout for tr in trainers)
        deadline = time.monotonic() + timeout
        for tr in trainers:
            tr._send("export %d" % step)
            tr._owed, tr._step, tr._version = ["snapshot", "published"], step, None
        got = [tr._answer(deadline, timeout) for tr in trainers]
        if wait == "published":
            got = [tr._answer(deadline, timeout) for tr in trainers]
        if len(set(got)) != 1:
            raise _error("the ranks of step %d were answered different versions: %s" %
                         (step, ", ".join("rank %d %d" % (tr.rank, v) for tr, v in zip(trainers, got))))
        return got[0]

    def published(self, timeout=None):
        """Waits for the publisher's answer to the last export: the version,
        as a Published (an int with what was sent). After wait="snapshot", or
        an ExportTimeout, it waits on for that export (timeout: as export's)."""
        if not self._owed:
            raise _error("trainer rank %d has no export waiting for its answer" % self.rank)
        if timeout is None:
            timeout = self._timeout
        deadline = time.monotonic() + timeout
        while self._owed[0] != "published":
            self._answer(deadline, timeout)
        return self._answer(deadline, timeout)

    def _answer(self, deadline, timeout):
        """Reads the next answer the export owes (self._owed[0]): the
        version after "snapshot", the Published after "published"."""
        try:
            line = self._line(deadline)
        except socket.timeout:
            line = None  # asked outside the handler: the timeout is no cause of what follows
        if line is None:
            line = self._late(timeout)
        kind = self._owed.pop(0)
        if line.startswith("error "):
            self._owed = []
            raise _error(line[6:])
        f = line.split()
        if kind == "snapshot":
            if len(f) != 3 or f[0] != "snapshot" or f[1] != str(self._step) or not f[2].isdigit():
                self._owed = []
                raise _error("publisher said %r, want 'snapshot %d V'" % (line, self._step))
            self._version = int(f[2])
            return self._version
        # published V CREATED_MS KIND WIRE_BYTES ANCHOR_BYTES ENCODE_US
        if (len(f) != 7 or f[0] != "published" or f[3] not in ("anchor", "delta") or
                not all(x.isdigit() for x in f[1:3] + f[4:7])):
            raise _error("publisher said %r, want 'published V CREATED_MS KIND WIRE "
                         "ANCHOR ENCODE_US'" % line)
        return Published(int(f[1]), int(f[2]), f[3], int(f[4]), int(f[5]), int(f[6]))

    def _late(self, timeout):
        """The export's answer did not come in time: asks the publisher why.
        Returns the answer when it came meanwhile; else raises ExportTimeout
        naming what the publisher waits for."""
        cause, version = None, self._version
        self._send("status")
        try:
            while True:
                line = self._line(time.monotonic() + _STATUS_WAIT_S, early=False)
                if line.startswith("status "):
                    st = _parse_status(line)
                    if st is None:
                        reason = "the publisher says it owes this connection no answer"
                    else:
                        cause, reason = st[2], st[3]
                        version = version if st[1] is None else st[1]
                    break
                if line.startswith("error unknown command 'status'"):
                    reason = ("the publisher cannot say why (it predates the control "
                              "socket's status command)")
                    break
                self._early.append(line)  # an answer that came meanwhile
        except socket.timeout:
            reason = "the publisher did not say why within %g s" % _STATUS_WAIT_S
        if self._early:
            return self._early.pop(0)
        raise ExportTimeout(self._step, version, cause, reason, timeout)

    def close(self):
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # views still alive keep the mapping
            self._mm = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
