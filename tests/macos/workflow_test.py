#!/usr/bin/env python3
"""workflow_test.py <repo>: .github/workflows/macos.yml is valid YAML and holds the job issue 13
asks for: on a macOS runner, configure `cmake --preset macos`, build, run the portable tests, run
check-dext, in that order. Exit 77 (skip) without the yaml module (Debian: python3-yaml)."""
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3 yaml module missing (apt-get install python3-yaml)")
    sys.exit(77)

path = sys.argv[1] + "/.github/workflows/macos.yml"
with open(path) as f:
    doc = yaml.safe_load(f)

problems = []


def check(cond, what):
    if not cond:
        problems.append(what)


check(isinstance(doc, dict), "top level is not a mapping")
# YAML 1.1 reads the bare key `on` as the boolean true; GitHub reads it as "on".
triggers = doc.get("on", doc.get(True))
check(isinstance(triggers, dict), "no 'on' triggers")
triggers = triggers or {}
for event in ("push", "pull_request"):
    check(event in triggers, f"not triggered by {event}")

jobs = doc.get("jobs") or {}
check(list(jobs) == ["macos"], f"jobs are {list(jobs)}, expected exactly ['macos']")
job = jobs.get("macos") or {}
check(str(job.get("runs-on", "")).startswith("macos-"), f"runs-on {job.get('runs-on')!r} is not a macOS runner")
steps = job.get("steps") or []
check(all("name" in s for s in steps), "a step has no name")
check(all(("run" in s) != ("uses" in s) for s in steps), "a step must either run or use, not both or neither")
check(steps and steps[0].get("uses", "").startswith("actions/checkout@"), "first step is not the checkout")


def step_index(fragment):
    """Index of the first step whose command contains fragment, or -1."""
    for i, s in enumerate(steps):
        if fragment in str(s.get("run", "")):
            return i
    return -1


order = ["cmake --preset macos", "cmake --build build/macos", "ctest --test-dir build/macos", "--target check-dext"]
found = [step_index(f) for f in order]
for fragment, i in zip(order, found):
    check(i >= 0, f"no step runs '{fragment}'")
check(found == sorted(found), f"steps out of order: {dict(zip(order, found))}")
check(not any("secrets." in str(s) for s in steps), "the job must not need secrets (nothing is signed in CI)")

for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print(f"PASS: {len(steps)} steps, order {found}")
