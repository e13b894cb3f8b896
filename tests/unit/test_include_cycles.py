#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""No include cycle among the modules of a directory (csi/ by default).

A module is NAME.h with NAME.c; NAME_int.h (its internal header) and a
.c with no header of its own that includes NAME_int.h are part of it
(bridge_place.c, rbd_snap.c); any other file is a module of its own
(main.c, node.c).  Module A depends on module B when a file of A includes
B's header by its plain name ("b.h"; paths with '/' are the library's,
below csi/).  Fails, printing every cycle found (as strongly connected
components), when the dependency graph is not acyclic.

usage: test_include_cycles.py [DIR] [--list]   (--list prints the graph)"""
import os
import re
import sys

INC = re.compile(r'^\s*#\s*include\s+"([^"/]+)\.h"', re.M)


def modules(d):
    """file -> its module's name (see above)."""
    files = sorted(f for f in os.listdir(d) if f.endswith((".c", ".h")))
    heads = {f[:-2] for f in files if f.endswith(".h")}
    owner = {}
    for f in files:
        stem = f[:-2]
        if stem.endswith("_int") and stem[:-4] in heads:
            owner[f] = stem[:-4]
        elif stem in heads:
            owner[f] = stem
        else:
            with open(os.path.join(d, f)) as fh:
                ints = [i[:-4] for i in INC.findall(fh.read())
                        if i.endswith("_int") and i[:-4] in heads]
            owner[f] = ints[0] if ints else stem
    return owner


def graph(d):
    owner = modules(d)
    heads = {f[:-2]: owner[f] for f in owner if f.endswith(".h")}
    g = {m: set() for m in owner.values()}
    for f, m in owner.items():
        with open(os.path.join(d, f)) as fh:
            for inc in INC.findall(fh.read()):
                n = heads.get(inc)
                if n and n != m:
                    g[m].add(n)
    return g


def sccs(g):
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def self_test():
    """The checker finds a planted cycle and passes a chain."""
    assert sccs({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert sccs({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    d = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                          "csi")
    self_test()
    g = graph(d)
    if "--list" in sys.argv:
        for m in sorted(g):
            print("%s -> %s" % (m, " ".join(sorted(g[m]))))
    bad = sccs(g)
    for comp in bad:
        print("include cycle among the modules of %s: %s" % (d, " ".join(comp)))
        for m in comp:
            print("  %s -> %s" % (m, " ".join(sorted(n for n in g[m] if n in comp))))
    if bad:
        sys.exit(1)
    print("%d modules in %s, no include cycle" % (len(g), d))


if __name__ == "__main__":
    main()
