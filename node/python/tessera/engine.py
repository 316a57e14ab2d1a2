"""A weight-update backend for one worker of a tensor-parallel serving engine.

Inference engines take new weights in phases: initialise, start an update
to version V, receive (or map) the weights, finish (switch at a step
boundary), shut down. WeightUpdater gives a worker exactly those phases over
its rank's tessera node, so that wiring tessera into an engine's plugin
interface (vLLM's weight-transfer hooks, SGLang's update_weights handlers)
is a thin adapter:

    up = tessera.engine.WeightUpdater(sock, "A", rank, agree=tessera.engine.torch_agree())
    ...
    # at a step boundary, on every worker of the replica together:
    v = up.start_update()            # the version every rank holds, or None
    if v is not None:
        pin = up.receive()           # exactly v, mapped (views, no copy)
        load(pin)                    # the engine's own loader (or keep the views)
        up.finish_update()           # v serves from now on; older versions go
    stamp = up.record()              # with each request: the version it ran on

The node activates each version on its own loop, so the ranks of a replica
switch at different moments; the updater attaches with holds (the node keeps
every version it sends this worker until the updater drops it) and agrees
with the other workers, through `agree`, on a version all of them hold. agree
is the engine's collective: a callable agree(value, op) with op "min" or
"max" that every worker calls in the same order and that returns the
reduction over all of them (torch_agree() is one over torch.distributed).

On a node that installs in place nothing can be held (one copy): the updater
then pins the active version on each worker and agrees that they match,
retrying until they do (the nodes pause requests while they write).
"""

import time

import tessera

__all__ = ["WeightUpdater", "torch_agree", "alone"]


def alone(value, op):
    """agree for a worker without peers (a tp1 replica)."""
    return value


def torch_agree(group=None):
    """agree over torch.distributed: an all-reduce of one int64 (gloo or nccl;
    with nccl the tensor must live on the worker's GPU: pass device)."""
    import torch
    import torch.distributed as dist

    def agree(value, op):
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX,
                        group=group)
        return int(t.item())

    return agree


class WeightUpdater:
    """One worker's weights: the version it serves and the next one.

    start_update(policy) picks, together with the other workers, the version
    to switch to: "newest" (the newest every worker holds) or "next" (the
    oldest held one newer than the serving version, so that an engine sees
    every version in order). receive() pins it; finish_update() makes it the
    serving version, releases the previous one and drops older holds.
    """

    def __init__(self, sock, replica, rank, agree=alone, timeout_ms=30000, client=None):
        self.client = client or tessera.Client(sock, replica, rank, timeout_ms=timeout_ms,
                                               hold=True)
        self.agree = agree
        self.timeout_ms = timeout_ms
        self.current = None   # the Pin serving now
        self._next = None     # the Pin received, not yet switched to
        self._target = None   # the version start_update chose

    @property
    def version(self):
        """The version this worker serves (0: none yet)."""
        return self.current.version if self.current is not None else 0

    def record(self):
        """The per-request stamp: replica, rank, version, its manifest digest."""
        if self.current is None:
            raise tessera.TesseraError(11, "no version served yet")
        return self.current.record()

    def _held_newer(self):
        self.client.poll(0)
        return [v for v in self.client.prepared if v > self.version]

    def start_update(self, policy="newest", wait_ms=0):
        """Every worker calls it at the same step boundary. Returns the
        version all workers will switch to (None: nothing newer on every
        rank yet, within wait_ms)."""
        if policy not in ("newest", "next"):
            raise ValueError("policy is 'newest' or 'next'")
        if not self.client.holding:
            return self._start_unheld(wait_ms)
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            held = self._held_newer()
            newest = held[-1] if held else 0
            common = self.agree(newest, "min")  # the newest all hold
            if common > self.version:
                if policy == "newest":
                    self._target = common
                else:
                    # The oldest newer version every worker still holds.
                    self._target = self.agree(min(v for v in held if v <= common), "max")
                return self._target
            # Every worker decides together to stop waiting.
            if self.agree(int(time.monotonic() >= deadline), "max"):
                return None
            self.client.poll(min(50, max(1, int((deadline - time.monotonic()) * 1000))))

    def _start_unheld(self, wait_ms):
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            self.client.poll(0)
            active = self.client.active
            lo, hi = self.agree(active, "min"), self.agree(active, "max")
            if lo == hi and lo > self.version:
                self._target = lo
                return lo
            if self.agree(int(time.monotonic() >= deadline), "max"):
                return None
            self.client.poll(min(50, max(1, int(max(0.0, deadline - time.monotonic()) * 1000))))

    def receive(self):
        """Pins the chosen version (a Pin: views of its tensors, no copy)."""
        if self._target is None:
            raise tessera.TesseraError(22, "receive() before start_update() chose a version")
        if self._next is None:
            self._next = self.client.acquire(version=self._target)
        return self._next

    def finish_update(self):
        """The received version serves from now on: the previous pin is
        released and every older hold dropped. Returns the version."""
        pin = self.receive()
        old, self.current, self._next, self._target = self.current, pin, None, None
        if old is not None:
            old.release()
        if self.client.holding:
            for v in self.client.prepared:
                if v < pin.version:
                    self.client.drop(v)
        return pin.version

    def abort_update(self):
        """Gives up the received version (it stays held until dropped)."""
        if self._next is not None:
            self._next.release()
        self._next = self._target = None

    def shutdown(self):
        self.abort_update()
        if self.current is not None:
            self.current.release()
            self.current = None
        self.client.close()
