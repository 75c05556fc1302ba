#!/usr/bin/env python3
"""A gate run's plots and HTML page (docs/gates.md "Reports").

plot.py REPORT_DIR reads REPORT_DIR/results.tsv (the figures melon-gate measured), gate.txt,
metadata.txt and summary.txt, and writes REPORT_DIR/plots/*.png and *.svg (matplotlib) and
REPORT_DIR/index.html, which shows them. Rows of results.tsv (tab-separated):
  sweep    gate mtu window size gbps      bandwidth vs message size per outstanding-WR window and MTU
  qp       gate qps size gbps             multi-QP aggregate bandwidth
  bulk     gate run size gbps             repeated bulk WRITE runs
  lat      gate tool size min typical avg p99 p99.9 max   (usec)
  pingpong gate tool size usec_per_iter
"""
import html
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    rows = defaultdict(list)
    if os.path.exists(path):
        for line in open(path):
            f = line.rstrip("\n").split("\t")
            if len(f) > 2:
                rows[f[0]].append(f[1:])
    return rows


def size_label(n):
    n = int(n)
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def save(fig, out, name):
    paths = []
    for ext in ("png", "svg"):
        p = os.path.join(out, f"{name}.{ext}")
        fig.savefig(p, dpi=110, bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return name


def plot_sweep(rows, out):
    series = defaultdict(list)
    for gate, mtu, window, size, gbps in rows:
        series[(int(mtu), int(window))].append((int(size), float(gbps)))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (mtu, window), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                linestyle="-" if mtu == 4096 else "--", label=f"MTU {mtu}, window {window}")
    ax.set_xscale("log", base=2)
    sizes = sorted({p[0] for pts in series.values() for p in pts})
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes])
    ax.set_xlabel("message size")
    ax.set_ylabel("RDMA WRITE bandwidth (Gbit/s)")
    ax.set_title("Bandwidth vs message size per outstanding-WR window and path MTU")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out, "bandwidth_vs_size")


def plot_latency(rows, out):
    labels = ["min", "typical", "avg", "99%", "99.9%", "max"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(rows))
    for i, (gate, tool, size, *vals) in enumerate(rows):
        v = [float(x) for x in vals]
        xs = [k + i * width for k in range(len(labels))]
        ax.bar(xs, v, width=width, label=f"{tool} {size_label(size)}")
    ax.set_xticks([k + width * (len(rows) - 1) / 2 for k in range(len(labels))])
    ax.set_xticklabels(labels)
    ax.set_ylabel("latency (usec)")
    ax.set_yscale("log")
    ax.set_title("Latency percentiles")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out, "latency_percentiles")


def plot_qp(rows, out):
    pts = sorted((int(q), float(g), int(s)) for gate, q, s, g in rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    qs = [p[0] for p in pts]
    gs = [p[1] for p in pts]
    ax.plot(qs, gs, marker="o")
    base = gs[0] if gs and gs[0] > 0 else None
    for q, g in zip(qs, gs):
        ax.annotate(f"{g:.2f}" + (f" ({g / base:.2f}x)" if base else ""), (q, g), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(qs)
    ax.set_xticklabels([str(q) for q in qs])
    ax.set_xlabel("QPs")
    ax.set_ylabel("aggregate WRITE bandwidth (Gbit/s)")
    ax.set_title(f"QP scaling ({size_label(pts[0][2])} messages)" if pts else "QP scaling")
    ax.grid(True, alpha=0.3)
    return save(fig, out, "qp_scaling")


def plot_bulk(rows, out):
    pts = sorted((int(r), float(g)) for gate, r, s, g in rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([p[0] for p in pts], [p[1] for p in pts])
    ax.set_xticks([p[0] for p in pts])
    ax.set_xlabel("run (fresh QP and MR)")
    ax.set_ylabel("1 MiB WRITE bandwidth (Gbit/s)")
    ax.set_title("Bulk write stability")
    ax.grid(True, axis="y", alpha=0.3)
    return save(fig, out, "bulk_runs")


def table(path):
    if not os.path.exists(path):
        return ""
    lines = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
    if not lines:
        return ""
    head, body = lines[0], lines[1:]
    h = "<table><tr>" + "".join(f"<th>{html.escape(c.lstrip('# '))}</th>" for c in head) + "</tr>\n"
    for r in body:
        cls = r[2].lower() if len(r) > 2 else ""
        cells = []
        for i, c in enumerate(r):
            if i >= len(head) - 2 and c not in ("-", ""):
                cells.append(f'<td><a href="{html.escape(c)}">{html.escape(os.path.basename(c))}</a></td>')
            else:
                cells.append(f"<td>{html.escape(c)}</td>")
        h += f'<tr class="{cls}">' + "".join(cells) + "</tr>\n"
    return h + "</table>"


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    rep = sys.argv[1]
    out = os.path.join(rep, "plots")
    os.makedirs(out, exist_ok=True)
    rows = read_rows(os.path.join(rep, "results.tsv"))
    plots = []
    for kind, fn, caption in (("sweep", plot_sweep, "Bandwidth vs message size, per outstanding-WR window and MTU"),
                              ("lat", plot_latency, "Latency percentiles"),
                              ("qp", plot_qp, "QP scaling"),
                              ("bulk", plot_bulk, "Bulk write runs")):
        if rows.get(kind):
            plots.append((fn(rows[kind], out), caption))
    read = lambda n: open(os.path.join(rep, n)).read() if os.path.exists(os.path.join(rep, n)) else ""
    figs = "\n".join(
        f'<figure><img class="plot" src="plots/{n}.png" alt="{html.escape(c)}">'
        f'<figcaption>{html.escape(c)} (<a href="plots/{n}.svg">SVG</a>)</figcaption></figure>' for n, c in plots)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>MelonDMA gate report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
pre {{ background: #f4f4f4; padding: 0.8em; overflow-x: auto; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }}
tr.fail td {{ background: #fdd; }} tr.skip td {{ background: #eee; }}
figure {{ display: inline-block; margin: 1em; }} img.plot {{ max-width: 760px; border: 1px solid #ddd; }}
</style></head>
<body data-plots="{len(plots)}">
<h1>MelonDMA gate report</h1>
<h2>Summary</h2><pre>{html.escape(read("summary.txt"))}</pre>
<h2>Plots</h2>
{figs if figs else "<p>This run measured nothing to plot.</p>"}
<h2>Run</h2><pre>{html.escape(read("metadata.txt"))}</pre>
<h2>Steps (gate.txt)</h2>
{table(os.path.join(rep, "gate.txt"))}
<p id="plot-check">plots: not checked</p>
<script>
// What a screenshot test reads: every plot decoded (natural size nonzero).
window.addEventListener("load", function () {{
  var imgs = document.querySelectorAll("img.plot"), ok = 0, sizes = [];
  imgs.forEach(function (i) {{ if (i.complete && i.naturalWidth > 0) ok++; sizes.push(i.naturalWidth + "x" + i.naturalHeight); }});
  document.getElementById("plot-check").textContent = "plots loaded " + ok + "/" + imgs.length + " " + sizes.join(" ");
}});
</script>
</body></html>
"""
    with open(os.path.join(rep, "index.html"), "w") as f:
        f.write(page)
    print(f"{len(plots)} plots, {os.path.join(rep, 'index.html')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
