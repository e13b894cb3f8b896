#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""unit/lib_layers: the shared library's layering (docs/files.md) holds.

Fails when, under qsdctl/lib/qsd/:
- base/ includes a header of another layer, vhost/ a qemu/ or state/ one,
  or qemu/ a state/ one (state/, the plugin's records, is the top);
- two qemu/ modules (a .c and its .h) include each other, directly or round
  a longer cycle;
- pool, the bottom of qemu/'s storage side, includes a qemu/ header other
  than layers.h, or the pure option builder (qsdopts) one other than rbdsrc.h.
The check runs on a planted tree first, so it is known to be able to fail.
Usage: lib_layers.py SOURCE_ROOT"""
import os
import re
import sys
import tempfile

INC = re.compile(r'^\s*#\s*include\s+"qsd/(base|qemu|vhost|state)/(\w+)\.h"', re.M)
ALLOWED = {"pool": {"layers"}, "qsdopts": {"rbdsrc"}}


def includes(lib):
    """{(layer, module): {(layer, module) it includes}} over lib's files."""
    g = {}
    for layer in ("base", "qemu", "vhost", "state"):
        d = os.path.join(lib, layer)
        for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if not f.endswith((".c", ".h")):
                continue
            me = (layer, f[:-2])
            with open(os.path.join(d, f), encoding="utf-8") as fh:
                deps = set(INC.findall(fh.read()))
            g.setdefault(me, set()).update(deps - {me})
    return g


def cycle_from(g, start):
    """A path start -> ... -> start within qemu/, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for dep in sorted(g.get(node, ())):
            if dep[0] != "qemu":
                continue
            if dep == start:
                return path + [dep]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, path + [dep]))
    return None


def problems(lib):
    g, out = includes(lib), []
    for (layer, mod), deps in sorted(g.items()):
        for dl, dm in sorted(deps):
            if layer == "base" and dl != "base":
                out.append(f"base/{mod} includes {dl}/{dm}.h (base is the bottom layer)")
            if layer == "vhost" and dl in ("qemu", "state"):
                out.append(f"vhost/{mod} includes {dl}/{dm}.h")
            if layer == "qemu" and dl == "state":
                out.append(f"qemu/{mod} includes state/{dm}.h (state is the top layer)")
            if layer == "qemu" and mod in ALLOWED and dl == "qemu" and dm not in ALLOWED[mod]:
                out.append(f"qemu/{mod} includes qemu/{dm}.h (allowed: {sorted(ALLOWED[mod])})")
    reported = set()
    for node in sorted(g):
        if node[0] != "qemu":
            continue
        c = cycle_from(g, node)
        if c and frozenset(c) not in reported:
            reported.add(frozenset(c))
            out.append("include cycle: " + " -> ".join(m for _, m in c))
    return out


def plant(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)


def main():
    root = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        plant(tmp, {
            "base/a.c": '#include "qsd/qemu/x.h"\n',
            "qemu/x.c": '#include "qsd/qemu/y.h"\n',
            "qemu/y.h": '#include "qsd/qemu/x.h"\n',
            "qemu/pool.c": '#include "qsd/qemu/layers.h"\n#include "qsd/qemu/thin.h"\n',
            "qemu/z.c": '#include "qsd/qemu/layers.h"\n#include "qsd/state/s.h"\n',
            "state/s.c": '#include "qsd/qemu/layers.h"\n',
        })
        got = problems(tmp)
        want = ["base/a includes qemu/x.h", "include cycle: x -> y -> x",
                "qemu/pool includes qemu/thin.h", "qemu/z includes state/s.h"]
        missing = [w for w in want if not any(p.startswith(w) for p in got)]
        if missing or len(got) != len(want):
            print(f"FAIL: the check itself is broken on a planted tree: {got}", file=sys.stderr)
            return 1
    got = problems(os.path.join(root, "qsdctl", "lib", "qsd"))
    if got:
        print("FAIL: the library's layering is broken:", file=sys.stderr)
        for p in got:
            print("  " + p, file=sys.stderr)
        return 1
    print("ok: base < qemu < state, base < vhost; pool at the bottom of qemu/; no include cycle in qemu/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
