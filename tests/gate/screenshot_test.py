#!/usr/bin/python3
"""The report page renders in headless Chromium (docs/gates.md "Reports").

screenshot_test.py REPORT_DIR: opens REPORT_DIR/index.html in headless Chromium (Debian's
`chromium`), once with --dump-dom to read what the page's own check wrote after load (every
<img class="plot"> decoded: "plots loaded N/N" with their natural sizes), and once with
--screenshot; the PNG must not be blank: many colours, a good share of non-white pixels, and the
plots' matplotlib blue (#1f77b4) on screen. Exit 0 pass, 1 fail, 77 no chromium.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image


def chromium():
    for c in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(c)
        if p:
            return p
    return None


def main():
    rep = os.path.abspath(sys.argv[1])
    page = os.path.join(rep, "index.html")
    if not os.path.exists(page):
        print(f"FAIL: no {page}")
        return 1
    want = len(re.findall(r'<img class="plot"', open(page).read()))
    if want < 3:
        print(f"FAIL: the page has {want} plots; a speed-sweep report has at least 3 (sweep, latency, QPs)")
        return 1
    exe = chromium()
    if not exe:
        print("SKIP: no chromium")
        return 77
    tmp = tempfile.mkdtemp(prefix="gat-chromium-")
    base = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp}",
            "--window-size=1400,2600", "--virtual-time-budget=5000"]
    try:
        dom = subprocess.run(base + ["--dump-dom", "file://" + page], capture_output=True, text=True, timeout=120).stdout
        m = re.search(r'id="plot-check">plots loaded (\d+)/(\d+)((?: \d+x\d+)*)<', dom)
        if not m:
            print("FAIL: the page's load check did not run:", re.findall(r'id="plot-check">[^<]*', dom))
            return 1
        ok, total, sizes = int(m.group(1)), int(m.group(2)), m.group(3).split()
        print(f"DOM: plots loaded {ok}/{total}, natural sizes {' '.join(sizes)}")
        if ok != total or total != want or any(s.startswith("0x") for s in sizes):
            print("FAIL: not every plot decoded")
            return 1
        shot = os.path.join(rep, "screenshot.png")
        subprocess.run(base + [f"--screenshot={shot}", "file://" + page], capture_output=True, timeout=120)
        if not os.path.exists(shot):
            print("FAIL: chromium wrote no screenshot")
            return 1
        img = Image.open(shot).convert("RGB")
        w, h = img.size
        px = list(img.getdata())
        colours = len(set(px))
        nonwhite = sum(1 for p in px if sum(p) < 720) / len(px)
        blue = sum(1 for r, g, b in px if abs(r - 31) < 30 and abs(g - 119) < 30 and abs(b - 180) < 30)
        print(f"screenshot {w}x{h}: {colours} colours, {nonwhite:.1%} non-white, {blue} plot-blue pixels ({shot})")
        if colours < 50 or nonwhite < 0.02 or blue < 300:
            print("FAIL: the screenshot looks blank or shows no plot")
            return 1
        print("PASS")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
