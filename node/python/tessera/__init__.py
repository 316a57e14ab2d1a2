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
            wq = pin.tensor("model.layers.0.self_attn.o_proj.weight")
            ...                             # pin.version is what it ran on

A view lives as long as its pin: after release() the pin hands out
nothing more (TesseraError), a memoryview it handed out raises on access,
and a numpy array (or a torch tensor over one) still referenced is made
unreadable (the process faults on a read) rather than show whatever the
node writes into that memory next: numpy arrays cannot be made to raise.
Keep a copy (pin.tensor(name, copy=True)) of what must outlive the pin.

An engine that switches all its ranks to one version at a step boundary
attaches with hold=True: the node holds every version it sends the client
(client.prepared lists them) until client.drop(v); acquire(version=v) pins
exactly v (see node/client/tessera_client.h, TESSERA_HOLD, and
tessera.engine for the whole step-boundary switch).

The library is the one built into the package when pip installed it
(tessera/_libtessera_client*.so, compiled from node/client/client.c);
TESSERA_CLIENT_LIB (a path) names another, and a package without one (its
files copied by hand) looks in the system's library path
(libtessera-client.so, as `make install` puts it).
"""

import ctypes
import ctypes.util
import errno
import glob
import importlib.machinery
import os
import warnings
import weakref

try:
    import numpy as _np
except ImportError:  # numpy is optional
    _np = None

__all__ = ["Client", "Pin", "Tensor", "Piece", "TesseraError", "TesseraWarning", "Trainer",
           "TrainerTensor", "Published", "numpy_dtype", "library_version"]

_DIMS_MAX = 8


class _Piece(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * _DIMS_MAX),
        ("lo", ctypes.c_uint64 * _DIMS_MAX),
        ("hi", ctypes.c_uint64 * _DIMS_MAX),
        ("base", ctypes.c_uint64),
        ("flat", ctypes.c_int),
    ]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * _DIMS_MAX),
        ("offset", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
        ("concat_dim", ctypes.c_uint32),
        ("npieces", ctypes.c_uint32),
        ("pieces", ctypes.POINTER(_Piece)),
        ("scale", ctypes.c_char_p),
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


def _bundled():
    """The library pip built into this package, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(os.path.join(here, "_libtessera_client" + suffix))
        if found:
            return found[0]
    return None


def _load(path=None):
    global _lib
    if _lib is not None and path is None:
        return _lib
    path = (path or os.environ.get("TESSERA_CLIENT_LIB") or _bundled()
            or ctypes.util.find_library("tessera-client"))
    if not path:
        raise OSError("libtessera-client not found: install the package with pip "
                      "(pip install node/python builds it in), or set TESSERA_CLIENT_LIB to "
                      "the path of libtessera-client.so (`make` builds it in build/lib/)")
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
        "tessera_client_version": (ctypes.c_char_p, []),
        "tessera_attach_flags": (ctypes.c_int, [C, C, ctypes.c_uint32, ctypes.c_int,
                                                ctypes.c_uint, ctypes.POINTER(P), C,
                                                ctypes.c_size_t]),
        "tessera_holding": (ctypes.c_int, [P]),
        "tessera_in_place": (ctypes.c_int, [P]),
        "tessera_prepared": (ctypes.c_size_t, [P, ctypes.POINTER(ctypes.c_uint64),
                                               ctypes.c_size_t]),
        "tessera_acquire_version": (ctypes.c_int, [P, ctypes.c_uint64, ctypes.POINTER(_Pin)]),
        "tessera_drop": (ctypes.c_int, [P, ctypes.c_uint64]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    if path is None or _lib is None:
        _lib = lib
    return lib


def library_version():
    """The tessera release of the libtessera-client this package loads."""
    return _load().tessera_client_version().decode()


class TesseraError(OSError):
    """A call the node or the library refused; .errno and the reason."""


class TesseraWarning(UserWarning):
    """Something the engine did that tessera had to guard against."""


# ---- a version's memory, mapped by this process ----------------------------------------

_PROT_NONE, _PROT_READ, _MAP_SHARED = 0, 1, 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class _Mapping:
    """One version's memfd mapped read-only here, once for all its pins.
    Every view of it references it (through its pin's exporter): it is
    unmapped when the last view and pin are gone, so a view never points at
    memory reused for something else. guard(True) makes it unreadable."""

    __slots__ = ("version", "addr", "size", "guarded", "__weakref__")

    def __init__(self, version, memfd, size):
        self.version, self.size, self.guarded = version, size, False
        addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, memfd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            e = ctypes.get_errno()
            raise TesseraError(e, "cannot map v%d (%d bytes): %s" % (version, size, os.strerror(e)))
        self.addr = addr

    def guard(self, on):
        if on != self.guarded and _libc.mprotect(self.addr, self.size,
                                                 _PROT_NONE if on else _PROT_READ) == 0:
            self.guarded = on

    def exporter(self):
        """A buffer over the whole version that keeps this mapping alive:
        views made from it reference it, and nothing else does."""
        arr = (ctypes.c_char * self.size).from_address(self.addr)
        arr._mapping = self
        return arr

    def __del__(self):
        if _libc is not None:  # None at interpreter exit: the process unmaps it
            _libc.munmap(self.addr, self.size)


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


class Piece:
    """Where part of a local tensor comes from: the box [lo, hi) of the
    model (checkpoint) tensor `name` of shape `shape`, starting at element
    `base` of the local tensor. A flat piece (FSDP-style) is the run
    lo[0]..hi[0] of the flattened model tensor instead."""

    __slots__ = ("name", "shape", "lo", "hi", "base", "flat")

    def __init__(self, name, shape, lo, hi, base, flat):
        self.name, self.shape, self.lo, self.hi = name, shape, lo, hi
        self.base, self.flat = base, flat

    def __repr__(self):
        box = ", ".join("%d:%d" % b for b in zip(self.lo, self.hi))
        return "Piece(%r [%s] of %r%s)" % (self.name, box, self.shape, ", flat" if self.flat else "")


class Tensor:
    """One local tensor of the rank: where it lies in a version's memory,
    and where it comes from (pieces, in order along concat_dim; empty when
    the node does not say). An FP8 tensor of a block-scaled serving layout
    (fp8_e4m3_block128) names its scales' tensor in `scale` (FP32, one per
    128 x 128 block, "<name>_scale_inv"; dequantize as value * scale); None
    otherwise. Its numpy view is uint8 (numpy has no FP8), its torch view
    float8_e4m3fn where the torch in use has it."""

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes", "concat_dim", "pieces", "scale")

    def __init__(self, name, dtype, shape, offset, nbytes, concat_dim=0, pieces=(), scale=None):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.offset, self.nbytes = offset, nbytes
        self.concat_dim, self.pieces = concat_dim, list(pieces)
        self.scale = scale

    def __repr__(self):
        return "Tensor(%r, %s, %r, offset=%d)" % (self.name, self.dtype, self.shape, self.offset)


def _pieces(t):
    out = []
    for k in range(t.npieces):
        p = t.pieces[k]
        n = 1 if p.flat else p.ndim
        out.append(Piece(p.name.decode(), tuple(p.shape[d] for d in range(p.ndim)),
                         tuple(p.lo[d] for d in range(n)), tuple(p.hi[d] for d in range(n)),
                         p.base, bool(p.flat)))
    return out


class Pin:
    """One request's hold on one version. Its views (tensor(), buffer())
    read that version and nothing else: valid while the pin is held; after
    release() the pin hands out nothing, memoryviews it handed out raise,
    and numpy arrays (or torch tensors) still referencing it are made
    unreadable once no pin of this client holds the version (a read faults)
    instead of showing whatever the node writes there next. Use as a
    context manager."""

    def __init__(self, client, raw):
        self._client, self._raw = client, raw
        self.id, self.version, self.acquired_ms = raw.id, raw.version, raw.acquired_ms
        self.released = False
        self._map = client._mapping(raw.version)
        if self._map is not None:
            self._map.guard(False)  # pinned again: readable (still this version)
            self._arr = self._map.exporter()
        else:
            self._arr = None
        self._handed = []  # memoryviews handed out: released with the pin

    def record(self):
        """What to store with the request's trajectory: the version it really
        ran on, that version's signed manifest digest, the replica and rank,
        and when the node granted the pin (ms since the epoch)."""
        info = self._client.version_info(self.version)
        return {"replica": self._client.replica, "rank": self._client.rank,
                "version": self.version, "manifest_digest": info["digest"],
                "acquired_ms": self.acquired_ms}

    def _bytes(self, off, n):
        if self.released:
            raise TesseraError(errno.ESTALE, "the pin of v%d was released: its memory may hold "
                               "another version now (acquire again)" % self.version)
        if self._arr is None:
            return memoryview(b"")
        mv = memoryview(self._arr).cast("B")[off:off + n].toreadonly()
        self._handed.append(mv)
        return mv

    def buffer(self):
        """The whole version as a read-only memoryview."""
        return self._bytes(0, self._map.size if self._map is not None else 0)

    def tensor(self, name, as_numpy=None, copy=False):
        """The tensor as a numpy array (or a memoryview without numpy, or
        with as_numpy=False), a view of the node's memory: no copy, valid
        while the pin is held. copy=True: a copy of its own, to keep."""
        t = self._client.tensor(name)
        use_np = _np is not None if as_numpy is None else as_numpy
        if use_np and _np is None:
            raise TesseraError(errno.ENOSYS, "numpy is not installed")
        if not use_np:
            mv = self._bytes(t.offset, t.nbytes)
            return memoryview(bytes(mv)) if copy else mv
        self._bytes(0, 0)  # refuses a released pin
        dt = _np.dtype(numpy_dtype(t.dtype))
        if self._arr is None:
            a = _np.zeros(t.shape, dtype=dt)
        else:
            a = _np.frombuffer(self._arr, dtype=dt, count=t.nbytes // dt.itemsize,
                               offset=t.offset).reshape(t.shape)
        a.flags.writeable = False
        return a.copy() if copy else a

    def release(self):
        if self.released:
            return
        self.released = True
        for mv in self._handed:
            try:
                mv.release()  # a kept memoryview raises from now on
            except BufferError:
                pass          # something was made from it: seen below
        self._handed = []
        kept = None
        if self._arr is not None:
            kept = weakref.ref(self._arr)
            self._arr = None
            if kept() is None:
                kept = None
        # Before the node may reuse the memory: views still alive are
        # guarded once no pin of this client holds the version.
        self._client._release(self, kept)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Client:
    """A serving process's connection to its node (one rank of a replica).
    hold=True: the node holds every version it sends this client until
    drop() (for an engine switching its ranks together; see prepared and
    acquire(version))."""

    def __init__(self, path, replica, rank, timeout_ms=10000, lib=None, hold=False):
        self._lib = _load(lib)
        self.replica, self.rank = replica, rank
        self._c = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = self._lib.tessera_attach_flags(path.encode(), replica.encode(), rank, timeout_ms,
                                            1 if hold else 0, ctypes.byref(self._c), err,
                                            len(err))
        if rc != 0:
            raise TesseraError(-rc, err.value.decode(errors="replace"))
        self._maps = {}   # version -> _Mapping, shared by the pins of that version
        self._pins = {}   # version -> pins held through this object
        self._kept = {}   # version -> weakrefs to exporters of released pins
        self._cb = None
        self.tensors = []
        for i in range(self._lib.tessera_ntensors(self._c)):
            t = self._lib.tessera_tensor(self._c, i).contents
            self.tensors.append(Tensor(t.name.decode(), t.dtype.decode(),
                                       tuple(t.shape[d] for d in range(t.ndim)),
                                       t.offset, t.nbytes, t.concat_dim, _pieces(t),
                                       t.scale.decode() if t.scale else None))
        self._by_name = {t.name: t for t in self.tensors}

    def _check(self, rc):
        if rc < 0:
            raise TesseraError(-rc, self._lib.tessera_error(self._c).decode(errors="replace"))
        return rc

    def tensor(self, name):
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError("no tensor %r on this rank (it has %s)" % (
                name, ", ".join(sorted(self._by_name)[:8]) +
                (", ..." if len(self._by_name) > 8 else ""))) from None

    @property
    def active(self):
        """The newest version the node said is active (0: none yet)."""
        return self._lib.tessera_active(self._c)

    @property
    def store(self):
        return "cuda" if self._lib.tessera_store(self._c) == 1 else "host"

    @property
    def holding(self):
        """True when the node holds the versions it sends this client."""
        return bool(self._lib.tessera_holding(self._c))

    @property
    def in_place(self):
        """True when the node installs versions in place (one copy: nothing
        is held, and requests pause while it writes the next version)."""
        return bool(self._lib.tessera_in_place(self._c))

    @property
    def prepared(self):
        """The versions this client can pin by number, ascending: those the
        node holds for it and the active one (as far as the socket was read:
        poll())."""
        n = self._lib.tessera_prepared(self._c, None, 0)
        buf = (ctypes.c_uint64 * max(n, 1))()
        n = min(n, self._lib.tessera_prepared(self._c, buf, n))
        return [buf[i] for i in range(n)]

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
            mm = self._maps[version] = _Mapping(version, v.memfd, v.size)
        return mm

    def acquire(self, version=None):
        """Pins the active version for a request (TesseraError EAGAIN when
        none is active yet); version=v pins exactly v, which must be held
        for this client or active (else ENOENT)."""
        raw = _Pin()
        if version is None:
            self._check(self._lib.tessera_acquire(self._c, ctypes.byref(raw)))
        else:
            self._check(self._lib.tessera_acquire_version(self._c, version, ctypes.byref(raw)))
        try:
            pin = Pin(self, raw)
        except BaseException:
            self._lib.tessera_release(self._c, ctypes.byref(raw))
            raise
        self._pins[raw.version] = self._pins.get(raw.version, 0) + 1
        return pin

    def drop(self, version):
        """Lets a held version go (pins still running on it keep it)."""
        self._check(self._lib.tessera_drop(self._c, version))
        self._forget(version)

    def _forget(self, version):
        if self._pins.get(version, 0) == 0 and version not in self.prepared:
            self._pins.pop(version, None)
            self._maps.pop(version, None)  # views still alive keep the mapping

    def _release(self, pin, kept):
        v = pin.version
        left = self._pins[v] - 1
        kept_list = self._kept.setdefault(v, [])
        if kept is not None:
            kept_list.append(kept)
            warnings.warn(TesseraWarning(
                "the pin of v%d was released while views of it are still referenced: they are "
                "made unreadable once no request pins v%d (copy what must outlive a pin: "
                "pin.tensor(name, copy=True))" % (v, v)), stacklevel=3)
        kept_list[:] = [w for w in kept_list if w() is not None]
        if left == 0 and kept_list:
            # The node may write another version there once unpinned.
            for w in kept_list:
                arr = w()
                if arr is not None:
                    arr._mapping.guard(True)
        if not kept_list:
            self._kept.pop(v, None)
        self._check(self._lib.tessera_release(self._c, ctypes.byref(pin._raw)))
        self._pins[v] = left
        if left == 0:
            self._forget(v)

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
            # The node drops our pins with the socket: views still alive
            # must not read what it writes there next.
            for m in self._maps.values():
                m.guard(True)
            for ws in self._kept.values():
                for w in ws:
                    arr = w()
                    if arr is not None:
                        arr._mapping.guard(True)
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
