#!/usr/bin/env python3
"""check_structure.py ROOT — the source tree's shape rules (docs/design.md, "Modules"):

1. Folders by concern, in one order: a file under src/<folder> includes only headers of its own folder or of a
   lower one (a public header include/hyperpar/X.h counts as its owner's, the table below).
2. No function in src/ longer than 150 lines; no file in src/, tools/, include/ longer than 1,500 lines.
3. Only the comm module includes <mpi.h>.

Prints every violation and exits 1 when there is one."""
import os
import re
import sys

# Low to high: a folder may include its own headers and those of any folder before it.
LAYERS = ["core", "io", "tok", "data", "comm", "kernels", "model", "plan", "shard", "convert", "moe", "exec", "run",
          "cost", "train", "api"]
# Each public header's owner (the folder that implements it).
PUBLIC = {
    "core.h": "core", "safetensors.h": "io", "tokenizer.h": "tok", "data.h": "data", "comm.h": "comm", "linalg.h": "kernels",
    "model.h": "model", "gen.h": "model", "plan.h": "plan", "overrides.h": "plan", "shard.h": "shard",
    "outdir.h": "shard", "trainckpt.h": "shard", "gguf.h": "io", "convert.h": "convert", "moe.h": "moe",
    "run.h": "run", "cost.h": "cost",
    "report.h": "cost", "train.h": "train", "api.h": "api",
}
MAX_FUNCTION = 150
MAX_FILE = 1500
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def owner(inc, here):
    """The folder a quoted include belongs to, or None for a header beside the file (its own folder)."""
    parts = inc.split("/")
    if len(parts) == 2 and parts[0] == "hyperpar":
        return PUBLIC.get(parts[1], "?" + parts[1])
    if len(parts) == 2:
        return parts[0]
    return here


def functions(text):
    """(name, first line, length) of each function definition: a line at column 0 that opens a definition, up to
    the first line that starts with '}'."""
    lines = text.split("\n")
    start = None
    for i, ln in enumerate(lines):
        if start is None:
            if re.match(r"^[A-Za-z_][^;=]*\(", ln) and not ln.startswith(("typedef", "#")) and \
                    not ln.rstrip().endswith(";"):
                start, head = i, ln
        elif ln.startswith("}"):
            yield head.strip(), start + 1, i - start + 1
            start = None
        elif ln.rstrip().endswith(";") and lines[start].rstrip().endswith(")") and i == start + 1:
            start = None  # a multi-line prototype


def main(root):
    bad = []
    rank = {name: i for i, name in enumerate(LAYERS)}
    for top in ("src", "tools", "include", "tests", "bench"):
        base = os.path.join(root, top)
        for dp, _, names in os.walk(base):
            for nm in sorted(names):
                if not nm.endswith((".c", ".h")):
                    continue
                path = os.path.join(dp, nm)
                rel = os.path.relpath(path, root)
                text = open(path, encoding="utf-8").read()
                n_lines = text.count("\n")
                if top in ("src", "tools", "include") and n_lines > MAX_FILE:
                    bad.append(f"{rel}: {n_lines} lines (at most {MAX_FILE})")
                if "<mpi.h>" in text and re.search(r"^\s*#\s*include\s*<mpi\.h>", text, re.M) and \
                        not rel.startswith("src/comm/"):
                    bad.append(f"{rel}: includes <mpi.h> (only src/comm may)")
                if top != "src":
                    continue
                folder = os.path.relpath(dp, base).split(os.sep)[0]
                if folder not in rank:
                    bad.append(f"{rel}: folder '{folder}' is not in the layer table of {sys.argv[0]}")
                    continue
                for inc in INCLUDE.findall(text):
                    o = owner(inc, folder)
                    if o not in rank:
                        bad.append(f"{rel}: includes \"{inc}\", whose folder is not in the layer table")
                    elif rank[o] > rank[folder]:
                        bad.append(f"{rel}: includes \"{inc}\" ({o}), a folder above {folder}")
                if nm.endswith(".c"):
                    for head, line, n in functions(text):
                        if n > MAX_FUNCTION:
                            bad.append(f"{rel}:{line}: function of {n} lines (at most {MAX_FUNCTION}): {head[:70]}")
    for b in bad:
        print(b)
    print(f"check_structure: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
