#!/usr/bin/env python3
"""Outsider attacks on a tessera-tracker, at the scale they were found.

Starts the tracker given by --bin (its own state directory, loopback, a
cluster key so that it runs as deployed), attacks it from 127.0.0.1 as an
outsider (no key) and measures, from 127.0.0.2, what a legitimate client
gets. Prints one line per attack: what the tracker held (connections,
resident memory, its peak) and what the legitimate client got. The same
command on an older build gives the "before" row. Nothing here asserts:
test_tracker's flood tests are the checks; this is the figure at full scale.

  tests/bench/attack_tracker.py --bin build/bin [--attack lockout|onebyte|bodies|all]

  lockout  4 200 connections kept open, each holding an unauthenticated
           watch (pipelined twice) or a PUT with part of a 1 MiB body,
           reopened as soon as one is closed; 40 fresh GETs of
           /api/v1/status from another address, 3 s each.
  onebyte  16 PUTs whose request line ends in a space, each declaring
           63 MiB and sending it as fast as the tracker reads it, 10 s.
  bodies   1 000 unauthenticated PUTs of a whole 1 MiB body, kept open.
"""
import argparse
import os
import resource
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time

WATCH = (b"GET /api/v1/versions?after=999999999&wait_ms=30000 HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
PUT_PART = (b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n" + b"0123456789abcdef" * 2)


def proc_figures(pid):
    """(resident MiB, peak resident MiB, open descriptors) of a process."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return rss, hwm, len(os.listdir(f"/proc/{pid}/fd"))


def connect(port, src="127.0.0.1", timeout=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def is_open(s):
    """Whether the tracker still holds a flood connection: what it sent
    (an answer, a refusal) is read away; EOF or a reset means closed."""
    try:
        while True:
            pl = select.poll()
            pl.register(s, select.POLLIN)
            if not pl.poll(0):
                return True
            if len(s.recv(65536, socket.MSG_DONTWAIT)) == 0:
                return False
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def held_and_close(conns, pid):
    """How many of conns the tracker still holds, its figures; closes them."""
    kept = sum(is_open(s) for s in conns)
    figures = proc_figures(pid)
    for s in conns:
        s.close()
    return (kept,) + figures


def wait_writable(conns, ms):
    """The connections among conns that can take bytes within ms."""
    pl = select.poll()
    for s in conns:
        pl.register(s, select.POLLOUT)
    ready = {fd for fd, ev in pl.poll(ms)}
    return [s for s in conns if s.fileno() in ready]


def fresh_get(port):
    """One legitimate GET from another address: True when answered 200."""
    try:
        s = connect(port, "127.0.0.2", 3.0)
        s.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = s.recv(64)
        s.close()
        return head.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def top_up(port, held, target, says):
    """Replaces closed flood connections and opens up to target."""
    alive = [s for s in held if is_open(s)]
    for s in held:
        if s not in alive:
            s.close()
    while len(alive) < target:
        try:
            s = connect(port, timeout=0.5)
            s.sendall(says[len(alive) % len(says)])
            s.setblocking(False)
            alive.append(s)
        except OSError:
            break
    return alive


def attack_lockout(port, pid):
    held = top_up(port, [], 4200, [WATCH, PUT_PART])
    served = 0
    for i in range(40):
        served += fresh_get(port)
        if i % 5 == 4:
            held = top_up(port, held, 4200, [WATCH, PUT_PART])
    time.sleep(2)  # the tracker's sweep judges every connection within a second
    kept, rss, hwm, fds = held_and_close(held, pid)
    return (f"lockout: 4 200 held watches and PUT bodies: {served} of 40 fresh GETs served; "
            f"{kept} flood connections still held; tracker {fds} descriptors, "
            f"{rss:.0f} MiB resident (peak {hwm:.0f} MiB)")


def attack_onebyte(port, pid):
    base = proc_figures(pid)[0]
    head = b"PUT / HTTP/1.1 \r\nHost: x\r\nContent-Length: 66060288\r\n\r\n"
    conns = []
    for _ in range(16):
        s = connect(port, timeout=0.5)
        s.sendall(head)
        s.setblocking(False)
        conns.append(s)
    chunk = b"\0" * 65536
    sent = [0] * len(conns)
    refused = set()
    end = time.monotonic() + 10
    while time.monotonic() < end:
        for s in wait_writable([c for c in conns if c not in refused], 200):
            i = conns.index(s)
            if sent[i] >= 66060288:
                continue
            try:
                sent[i] += s.send(chunk)
            except OSError:
                refused.add(s)
    kept, rss, hwm, _ = held_and_close(conns, pid)
    return (f"onebyte: 16 PUTs with a trailing space, 63 MiB each: {sum(sent) / 2**20:.0f} MiB "
            f"sent, {kept} of 16 still open after 10 s; tracker {base:.0f} -> {rss:.0f} MiB "
            f"resident (peak {hwm:.0f} MiB)")


def attack_bodies(port, pid):
    base = proc_figures(pid)[0]
    body = b"x" * 1048576
    conns, sent = [], 0
    for _ in range(1000):
        try:
            s = connect(port, timeout=2.0)
            s.sendall(b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
            s.setblocking(False)
            conns.append(s)
            n = 0
            end = time.monotonic() + 0.2
            while n < len(body) and time.monotonic() < end:
                try:
                    n += s.send(body[n:n + 262144])
                except BlockingIOError:
                    wait_writable([s], 50)
            sent += n
        except OSError:
            continue
    time.sleep(2)
    kept, rss, hwm, _ = held_and_close(conns, pid)
    return (f"bodies: 1 000 unauthenticated 1 MiB PUTs: {sent / 2**20:.0f} MiB sent, "
            f"{kept} still open; tracker {base:.0f} -> {rss:.0f} MiB resident (peak {hwm:.0f} MiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin", help="directory holding tessera-tracker")
    ap.add_argument("--attack", default="all", choices=["lockout", "onebyte", "bodies", "all"])
    a = ap.parse_args()
    tracker = os.path.join(a.bin, "tessera-tracker")
    tessera = os.path.join(a.bin, "tessera")
    for b in (tracker, tessera):
        if not os.access(b, os.X_OK):
            sys.exit(f"attack_tracker: {b} not built (run make)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10000:
        sys.exit(f"attack_tracker: the descriptor limit is {hard}; 10 000 are needed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    d = tempfile.mkdtemp(prefix="tessera-attack.")
    procs = []
    try:
        subprocess.run([tessera, "keygen", "--cluster", "-o", f"{d}/cluster.key"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        attacks = ["lockout", "onebyte", "bodies"] if a.attack == "all" else [a.attack]
        for name in attacks:  # a fresh tracker per attack: one's memory is not the next one's
            log = open(f"{d}/{name}.log", "w")
            p = subprocess.Popen([tracker, "--listen", "127.0.0.1:0", "--state", f"{d}/state-{name}",
                                  "--cluster-key", f"{d}/cluster.key"],
                                 stdout=subprocess.PIPE, stderr=log, text=True)
            procs.append(p)
            line = p.stdout.readline()
            if not line.startswith("listening on "):
                sys.exit(f"attack_tracker: the tracker did not start: {open(log.name).read()}")
            port = int(line.strip().rsplit(":", 1)[1])
            print(globals()[f"attack_{name}"](port, p.pid), flush=True)
            p.terminate()
            p.wait(10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
