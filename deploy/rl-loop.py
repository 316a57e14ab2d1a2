#!/usr/bin/env python3
"""The RL loop on tessera, end to end, on one host: a trainer trains a torch
policy and exports it through tessera after every optimizer step; a
tensor-parallel rollout engine of 2 workers (torch.distributed, gloo) serves
it from a tp2 replica whose two ranks are two node agents, and switches both
workers to each version together at its own step boundary.

    make venv && build/venv/bin/python3 deploy/rl-loop.py     # 8 versions, one a second
    build/venv/bin/python3 deploy/rl-loop.py --steps 20 --every-ms 500 --keep run/rl

What it checks, for every version the engine switches to: the engine's
sharded forward pass (each worker holds only its rank's shards; partial sums
all-reduced, vocabulary-parallel embedding and lm_head) gives logits equal,
bit for bit, to the trainer's unsharded forward on the weights it exported.
The compute rounds activations to bf16 before every matmul and accumulates
in float64, where bf16 products sum exactly: the sharded and unsharded
passes are then equal whatever the order of their sums, as a bf16 engine's
would be up to its own rounding.

It prints, per version, the time from the trainer's export() call to the
engine's switch, and their median and worst; the node ranks' activation
skew at each switch shows why the engine holds versions (tessera.engine).
Runs the real programs (tracker, publisher fed by the trainer, two
tessera-node processes) from --bin, in a temporary directory (--keep DIR
keeps it: logs, keys, state). Needs python3-torch and python3-numpy, and
the tessera package installed for the python that runs it (`make venv`:
pip installs node/python into build/venv, with the system's packages).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

try:
    import tessera  # noqa: E402
except ImportError:
    sys.exit("rl-loop.py: the tessera package is not installed for %s: `make venv`, then run "
             "build/venv/bin/python3 deploy/rl-loop.py (or pip install node/python)"
             % sys.executable)
import tessera.engine  # noqa: E402
import tessera.torch  # noqa: E402

# A llama-shaped policy (HF names), small enough for a test.
VOCAB, D, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, SEQ = 256, 64, 4, 2, 16, 128, 2, 8


def model_spec():
    t = [("model.embed_tokens.weight", (VOCAB, D))]
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", (D,)),
              (p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, D)),
              (p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, D)),
              (p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, D)),
              (p + "self_attn.o_proj.weight", (D, HEADS * HEAD_DIM)),
              (p + "post_attention_layernorm.weight", (D,)),
              (p + "mlp.gate_proj.weight", (INTER, D)),
              (p + "mlp.up_proj.weight", (INTER, D)),
              (p + "mlp.down_proj.weight", (D, INTER))]
    return t + [("model.norm.weight", (D,)), ("lm_head.weight", (VOCAB, D))]


def init_params(seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in model_spec():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            out[name] = torch.randn(shape, generator=g) * (1.0 / shape[-1] ** 0.5)
        out[name].requires_grad_(True)
    return out


# ---- the forward pass: unsharded (the trainer) or sharded (a worker) ---------------------

class Shard:
    """How a worker's pass combines with the others: tp rank and size, and
    the collectives (identities for the unsharded pass)."""

    def __init__(self, rank=0, size=1, group=None):
        self.rank, self.size, self.group = rank, size, group

    def all_reduce(self, x):
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x):
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def forward(W, ids, exact, sh=Shard()):
    """Logits of ids (batch, seq). exact: bf16 activations into float64
    matmuls (bit-reproducible across shardings); else plain float32 (training)."""
    if exact:
        def mm(x, w):
            return x.to(torch.bfloat16).to(torch.float64) @ w.T
    else:
        def mm(x, w):
            return x @ w.T

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w

    heads, kv = HEADS // sh.size, KV_HEADS // sh.size
    emb = W["model.embed_tokens.weight"]
    lo = sh.rank * emb.shape[0]  # vocabulary-parallel: this worker's rows
    local = ids - lo
    mine = (local >= 0) & (local < emb.shape[0])
    h = emb[local.clamp(0, emb.shape[0] - 1)] * mine.unsqueeze(-1)
    h = sh.all_reduce(h)
    b, s = ids.shape
    causal = torch.full((s, s), float("-inf"), dtype=h.dtype).triu(1)
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        x = rms(h, W[p + "input_layernorm.weight"])
        q = mm(x, W[p + "self_attn.q_proj.weight"]).view(b, s, heads, HEAD_DIM).transpose(1, 2)
        k = mm(x, W[p + "self_attn.k_proj.weight"]).view(b, s, kv, HEAD_DIM).transpose(1, 2)
        v = mm(x, W[p + "self_attn.v_proj.weight"]).view(b, s, kv, HEAD_DIM).transpose(1, 2)
        k = k.repeat_interleave(heads // kv, dim=1)
        v = v.repeat_interleave(heads // kv, dim=1)
        if exact:
            q, k, v = (t.to(torch.bfloat16).to(torch.float64) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / HEAD_DIM ** 0.5 + causal, dim=-1)
        if exact:
            att = att.to(torch.bfloat16).to(torch.float64)
        o = (att @ v).transpose(1, 2).reshape(b, s, heads * HEAD_DIM)
        h = h + sh.all_reduce(mm(o, W[p + "self_attn.o_proj.weight"]))
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        g = mm(x, W[p + "mlp.gate_proj.weight"])
        u = mm(x, W[p + "mlp.up_proj.weight"])
        h = h + sh.all_reduce(mm(torch.nn.functional.silu(g) * u, W[p + "mlp.down_proj.weight"]))
    x = rms(h, W["model.norm.weight"])
    return sh.all_gather(mm(x, W["lm_head.weight"]))


def probe_ids():
    return torch.arange(2 * SEQ).view(2, SEQ) * 37 % VOCAB


# ---- a worker: one rank of the rollout engine ----------------------------------------------

def rank_weights(pin):
    """This worker's shard of every checkpoint tensor (the node says where
    each local tensor comes from; fused ones split back), as float64 copies:
    the engine's load."""
    return {name: x.to(torch.float64) for name, x in tessera.torch.state_dict(pin).items()}


def worker(args, rank):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(args.dir, "pg"),
                            rank=rank, world_size=2)
    sock = os.path.join(args.dir, "A-%d.sock" % rank)
    up = tessera.engine.WeightUpdater(sock, "A", rank, agree=tessera.engine.torch_agree(),
                                      timeout_ms=60000)
    seen = {}  # version -> when this rank's node told the engine of it (ms)
    up.client.on_version(lambda new, prev: seen.setdefault(new, time.time() * 1000.0))
    ids, sh = probe_ids(), Shard(rank, 2)
    log = open(os.path.join(args.dir, "worker-%d.jsonl" % rank), "w")
    open(os.path.join(args.dir, "ready-%d" % rank), "w").close()  # the engine is up
    last = None
    while True:
        v = up.start_update(policy="next", wait_ms=200)
        if v is None:
            if last is None and os.path.exists(os.path.join(args.dir, "last")):
                with open(os.path.join(args.dir, "last")) as f:
                    last = int(f.read())
            done = up.agree(1 if last is not None and up.version >= last else 0, "min")
            if done:
                break
            continue
        pin = up.receive()
        W = rank_weights(pin)
        up.finish_update()
        switched_ms = time.time() * 1000.0
        logits = forward(W, ids, exact=True, sh=sh)
        told = [torch.zeros(1, dtype=torch.float64) for _ in range(2)]
        dist.all_gather(told, torch.tensor([seen.get(v, switched_ms)], dtype=torch.float64))
        rec = {"version": v, "switched_ms": switched_ms, "told_ms": [t.item() for t in told]}
        if rank == 0:
            ref = os.path.join(args.dir, "ref-%d.pt" % v)
            deadline = time.monotonic() + 60
            while not os.path.exists(ref) and time.monotonic() < deadline:
                time.sleep(0.01)
            want = torch.load(ref)
            rec["equal"] = bool(torch.equal(logits, want["logits"]))
            rec["export_ms"] = want["export_ms"]
        log.write(json.dumps(rec) + "\n")
        log.flush()
    up.shutdown()
    dist.destroy_process_group()


# ---- the trainer and the programs ------------------------------------------------------------

def start(args, name, argv, env=None):
    log = open(os.path.join(args.dir, name + ".log"), "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=args.dir, env=env)


def wait_line(path, prefix, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.startswith(prefix):
                        return line[len(prefix):].strip()
        time.sleep(0.05)
    raise RuntimeError("%s: no line '%s...' within %d s" % (path, prefix, timeout))


def train(args, tr):
    """Trains on random next-token batches; exports after every step."""
    params = init_params(1)
    opt = torch.optim.AdamW(params.values(), lr=args.lr)
    g = torch.Generator().manual_seed(2)
    ids = probe_ids()
    tick = time.monotonic()
    versions = []
    for step in range(1, args.steps + 1):
        batch = torch.randint(0, VOCAB, (4, SEQ + 1), generator=g)
        logits = forward(params, batch[:, :-1], exact=False)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        exported = {}
        for name, p in params.items():
            w = p.detach().to(torch.bfloat16)
            tr.fill(name, w)
            exported[name] = w.to(torch.float64)
        v = tr.export(step)
        ref = {"logits": forward(exported, ids, exact=True), "export_ms": v.created_ms}
        torch.save(ref, os.path.join(args.dir, "ref-%d.tmp" % v))
        os.rename(os.path.join(args.dir, "ref-%d.tmp" % v), os.path.join(args.dir, "ref-%d.pt" % v))
        versions.append(int(v))
        print("trainer: step %d loss %.4f -> v%d (%s, %d bytes on the wire)" %
              (step, loss.item(), v, v.kind, v.wire_bytes), flush=True)
        tick += args.every_ms / 1000.0
        time.sleep(max(0.0, tick - time.monotonic()))
    with open(os.path.join(args.dir, "last"), "w") as f:
        f.write(str(versions[-1]))
    return versions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every-ms", type=int, default=1000, help="the trainer's clock")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--install", choices=("double", "in-place"), default="double",
                    help="the nodes' install mode (in place: nothing held, the "
                    "engine checks that its ranks agree)")
    ap.add_argument("--rank-lag-ms", type=int, default=0,
                    help="test knob: rank 1's engine hears of each version this much later")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--keep", help="run in this directory and keep it")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        return worker(args, args.worker)
    binp = os.path.abspath(args.bin)
    args.dir = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="tessera-rl-")
    os.makedirs(args.dir, exist_ok=True)
    procs = []

    def run(*a):
        subprocess.run(a, cwd=args.dir, check=True, stdout=subprocess.DEVNULL)

    try:
        run(binp + "/tessera", "keygen", "-o", "trainer")
        run(binp + "/tessera", "keygen", "--cluster", "-o", "cluster.key")
        with open(os.path.join(args.dir, "model.json"), "w") as f:
            json.dump({"tensors": [{"name": n, "dtype": "bf16", "shape": list(s)}
                                   for n, s in model_spec()]}, f)
        procs.append(start(args, "tracker", [
            binp + "/tessera-tracker", "--listen", "127.0.0.1:0", "--state", "state",
            "--cluster-key", "cluster.key", "--trainer-pubkey", "trainer.pub"]))
        url = wait_line(os.path.join(args.dir, "tracker.log"), "listening on ")
        procs.append(start(args, "publisher", [
            binp + "/tessera", "publish", "--tracker", url, "--key", "trainer.key",
            "--cluster-key", "cluster.key", "--trainer", "model.json", "--layout", "fsdp1",
            "--control", "publish.sock", "--log-level", "info"]))
        for r in (0, 1):  # two node agents: the replica's ranks, as on two hosts
            env = dict(os.environ)
            if r == 1 and args.rank_lag_ms:
                env["TESSERA_TEST_ANNOUNCE_LAG_MS"] = str(args.rank_lag_ms)
            procs.append(start(args, "node-A-%d" % r, env=env, argv=[
                binp + "/tessera-node", "--tracker", url, "--replica", "A", "--rank", str(r),
                "--layout", "tp2", "--model", "model.json", "--trainer-pubkey", "trainer.pub",
                "--cluster-key", "cluster.key", "--store", "host", "--metrics", "off",
                "--attach", "A-%d.sock" % r, "--install", args.install, "--log-level", "info"]))
        workers = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r),
                                     "--dir", args.dir, "--bin", binp]) for r in (0, 1)]
        procs += workers
        # The engine first (it serves every version from the first on), then
        # the trainer.
        deadline = time.monotonic() + 120
        for f in ("publish.sock", "ready-0", "ready-1"):
            while not os.path.exists(os.path.join(args.dir, f)):
                if time.monotonic() > deadline:
                    raise RuntimeError("no %s within 120 s (see the logs in %s)" % (f, args.dir))
                if any(w.poll() is not None for w in workers):
                    raise RuntimeError("a worker failed before the first version")
                time.sleep(0.05)
        with tessera.Trainer(os.path.join(args.dir, "publish.sock"), rank=0) as tr:
            versions = train(args, tr)
        for w in workers:
            if w.wait(timeout=120) != 0:
                raise RuntimeError("a worker failed (exit %d)" % w.returncode)
        return report(args, versions)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if not args.keep:
            subprocess.run(["rm", "-rf", args.dir])


def report(args, versions):
    recs = [json.loads(line) for line in open(os.path.join(args.dir, "worker-0.jsonl"))]
    other = {r["version"]: r for r in map(json.loads, open(os.path.join(args.dir, "worker-1.jsonl")))}
    lat, skew, bad = [], [], []
    for r in recs:
        o = other.get(r["version"])
        lat.append(r["switched_ms"] - r["export_ms"])
        skew.append(abs(r["told_ms"][1] - r["told_ms"][0]))
        if not r["equal"] or o is None:
            bad.append(r["version"])
        print("v%d: export -> engine switch %.0f ms; logits %s; the ranks' nodes announced it "
              "%.0f ms apart" % (r["version"], lat[-1], "equal" if r["equal"] else "DIFFER",
                                 skew[-1]))
    seen = [r["version"] for r in recs]
    # Holding nodes keep every version for the engine; in-place ones keep
    # one, so an engine slower than the trainer's clock skips some.
    if (seen != versions if args.install == "double" else
            not set(seen) <= set(versions) or seen != sorted(seen) or seen[-1:] != versions[-1:]):
        print("rl-loop: the engine switched to %s, the trainer published %s" % (seen, versions))
        return 1
    lat.sort()
    skew.sort()
    print("rl-loop: %d versions, logits equal in %d; export -> switch median %.0f ms, worst %.0f ms; "
          "the ranks' nodes announced each version %.0f ms apart (median), %.0f ms at most" %
          (len(recs), len(recs) - len(bad), lat[len(lat) // 2], lat[-1], skew[len(skew) // 2],
           skew[-1]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
