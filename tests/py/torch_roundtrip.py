"""torch in and out of tessera (tessera.torch), driven by tests/test_trainer.c.

`torch_roundtrip.py pieces`: no node. tessera.torch.split() on hand-built
tables (a tp2 rank's fused qkv, a fuse on dim 1, flat pieces), dtypes, and
`import tessera` without torch.

`torch_roundtrip.py cluster CTL NODE-SOCK REPLICA NRANKS MODEL.json`: the
publisher takes the model's BF16 tensors from NRANKS trainer ranks (fsdp);
the node serves them as one tp1 rank (fused qkv_proj, gate_up_proj). Every
step's tensors are random bf16 bit patterns (NaNs included) made in torch;
the trainer ranks take them as torch tensors (Trainer.fill, then
tessera.torch.export); the serving side must hand them back as torch views
of the pin's mapping (data_ptr inside it), bit for bit, under checkpoint and
fused names, and load_into must copy them into a module; a view kept past
its pin is seen and guarded at release. Prints "ok".
"""
import errno
import importlib.util
import json
import os
import sys
import time
import types
import warnings


def refused(fn, reason, kind=None):
    import tessera
    try:
        fn()
    except (kind or tessera.TesseraError) as e:
        if reason not in str(e):
            raise AssertionError("refused with %r, want %r" % (str(e), reason))
        e.__traceback__ = None  # its frames would keep views past their pin
        return e
    raise AssertionError("not refused (want %r)" % reason)


def bits(x):
    """The tensor's bytes as int16 (bf16 compared bit for bit, NaNs too)."""
    return x.contiguous().view(torch.int16)


def same(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def random_bf16(shape, gen):
    return torch.randint(-32768, 32768, tuple(shape), generator=gen, dtype=torch.int16).view(torch.bfloat16)


def inside(x, lo, size):
    """x's memory lies in [lo, lo + size)."""
    n = x.numel() * x.element_size()
    return lo <= x.data_ptr() and x.data_ptr() + n <= lo + size


# ---- no node: the piece arithmetic ----

def piece(name, shape, lo, hi, base, flat=False):
    return types.SimpleNamespace(name=name, shape=tuple(shape), lo=tuple(lo), hi=tuple(hi),
                                 base=base, flat=flat)


def table(name, shape, concat_dim, pieces):
    return types.SimpleNamespace(name=name, dtype="bf16", shape=tuple(shape),
                                 concat_dim=concat_dim, pieces=pieces)


def check_split(t, local, want):
    """split(t, local) gives, in order, views of local equal to want:
    [(name, full tensor, lo, hi, flat)]."""
    got = tessera.torch.split(t, local)
    assert [s.name for s in got] == [w[0] for w in want], got
    for s, (name, full, lo, hi, flat) in zip(got, want):
        assert (s.shape, s.lo, s.hi, s.flat) == (tuple(full.shape), lo, hi, flat), s
        if flat:
            part = full.reshape(-1)[lo[0]:hi[0]]
            if hi[0] - lo[0] == full.numel():
                part = full
        else:
            part = full[tuple(slice(a, b) for a, b in zip(lo, hi))]
        assert same(s.tensor, part), "%s: %s differs" % (t.name, name)
        assert inside(s.tensor, local.data_ptr(), local.numel() * 2), "%s: %s is a copy" % (t.name, name)


def test_pieces():
    gen = torch.Generator().manual_seed(30)
    # A tp2 rank 1's fused qkv: the second half of q's rows, then k's, v's.
    q, k, v = random_bf16((8, 4), gen), random_bf16((2, 4), gen), random_bf16((2, 4), gen)
    local = torch.cat([q[4:], k[1:], v[1:]])
    t = table("qkv", (6, 4), 0, [piece("q", (8, 4), (4, 0), (8, 4), 0),
                                 piece("k", (2, 4), (1, 0), (2, 4), 16),
                                 piece("v", (2, 4), (1, 0), (2, 4), 20)])
    check_split(t, local, [("q", q, (4, 0), (8, 4), False), ("k", k, (1, 0), (2, 4), False),
                           ("v", v, (1, 0), (2, 4), False)])
    assert all(s.tensor.is_contiguous() for s in tessera.torch.split(t, local))
    # Fused on dim 1: strided views.
    a, b = random_bf16((3, 2), gen), random_bf16((3, 5), gen)
    t = table("ab", (3, 7), 1, [piece("a", (3, 2), (0, 0), (3, 2), 0),
                                piece("b", (3, 5), (0, 0), (3, 5), 2)])
    check_split(t, torch.cat([a, b], 1), [("a", a, (0, 0), (3, 2), False),
                                          ("b", b, (0, 0), (3, 5), False)])
    # A row-parallel shard (o_proj on a tp2 rank 1): the columns 4..8.
    o = random_bf16((8, 8), gen)
    t = table("o", (8, 4), 0, [piece("o", (8, 8), (0, 4), (8, 8), 0)])
    check_split(t, o[:, 4:].contiguous(), [("o", o, (0, 4), (8, 8), False)])
    # Flat (FSDP-style): elements 2..6 of w, then all of u (shaped as u).
    w, u = random_bf16((2, 3), gen), random_bf16((2, 3), gen)
    t = table("flat", (10,), 0, [piece("w", (2, 3), (2,), (6,), 0, True),
                                 piece("u", (2, 3), (0,), (6,), 4, True)])
    flat = torch.cat([w.reshape(-1)[2:6], u.reshape(-1)])
    check_split(t, flat, [("w", w, (2,), (6,), True), ("u", u, (0,), (6,), True)])
    assert tessera.torch.split(t, flat)[1].tensor.shape == (2, 3)
    # A table that does not add up, a tensor of another shape, no pieces.
    bad = table("qkv", (6, 4), 0, [piece("q", (8, 4), (4, 0), (8, 4), 0),
                                   piece("k", (2, 4), (0, 0), (2, 4), 20)])
    e = refused(lambda: tessera.torch.split(bad, local), "qkv: the piece of k with box")
    assert e.errno == errno.EPROTO
    bad.pieces[1] = piece("k", (2, 3), (0, 0), (2, 3), 16)  # 3 columns of a 4-column local
    refused(lambda: tessera.torch.split(bad, local), "qkv: the piece of k with box (0, 0)..(2, 3)")
    bad = table("flat", (10,), 0, [piece("u", (2, 3), (0,), (6,), 6, True)])  # past the end
    refused(lambda: tessera.torch.split(bad, flat), "flat: the piece of u with box")
    refused(lambda: tessera.torch.split(table("qkv", (6, 4), 0, t.pieces), local[:5]),
            "qkv has shape (6, 4), the tensor given (5, 4)")
    old = tessera.Tensor("qkv", "bf16", (6, 4), 0, 48)  # from a node that says no pieces
    refused(lambda: tessera.torch.split(old, local), "only names='fused' works")

    assert tessera.torch.dtype("bf16") is torch.bfloat16
    fp8 = getattr(torch, "float8_e4m3fn", torch.uint8)
    assert tessera.torch.dtype("fp8_e4m3") is fp8
    assert tessera.torch.dtype("u16") is getattr(torch, "uint16", torch.int16)
    refused(lambda: tessera.torch.dtype("bf17"), "unknown tessera dtype", KeyError)
    print("ok", flush=True)


# ---- with a node ----

class TorchExport:
    """A trainer rank whose export(step) fills it from torch tensors first
    (tessera.torch.export), for trainer_export.export_all."""

    def __init__(self, tr, tensors):
        self.tr, self.tensors, self.rank = tr, tensors, tr.rank

    def export(self, step):
        return tessera.torch.export(self.tr, self.tensors, step)


def module_for(shapes):
    """A torch module with one zero bf16 parameter per name (dots nest)."""
    root = torch.nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        m = root
        for p in path:
            if not isinstance(getattr(m, p, None), torch.nn.Module):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)))
    return root


def check_served(client, pin, full, hook):
    base = numpy.frombuffer(pin.buffer(), dtype=numpy.uint8).__array_interface__["data"][0]
    size = client.version_info(pin.version)["size"]
    # Each local tensor: a torch view at its offset in the mapping, the same
    # memory as the pin's numpy view.
    fused = tessera.torch.state_dict(pin, names="fused")
    assert sorted(fused) == sorted(t.name for t in client.tensors), sorted(fused)
    for t in client.tensors:
        x = tessera.torch.tensor(pin, t.name)
        assert x.dtype == torch.bfloat16 and tuple(x.shape) == t.shape, (t.name, x.dtype, x.shape)
        assert x.data_ptr() == base + t.offset, "%s is not the node's memory" % t.name
        assert x.data_ptr() == pin.tensor(t.name).__array_interface__["data"][0]
        assert fused[t.name].data_ptr() == x.data_ptr()
        assert hook.as_torch(pin, t).data_ptr() == x.data_ptr()
        want = torch.cat([full[p.name] for p in t.pieces], t.concat_dim)
        assert same(x, want), "%s of version %d differs" % (t.name, pin.version)
    assert "model.layers.0.self_attn.qkv_proj.weight" in fused
    # Under checkpoint names: q, k, v split back, views, bit for bit.
    sd = tessera.torch.state_dict(pin)
    assert sorted(sd) == sorted(full), sorted(set(sd) ^ set(full))
    for name, x in sd.items():
        assert inside(x, base, size), "%s is not the node's memory" % name
        assert same(x, full[name]), "%s of version %d differs" % (name, pin.version)
    for s in tessera.torch.shards(pin):
        assert s.lo == (0,) * len(s.shape) and s.hi == s.shape and not s.flat, s
    # load_into copies into a module's parameters.
    shapes = {n: tuple(x.shape) for n, x in full.items()}
    m = module_for(shapes)
    assert tessera.torch.load_into(m, pin) == sorted(full)
    for name, p in m.named_parameters():
        assert same(p, full[name]) and not inside(p, base, size), name
    return sd


def check_load_refusals(pin, full):
    shapes = {n: tuple(x.shape) for n, x in full.items()}
    q = "model.layers.0.self_attn.q_proj.weight"
    fewer = dict(shapes)
    del fewer[q]
    refused(lambda: tessera.torch.load_into(module_for(fewer), pin),
            "no parameter or buffer of the module for %s" % q)
    refused(lambda: tessera.torch.load_into(module_for(dict(shapes, extra=(2,))), pin),
            "not on the rank: extra")
    wrong = dict(shapes, **{q: shapes[q][::-1] + (1,)})
    m = module_for(wrong)
    refused(lambda: tessera.torch.load_into(m, pin), "shapes differ: %s (rank %r, module %r)" %
            (q, shapes[q], wrong[q]))
    assert all(not p.any() for p in m.parameters()), "a refused load_into copied"
    refused(lambda: tessera.torch.state_dict(pin, names="hf"), "names is 'checkpoint' or 'fused'",
            ValueError)


def check_trainer_side(tr, full):
    """The trainer's buffer as torch views; refusals of fill."""
    t = tr.tensors[0]
    view = tessera.torch.tensor(tr, t.name)
    size = len(tr.buffer())
    base = numpy.frombuffer(tr.buffer(), dtype=numpy.uint8).__array_interface__["data"][0]
    assert view.data_ptr() == base + t.offset and view.dtype == torch.bfloat16 and size > 0
    x = torch.zeros(t.shape, dtype=torch.float32)
    refused(lambda: tr.fill(t.name, x), "tensor %s is bf16 (torch torch.bfloat16), not torch.float32" % t.name)
    refused(lambda: tr.fill(t.name, torch.zeros((1,) + t.shape, dtype=torch.bfloat16)), "has shape")
    refused(lambda: tessera.torch.export(tr, {}, 1), "no tensor %r among those rank %d exports" %
            (t.name, tr.rank), KeyError)


def check_kept(client, full):
    """A torch view kept past its pin references the pin's memory: release
    sees it and guards it (TesseraWarning); a clone is the engine's own."""
    q = "model.layers.0.self_attn.q_proj.weight"
    for copy in (False, True):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pin = client.acquire()
            x = tessera.torch.state_dict(pin)[q]
            x = x.clone() if copy else x
            pin.release()
        guarded = [w for w in seen if issubclass(w.category, tessera.TesseraWarning)]
        assert bool(guarded) != copy, (copy, [str(w.message) for w in seen])
        if copy:
            assert same(x, full[q])
        del x  # the kept view is unreadable now: never read


def cluster(ctl, node_sock, replica, nranks, model_path):
    from trainer_export import export_all  # each rank exports from its own thread
    with open(model_path) as f:
        model = json.load(f)["tensors"]
    assert all(m["dtype"] == "bf16" for m in model), model
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "serving_hook", os.path.join(here, "..", "..", "deploy", "serving-hook.py"))
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)

    deadline = time.monotonic() + 120
    while not (os.path.exists(ctl) and os.path.exists(node_sock)):
        if time.monotonic() > deadline:
            raise AssertionError("no sockets at %s and %s after 120 s" % (ctl, node_sock))
        time.sleep(0.05)
    trainers = [tessera.Trainer(ctl, r) for r in range(nranks)]
    client = tessera.Client(node_sock, replica, 0, timeout_ms=60000)
    gen = torch.Generator().manual_seed(3030)
    for step in (1, 2):
        full = {m["name"]: random_bf16(m["shape"], gen) for m in model}
        keep = {n: x.clone() for n, x in full.items()}
        if step == 1:
            # Trainer.fill with torch tensors: each rank its box of the full tensor.
            for tr in trainers:
                check_trainer_side(tr, full)
                for t in tr.tensors:
                    box = full[t.name][tuple(slice(a, a + n) for a, n in zip(t.start, t.shape))]
                    tr.fill(t.name, box)
                    assert same(tessera.torch.tensor(tr, t.name), box), t.name
            v = export_all(trainers, step)
        else:
            # tessera.torch.export from the full tensors (each rank takes its box).
            v = export_all([TorchExport(tr, full) for tr in trainers], step)
        assert all(same(full[n], keep[n]) for n in full), "export wrote into its source"
        client.wait_version(v, timeout_ms=120000)
        with client.acquire() as pin:
            assert pin.version == v, (pin.version, v)
            check_served(client, pin, full, hook)
            if step == 1:
                check_load_refusals(pin, full)
        check_kept(client, full)
        print("served step %d as version %d" % (step, v), file=sys.stderr)
    client.close()
    for tr in trainers:
        tr.close()
    print("ok", flush=True)


def no_torch():
    """`import tessera` (and the numpy trainer path) needs no torch."""
    sys.modules["torch"] = None  # import torch now raises ImportError
    import tessera as t
    assert "tessera.torch" not in sys.modules
    try:
        import tessera.torch  # noqa: F401
        raise AssertionError("tessera.torch imported without torch")
    except ImportError:
        pass
    del sys.modules["torch"]
    return t


if __name__ == "__main__":
    tessera = no_torch()
    import numpy
    import torch
    import tessera.torch

    if sys.argv[1] == "pieces":
        test_pieces()
    else:
        cluster(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
