#!/usr/bin/env python3
"""The structure checks of the test command: import cycles and layer order, at three levels.

1. Files: an edge a -> b when the file of module a names an item of module b (`use crate::…`,
   `super::…`, paths in code). Child modules naming their parent are parent/child, not peers,
   and are left out.
2. Sibling modules, inside every module at every depth (the crate root's children, the top-level
   modules, included): for each module m, the file edges between two of its descendants, each
   end collapsed to the child of m that holds it (inside `client`, `client::discovery::follow ->
   client::target` becomes `discovery -> target`). A cycle here is what a reader cannot untangle
   even when every file is acyclic (metrics -> outbound::routes, outbound::x -> metrics).
   Where the crate root's doc comment says `//! Layers: a → b | c → d` (each layer may name only
   the layers before it; `|` separates peers that may not name each other), every top-level
   module must be listed and every edge must point to an earlier layer.
3. Crates: `cargo metadata` gives the workspace's own dependency edges (normal, dev and build;
   a crate's dev-dependency on itself, for features, is allowed). No cycles, and where the root
   Cargo.toml has `[workspace.metadata.crate-layers] order = ["a", "b | c", …]`, every edge
   points to an earlier entry and every workspace crate is listed.

Test code may reach anywhere: `tests.rs`/`tests/` modules and what follows `#[cfg(test)] mod
tests` are left out. Exit 1 when anything is found.
Usage: scripts/module-cycles.py [CRATE_DIR ...] (default: every workspace crate, and the crate graph);
scripts/module-cycles.py --self-test (plants cycles in a scratch crate and checks they are found)."""
import json, os, re, subprocess, sys

try:
    import tomllib
except ImportError:  # Python < 3.11: the crate layers are then read from cargo metadata only
    tomllib = None


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand_use_trees(text):
    """Rewrites every `use` tree (`use crate::{a::{b, c}, d as e};`) into plain paths, one per
    leaf, so the path scan below sees `crate::a::b crate::a::c crate::d`."""
    out, pos = [], 0
    for m in re.finditer(r"\buse\s+([^;]*);", text):
        out.append(text[pos : m.start()])
        out.append(" ".join(flatten(m.group(1).replace("\n", " "))) + ";")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def flatten(tree, prefix=""):
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        leaf = tree.split(" as ")[0].strip()
        if leaf in ("self", ""):
            return [prefix.rstrip(":")] if prefix else []
        return [prefix + leaf]
    head, body = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    paths = []
    for item in items:
        if item.strip():
            paths.extend(flatten(item, prefix + head.strip()))
    return paths


PATH = re.compile(r"\b(crate|super)((?:::\w+)+)")


def is_module(src, parts):
    return os.path.exists(os.path.join(src, *parts) + ".rs") or os.path.exists(os.path.join(src, *parts, "mod.rs"))


def edges(src):
    """File-level module graph of one crate's src/."""
    graph = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            me = module_of(src, path)
            if "tests" in me or (me and me[0] == "bin"):
                continue
            text = strip_comments(open(path, encoding="utf-8").read())
            text = re.split(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod tests", text)[0]
            text = expand_use_trees(text)
            for kind, rest in PATH.findall(text):
                segs = [s for s in rest.split("::") if s]
                if kind == "crate":
                    target = ()
                else:
                    # `super` of a/b.rs and of a/b/mod.rs alike is a.
                    target = me[:-1]
                    while segs and segs[0] == "super":
                        target = target[:-1]
                        segs = segs[1:]
                best = target
                for s in segs:
                    if is_module(src, best + (s,)):
                        best = best + (s,)
                    else:
                        break
                if best != me and me[: len(best)] != best and best[: len(me)] != me:
                    graph.setdefault(me, set()).add(best)
    return graph


def siblings(graph):
    """The file graph collapsed, inside each module, to that module's children: {parent: graph of
    its children}. The parent's own file (its wiring) is left out, as are edges leaving it. The
    crate root's entry, `()`, is the top-level module graph."""
    levels = {}
    for a, bs in graph.items():
        for b in bs:
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common < len(a) and common < len(b):
                parent = a[:common]
                levels.setdefault(parent, {}).setdefault(a[: common + 1], set()).add(b[: common + 1])
    return levels


def self_test():
    """Runs the check on two scratch crates: one with planted sibling cycles that no file cycle
    shows (`a::x::p -> a::y` with `a::y::q -> a::x`, one level down; `b::m -> c` with `c::n -> b`,
    at the top), which must fail naming both, and the same crate without them, which must pass."""
    import tempfile

    def check(files):
        d = tempfile.mkdtemp(prefix="module-cycles-")
        for rel, text in files.items():
            path = os.path.join(d, "src", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w", encoding="utf-8").write(text)
        run = subprocess.run([sys.executable, os.path.abspath(__file__), d], capture_output=True, text=True)
        return run.returncode, run.stdout

    clean = {
        "lib.rs": "mod a;\nmod b;\nmod c;\n",
        "a/mod.rs": "mod x;\nmod y;\n",
        "a/x/mod.rs": "mod p;\npub struct X;\n",
        "a/x/p.rs": "use crate::a::y::Y;\n",
        "a/y/mod.rs": "mod q;\npub struct Y;\n",
        "a/y/q.rs": "pub fn f() {}\n",
        "b/mod.rs": "mod m;\npub struct B;\n",
        "b/m.rs": "use crate::c::C;\n",
        "c/mod.rs": "mod n;\npub struct C;\n",
        "c/n.rs": "pub fn g() {}\n",
    }
    planted = dict(clean, **{"a/y/q.rs": "use super::super::x::X;\n", "c/n.rs": "use crate::b::B;\n"})
    failures = []
    code, out = check(planted)
    for want in ("module cycle inside a: a::x <-> a::y", "module cycle inside crate root: b <-> c", "0 file cycles, 2 module cycles"):
        if want not in out:
            failures.append(f"planted cycles: expected `{want}` in:\n{out}")
    if code != 1:
        failures.append(f"planted cycles: exit status {code}, expected 1")
    code, out = check(clean)
    if code != 0:
        failures.append(f"clean crate: exit status {code}, expected 0:\n{out}")
    for f in failures:
        print("self-test: " + f)
    print("self-test: " + ("FAILED" if failures else "planted sibling cycles (top level and one level down) fail the check; the clean crate passes"))
    return 1 if failures else 0


def cycles(graph):
    found, index, low, stack, on, n = [], {}, {}, [], set(), [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    return found


def parse_layers(spec):
    """`a → b | c -> d` -> {a: 0, b: 1, c: 1, d: 2}."""
    rank = {}
    for i, layer in enumerate(re.split(r"\s*(?:→|->)\s*", spec.strip())):
        for name in layer.split("|"):
            if name.strip():
                rank[name.strip()] = i
    return rank


def declared_modules(root_file):
    text = strip_comments(open(root_file, encoding="utf-8").read())
    text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
    return {m for m in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, flags=re.M) if m != "tests"}


def check_layers(crate, src, top):
    root = next((os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))), None)
    if root is None:
        return 0
    m = re.search(r"^//!\s*Layers:\s*(.+)$", open(root, encoding="utf-8").read(), flags=re.M)
    if not m:
        return 0
    rank, bad = parse_layers(m.group(1)), 0
    for name in sorted(declared_modules(root) - set(rank)):
        bad += 1
        print(f"{crate}: module `{name}` is in no layer of the `Layers:` line of {os.path.relpath(root)}")
    for name in sorted(set(rank) - declared_modules(root)):
        bad += 1
        print(f"{crate}: the `Layers:` line names `{name}`, which is no module of {os.path.relpath(root)}")
    for (a,), bs in sorted(top.items()):
        for (b,) in sorted(bs):
            if a in rank and b in rank and rank[b] >= rank[a]:
                bad += 1
                how = "its peer" if rank[a] == rank[b] else "a later layer"
                print(f"{crate}: layer violation: {a} names {b}, {how}")
    return bad


def crate_graph(top):
    run = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
                         cwd=top, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"cargo metadata failed:\n{run.stderr}")
    meta = json.loads(run.stdout)
    names = {p["name"] for p in meta["packages"]}
    graph = {n: set() for n in names}
    for p in meta["packages"]:
        for d in p["dependencies"]:
            if d["name"] in names and d["name"] != p["name"]:
                graph[p["name"]].add(d["name"])
    order = ((meta.get("metadata") or {}).get("crate-layers") or {}).get("order")
    return graph, order


def check_crates(top):
    graph, order = crate_graph(top)
    bad = 0
    for comp in cycles(graph):
        bad += 1
        print("crates: dependency cycle: " + " <-> ".join(comp))
    if order:
        rank = parse_layers(" → ".join(order))
        for name in sorted(set(graph) - set(rank)):
            bad += 1
            print(f"crates: `{name}` is in no entry of [workspace.metadata.crate-layers] order")
        for a, bs in sorted(graph.items()):
            for b in sorted(bs):
                if a in rank and b in rank and rank[b] >= rank[a]:
                    bad += 1
                    print(f"crates: layer violation: {a} depends on {b}")
    return bad


def main():
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    crates = args or sorted(d for d in os.listdir(top) if os.path.isfile(os.path.join(top, d, "Cargo.toml")) and os.path.isdir(os.path.join(top, d, "src")))
    if not crates:
        print(f"no crates found under {top}: run the script from the repository's scripts/ folder")
        return 1
    files = mods = layers = 0
    for c in crates:
        src = os.path.join(top, c, "src")
        graph = edges(src)
        for comp in cycles(graph):
            files += 1
            print(f"{c}: file import cycle: " + " <-> ".join("::".join(m) or "crate" for m in comp))
        levels = siblings(graph)
        for parent, level in sorted(levels.items()):
            for comp in cycles(level):
                mods += 1
                inside = "::".join(parent) or "crate root"
                print(f"{c}: module cycle inside {inside}: " + " <-> ".join("::".join(m) for m in comp))
        layers += check_layers(c, src, levels.get((), {}))
    crates_bad = 0 if args else check_crates(top)
    print(f"{files} file cycles, {mods} module cycles, {layers} layer violations, {crates_bad} crate-graph problems")
    return 1 if files or mods or layers or crates_bad else 0


sys.exit(main())
