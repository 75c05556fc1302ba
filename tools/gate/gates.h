// The gate table (docs/gates.md): every gate with its anchor name, aliases, what it proves, what it
// needs, its pass criteria and the figures that parameterise them, quick (CI) and full. One row per
// gate; `melon-gate --list` prints the table, and each gate's steps are built from its row.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "report.h"
#include "target.h"

namespace melon::gate {

enum Need : unsigned {
  kPeer = 1u << 0,  // traffic to a peer (local, linux-peer or ssh)
  kMlx5 = 1u << 1,  // the mlx5 provider only (the user-client boundary, melon-emud's re-init)
  kLocalOnly = 1u << 2,  // runs here whatever the peer (the build's test programs)
};

// Figures a gate's criteria use; [0] quick (--quick, CI), [1] full.
struct Figures {
  int iters[2];  // messages per exchange
  int repeats[2];  // runs (recreate cycles, stability runs, ...)
};

struct Ctx;
struct Step {
  std::string name;
  std::function<StepRecord(Ctx&)> run;
};

struct GateSpec {
  const char* name;
  const char* aliases;  // comma separated
  const char* anchor;  // the anchor project's gate
  const char* proves;
  const char* criteria;  // the pass criteria, as docs/gates.md states them
  unsigned needs;
  Figures fig;
  const char* peer_only;  // --peer linux-peer: tests/peer/gate.sh's PEER_GATE_ONLY ("" = not there)
  std::vector<Step> (*plan)(Ctx&, const GateSpec&);
};

const std::vector<GateSpec>& gate_table();
const GateSpec* find_gate(const std::string& name_or_alias);
// Why the target cannot run this gate ("" when it can).
std::string unsupported_reason(const GateSpec& g, const Target& t);

// What a running gate has: the target, the report, the options, the figure index (0 quick, 1 full).
struct Ctx {
  Target& t;
  Report& rep;
  const Options& o;
  int q;  // 0 quick, 1 full
  std::string gate;
  int seq = 0;  // step number (log and pcap names)
  int iters(const GateSpec& g) const;
  int repeats(const GateSpec& g) const { return g.fig.repeats[q]; }
};

}  // namespace melon::gate
