"""tessera: serve the weights a tessera node holds, without copying them.

A thin ctypes layer over libtessera-client (node/client/tessera_client.h).
numpy is optional: with it a tensor is a numpy array over the node's shared
memory, without it a read-only memoryview of the same bytes. Either way
nothing is copied: the version's memfd is mapped once and every tensor is a
view into that mapping.

    import tessera
    with tessera.Client("/run/tessera/A-0.sock", "A", 0) as c:
        c.wait_version(1, timeout_ms=60000)
        with c.acquire() as pin:            # one request, one version
            wq = pin.tensor("layers.0.attn.wq")
            ...                             # pin.version is what it ran on

The library is found through TESSERA_CLIENT_LIB (a path), then the
system's library path (libtessera-client.so).
"""

import ctypes
import ctypes.util
import errno
import mmap
import os

try:
    import numpy as _np
except ImportError:  # numpy is optional
    _np = None

__all__ = ["Client", "Pin", "Tensor", "TesseraError", "Trainer", "TrainerTensor", "Published",
           "numpy_dtype"]

_DIMS_MAX = 8


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * _DIMS_MAX),
        ("offset", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
    ]


class _Version(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("digest", ctypes.c_uint8 * 32),
        ("store", ctypes.c_int),
        ("cuda_device", ctypes.c_int),
        ("cuda_ipc_handle", ctypes.c_uint8 * 64),
        ("memfd", ctypes.c_int),
        ("host", ctypes.c_void_p),
    ]


class _Pin(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("version", ctypes.c_uint64),
        ("base", ctypes.c_void_p),
        ("size", ctypes.c_uint64),
        ("acquired_ms", ctypes.c_uint64),
    ]


_lib = None


def _load(path=None):
    global _lib
    if _lib is not None and path is None:
        return _lib
    path = path or os.environ.get("TESSERA_CLIENT_LIB") or ctypes.util.find_library("tessera-client")
    if not path:
        raise OSError("libtessera-client not found: set TESSERA_CLIENT_LIB to the path of "
                      "libtessera-client.so (`make` builds it in build/lib/)")
    lib = ctypes.CDLL(path)
    P, C = ctypes.c_void_p, ctypes.c_char_p
    sigs = {
        "tessera_attach": (ctypes.c_int, [C, C, ctypes.c_uint32, ctypes.c_int,
                                          ctypes.POINTER(P), C, ctypes.c_size_t]),
        "tessera_detach": (None, [P]),
        "tessera_ntensors": (ctypes.c_size_t, [P]),
        "tessera_tensor": (ctypes.POINTER(_Tensor), [P, ctypes.c_size_t]),
        "tessera_block_size": (ctypes.c_uint64, [P]),
        "tessera_store": (ctypes.c_int, [P]),
        "tessera_active": (ctypes.c_uint64, [P]),
        "tessera_version_info": (ctypes.POINTER(_Version), [P, ctypes.c_uint64]),
        "tessera_acquire": (ctypes.c_int, [P, ctypes.POINTER(_Pin)]),
        "tessera_release": (ctypes.c_int, [P, ctypes.POINTER(_Pin)]),
        "tessera_wait_version": (ctypes.c_int, [P, ctypes.c_uint64, ctypes.c_int]),
        "tessera_poll": (ctypes.c_int, [P, ctypes.c_int]),
        "tessera_fd": (ctypes.c_int, [P]),
        "tessera_error": (ctypes.c_char_p, [P]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    if path is None or _lib is None:
        _lib = lib
    return lib


class TesseraError(OSError):
    """A call the node or the library refused; .errno and the reason."""


# numpy has no bfloat16 or fp8: those come as raw integers of their width
# (view them as torch.bfloat16 / torch.float8_* in the engine).
_NUMPY = {
    "fp64": "<f8", "fp32": "<f4", "fp16": "<f2", "bf16": "<u2",
    "fp8_e4m3": "u1", "fp8_e5m2": "u1", "bool": "?",
    "u8": "u1", "i8": "i1", "u16": "<u2", "i16": "<i2",
    "u32": "<u4", "i32": "<i4", "u64": "<u8", "i64": "<i8",
}


def numpy_dtype(name):
    """The numpy dtype string a tessera dtype is handed out as."""
    return _NUMPY[name]


class Tensor:
    """One local tensor of the rank: where it lies in a version's memory."""

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")

    def __init__(self, name, dtype, shape, offset, nbytes):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.offset, self.nbytes = offset, nbytes

    def __repr__(self):
        return "Tensor(%r, %s, %r, offset=%d)" % (self.name, self.dtype, self.shape, self.offset)


class Pin:
    """One request's hold on one version. Views stay valid (and unchanged)
    while they exist; release() lets the node free the version once no
    request pins it. Use as a context manager."""

    def __init__(self, client, raw):
        self._client, self._raw = client, raw
        self.id, self.version, self.acquired_ms = raw.id, raw.version, raw.acquired_ms
        self._mm = client._mapping(raw.version)
        self.released = False

    def record(self):
        """What to store with the request's trajectory: the version it really
        ran on, that version's signed manifest digest, the replica and rank,
        and when the node granted the pin (ms since the epoch)."""
        info = self._client.version_info(self.version)
        return {"replica": self._client.replica, "rank": self._client.rank,
                "version": self.version, "manifest_digest": info["digest"],
                "acquired_ms": self.acquired_ms}

    def buffer(self):
        """The whole version as a read-only memoryview."""
        return memoryview(self._mm) if self._mm is not None else memoryview(b"")

    def tensor(self, name, as_numpy=None):
        """The tensor as a numpy array (or a memoryview without numpy, or
        with as_numpy=False), a view of the shared memory: no copy."""
        t = self._client.tensor(name)
        use_np = _np is not None if as_numpy is None else as_numpy
        if self._mm is None:
            mv = memoryview(b"")
        else:
            mv = memoryview(self._mm)[t.offset:t.offset + t.nbytes]
        if not use_np:
            return mv
        if _np is None:
            raise TesseraError(errno.ENOSYS, "numpy is not installed")
        return _np.frombuffer(mv, dtype=numpy_dtype(t.dtype)).reshape(t.shape)

    def release(self):
        if not self.released:
            self._client._release(self)
            self.released = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Client:
    """A serving process's connection to its node (one rank of a replica)."""

    def __init__(self, path, replica, rank, timeout_ms=10000, lib=None):
        self._lib = _load(lib)
        self.replica, self.rank = replica, rank
        self._c = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = self._lib.tessera_attach(path.encode(), replica.encode(), rank, timeout_ms,
                                      ctypes.byref(self._c), err, len(err))
        if rc != 0:
            raise TesseraError(-rc, err.value.decode(errors="replace"))
        self._maps = {}  # version -> mmap, shared by the pins of that version
        self._pins = {}  # version -> pins held through this object
        self._cb = None
        self.tensors = []
        for i in range(self._lib.tessera_ntensors(self._c)):
            t = self._lib.tessera_tensor(self._c, i).contents
            self.tensors.append(Tensor(t.name.decode(), t.dtype.decode(),
                                       tuple(t.shape[d] for d in range(t.ndim)),
                                       t.offset, t.nbytes))
        self._by_name = {t.name: t for t in self.tensors}

    def _check(self, rc):
        if rc < 0:
            raise TesseraError(-rc, self._lib.tessera_error(self._c).decode(errors="replace"))
        return rc

    def tensor(self, name):
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError("no tensor %r on this rank" % name) from None

    @property
    def active(self):
        """The newest version the node said is active (0: none yet)."""
        return self._lib.tessera_active(self._c)

    @property
    def store(self):
        return "cuda" if self._lib.tessera_store(self._c) == 1 else "host"

    def version_info(self, version):
        """dict of a version this client holds: size, digest, store, CUDA
        device and IPC handle (bytes, for cudaIpcOpenMemHandle)."""
        p = self._lib.tessera_version_info(self._c, version)
        if not p:
            raise KeyError("version %d is not held" % version)
        v = p.contents
        return {"version": v.version, "size": v.size, "digest": bytes(v.digest).hex(),
                "store": "cuda" if v.store == 1 else "host", "cuda_device": v.cuda_device,
                "cuda_ipc_handle": bytes(v.cuda_ipc_handle)}

    def _mapping(self, version):
        mm = self._maps.get(version)
        if mm is None:
            v = self._lib.tessera_version_info(self._c, version).contents
            if v.size == 0:
                return None
            fd = os.dup(v.memfd)
            try:
                mm = mmap.mmap(fd, v.size, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
            self._maps[version] = mm
        return mm

    def acquire(self):
        """Pins the active version for a request (TesseraError EAGAIN when
        none is active yet)."""
        raw = _Pin()
        self._check(self._lib.tessera_acquire(self._c, ctypes.byref(raw)))
        self._pins[raw.version] = self._pins.get(raw.version, 0) + 1
        return Pin(self, raw)

    def _release(self, pin):
        self._check(self._lib.tessera_release(self._c, ctypes.byref(pin._raw)))
        left = self._pins[pin.version] - 1
        self._pins[pin.version] = left
        if left == 0 and pin.version != self.active:
            # Views still alive keep the mapping; it goes with the last one.
            self._maps.pop(pin.version, None)
            del self._pins[pin.version]

    def wait_version(self, minimum, timeout_ms=60000):
        """Blocks until a version >= minimum is active; returns it."""
        self._check(self._lib.tessera_wait_version(self._c, minimum, timeout_ms))
        return self.active

    def poll(self, timeout_ms=0):
        """Handles new-version notifications; returns how many arrived."""
        before = self.active
        n = self._check(self._lib.tessera_poll(self._c, timeout_ms))
        if n > 0 and self._cb is not None:
            self._cb(self.active, before)
        return n

    def on_version(self, cb):
        """cb(new_version, previous_version), called from poll()."""
        self._cb = cb

    def fileno(self):
        """The socket: readable when a notification waits (then poll())."""
        return self._lib.tessera_fd(self._c)

    def close(self):
        if self._c:
            self._lib.tessera_detach(self._c)
            self._c = ctypes.c_void_p()
            self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


from tessera.trainer import ExportTimeout, Published, Trainer, TrainerTensor  # noqa: E402  (the trainer's side)
__all__ += ["ExportTimeout"]
