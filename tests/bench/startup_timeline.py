#!/usr/bin/env python3
"""A version's start-up on one clock: from the manifest's creation to every
reader's first read and first byte.

usage: startup_timeline.py DIR [TRACE]

DIR holds the logs of a run (deploy/netns-cluster.sh --keep DIR, or
`tessera cluster` logs) at TESSERA_LOG=debug: publisher.log's line
"version N start-up, ms from its creation: ..." and each node log's "vN
start-up, ms from the manifest's creation: ..." (at debug). TRACE is the tracker's TESSERA_TRACKER_TRACE
file; its first line "W NS MS" puts its monotonic clock on the wall clock,
and its requests answered from a version's creation until 3 s after it, or
after the last publisher or node step if later, are listed by kind (the
first, median and last answer's last byte written, ms from the creation). Prints, per version, the publisher's steps and, per node step,
the first, median and last rank.
"""
import glob
import os
import re
import sys

PUB = re.compile(r"version (\d+) start-up, ms from its creation: (.*) \(created at (\d+)\)")
NODE = re.compile(r"node (\S+): v(\d+) start-up, ms from the manifest's creation: (.*)")
STEP = re.compile(r"([a-z][a-z -]*?) (-|-?\d+)(?:,|$)")


def steps(text):
    return [(k.strip(), None if v == "-" else int(v)) for k, v in STEP.findall(text)]


def kind(uri):
    path = uri.split("?")[0]
    if path.endswith("/manifest"):
        return "GET manifest"
    for k in ("/versions", "/sources", "/replicas", "/offers", "/nodes/state", "/layouts",
              "/heartbeat", "/holders", "/addenda"):
        if k in path:
            return k[1:]
    return path.replace("/api/v1/", "", 1)


def spread(xs):
    xs = sorted(xs)
    if not xs:
        return "-"
    return "%d / %d / %d (n=%d)" % (xs[0], xs[len(xs) // 2], xs[-1], len(xs))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    pub, nodes = {}, {}
    for f in sorted(glob.glob(os.path.join(d, "*.log"))):
        for line in open(f, errors="replace"):
            m = PUB.search(line)
            if m:
                pub[int(m.group(1))] = (int(m.group(3)), steps(m.group(2)))
            m = NODE.search(line)
            if m:
                nodes.setdefault(int(m.group(2)), []).append(steps(m.group(3)))
    trace = []
    if len(sys.argv) > 2:
        anchor = None
        for line in open(sys.argv[2], errors="replace"):
            w = line.split()
            if w and w[0] == "W" and anchor is None:
                anchor = (int(w[1]), int(w[2]))
            elif w and w[0] == "R" and anchor is not None and len(w) >= 8:
                method, uri = w[6], w[7]
                if "wait_ms" in uri and method == "GET" and "/versions" in uri:
                    k = "watch answered"
                else:
                    k = method + " " + kind(uri) if not kind(uri).startswith("GET") else kind(uri)
                wall = anchor[1] + (int(w[4]) - anchor[0]) / 1e6
                head = anchor[1] + (int(w[1]) - anchor[0]) / 1e6
                trace.append((wall, head, k))
    for v in sorted(set(pub) | set(nodes)):
        print("v%d" % v)
        created = None
        if v in pub:
            created, st = pub[v]
            print("  publisher: " + ", ".join("%s %s" % (k, x) for k, x in st))
        if created is not None and trace:
            # A loaded machine's publish can take over 3 s: the window
            # reaches past the version's last step.
            last = [x for _, x in st if x is not None]
            last += [x for r in nodes.get(v, []) for _, x in r if x is not None]
            span = max([3000] + [x + 1000 for x in last])
            byk = {}
            for wall, head, k in trace:
                if created <= wall <= created + span:
                    byk.setdefault(k, []).append(wall - created)
            for k in sorted(byk, key=lambda k: min(byk[k])):
                print("  tracker %-20s written: %s" % (k, spread([int(x) for x in byk[k]])))
        if v in nodes:
            names = [k for k, _ in nodes[v][0]]
            print("  nodes (first / median / last rank, ms from creation):")
            for i, k in enumerate(names):
                xs = [r[i][1] for r in nodes[v] if i < len(r) and r[i][1] is not None]
                print("    %-12s %s" % (k, spread(xs)))


if __name__ == "__main__":
    main()
