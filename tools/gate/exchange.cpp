#include "exchange.h"

#include <signal.h>
#include <stdarg.h>
#include <unistd.h>

#include <regex>
#include <sstream>

namespace melon::gate {

std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

namespace {

bool is_perftest(const std::string& tool) { return tool.rfind("ib_", 0) == 0; }

std::string command(const Side& s, const std::string& tool, const std::string& args, int port,
                    const std::string& connect_to, bool emulated) {
  std::string c = tool + " -d " + s.dev() + (is_perftest(tool) ? " -x " : " -g ") + std::to_string(s.gid()) + " -p " +
                  std::to_string(port);
  if (is_perftest(tool)) c += " -F";
  // melon-emud's data path is slow on a loaded machine: perftest's default ACK timeout (14: 67 ms)
  // ends 64 KiB+ runs in RETRY_EXC_ERR now and then; 18 (1 s) as tests/stock does for mlx5_0.
  if (is_perftest(tool) && emulated) c += " -u 18";
  c += " " + args;
  if (!connect_to.empty()) c += " " + connect_to;
  return c;
}

// tcpdump of our RoCE traffic for one step; the file is kept only when the step fails.
struct Capture {
  Proc p;
  std::string file;
  bool start(Ctx& c, const std::string& rel) {
    std::string filter = c.t.capture_filter();
    if (!c.o.capture || filter.empty() || access("/usr/bin/tcpdump", X_OK) != 0 || geteuid() != 0) return false;
    file = rel;
    std::string log = c.rep.path("logs/tcpdump.log");
    // Headers and the first payload bytes (BTH, RETH, AETH, ...): a failing 1 MiB sweep stays small.
    p = spawn({"tcpdump", "-i", c.t.capture_iface(), "-U", "-s", "256", "-w", c.rep.path(rel), filter}, {}, log,
              "tcpdump");
    double t0 = now_s();
    while (now_s() - t0 < 3 && alive(p) && read_file(log).find("listening on") == std::string::npos) usleep(20000);
    return alive(p);
  }
  void finish(Ctx& c, bool keep) {
    if (p.pid <= 0) return;
    usleep(100000);  // the last packets reach the file (-U writes each packet)
    stop(p, SIGINT);
    if (!keep) unlink(c.rep.path(file).c_str()), file.clear();
  }
};

}  // namespace

Exchange exchange(Ctx& c, const std::string& tool, const std::string& args, bool ours_serves, double timeout_s) {
  Exchange x;
  Side& srv = ours_serves ? c.t.ours() : c.t.peer();
  Side& cli = ours_serves ? c.t.peer() : c.t.ours();
  int n = ++c.seq;
  std::string base = fmt("logs/%s-%03d-%s", c.gate.c_str(), n, tool.c_str());
  x.log = base + ".log";
  std::string slog = c.rep.path(base + "." + srv.name() + "-server.out");
  std::string clog = c.rep.path(base + "." + cli.name() + "-client.out");
  int port = free_port();
  Capture cap;
  cap.start(c, fmt("pcap/%s-%03d-%s.pcap", c.gate.c_str(), n, tool.c_str()));
  bool emu = c.t.is_mlx5();
  std::string scmd = command(srv, tool, args, port, "", emu);
  std::string ccmd = command(cli, tool, args, port, srv.control_addr(), emu);
  Proc sp = srv.start("timeout " + std::to_string(int(timeout_s)) + " " + scmd, slog, tool + " server");
  double t0 = now_s();
  bool up = false;
  while (now_s() - t0 < 20) {
    if (srv.listening(port)) {
      up = true;
      break;
    }
    if (!alive(sp)) break;
    usleep(50000);
  }
  if (up) {
    Proc cp = cli.start("timeout " + std::to_string(int(timeout_s)) + " " + ccmd, clog, tool + " client");
    x.client = wait(cp, timeout_s + 10);
    x.server = wait(sp, x.client.rc == 0 ? 30 : 5);
  } else {
    x.server = wait(sp, 1);
    x.why = "the server never listened on TCP port " + std::to_string(port);
  }
  if (x.why.empty() && x.client.rc != 0) x.why = fmt("client (%s) exit %d", cli.name().c_str(), x.client.rc);
  if (x.why.empty() && x.server.rc != 0) x.why = fmt("server (%s) exit %d", srv.name().c_str(), x.server.rc);
  x.ok = x.why.empty();
  cap.finish(c, true);  // record() drops it when the step passes (its own checks may still fail it)
  x.pcap = cap.file;
  std::ostringstream l;
  l << "## " << srv.name() << " (server): " << scmd << "\n"
    << x.server.out << "\n## " << cli.name() << " (client): " << ccmd << "\n"
    << x.client.out;
  write_file(c.rep.path(x.log), l.str());
  unlink(slog.c_str());
  unlink(clog.c_str());
  return x;
}

double perftest_gbps(const std::string& out, long size) {
  static const std::regex row(R"(^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$)");
  std::istringstream s(out);
  std::string line;
  std::smatch m;
  double best = -1;
  while (std::getline(s, line))
    if (std::regex_match(line, m, row) && std::stol(m[1]) == size) best = std::max(best, std::stod(m[4]));
  return best;
}

bool perftest_lat(const std::string& out, long size, double v[7]) {
  static const std::regex row(
      R"(^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$)");
  std::istringstream s(out);
  std::string line;
  std::smatch m;
  while (std::getline(s, line))
    if (std::regex_match(line, m, row) && std::stol(m[1]) == size) {
      for (int i = 0; i < 7; i++) v[i] = std::stod(m[3 + i]);
      return true;
    }
  return false;
}

double pingpong_usec(const std::string& out, int iters) {
  std::regex re(std::to_string(iters) + R"( iters in [\d.]+ seconds = ([\d.]+) usec/iter)");
  std::smatch m;
  return std::regex_search(out, m, re) ? std::stod(m[1]) : -1;
}

void completion_failure(const std::string& out, std::string* status, std::string* syndrome) {
  std::smatch m;
  // perftest: "Failed status 12: wr_id 0 syndrom 0x81"; pingpong: "Failed status transport retry
  // counter exceeded (12) for wr_id 2".
  if (std::regex_search(out, m, std::regex(R"(Failed status (\d+): wr_id \d+ syndro?m?e? (0x[0-9a-fA-F]+))")))
    *status = m[1], *syndrome = m[2];
  else if (std::regex_search(out, m, std::regex(R"(Failed status ([^(\n]*\((\d+)\)))")))
    *status = m[2].str() + " (" + m[1].str().substr(0, m[1].str().find(" (")) + ")";
}

StepRecord record(Ctx& c, const std::string& step, const Exchange& x, const std::string& opcode, bool extra,
                  const std::string& detail) {
  StepRecord r;
  r.gate = c.gate;
  r.step = step;
  r.seconds = x.client.seconds + 0.0;
  r.opcode = opcode;
  r.result = x.ok && extra ? "PASS" : "FAIL";
  r.detail = x.ok ? detail : x.why;
  r.log = x.log;
  r.pcap = x.pcap;
  if (!x.ok) {
    r.stage = "data path";
    completion_failure(x.client.out + "\n" + x.server.out, &r.status, &r.syndrome);
  }
  if (c.t.is_mlx5() && !c.t.emud_alive()) {
    r.result = "FAIL";
    r.detail = "melon-emud died; " + r.detail;
  }
  if (r.result == "PASS" && !r.pcap.empty()) unlink(c.rep.path(r.pcap).c_str()), r.pcap.clear();
  return r;
}

}  // namespace melon::gate
