#!/usr/bin/env python3
"""Checks every #include "..." in src/ and tools/ against the layer table (docs/layers.txt).

Usage: check_layers.py <repo root> [--graph]
Exit status 1 and one line per crossing include when a file includes a header its layer may not.
--graph prints the folder-to-header edges that exist, to help write the table.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = ('.h', '.hpp', '.c', '.cc', '.cpp', '.inc', '.iig')


def load_table(path):
    layers = {}
    for n, line in enumerate(open(path), 1):
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        if ':' not in line:
            sys.exit(f'{path}:{n}: expected "<folder>: <allowed>..."')
        folder, allowed = line.split(':', 1)
        layers[folder.strip().rstrip('/')] = allowed.split()
    return layers


def layer_of(rel, layers):
    best = None
    for folder in layers:
        if rel == folder or rel.startswith(folder + '/'):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def resolve(root, including, name):
    for base in (os.path.dirname(including), 'src', 'include', 'tests', '.'):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def allowed(target, rules):
    return any(target == r or target.startswith(r.rstrip('/') + '/') for r in rules)


def main():
    root = sys.argv[1]
    graph = '--graph' in sys.argv
    layers = load_table(os.path.join(root, 'docs', 'layers.txt'))
    bad, edges = [], set()
    for top in ('src', 'tools'):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(SOURCES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                layer = layer_of(rel, layers)
                text = open(os.path.join(root, rel), errors='replace').read()
                for name in INCLUDE.findall(text):
                    # A header generated into the build tree is judged by the path it is named with.
                    target = resolve(root, rel, name) or os.path.normpath(os.path.join('src', name))
                    edges.add((layer or '(none)', target))
                    if layer is None:
                        bad.append(f'{rel}: its folder is not in docs/layers.txt')
                    elif not allowed(target, layers[layer]):
                        bad.append(f'{rel}: #include "{name}" ({target}) crosses the layer table: '
                                   f'{layer} may include {" ".join(layers[layer])}')
    if graph:
        for e in sorted(edges):
            print(f'{e[0]} -> {e[1]}')
        return 0
    for b in sorted(set(bad)):
        print(b)
    if bad:
        print(f'{len(set(bad))} include(s) cross docs/layers.txt')
        return 1
    print('every #include in src/ and tools/ keeps docs/layers.txt')
    return 0


if __name__ == '__main__':
    sys.exit(main())
