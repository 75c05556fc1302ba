// A run's folder (docs/gates.md "Reports"): metadata.txt, gate.txt (one line per step: result, stage,
// opcode, status, syndrome), summary.txt, results.tsv (the figures the plots are drawn from),
// logs/ (every tool's output, the daemon's log), pcap/ (the capture of each failing step), and, when
// a gate measured something, plots/ and index.html (tools/gate/plot.py).
#pragma once

#include <stdio.h>

#include <string>
#include <vector>

namespace melon::gate {

struct StepRecord {
  std::string gate, step, result;  // PASS, FAIL, SKIP
  double seconds = 0;
  // Where a failure happened, as the driver reports it (stage, firmware opcode/status/syndrome), or
  // "-" when the step has no such notion (a stock tool's exit).
  std::string stage = "-", opcode = "-", status = "-", syndrome = "-";
  std::string detail;  // one line: what was checked, or why it failed
  std::string log, pcap;  // relative to the report folder
};

class Report {
 public:
  bool open(const std::string& dir, std::string* why);
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& rel) const { return dir_ + "/" + rel; }
  void add(const StepRecord& r);
  // A row of figures: kind and tab-separated fields (results.tsv).
  void figure(const std::string& row);
  void write_metadata(const std::string& text);
  const std::vector<StepRecord>& steps() const { return steps_; }
  bool has_figures() const { return figures_ > 0; }

  // Progress: a bar with ETA on a terminal, plain lines otherwise.
  void plan(int total) { total_ = total; }
  void begin_step(const std::string& gate, const std::string& step);
  void end_step(const StepRecord& r);

 private:
  void redraw(const std::string& what);
  std::string dir_;
  std::vector<StepRecord> steps_;
  int figures_ = 0;
  int total_ = 0, done_ = 0;
  double t0_ = 0, step_t0_ = 0;
  bool tty_ = false;
};

}  // namespace melon::gate
