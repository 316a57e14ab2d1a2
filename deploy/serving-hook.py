"""How a vLLM- or SGLang-style engine takes its weights from a tessera node.

Each rank of a serving replica runs next to a tessera-node started with
`--attach /run/tessera/<replica>-<rank>.sock`. The `tessera` Python package
(node/python; ctypes over libtessera-client, numpy optional) attaches to it
and hands out every local tensor of that rank as a numpy array over the
node's shared memory, and tessera.torch as torch tensors (bf16 included):
nothing is copied until the engine copies it.

Two ways to use it, both shown below:

1. Update hook (what RL frameworks add to vLLM/SGLang today): when the
   trainer says "version N is out", every worker waits for N, pins it, loads
   the tensors into the engine's own buffers (`load_weights`, one
   host-to-device copy) and releases the pin. The shape is the familiar
   start update -> receive -> finish update, with a version number.
2. Per-request pinning (engines that read the node's buffers directly, e.g.
   a CPU engine, or the CUDA IPC handle in GPU mode): `acquire()` at request
   admission, `release()` when it finishes; `pin.version` is the version the
   request really ran on, to store with its trajectory. A pinned version
   stays valid while the node switches to newer ones.

This file is an example (it needs torch and an engine); tests/py/ holds the
package's tested use.
"""
import os

import tessera
import tessera.torch  # torch tensors out of tessera (needs torch)


def as_torch(pin, t):
    """Local tensor t as a torch tensor over the node's memory (no copy;
    bf16 too, which numpy lacks)."""
    return tessera.torch.tensor(pin, t.name)


class TesseraWorkerExtension:
    """vLLM: LLM(..., worker_extension_cls="serving_hook.TesseraWorkerExtension"),
    then llm.collective_rpc("tessera_update", args=(version,)) from the
    rollout driver. SGLang: call the same body from a custom
    update_weights handler on each TP worker."""

    def tessera_attach(self, replica, rank=None, sock_dir="/run/tessera"):
        rank = self.rank if rank is None else rank  # the worker's TP rank
        path = os.path.join(sock_dir, "%s-%d.sock" % (replica, rank))
        self.tessera = tessera.Client(path, replica, rank, timeout_ms=60000)

    def tessera_update(self, version, timeout_ms=600000):
        c = self.tessera
        c.wait_version(version, timeout_ms)          # start update
        with c.acquire() as pin:                     # the version stays put
            # load_weights takes checkpoint (HF) names and cuts the worker's
            # share itself: feed it a tp1 node's tensors (whole, q/k/v split
            # back). A node of the engine's own tpN layout holds the shares:
            # tessera.torch.load_into(model, pin, names="fused") copies them
            # straight into vLLM's fused qkv_proj/gate_up_proj parameters.
            weights = tessera.torch.state_dict(pin).items()
            self.model_runner.model.load_weights(weights=weights)  # receive
        self.tessera_version = pin.version           # finish update
        return pin.version


def gpu_tensors(client, pin):
    """GPU mode (tessera-node --store cuda): the version lives in one device
    buffer the node exports with a CUDA IPC handle; each tensor sits at its
    table offset in it. The tessera package stays numpy-only and gives the
    handle as bytes; here CuPy opens it (torch has no public call for it).
    Keep the pin while the tensors are in use."""
    import cupy
    info = client.version_info(pin.version)
    with cupy.cuda.Device(info["cuda_device"]):
        base = cupy.cuda.runtime.ipcOpenMemHandle(info["cuda_ipc_handle"])
        mem = cupy.cuda.UnownedMemory(base, info["size"], client)
        return {t.name: cupy.ndarray((t.nbytes,), cupy.uint8,
                                     cupy.cuda.MemoryPointer(mem, t.offset))
                for t in client.tensors}


def serve_request(client, run):
    """Per-request pinning: the request sees one version from start to end."""
    with client.acquire() as pin:
        out = run(pin)  # read weights through pin.tensor(name)
        return out, pin.version  # record the true version with the trajectory


def follow(client, on_new):
    """An event loop: the socket is readable when a new version is active."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(client.fileno(), selectors.EVENT_READ)
    client.on_version(lambda new, old: on_new(new))
    while True:
        sel.select()
        client.poll()
