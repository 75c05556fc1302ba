#include "report.h"

#include <sys/stat.h>
#include <unistd.h>

#include "run.h"

namespace melon::gate {

namespace {
bool mkdirs(const std::string& d) {
  std::string cur;
  for (size_t i = 0; i <= d.size(); i++) {
    if (i == d.size() || d[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
    if (i < d.size()) cur += d[i];
  }
  return true;
}
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  return s;
}
}  // namespace

bool Report::open(const std::string& dir, std::string* why) {
  dir_ = dir;
  if (!mkdirs(dir + "/logs") || !mkdirs(dir + "/pcap")) return *why = "cannot create " + dir, false;
  write_file(path("gate.txt"), "# gate\tstep\tresult\tseconds\tstage\topcode\tstatus\tsyndrome\tdetail\tlog\tpcap\n");
  write_file(path("results.tsv"), "");
  tty_ = isatty(2);
  t0_ = now_s();
  return true;
}

void Report::add(const StepRecord& r) {
  steps_.push_back(r);
  if (FILE* f = fopen(path("gate.txt").c_str(), "a")) {
    fprintf(f, "%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.gate.c_str(), one_line(r.step).c_str(),
            r.result.c_str(), r.seconds, r.stage.c_str(), r.opcode.c_str(), r.status.c_str(), r.syndrome.c_str(),
            one_line(r.detail).c_str(), r.log.empty() ? "-" : r.log.c_str(), r.pcap.empty() ? "-" : r.pcap.c_str());
    fclose(f);
  }
}

void Report::figure(const std::string& row) {
  figures_++;
  if (FILE* f = fopen(path("results.tsv").c_str(), "a")) {
    fprintf(f, "%s\n", row.c_str());
    fclose(f);
  }
}

void Report::write_metadata(const std::string& text) { write_file(path("metadata.txt"), text); }

void Report::begin_step(const std::string& gate, const std::string& step) {
  step_t0_ = now_s();
  if (tty_) redraw(gate + ": " + step);
}

void Report::end_step(const StepRecord& r) {
  done_++;
  if (tty_) {
    fprintf(stderr, "\r\033[K");
    if (r.result != "PASS")
      fprintf(stderr, "%s %s: %s  %s\n", r.result.c_str(), r.gate.c_str(), r.step.c_str(), r.detail.c_str());
    redraw("");
  } else {
    printf("[%d/%d] %s %s: %s (%.1f s)%s%s\n", done_, total_, r.result.c_str(), r.gate.c_str(), r.step.c_str(),
           now_s() - step_t0_, r.result == "PASS" ? "" : "  ", r.result == "PASS" ? "" : r.detail.c_str());
    fflush(stdout);
  }
}

void Report::redraw(const std::string& what) {
  int total = total_ > 0 ? total_ : 1;
  int width = 30, fill = done_ * width / total;
  double el = now_s() - t0_;
  int eta = done_ ? int(el / done_ * (total - done_)) : -1;
  std::string bar(size_t(fill), '#');
  bar += std::string(size_t(width - fill), '.');
  if (eta >= 0)
    fprintf(stderr, "\r\033[K[%s] %d/%d  ETA %d:%02d  %.60s", bar.c_str(), done_, total, eta / 60, eta % 60,
            what.c_str());
  else
    fprintf(stderr, "\r\033[K[%s] %d/%d  ETA --:--  %.60s", bar.c_str(), done_, total, what.c_str());
  if (done_ == total) fprintf(stderr, "\r\033[K");
  fflush(stderr);
}

}  // namespace melon::gate
