#!/usr/bin/env python3
"""Checks that the source tree keeps the layering of DESIGN.md "Layout of the source tree".

Reads two graphs of the code under controller/ worker/ runtime/ transport/ kernels/ proto/ (not
tests/ or bench/):
  - the include graph: every #include of a project file (and of gRPC, protobuf and CUDA headers),
    with the file and line it is on;
  - the CMake link graph: add_library/add_executable and target_link_libraries of the
    CMakeLists.txt in those folders (every branch of an if(): an edge in any configuration counts),
    followed transitively, since a library linked through another is linked all the same.
Each edge is mapped to components (controller, controller/cli, worker, runtime/<folder>, kernels,
proto, and the externals ext:cuda, ext:grpc, ext:protobuf) and checked against RULES. Folders of
runtime/ must also form a DAG. Prints every violation with its file and line (or the target and the
link path) and exits 1 if there is any.

Usage: check_layering.py [--root DIR]   (DIR: the repository root; default: two levels up)
"""

import argparse
import fnmatch
import os
import re
import sys

SOURCE_DIRS = ("controller", "worker", "runtime", "transport", "kernels", "proto")
SOURCE_EXTS = (".h", ".cc", ".cu", ".cuh")
PROJECT = "controller*|worker|runtime*|transport|kernels|proto"

# The forbidden edges: (from, to, unless, why). A dependency of a `from` component on a `to`
# component is a violation unless it also matches `unless`. Patterns: fnmatch globs joined by "|".
RULES = [
    ("kernels", PROJECT, "kernels",
     "kernels/ is the leaf: no project dependencies"),
    ("proto", PROJECT, "proto",
     "proto/ is generated code below everything else"),
    ("runtime*", "proto|ext:grpc|ext:protobuf|transport", "",
     "runtime/ has no gRPC and no protobuf: it is a library a user could embed"),
    ("transport", PROJECT, "transport|runtime/base",
     "transport/ (gRPC credentials, tokens, the dev CA) sits below both daemons and the CLI: "
     "it may use runtime/base, nothing else of the project (no proto, no runtime)"),
    ("runtime*", "worker|controller*", "",
     "dependencies point down: the runtime is below the daemons"),
    ("worker", "controller*", "",
     "worker/ and controller/ share only proto/, transport/ and runtime/base"),
    ("controller*", "worker", "",
     "worker/ and controller/ share only proto/, transport/ and runtime/base"),
    ("controller*", "kernels|ext:cuda", "",
     "controller/ never links CUDA or the kernels"),
    ("controller", "runtime*", "runtime/base",
     "controller/ never links the training runtime; it may use runtime/base"),
    ("controller/cli", "runtime*",
     "runtime/base|runtime/data|runtime/checkpoint|runtime/trainable|runtime/moe|runtime/model|"
     "runtime/topology|runtime/memory",
     "the CLI may also use runtime/data and runtime/checkpoint (with the ParamInfo of "
     "runtime/trainable), runtime/moe for the schedules' op lists and cost model (pure: "
     "furnace_moe_schedule links no communicator), runtime/topology for the layout's groups (a "
     "pure function of the sizes), runtime/model for text generation (plain loops: "
     "furnace_kv_decoder, furnace_generate) and for what a rank holds (furnace_model_bytes: "
     "the shard, the parameter layout and the declared activation bytes, pure arithmetic), and "
     "runtime/memory for the static policies those bytes apply (furnace_memory_policy, pure), "
     "not the training runtime"),
]

# Targets a component may not link although RULES allow the target's folder: (from, target, why).
TARGET_RULES = [
    ("controller/cli", "furnace_moe",
     "the CLI uses runtime/moe only through furnace_moe_schedule (pure); furnace_moe links the "
     "communicators"),
    ("controller/cli", "furnace_model",
     "the CLI uses runtime/model only through furnace_model_config, furnace_model_bytes, "
     "furnace_kv_decoder and furnace_generate (no kernels); furnace_model is the training model "
     "on the kernels"),
    ("controller/cli", "furnace_memory",
     "the CLI uses runtime/memory only through furnace_memory_policy (pure); furnace_memory "
     "links the device, the copy engine and the planner"),
]

# Headers and CMake targets outside the project that the rules name.
EXTERNAL_HEADERS = [
    ("ext:grpc", r"^grpcpp?/"),
    ("ext:protobuf", r"^google/protobuf/"),
    ("ext:cuda", r"^(cuda[A-Za-z0-9_]*\.h|cuda/|cublas[A-Za-z0-9_]*\.h|nccl[A-Za-z0-9_]*\.h|"
                 r"cub/|thrust/|curand[A-Za-z0-9_]*\.h|nvrtc\.h)"),
]
EXTERNAL_TARGETS = [
    ("ext:grpc", r"^gRPC::"),
    ("ext:protobuf", r"^protobuf::"),
    ("ext:cuda", r"^(CUDA::|NCCL::)"),
]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def matches(name, patterns):
    return bool(patterns) and any(fnmatch.fnmatchcase(name, p) for p in patterns.split("|"))


def rule_violated(src, dst):
    """The first rule that forbids src -> dst, or None."""
    if src == dst:
        return None
    for frm, to, unless, why in RULES:
        if matches(src, frm) and matches(dst, to) and not matches(dst, unless):
            return why
    return None


def component(rel_path):
    """The component of a repository-relative path (a file or a folder), or None."""
    parts = rel_path.replace(os.sep, "/").split("/")
    top = parts[0]
    if top not in SOURCE_DIRS:
        return None
    if top == "runtime":
        return "runtime/" + parts[1] if len(parts) > 2 else "runtime"
    if top == "controller" and len(parts) > 2 and parts[1] == "cli":
        return "controller/cli"
    return top


def source_files(root):
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), name


def resolve_include(root, including, header, quoted):
    """What an include names: ("file", repo-relative path), ("ext", component) or None."""
    if quoted:
        here = os.path.dirname(including)
        for base in (here, "", "kernels/include"):
            candidate = os.path.normpath(os.path.join(base, header)).replace(os.sep, "/")
            if os.path.isfile(os.path.join(root, candidate)):
                return ("file", candidate)
        # Generated from proto/furnace/v1/*.proto.
        m = re.match(r"^(furnace/v1/[A-Za-z0-9_]+)\.(grpc\.)?pb\.h$", header)
        if m and os.path.isfile(os.path.join(root, "proto", m.group(1) + ".proto")):
            return ("file", "proto/" + m.group(1) + ".proto")
    for name, pattern in EXTERNAL_HEADERS:
        if re.match(pattern, header):
            return ("ext", name)
    return None


def include_edges(root):
    """(src component, dst component, "file:line", text) for every include that crosses one."""
    edges = []
    for rel, name in source_files(root):
        if not name.endswith(SOURCE_EXTS):
            continue
        src = component(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                target = resolve_include(root, rel, m.group(2), m.group(1) == '"')
                if target is None:
                    continue
                kind, value = target
                dst = component(value) if kind == "file" else value
                if dst is not None and dst != src:
                    edges.append((src, dst, "%s:%d" % (rel, lineno), line.strip()))
    return edges


def cmake_commands(text):
    """(command, arguments, line) of every command call in a CMakeLists.txt."""
    text = re.sub(r"#[^\n]*", "", text)
    out = []
    for m in re.finditer(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = text[m.end():i - 1]
        # Drop generator expressions ($<...>, possibly nested) and quoted strings.
        while True:
            stripped = re.sub(r"\$<[^<>]*>", "", args)
            if stripped == args:
                break
            args = stripped
        args = re.sub(r'"[^"]*"', "", args)
        out.append((m.group(1).lower(), args.split(), text.count("\n", 0, m.start()) + 1))
    return out


LINK_KEYWORDS = {"PUBLIC", "PRIVATE", "INTERFACE", "LINK_PUBLIC", "LINK_PRIVATE", "debug",
                 "optimized", "general"}


def link_graph(root):
    """(targets: name -> (component, "CMakeLists:line"), links: name -> [(dep, "file:line")])."""
    targets, links = {}, {}
    for rel, name in source_files(root):
        if name != "CMakeLists.txt":
            continue
        comp = component(os.path.dirname(rel) + "/x")
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        for cmd, args, lineno in cmake_commands(text):
            if not args or "${" in args[0]:
                continue
            where = "%s:%d" % (rel, lineno)
            if cmd in ("add_library", "add_executable"):
                targets[args[0]] = (comp, where)
            elif cmd == "target_link_libraries":
                for dep in args[1:]:
                    if dep not in LINK_KEYWORDS and "${" not in dep:
                        links.setdefault(args[0], []).append((dep, where))
    return targets, links


def target_component(name, targets):
    if name in targets:
        return targets[name][0]
    for comp, pattern in EXTERNAL_TARGETS:
        if re.match(pattern, name):
            return comp
    return None


def link_edges(root):
    """(src component, dst component, "file:line", text) for every target's transitive links."""
    targets, links = link_graph(root)
    edges = []
    for name in sorted(targets):
        src = targets[name][0]
        # Breadth-first over the link graph, keeping the first path to each dependency.
        seen = {name: [name]}
        queue = [name]
        first_where = {}
        while queue:
            current = queue.pop(0)
            for dep, where in links.get(current, []):
                if dep in seen:
                    continue
                seen[dep] = seen[current] + [dep]
                first_where[dep] = first_where.get(current, where)
                if dep in targets:
                    queue.append(dep)
        for dep, path in seen.items():
            dst = target_component(dep, targets)
            if dep == name or dst is None or dst == src:
                continue
            text = "%s links %s" % (name, dep)
            if len(path) > 2:
                text += " (via %s)" % " -> ".join(path[1:-1])
            edges.append((src, dst, first_where[dep], text))
    return edges


def runtime_cycles(edges):
    """Cycles among runtime/ folders: lists of (src, dst, where, text) edges."""
    graph = {}
    for src, dst, where, text in edges:
        if src.startswith("runtime/") and dst.startswith("runtime/") and src != dst:
            graph.setdefault(src, {}).setdefault(dst, (where, text))
    cycles, done = [], set()
    for start in sorted(graph):
        # Shortest way back to `start`, breadth-first.
        parent = {start: None}
        queue = [start]
        found = None
        while queue and found is None:
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, {})):
                if nxt == start:
                    found = node
                    break
                if nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
        if found is None:
            continue
        path = [found]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        path.reverse()
        path.append(start)
        key = frozenset(path)
        if key in done:
            continue
        done.add(key)
        cycles.append([(a, b) + graph[a][b] for a, b in zip(path, path[1:])])
    return cycles


def check(root, edges=None):
    """The violations, as printable lines (`edges`: include_edges + link_edges, if computed)."""
    problems = []
    edges = edges if edges is not None else include_edges(root) + link_edges(root)
    for src, dst, where, text in edges:
        why = rule_violated(src, dst)
        words = text.split()
        if not why and len(words) > 2 and words[1] == "links":  # a link edge: "a links b ..."
            why = next((w for frm, target, w in TARGET_RULES
                        if matches(src, frm) and words[2] == target), None)
        if why:
            problems.append("%s: %s -> %s: `%s`: %s" % (where, src, dst, text, why))
    for cycle in runtime_cycles(edges):
        names = " -> ".join([cycle[0][0]] + [edge[1] for edge in cycle])
        lines = ["runtime/ folders form a cycle: %s (dependencies must point one way)" % names]
        for src, dst, where, text in cycle:
            lines.append("    %s: %s -> %s: `%s`" % (where, src, dst, text))
        problems.append("\n".join(lines))
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    edges = include_edges(root) + link_edges(root)
    problems = check(root, edges)
    for problem in problems:
        print(problem)
    if problems:
        print("%d layering violation(s); the rules are RULES in %s" % (len(problems), __file__))
        return 1
    print("layering: %d include and link edges checked, no violation" % len(edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
