#!/usr/bin/env python3
"""A fanout run's timeline, per node and per source, from its logs.

Run one version through deploy/netns-cluster.sh with the nodes at debug
level, keeping the logs and the link counters:

    mkdir -p DIR
    TESSERA_LOG=debug deploy/netns-cluster.sh --replica tp1 ... --versions 1 \\
        --rate 100mbit --synthetic-mb 128 --keep DIR --links DIR/links.tsv
    tests/bench/fanout_timeline.py DIR [STEP_MS]

Prints, from the trainer's first busy sample on (every STEP_MS, 250 by
default): the trainer's uplink and every node's downlink and uplink
(MB/s, the switch ports' counters); per node the reads in flight to the
trainer and to peers, and the reads queued on it as a source (from its
"post" and "verified" lines); how many nodes hold each chunk (a histogram
over the version's chunks: 0, 1, .. N holders); then when the trainer's
last chunk and the last chunk landed, the chunks the trainer sent more than
once, the chunks taken from another reader's share (agent_swarm_steal),
and a relay hop's two parts: discovery (holder verified -> reader posts)
and transfer (post -> verified), as quartiles.
"""
import collections
import datetime
import glob
import re
import statistics
import sys

POST = re.compile(r'^(\S+) debug .*node (R\d+)/\d+: post (\d+)/(\d+) from (\S+)')
VERIFIED = re.compile(r'^(\S+) debug .*node (R\d+)/\d+: v\d+ chunk (\d+) of parcel '
                      r'\d+<-(\d+) verified, from (\S+)')
STOLEN = re.compile(r'^(\S+) debug .*node (R\d+)/\d+: parcel \d+: our chunks have left the trainer')


def wall_ms(stamp):
    t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    return int(t.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)


def events(keep):
    """(ms, kind, node, chunk key, source) from every node log, in time order.
    A post names its parcel by index, a verified line by its source rank:
    with one destination rank per node (TP1) they are the same."""
    ev = []
    for path in glob.glob(keep + "/node-R*.log"):
        for line in open(path, errors="replace"):
            m = POST.match(line)
            if m:
                ev.append((wall_ms(m[1]), "post", m[2], (int(m[3]), int(m[4])), m[5]))
                continue
            m = VERIFIED.match(line)
            if m:
                ev.append((wall_ms(m[1]), "ver", m[2], (int(m[4]), int(m[3])), m[5]))
                continue
            m = STOLEN.match(line)
            if m:
                ev.append((wall_ms(m[1]), "stolen", m[2], None, None))
    ev.sort(key=lambda e: e[0])
    return ev


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    keep = sys.argv[1]
    step = int(sys.argv[2]) if len(sys.argv) > 2 else 250
    try:
        links = [list(map(int, x.split())) for x in open(keep + "/links.tsv") if x.strip()]
    except OSError as e:
        sys.exit("%s: %s (a deploy/netns-cluster.sh run with --links DIR/links.tsv; "
                 "`tessera cluster` keeps no link counters)" % (sys.argv[0], e))
    nn = (len(links[0]) - 2) // 2
    nodes = ["R%d" % (i + 1) for i in range(nn)]
    first = next(i for i in range(1, len(links)) if links[i][1] - links[i - 1][1] > 100000) - 1
    t0 = links[first][0]
    ev = events(keep)
    if not ev:
        sys.exit("no post/verified lines: were the nodes at TESSERA_LOG=debug?")
    chunks = {e[3] for e in ev if e[1] == "ver"}
    is_pub = lambda src: not re.match(r'R\d+/\d+$', src)

    print("t (s) from the trainer's first busy sample; rates MB/s over %d ms" % step)
    print("   t  trainer | down %s | up %s" % (" ".join("%5s" % n for n in nodes),
                                               " ".join("%5s" % n for n in nodes)))
    per = max(1, round(step / max(1, links[1][0] - links[0][0])))
    for i in range(first, len(links) - per, per):
        a, b = links[i], links[i + per]
        dt = (b[0] - a[0]) / 1000
        down = [(b[2 + k] - a[2 + k]) / dt / 1e6 for k in range(nn)]
        up = [(b[2 + nn + k] - a[2 + nn + k]) / dt / 1e6 for k in range(nn)]
        tr = (b[1] - a[1]) / dt / 1e6
        if sum(down) < 0.5 and tr < 0.1 and i > first + 20 * per:
            break
        print("%5.2f %7.1f | down %s | up %s" % ((a[0] - t0) / 1000, tr,
                                                 " ".join("%5.1f" % x for x in down),
                                                 " ".join("%5.1f" % x for x in up)))

    print("\nreads in flight per node (to the trainer / to peers), reads queued on each node"
          " as a source, and chunks by number of holders (0..%d)" % nn)
    inflight = collections.Counter()
    out = {}
    holders = collections.Counter()
    due = t0
    for e in ev + [(float("inf"), "end", None, None, None)]:
        while e[0] >= due and due <= ev[-1][0] + step:
            trn = [sum(v for (n, s), v in inflight.items() if n == x and is_pub(s)) for x in nodes]
            peer = [sum(v for (n, s), v in inflight.items() if n == x and not is_pub(s))
                    for x in nodes]
            served = [sum(v for (n, s), v in inflight.items() if s.split("/")[0] == x)
                      for x in nodes]
            hist = [0] * (nn + 1)
            for c in chunks:
                hist[min(nn, holders[c])] += 1
            print("%5.2f trainer %s peers %s queued-on %s holders %s" % (
                (due - t0) / 1000, trn, peer, served, hist))
            due += step
        t, kind, node, key, src = e
        if kind == "post":
            inflight[(node, src)] += 1
            out[(node, key, src)] = t
        elif kind == "ver":
            if out.pop((node, key, src), None) is not None:
                inflight[(node, src)] -= 1
            holders[key] += 1

    ver = [e for e in ev if e[1] == "ver"]
    from_trainer = [e for e in ver if is_pub(e[4])]
    last_tr = max(e[0] for e in from_trainer) if from_trainer else t0
    print("\ntrainer's last chunk landed at %.2f s, the last chunk at %.2f s: %.2f s of tail"
          % ((last_tr - t0) / 1000, (ver[-1][0] - t0) / 1000, (ver[-1][0] - last_tr) / 1000))
    # A relay hop: from the holder's verified line to the reader's post of
    # the same chunk to it (discovery: its have-page, then room in the
    # reader's window there), and from that post to the reader's verified
    # line (the bytes queued on the holder's uplink).
    landed = {(e[2], e[3]): e for e in ver}
    seen, queued, trainer = [], [], []
    for t, kind, node, key, src in ev:
        got = landed.get((node, key)) if kind == "post" else None
        if got is None or got[4] != src:
            continue
        if is_pub(src):
            trainer.append(got[0] - t)
            continue
        queued.append(got[0] - t)
        held = landed.get((src.split("/")[0], key))
        if held is not None:
            seen.append(t - held[0])
    quart = lambda a: "/".join("%d" % q for q in statistics.quantiles(a, n=4)) if len(a) > 1 else "-"
    print("relay hop quartiles (ms): holder verified -> reader posts %s; post -> verified %s"
          " (%d reads); from the trainer post -> verified %s" % (quart(seen), quart(queued),
                                                                  len(queued), quart(trainer)))
    twice = collections.Counter(e[3] for e in from_trainer)
    print("chunks the trainer sent more than once: %d; taken from another reader's share: %d"
          % (sum(1 for v in twice.values() if v > 1), sum(1 for e in ev if e[1] == "stolen")))


if __name__ == "__main__":
    main()
