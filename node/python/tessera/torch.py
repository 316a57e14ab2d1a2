"""torch tensors in and out of tessera, without copies on the way out.

Import it only where torch is installed (`import tessera` needs numpy at
most). Serving side: a pinned version's tensors as torch tensors over the
node's memory, each piece with its box in the full model tensor, a rank's
state_dict under checkpoint or fused names, and load_into(module). Trainer
side: fill and export a trainer rank's buffer from torch tensors (CPU, or
CUDA with one device-to-host copy straight into the shared buffer).

    import tessera, tessera.torch
    with tessera.Client(path, "A", 0) as c, c.acquire() as pin:
        sd = tessera.torch.state_dict(pin)        # {"model.layers.0.self_attn.q_proj.weight": ...}
        tessera.torch.load_into(model, pin)       # copies into model's parameters

A serving tensor is a view of the pin's numpy view (torch.from_numpy keeps a
reference to it), never a copy nor built from an address, so it follows the
pin's rules: read it while the pin is held; one kept past release() is made
unreadable (tessera.Pin). The node's memory is mapped read-only: never write
to it (a write kills the process with SIGSEGV); clone() for a tensor of your
own.

Dtypes: bf16 and fp16/fp32/fp64 are torch's; fp8_e4m3 and fp8_e5m2 are
torch.float8_e4m3fn and torch.float8_e5m2 where the torch in use has them,
else raw torch.uint8 (view them once your torch has the type); u16, u32 and
u64 are torch.uint16/32/64 where they exist, else the signed type of their
width holding the same bits.
"""

import collections
import errno
import warnings

import torch

from tessera import Pin, TesseraError

__all__ = ["Shard", "dtype", "tensor", "split", "shards", "state_dict", "load_into",
           "fill", "export"]

# tessera dtype -> torch dtypes to try, best first (torch 1.13 has no
# float8_* or uint16..64: the last name is the raw type of the same width).
_TORCH = {
    "fp64": ("float64",), "fp32": ("float32",), "fp16": ("float16",), "bf16": ("bfloat16",),
    "fp8_e4m3": ("float8_e4m3fn", "uint8"), "fp8_e5m2": ("float8_e5m2", "uint8"),
    "bool": ("bool",), "u8": ("uint8",), "i8": ("int8",), "u16": ("uint16", "int16"),
    "i16": ("int16",), "u32": ("uint32", "int32"), "i32": ("int32",),
    "u64": ("uint64", "int64"), "i64": ("int64",),
}

Shard = collections.namedtuple("Shard", "name tensor shape lo hi flat")
Shard.__doc__ = """One piece of a local tensor: `tensor` (a view, no copy) holds the
box [lo, hi) of the model tensor `name` of full shape `shape`; for a flat
piece (FSDP-style) it holds elements [lo[0], hi[0]) of the flattened tensor
(shaped as the full tensor when it is all of it, else one-dimensional)."""


def dtype(name):
    """The torch dtype a tessera dtype ("bf16", "fp8_e4m3", ...) is handed
    out as (see the module's note on raw fallbacks)."""
    try:
        names = _TORCH[name]
    except KeyError:
        raise KeyError("unknown tessera dtype %r" % name) from None
    for n in names:
        if hasattr(torch, n):
            return getattr(torch, n)
    raise TesseraError(errno.ENOSYS, "torch %s has none of %s" % (torch.__version__, names))


def _entry(src, name):
    """The table entry of tensor `name` in a Pin or a Trainer."""
    if isinstance(src, Pin):
        return src._client.tensor(name)
    t = src._by_name.get(name)
    if t is None:
        raise KeyError("no tensor %r on trainer rank %d" % (name, src.rank))
    return t


def _from_numpy(a, want):
    # torch.from_numpy knows no unsigned type wider than a byte (1.13): go
    # through the signed view of the same width, still the same memory.
    if a.dtype.kind == "u" and a.dtype.itemsize > 1:
        a = a.view("<i%d" % a.dtype.itemsize)
    with warnings.catch_warnings():
        # A pin's view is read-only; torch warns that its tensors are not.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        x = torch.from_numpy(a)
    return x if x.dtype == want else x.view(want)


def tensor(src, name):
    """Local tensor `name` of a Pin (read-only) or a Trainer (writable) as a
    torch tensor over the same memory as src.tensor(name): no copy."""
    t = _entry(src, name)
    return _from_numpy(src.tensor(name, as_numpy=True), dtype(t.dtype))


def _misfit(t, p):
    return TesseraError(errno.EPROTO, "%s: the piece of %s with box %r..%r does not fit its "
                        "shape %r" % (t.name, p.name, tuple(p.lo), tuple(p.hi), tuple(t.shape)))


def _narrow(t, p, x, dim, start, n):
    if dim >= x.dim() or start + n > x.shape[dim]:
        raise _misfit(t, p)
    return x.narrow(dim, start, n)


def split(t, x):
    """The Shards of local tensor t (a table entry with pieces, from
    Client.tensors) whose memory is the torch tensor x of t's shape: views
    of x, in order along t.concat_dim. A piece fused on a dim other than 0
    is a strided view (contiguous() copies it)."""
    pieces = getattr(t, "pieces", None)
    if not pieces:  # every local tensor has one at least: the node did not say
        raise TesseraError(errno.EPROTO, "the node's table says nothing of %s's pieces (a node "
                           "older than this client): only names='fused' works" % t.name)
    if tuple(x.shape) != tuple(t.shape):
        raise TesseraError(errno.EINVAL, "%s has shape %r, the tensor given %r" %
                           (t.name, tuple(t.shape), tuple(x.shape)))
    out = []
    for p in pieces:
        box = tuple(h - lo for lo, h in zip(p.lo, p.hi))
        if p.flat:
            v = _narrow(t, p, x.reshape(-1), 0, p.base, box[0])
            full = 1
            for n in p.shape:
                full *= n
            if p.lo[0] == 0 and p.hi[0] == full:
                v = v.view(p.shape)
        elif x.dim() == 0:
            v = x
        else:
            d = t.concat_dim
            stride = 1
            for n in x.shape[d + 1:]:
                stride *= n
            if stride and p.base % stride:
                raise _misfit(t, p)
            v = _narrow(t, p, x, d, p.base // stride if stride else 0, box[d])
            if tuple(v.shape) != box:
                raise _misfit(t, p)
        out.append(Shard(p.name, v, tuple(p.shape), tuple(p.lo), tuple(p.hi), p.flat))
    return out


def shards(pin):
    """Every piece of the pinned rank: a list of Shards (views, no copy)."""
    return [s for t in pin._client.tensors for s in split(t, tensor(pin, t.name))]


def state_dict(pin, names="checkpoint"):
    """The pinned rank's tensors as a dict of torch views (no copy).
    names="checkpoint": under the model's (HF) names, fused tensors split
    back (q_proj, k_proj, v_proj out of qkv_proj); each value is the rank's
    share (the whole tensor on a tp1 rank). names="fused": the node's local
    tensors, under the fused names vLLM uses (qkv_proj, gate_up_proj)."""
    if names == "fused":
        return {t.name: tensor(pin, t.name) for t in pin._client.tensors}
    if names != "checkpoint":
        raise ValueError("names is 'checkpoint' or 'fused', not %r" % (names,))
    out = {}
    for s in shards(pin):
        if s.name in out:
            raise TesseraError(errno.EINVAL, "rank %d holds %s in more than one piece: use "
                               "shards() or names='fused'" % (pin._client.rank, s.name))
        out[s.name] = s.tensor
    return out


def _listed(what, items, most=5):
    more = " and %d more" % (len(items) - most) if len(items) > most else ""
    return "%s %s%s" % (what, ", ".join(items[:most]), more)


def load_into(module, pin, names="checkpoint"):
    """Copies the pinned rank's state_dict(pin, names) into the module's
    parameters and buffers of the same names (copy_: any device, dtype
    converted). Strict: every tensor of the rank must name a parameter or
    buffer of the module, every parameter must be given, shapes must be
    equal; else TesseraError EINVAL naming them, and nothing is copied.
    Returns the names copied, sorted."""
    src = state_dict(pin, names)
    dst = module.state_dict(keep_vars=True)  # every name of a tied weight, unlike named_parameters()
    wrong = []
    unknown = sorted(k for k in src if k not in dst)
    if unknown:
        wrong.append(_listed("no parameter or buffer of the module for", unknown))
    missing = sorted(k for k, v in dst.items() if isinstance(v, torch.nn.Parameter) and k not in src)
    if missing:
        wrong.append(_listed("not on the rank:", missing))
    shapes = sorted("%s (rank %r, module %r)" % (k, tuple(v.shape), tuple(dst[k].shape))
                    for k, v in src.items() if k in dst and v.shape != dst[k].shape)
    if shapes:
        wrong.append(_listed("shapes differ:", shapes))
    if wrong:
        raise TesseraError(errno.EINVAL, "load_into: rank %d of replica %s does not fit the "
                           "module: %s" % (pin._client.rank, pin._client.replica, "; ".join(wrong)))
    with torch.no_grad():
        for k, v in src.items():
            dst[k].copy_(v)
    return sorted(src)


def fill(trainer, name, x):
    """Copies the torch tensor x (CPU or CUDA, any strides; the tensor's
    torch dtype and the rank's local shape) into the trainer's buffer: one
    copy, straight into the shared memory. Trainer.fill(name, x) comes here
    for a torch tensor."""
    t = _entry(trainer, name)
    want = dtype(t.dtype)
    if x.dtype != want:
        raise TesseraError(errno.EINVAL, "tensor %s is %s (torch %s), not %s" %
                           (name, t.dtype, want, x.dtype))
    if tuple(x.shape) != tuple(t.shape):
        raise TesseraError(errno.EINVAL, "tensor %s has shape %r on rank %d, not %r" %
                           (name, tuple(t.shape), trainer.rank, tuple(x.shape)))
    with torch.no_grad():
        tensor(trainer, name).copy_(x)


def export(trainer, tensors, step, wait="published"):
    """Fills every local tensor of the trainer rank from `tensors` (a dict of
    name -> torch tensor, or a module: its state_dict) and exports `step`
    (Trainer.export). A tensor is either the rank's local tensor or the full
    model tensor, whose box at the local's start is taken (a view). Returns
    what Trainer.export returns."""
    if isinstance(tensors, torch.nn.Module):
        tensors = tensors.state_dict()
    for t in trainer.tensors:
        x = tensors.get(t.name)
        if x is None:
            raise KeyError("no tensor %r among those rank %d exports" % (t.name, trainer.rank))
        if tuple(x.shape) != tuple(t.shape) and t.start is not None and x.dim() == len(t.shape):
            x = x[tuple(slice(a, a + n) for a, n in zip(t.start, t.shape))]
        fill(trainer, t.name, x)
    return trainer.export(step, wait=wait)
