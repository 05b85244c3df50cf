#!/usr/bin/python3
"""layers_check: every #include of the tree against docs/architecture.md.

The rules live in docs/architecture.md, section "Layers": a table with one
row per layer, its folders and the layers it may include:

    | layer | folders | may include |
    |---|---|---|
    | `base` | `core/base` | - |
    | `kernels` | `kernels`, `kernels/cpu`, `kernels/cuda` | `base` |

This script reads that table and checks
  - every folder of the table exists, and every folder of core/, kernels/,
    api/ and daemon/ holding C sources belongs to a layer;
  - the table and meson.build's `layer_dirs` (the include directories the
    compiler gets per library) name the same folders per layer;
  - every `#include "..."` of a .c/.h/.cu/.cuh file in a layer's folders
    names a header of its own layer or of one it may include (resolved as
    the compiler does: the including file's folder first, then the layer
    folders; a path that reaches outside every layer is refused too).

--selftest proves the check can fail: in a temporary copy of the tree it
injects a broken include (a core/model file including the jobs layer's
job_spec.h, by name and by a relative path) and asserts the check refuses
each, naming the file; with --build DIR it also asserts that the compiler
refuses it, using the real compile command of core/model/model.c from
DIR/compile_commands.json (and, as a control, accepts model.h).

Exit status 0 when all holds; 1 with one line per broken rule otherwise.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
SCANNED_TOPS = ("core", "kernels", "api", "daemon")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_rules(root):
    """The 'Layers' table of docs/architecture.md: [(layer, [folders], {may})]."""
    path = os.path.join(root, "docs", "architecture.md")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    rows, in_section, in_table = [], False, False
    for line in lines:
        if line.startswith("## "):
            in_section = line.strip() == "## Layers"
            in_table = False
            continue
        if not in_section:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            if in_table:
                break  # the first table of the section only
            continue
        if not in_table:
            if [c.lower() for c in cells] != ["layer", "folders", "may include"]:
                raise SystemExit("%s: the Layers table must have columns layer | folders | may include" % path)
            in_table = True
            continue
        if set(cells[0]) <= set("-: "):
            continue
        if len(cells) != 3:
            raise SystemExit("%s: a Layers row needs 3 cells: %s" % (path, line))
        names = lambda cell: [x.strip().strip("`") for x in cell.split(",") if x.strip().strip("`-— ")]
        rows.append((cells[0].strip("`"), names(cells[1]), set(names(cells[2]))))
    if not rows:
        raise SystemExit("%s: no 'Layers' table found" % path)
    return rows


def read_meson_layers(root):
    """meson.build's layer_dirs = { 'layer': ['dir', ...], ... }."""
    with open(os.path.join(root, "meson.build"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"layer_dirs\s*=\s*\{(.*?)\n\}", text, re.S)
    if m is None:
        return None
    out = {}
    for name, dirs in re.findall(r"'(\w+)'\s*:\s*\[([^\]]*)\]", m.group(1)):
        out[name] = re.findall(r"'([^']+)'", dirs)
    return out


def check(root):
    """The broken rules, one message each (empty: all hold)."""
    rows = read_rules(root)
    problems = []
    layer_of_dir, may = {}, {}
    names = [r[0] for r in rows]
    for name, folders, allowed in rows:
        may[name] = allowed
        for bad in sorted(allowed - set(names)):
            problems.append("docs/architecture.md: layer %s may include an unknown layer %s" % (name, bad))
        for d in folders:
            if not os.path.isdir(os.path.join(root, d)):
                problems.append("docs/architecture.md: layer %s names %s, which is not a folder" % (name, d))
            layer_of_dir[os.path.normpath(d)] = name

    meson = read_meson_layers(root)
    if meson is None:
        problems.append("meson.build: no layer_dirs table (the compiler's include directories per layer)")
    else:
        for name, folders, _ in rows:
            if sorted(meson.get(name, [])) != sorted(folders):
                problems.append("meson.build: layer_dirs['%s'] is %s, docs/architecture.md says %s"
                                % (name, meson.get(name), folders))
        for extra in sorted(set(meson) - set(names)):
            problems.append("meson.build: layer_dirs has %s, which docs/architecture.md does not" % extra)

    # every folder with C sources belongs to a layer
    sources = []
    for top in SCANNED_TOPS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            files = sorted(f for f in filenames if f.endswith(SOURCE_EXT))
            if files and rel not in layer_of_dir:
                problems.append("%s/: C sources in a folder of no layer (docs/architecture.md, Layers)" % rel)
            sources += [os.path.join(rel, f) for f in files]

    def layer_of(relpath):
        return layer_of_dir.get(os.path.dirname(os.path.normpath(relpath)))

    for src in sources:
        own = layer_of(src)
        if own is None:
            continue
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                # as the compiler looks: the file's own folder, then the -I folders
                cands = [os.path.normpath(os.path.join(os.path.dirname(src), inc))]
                cands += [os.path.normpath(os.path.join(d, inc)) for d in sorted(layer_of_dir)]
                target = next((c for c in cands if os.path.isfile(os.path.join(root, c))), None)
                if target is None:
                    continue  # generated or a system header in quotes
                if target.startswith(".."):
                    problems.append("%s:%d: includes \"%s\", outside the repository" % (src, lineno, inc))
                    continue
                tl = layer_of(target)
                if tl is None:
                    problems.append("%s:%d: includes \"%s\" (%s), a file of no layer" % (src, lineno, inc, target))
                elif tl != own and tl not in may[own]:
                    problems.append("%s:%d: layer %s includes \"%s\" of layer %s; %s may include %s"
                                    % (src, lineno, own, inc, tl, own,
                                       ", ".join(sorted(may[own])) or "nothing but itself"))
    return problems


def copy_tree(root, dst):
    for top in SCANNED_TOPS + ("docs",):
        shutil.copytree(os.path.join(root, top), os.path.join(dst, top),
                        ignore=shutil.ignore_patterns("*.png", "ui"))
    shutil.copy(os.path.join(root, "meson.build"), dst)


def inject(path, line):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(line + "\n" + text)


def compile_probe(build, body):
    """Compile `body` with core/model/model.c's own command line; the return code."""
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        cmds = json.load(f)
    entry = next((e for e in cmds if os.path.normpath(e["file"]).endswith(os.path.join("core", "model", "model.c"))),
                 None)
    if entry is None:
        raise SystemExit("selftest: no compile command for core/model/model.c in %s" % build)
    argv = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c", "-MQ", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-MD", "-MMD") or a.endswith("model.c"):
            continue
        out.append(a)
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.c")
        with open(probe, "w", encoding="utf-8") as f:
            f.write(body)
        r = subprocess.run(out + ["-fsyntax-only", "-fdiagnostics-color=never", probe], cwd=entry["directory"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return r.returncode, r.stdout


def selftest(root, build):
    failures = []
    base = check(root)
    if base:
        failures.append("the tree itself breaks the rules:\n  " + "\n  ".join(base))
    for inc in ('#include "job_spec.h"', '#include "../jobs/job_spec.h"', '#include "api_http.h"'):
        with tempfile.TemporaryDirectory() as tmp:
            copy_tree(root, tmp)
            inject(os.path.join(tmp, "core", "model", "model.c"), inc)
            found = [p for p in check(tmp) if p.startswith("core/model/model.c:1:")]
            if not found:
                failures.append("the check accepted %s in core/model/model.c" % inc)
            else:
                print("refused as it should: %s" % found[0])
    # a table that allows it makes the same include pass: the check reads the docs
    with tempfile.TemporaryDirectory() as tmp:
        copy_tree(root, tmp)
        inject(os.path.join(tmp, "core", "model", "model.c"), '#include "job_spec.h"')
        doc = os.path.join(tmp, "docs", "architecture.md")
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        text2 = re.sub(r"^(\| `model` \|[^|]*\|)([^|]*)\|", r"\1\2, `jobs` |", text, count=1, flags=re.M)
        if text2 == text:
            failures.append("selftest: could not find the model row of the Layers table")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text2)
        if any(p.startswith("core/model/model.c:1:") for p in check(tmp)):
            failures.append("the check refused an include its table allows: it does not read the docs")
    if build:
        rc, msg = compile_probe(build, '#include "job_spec.h"\n')
        if rc == 0:
            failures.append("the compiler accepted job_spec.h in the model layer")
        else:
            print("the compiler refuses job_spec.h in the model layer: %s" % msg.strip().splitlines()[0])
        rc, msg = compile_probe(build, '#include "model.h"\n#include "kern_device.h"\n')
        if rc != 0:
            failures.append("control: the model layer's own headers do not compile: %s" % msg)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--selftest", action="store_true", help="inject broken includes and expect refusals")
    ap.add_argument("--build", help="a build directory (compile_commands.json) for the compiler probe")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    problems = selftest(root, a.build) if a.selftest else check(root)
    for p in problems:
        print(p)
    if not problems:
        print("layers: %s" % ("the check and the compiler refuse broken includes" if a.selftest
                              else "every #include follows docs/architecture.md"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
