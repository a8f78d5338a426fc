#!/usr/bin/env python3
"""Import cycles between the modules of each crate, from `use crate::…` / `super::…` paths.

A module here is a file under src/ (mod.rs names its directory). An edge a -> b means a names an
item of b. Child modules naming their parent (`super::`) are parent/child, not peers, and are
left out; cycles among peers are what make code hard to test and move. Exit 1 when any exist.
Usage: scripts/module-cycles.py [CRATE_DIR ...] (default: every workspace crate)."""
import os, re, sys

def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)

USE = re.compile(r"\b(crate|super)((?:::\w+)+)")

def edges(src):
    graph = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            me = module_of(src, path)
            if me and me[-1] == "tests":  # test modules may reach anywhere
                continue
            text = re.sub(r"//[^\n]*", "", open(path, encoding="utf-8").read())
            # Stop at the test module: tests may name what they like.
            text = text.split("#[cfg(test)]\nmod tests")[0]
            # `use super::{a, b::c}` names a, b::c: expand one level of braces.
            text = re.sub(r"\b((?:crate|super)(?:::\w+)*)::\{([^{}]*)\}",
                          lambda m: " ".join(f"{m.group(1)}::{i.strip().split(' ')[0]}" for i in m.group(2).split(",") if i.strip()), text)
            for kind, rest in USE.findall(text):
                segs = [s for s in rest.split("::") if s]
                if kind == "crate":
                    target = ()
                else:
                    base = me if os.path.basename(path) in ("mod.rs", "lib.rs") else me[:-1]
                    target = base
                    while segs and segs[0] == "super":
                        target = target[:-1]
                        segs = segs[1:]
                # The longest prefix that is a module file.
                best = target
                for s in segs:
                    cand = best + (s,)
                    if os.path.exists(os.path.join(src, *cand) + ".rs") or os.path.exists(os.path.join(src, *cand, "mod.rs")):
                        best = cand
                    else:
                        break
                if best != me and me[: len(best)] != best and best[: len(me)] != me:
                    graph.setdefault(me, set()).add(best)
    return graph

def cycles(graph):
    found, index, low, stack, on, n = [], {}, {}, [], set(), [0]
    def strong(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            strong(v)
    return found

def main():
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crates = sys.argv[1:] or sorted(d for d in os.listdir(top) if os.path.isfile(os.path.join(top, d, "Cargo.toml")) and os.path.isdir(os.path.join(top, d, "src")))
    bad = 0
    for c in crates:
        for comp in cycles(edges(os.path.join(top, c, "src"))):
            bad += 1
            print(f"{c}: import cycle: " + " <-> ".join("::".join(m) or "crate" for m in comp))
    print(f"{bad} import cycles")
    return 1 if bad else 0

sys.exit(main())
