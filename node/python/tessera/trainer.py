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
(the trainer may write it again) and published() later gives that record. Pure Python (the standard library);
numpy is optional (tensor() then hands out a writable memoryview).
"""

import errno
import mmap
import os
import socket
import sys

try:
    import numpy as _np
except ImportError:  # numpy is optional
    _np = None

__all__ = ["Trainer", "TrainerTensor", "Published"]

_LINE_MAX = 4096


def _error(reason):
    # Local import: __init__ imports this module.
    from tessera import TesseraError
    return TesseraError(errno.EINVAL, reason)


def _dims(s):
    return () if s == "-" else tuple(int(d) for d in s.split("x"))


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
    other than its tensors' (TesseraError with the reason).
    """

    def __init__(self, path, rank, nbytes=None, dtype=None, timeout=60.0):
        self.rank = rank
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._buf = b""
        self._mm = None
        try:
            try:
                self._sock.connect(path)
            except OSError as e:
                # The same error, naming the socket: "[Errno 2] No such file
                # or directory: '/run/tessera/publish.sock'".
                raise type(e)(e.errno, e.strerror or str(e), path) from None
            cmd = "trainer %d" % rank
            if nbytes is not None:
                cmd += " bytes %d" % nbytes
            if dtype is not None:
                cmd += " dtype %s" % dtype
            self._send(cmd)
            fd, line = self._line_with_fd()
            try:
                if line.startswith("error "):
                    raise _error(line[6:])
                f = line.split()
                if len(f) != 4 or f[0] != "buffer" or int(f[1]) != rank or fd is None:
                    raise _error("publisher said %r, want 'buffer %d ...' with a memfd" % (line, rank))
                self.size, n = int(f[2]), int(f[3])
                if os.fstat(fd).st_size != self.size:
                    raise _error("the publisher's buffer is not %d bytes" % self.size)
                if self.size > 0:
                    self._mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED,
                                         mmap.PROT_READ | mmap.PROT_WRITE)
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

    # ---- the line protocol ----

    def _send(self, line):
        self._sock.sendall(line.encode() + b"\n")

    def _line_with_fd(self):
        """The next line and the fd that rode on it (None if none)."""
        fd = None
        while b"\n" not in self._buf:
            data, fds, _flags, _addr = socket.recv_fds(self._sock, _LINE_MAX, 4)
            for extra in fds:
                if fd is None:
                    fd = extra
                else:
                    os.close(extra)
            if not data:
                if fd is not None:
                    os.close(fd)
                raise _error("the publisher closed the control socket")
            self._buf += data
            if len(self._buf) > _LINE_MAX and b"\n" not in self._buf:
                raise _error("the publisher sent an overlong line")
        line, self._buf = self._buf.split(b"\n", 1)
        return fd, line.decode(errors="replace")

    def _line(self):
        fd, line = self._line_with_fd()
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

    def export(self, step, wait="published"):
        """Says the buffer holds this rank's shard of training step `step`.
        wait="published" (default): returns the version once it is published;
        wait="snapshot": returns once the publisher copied the buffer (it may
        be written again), and published() gives the version later."""
        if wait not in ("published", "snapshot"):
            raise ValueError("wait is 'published' or 'snapshot'")
        self._send("export %d" % step)
        line = self._line()
        if line.startswith("error "):
            raise _error(line[6:])
        f = line.split()
        if len(f) != 3 or f[0] != "snapshot" or int(f[1]) != step:
            raise _error("publisher said %r, want 'snapshot %d V'" % (line, step))
        if wait == "snapshot":
            return int(f[2])
        return self.published()

    def published(self):
        """Waits for the publisher's answer to the last export: the version,
        as a Published (an int with what was sent)."""
        line = self._line()
        if line.startswith("error "):
            raise _error(line[6:])
        f = line.split()
        # published V CREATED_MS KIND WIRE_BYTES ANCHOR_BYTES ENCODE_US
        if (len(f) != 7 or f[0] != "published" or f[3] not in ("anchor", "delta") or
                not all(x.isdigit() for x in f[1:3] + f[4:7])):
            raise _error("publisher said %r, want 'published V CREATED_MS KIND WIRE "
                         "ANCHOR ENCODE_US'" % line)
        return Published(int(f[1]), int(f[2]), f[3], int(f[4]), int(f[5]), int(f[6]))

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
