// melon-gate: the gate suite (docs/gates.md). `melonctl gate NAME` runs it; `melonctl gate --list`
// prints the table of gates and their pass criteria.
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <map>
#include <sstream>

#include "exchange.h"
#include "gates.h"

namespace melon::gate {
std::vector<Step> linux_peer_plan(Ctx& c, const GateSpec& g);
Step linux_peer_full(int mtu);
}  // namespace melon::gate

using namespace melon::gate;

namespace {

void print_list() {
  printf("%-14s %-24s %-6s %s\n", "gate", "aliases", "needs", "anchor gate / what it proves / pass criteria");
  for (const GateSpec& g : gate_table()) {
    std::string needs = (g.needs & kMlx5) ? "mlx5" : (g.needs & kPeer) ? "peer" : "-";
    printf("%-14s %-24s %-6s %s\n", g.name, g.aliases, needs.c_str(), g.anchor);
    printf("%-46s proves:   %s\n", "", g.proves);
    printf("%-46s criteria: %s\n", "", g.criteria);
    printf("%-46s figures:  quick %d iterations x %d, full %d x %d\n", "", g.fig.iters[0], g.fig.repeats[0],
           g.fig.iters[1], g.fig.repeats[1]);
  }
  printf(
      "\nall: every gate the target supports; linux-peer: tests/peer/gate.sh (stock tools against rxe in a guest)\n");
}

std::string capture(const std::vector<std::string>& argv, const Env& env = {}) {
  char tmpl[] = "/tmp/melon-gate-out.XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  Done d = run(argv, env, tmpl, 30);
  unlink(tmpl);
  while (!d.out.empty() && d.out.back() == '\n') d.out.pop_back();
  return d.out;
}

std::string metadata(Target& t, const Options& o, const std::string& cmdline, const std::string& report) {
  std::ostringstream m;
  utsname u{};
  uname(&u);
  time_t now = time(nullptr);
  char when[64];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  m << "date: " << when << "\ncommand: " << cmdline << "\n";
  m << "os: " << u.sysname << " " << u.release << " " << u.version << " " << u.machine << "\n";
  m << "os release: " << capture({"sh", "-c", ". /etc/os-release 2>/dev/null && echo \"$PRETTY_NAME\""}) << "\n";
  m << "build: " << o.build << " ("
    << capture({"sh", "-c", "sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' " + shell_quote(o.build + "/CMakeCache.txt")})
    << ")\n";
  std::string rev = capture({"git", "-C", o.source, "rev-parse", "HEAD"});
  std::string dirty =
      capture({"sh", "-c", "git -C " + shell_quote(o.source) + " status --porcelain --untracked-files=no | head -1"});
  m << "git revision: " << rev << (dirty.empty() ? "" : " (modified)") << "\n";
  m << "mode: " << (o.quick ? "quick" : "full") << "\n";
  m << t.metadata();
  if (!t.is_linux_peer()) {
    std::string log = report + "/logs/devinfo-ours.txt";
    Proc p = t.ours().start("ibv_devinfo -v -d " + t.ours().dev(), log, "devinfo");
    Done d = wait(p, 30);
    std::istringstream s(d.out);
    std::string line;
    while (std::getline(s, line))
      for (const char* k :
           {"hca_id", "fw_ver", "vendor_id", "vendor_part_id", "board_id", "node_guid", "active_mtu", "state"})
        if (line.find(std::string(k) + ":") != std::string::npos)
          m << "device " << line.substr(line.find_first_not_of(" \t")) << "\n";
    m << "firmware: "
      << capture({"sh", "-c", "sed -n 's/^[[:space:]]*fw_ver:[[:space:]]*//p' " + shell_quote(log) + " | head -1"})
      << "\n";
  }
  return m.str();
}

// What the peer says about itself (ssh: collected over the same channel as the tools).
void collect_peer(Target& t, const Options& o, Report& rep, const std::string& when) {
  if (!t.has_peer() || !t.is_ssh()) return;
  std::string dev = t.peer().dev();
  std::string cmd =
      "echo '## uname'; uname -a; echo '## os-release'; cat /etc/os-release; echo '## rdma-core';"
      " (dpkg-query -W rdma-core ibverbs-providers perftest 2>/dev/null || rpm -q rdma-core perftest 2>/dev/null);"
      " echo '## ibv_devinfo'; ibv_devinfo -v -d " +
      dev + "; echo '## counters'; for f in /sys/class/infiniband/" + dev +
      "/ports/1/counters/* /sys/class/infiniband/" + dev +
      "/ports/1/hw_counters/*; do [ -r \"$f\" ] && echo \"$(basename \"$f\") $(cat \"$f\")\"; done;"
      " echo '## neighbour'; ip neigh show " +
      o.our_ip;
  mkdir(rep.path("peer").c_str(), 0755);
  t.peer_shell(cmd, rep.path("peer/" + when + ".txt"), 60);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"melon-gate: MelonDMA's gate suite (docs/gates.md)", "melon-gate"};
  Options o;
  std::string name;
  bool list = false, no_capture = false;
  const char* src_env = getenv("MELON_SOURCE_DIR");
  o.source = src_env ? src_env : MELON_SOURCE_DIR;
  o.build = MELON_BUILD_DIR;
  if (const char* s = getenv("MELON_GATE_SSH")) o.ssh_cmd = s;
  app.add_option("gate", name, "a gate name or alias (--list), or all");
  app.add_flag("--list", list, "print the gate table with each gate's pass criteria");
  app.add_option("--provider", o.provider, "our side: soft or mlx5 (mlx5_0 on a melon-emud the gate starts)")
      ->check(CLI::IsMember({"soft", "mlx5"}));
  app.add_option("--peer", o.peer, "local, linux-peer, or ssh://user@host[:port]");
  app.add_option("--build", o.build, "the build tree to test (lib/, melon-emud, test programs)");
  app.add_option("--report", o.report, "the run's folder (default: <build>/gate-reports/<gate>-<time>)");
  app.add_flag("--quick", o.quick, "the short figures (CI)");
  app.add_option("--mtu", o.mtu, "path MTU for the tools")
      ->envname("PHASE2_MTU")
      ->check(CLI::IsMember({256, 512, 1024, 2048, 4096}));
  app.add_option("--cycles", o.cycles, "stable-driver: no-FLR cycles")
      ->envname("STABLE_INIT_CYCLES")
      ->check(CLI::Range(1, 100));
  app.add_option("--duration", o.duration, "soak: seconds")->check(CLI::PositiveNumber);
  app.add_option("--max-rounds", o.max_rounds, "caps every gate's iteration count")
      ->envname("MLX_MAX_ROUNDS")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min-gbps", o.min_gbps, "bulk-write: each run at least this many Gbit/s");
  app.add_flag("--no-capture", no_capture, "no pcap of failing steps");
  app.add_option("--ssh", o.ssh, "ssh: the peer login (user@host) when --peer ssh:// names none")->envname("SPARK_SSH");
  app.add_option("--ssh-key", o.ssh_key, "ssh: identity file")->envname("SPARK_SSH_KEY");
  app.add_option("--control-host", o.control_host, "ssh: the peer's address for the tools' TCP rendezvous")
      ->envname("SPARK_CONTROL_HOST");
  app.add_option("--our-ip", o.our_ip, "ssh: our RoCE address")->envname("MAC_ROCE_IP");
  app.add_option("--our-mac", o.our_mac, "ssh: our RoCE MAC (the peer's static neighbour entry is checked)")
      ->envname("MAC_ROCE_MAC");
  app.add_option("--peer-dev", o.peer_dev, "ssh: the peer's verbs device")->envname("SPARK_IB_DEV");
  app.add_option("--peer-gid", o.peer_gid, "ssh: the peer's GID index (RoCEv2)")->envname("SPARK_GID_INDEX");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) ? 2 : 0;
  }
  if (list) {
    print_list();
    return 0;
  }
  if (name.empty()) {
    fprintf(stderr, "melon-gate: name a gate (--list) or all\n");
    return 2;
  }
  o.capture = !no_capture;
  if (!o.min_gbps && getenv("MELON_GATE_MIN_GBPS")) o.min_gbps = atof(getenv("MELON_GATE_MIN_GBPS"));
  if (o.quick && !app.count("--duration")) o.duration = 5;
  if (o.quick && !app.count("--cycles") && !getenv("STABLE_INIT_CYCLES")) o.cycles = 3;
  std::vector<const GateSpec*> gates;
  if (name == "all") {
    for (const GateSpec& g : gate_table()) gates.push_back(&g);
  } else if (const GateSpec* g = find_gate(name)) {
    gates.push_back(g);
  } else {
    fprintf(stderr, "melon-gate: no gate '%s' (melon-gate --list)\n", name.c_str());
    return 2;
  }
  if (o.report.empty()) {
    char stamp[32];
    time_t now = time(nullptr);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
    o.report = o.build + "/gate-reports/" + name + "-" + o.provider + "-" + stamp + "-" + std::to_string(getpid());
  }
  std::string cmdline;
  for (int i = 0; i < argc; i++) cmdline += (i ? " " : "") + std::string(argv[i]);

  Report rep;
  std::string why;
  if (!rep.open(o.report, &why)) {
    fprintf(stderr, "melon-gate: %s\n", why.c_str());
    return 2;
  }
  Target t(o);
  if (!t.up(&why)) {
    fprintf(stderr, "melon-gate: %s\n", why.c_str());
    rep.write_metadata("setup failed: " + why + "\n");
    return 1;
  }
  rep.write_metadata(metadata(t, o, cmdline, o.report));
  collect_peer(t, o, rep, "before");
  printf("melon-gate %s: provider %s, peer %s; report %s\n", name.c_str(), o.provider.c_str(), o.peer.c_str(),
         o.report.c_str());

  // Plan every gate first: the progress bar knows the total.
  struct Planned {
    const GateSpec* g;
    std::string skip;
    std::vector<Step> steps;
  };
  std::vector<Planned> plan;
  int total = 0;
  bool whole_linux_peer = t.is_linux_peer() && name == "all";
  for (const GateSpec* g : gates) {
    Ctx c{t, rep, o, o.quick ? 0 : 1, g->name};
    Planned p{g, unsupported_reason(*g, t), {}};
    if (p.skip.empty()) {
      if (t.is_linux_peer() && (g->needs & kPeer)) {
        if (!whole_linux_peer)
          p.steps = linux_peer_plan(c, *g);
        else
          p.skip = "in the whole rxe guest gate (linux-peer, below)";
      } else {
        p.steps = g->plan(c, *g);
      }
    }
    total += int(p.steps.size());
    plan.push_back(std::move(p));
  }
  if (whole_linux_peer) {
    static const GateSpec lp{
        "linux-peer", "", "the interop gate (tests/peer/gate.sh)", "", "", kPeer, {{1, 1}, {1, 1}}, "", nullptr};
    Planned p{&lp, "", {}};
    for (int mtu : {1500, 4200}) p.steps.push_back(linux_peer_full(mtu));
    total += int(p.steps.size());
    plan.push_back(std::move(p));
  }
  rep.plan(total);

  struct Row {
    std::string gate, anchor, result;
    int pass = 0, fail = 0, skip = 0;
    double seconds = 0;
  };
  std::vector<Row> rows;
  for (Planned& p : plan) {
    Row row{p.g->name, p.g->anchor, "", 0, 0, 0, 0};
    if (!p.skip.empty()) {
      row.result = "n/a";
      row.anchor = p.skip;
      rows.push_back(row);
      continue;
    }
    Ctx c{t, rep, o, o.quick ? 0 : 1, p.g->name};
    double g0 = now_s();
    for (Step& s : p.steps) {
      rep.begin_step(c.gate, s.name);
      double s0 = now_s();
      StepRecord r = s.run(c);
      if (r.seconds <= 0) r.seconds = now_s() - s0;
      rep.add(r);
      rep.end_step(r);
      (r.result == "PASS" ? row.pass : r.result == "SKIP" ? row.skip : row.fail)++;
    }
    row.seconds = now_s() - g0;
    row.result = row.fail ? "FAIL" : row.pass ? "PASS" : "SKIP";
    rows.push_back(row);
  }
  collect_peer(t, o, rep, "after");
  if (t.is_mlx5()) {
    // melon-emud stops: its last lines say what it released, and a leak is a nonzero exit.
    StepRecord r;
    r.gate = "teardown", r.step = "melon-emud stops on SIGTERM with nothing leaked", r.log = "logs/melon-emud.log";
    int rc = t.stop_emud();
    write_file(rep.path(r.log), read_file(t.emud_log()));
    r.result = rc == 0 ? "PASS" : "FAIL";
    r.stage = rc == 0 ? "-" : "teardown";
    r.detail = rc == 0 ? "exit 0" : fmt("exit %d (the core reports a leak at teardown as nonzero)", rc);
    rep.add(r);
    rows.push_back(Row{"teardown", "melon-emud's own teardown check", r.result, rc == 0, rc != 0, 0, 0});
  }
  t.down();

  // One summary table (also summary.txt), then the HTML page and plots.
  std::ostringstream sum;
  sum << fmt("%-14s %-6s %5s %5s %5s %8s  %s\n", "gate", "result", "pass", "fail", "skip", "seconds", "anchor gate");
  int failed = 0, passed = 0;
  for (const Row& r : rows) {
    sum << fmt("%-14s %-6s %5d %5d %5d %8.1f  %s\n", r.gate.c_str(), r.result.c_str(), r.pass, r.fail, r.skip,
               r.seconds, r.anchor.c_str());
    if (r.result == "FAIL") failed++;
    if (r.result == "PASS") passed++;
  }
  for (const StepRecord& s : rep.steps())
    if (s.result == "FAIL")
      sum << fmt("FAIL %s: %s: %s (stage %s, opcode %s, status %s, syndrome %s; %s)\n", s.gate.c_str(), s.step.c_str(),
                 s.detail.c_str(), s.stage.c_str(), s.opcode.c_str(), s.status.c_str(), s.syndrome.c_str(),
                 s.log.c_str());
  std::string verdict = failed ? "FAIL" : passed ? "PASS" : "SKIP";
  sum << "melon-gate " << name << ": " << verdict << " (" << passed << " passed, " << failed << " failed); report "
      << o.report << "\n";
  write_file(rep.path("summary.txt"), sum.str());
  std::string plot = o.source + "/tools/gate/plot.py";
  // Debian's python3 has python3-matplotlib; a python3 earlier on PATH (pyenv, Homebrew) may not.
  const char* py = getenv("MELON_PYTHON");
  Done pd = run({py ? py : "/usr/bin/python3", plot, o.report}, {}, rep.path("logs/plot.log"), 300);
  if (pd.rc != 0 && !py) pd = run({"python3", plot, o.report}, {}, rep.path("logs/plot.log"), 300);
  printf("\n%s", sum.str().c_str());
  if (pd.rc != 0) printf("melon-gate: the HTML page/plots were not written (logs/plot.log)\n");
  return failed ? 1 : passed ? 0 : 77;
}
