// One stock-tool exchange between our side and the peer (server on one, client on the other, TCP
// rendezvous as perftest and the pingpongs do it), with a capture kept when it fails, and the
// parsers for what the tools print.
#pragma once

#include <string>

#include "gates.h"

namespace melon::gate {

struct Exchange {
  Done server, client;
  bool ok = false;
  std::string why;  // the first failed check
  std::string log, pcap;  // report-relative
};

// tool: ibv_rc_pingpong, ib_write_bw, ...; args: the tool's own options (both ends);
// ours_serves: our side is the server. Checks both ends exit 0.
Exchange exchange(Ctx& c, const std::string& tool, const std::string& args, bool ours_serves, double timeout_s = 120);

// perftest bandwidth row (with --report_gbits): Gbit/s average of the row for `size`, -1 if none.
double perftest_gbps(const std::string& out, long size);
// perftest latency row: t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (usec); false if none.
bool perftest_lat(const std::string& out, long size, double v[7]);
// ibv_*_pingpong: "<n> iters in <t> seconds = <x> usec/iter"; usec/iter or -1.
double pingpong_usec(const std::string& out, int iters);
// A failed completion as the tools print it: status and vendor syndrome ("-" when none).
void completion_failure(const std::string& out, std::string* status, std::string* syndrome);

// A StepRecord from an exchange: PASS when ok and `extra` (an added check) passed.
StepRecord record(Ctx& c, const std::string& step, const Exchange& x, const std::string& opcode, bool extra,
                  const std::string& detail);

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

}  // namespace melon::gate
