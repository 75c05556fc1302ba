#include "gates.h"

#include <signal.h>
#include <unistd.h>

#include <string.h>

#include <algorithm>
#include <memory>

#include "exchange.h"
#include "uapi_steps.h"

namespace melon::gate {

int Ctx::iters(const GateSpec& g) const {
  int n = g.fig.iters[q];
  return o.max_rounds > 0 && o.max_rounds < n ? o.max_rounds : n;
}

namespace {

// perftest: the peer's outstanding reads become each end's max_rd_atomic; a ConnectX takes at most
// 16 (docs/mlx5-provider.md), so READ and atomic rows with mlx5_0 tell both ends -o 16.
std::string reads(Ctx& c) { return c.t.is_mlx5() || c.t.is_ssh() ? " -o 16" : ""; }
const char* dir_name(bool ours_serves) { return ours_serves ? "peer->ours" : "ours->peer"; }

Step pingpong(const std::string& name, const std::string& tool, int size, int iters, const std::string& extra,
              bool ours_serves) {
  return {name, [=](Ctx& c) {
            Exchange x = exchange(c, tool, fmt("-s %d -n %d -c %s", size, iters, extra.c_str()), ours_serves);
            double us = pingpong_usec(x.client.out, iters);
            if (x.ok) c.rep.figure(fmt("pingpong\t%s\t%s\t%d\t%.2f", c.gate.c_str(), tool.c_str(), size, us));
            return record(c, name, x, "SEND/RECV", us > 0,
                          fmt("%d x %d B, payload checked (-c), %.1f usec/iter", iters, size, us));
          }};
}

const char* opcode_of(const std::string& tool) {
  if (tool.find("write") != std::string::npos) return "RDMA_WRITE";
  if (tool.find("read") != std::string::npos) return "RDMA_READ";
  if (tool.find("atomic") != std::string::npos) return "ATOMIC";
  return "SEND";
}

// A perftest bandwidth exchange; `kind` names the figure row (sweep, qp, bulk) or "" for none.
Step bandwidth(const std::string& name, const std::string& tool, long size, int iters, const std::string& extra,
               bool ours_serves, const std::string& kind = "", const std::string& key = "", double min_gbps = 0) {
  return {name, [=](Ctx& c) {
            std::string ex = extra;
            if (tool == "ib_read_bw" || tool == "ib_atomic_bw")
              if (ex.find("-o ") == std::string::npos) ex += reads(c);
            Exchange x = exchange(c, tool, fmt("-s %ld -n %d --report_gbits %s", size, iters, ex.c_str()), ours_serves);
            double g = perftest_gbps(x.client.out + "\n" + x.server.out, size);
            bool fast = min_gbps > 0 ? g >= min_gbps : g > 0;
            if (x.ok && !kind.empty())
              c.rep.figure(fmt("%s\t%s\t%s\t%ld\t%.4f", kind.c_str(), c.gate.c_str(), key.c_str(), size, g));
            StepRecord r = record(c, name, x, opcode_of(tool), fast,
                                  fmt("%d x %ld B, %.3f Gbit/s%s", iters, size, g,
                                      min_gbps > 0 ? fmt(" (at least %.1f)", min_gbps).c_str() : ""));
            if (x.ok && !fast) r.detail = fmt("%.3f Gbit/s is below %.3f", g, min_gbps > 0 ? min_gbps : 0.0);
            return r;
          }};
}

Step latency(const std::string& name, const std::string& tool, long size, int iters, bool ours_serves) {
  return {name, [=](Ctx& c) {
            std::string ex = tool == "ib_read_lat" || tool == "ib_atomic_lat" ? reads(c) : "";
            Exchange x = exchange(c, tool, fmt("-s %ld -n %d%s", size, iters, ex.c_str()), ours_serves);
            double v[7] = {};
            bool have = perftest_lat(x.client.out + "\n" + x.server.out, size, v);
            bool sane = have && v[0] > 0 && v[0] <= v[2] && v[2] <= v[1];
            if (x.ok && have)
              c.rep.figure(fmt("lat\t%s\t%s\t%ld\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f", c.gate.c_str(), tool.c_str(),
                               size, v[0], v[2], v[3], v[5], v[6], v[1]));
            return record(c, name, x, opcode_of(tool), sane,
                          fmt("%ld B: min %.2f, typical %.2f, 99%% %.2f, 99.9%% %.2f, max %.2f usec", size, v[0], v[2],
                              v[5], v[6], v[1]));
          }};
}

// One of the build's test programs (the existing isolation, lifetime, quota and fuzz tests).
Step program(const std::string& name, const std::string& rel, std::vector<std::string> args, double timeout = 300) {
  return {name, [=](Ctx& c) {
            StepRecord r;
            r.gate = c.gate, r.step = name;
            std::string bin = c.o.build + "/" + rel;
            if (access(bin.c_str(), X_OK) != 0) {
              r.result = "SKIP", r.detail = "not built: " + rel;
              return r;
            }
            r.log = fmt("logs/%s-%03d-%s.log", c.gate.c_str(), ++c.seq, rel.substr(rel.rfind('/') + 1).c_str());
            std::vector<std::string> argv{bin};
            for (auto& a : args) argv.push_back(a);
            Done d = run(argv, {{"ASAN_OPTIONS", "detect_leaks=1"}}, c.rep.path(r.log), timeout, name);
            r.seconds = d.seconds;
            r.result = d.rc == 0 ? "PASS" : "FAIL";
            size_t p = d.out.rfind("[  PASSED  ]");
            r.detail = d.rc == 0 ? (p != std::string::npos ? d.out.substr(p, d.out.find('\n', p) - p) : "exit 0")
                                 : fmt("exit %d", d.rc);
            if (d.rc == 0 && d.out.find("Done ") != std::string::npos) {  // libFuzzer's last line
              size_t q = d.out.rfind("Done ");
              r.detail = d.out.substr(q, d.out.find('\n', q) - q);
            }
            return r;
          }};
}

Step fuzzer(const std::string& name, const std::string& target, int runs) {
  return {name, [=](Ctx& c) {
            char tmpl[] = "/tmp/melon-gate-corpus.XXXXXX";
            std::string dir = mkdtemp(tmpl) ? tmpl : "/tmp";
            std::vector<std::string> a{fmt("-runs=%d", runs), "-max_total_time=120", dir};
            std::string seed = c.o.source + "/tests/fuzz/corpus/" + target;
            if (access(seed.c_str(), R_OK) == 0) a.push_back(seed);
            StepRecord r = program(name, "tests/fuzz/" + target, a).run(c);
            run({"rm", "-rf", dir}, {}, "/dev/null", 10);
            return r;
          }};
}

// --peer linux-peer: the rxe guest gate (tests/peer/gate.sh) for the exchanges this gate stands for.
Step linux_peer(const std::string& name, const std::string& only, int mtu, bool extended) {
  return {name, [=](Ctx& c) {
            StepRecord r;
            r.gate = c.gate, r.step = name;
            r.log = fmt("logs/%s-%03d-linux-peer-%d.log", c.gate.c_str(), ++c.seq, mtu);
            std::vector<std::string> argv{c.o.source + "/tests/peer/gate.sh", "--provider", c.o.provider, "--mtu",
                                          std::to_string(mtu)};
            if (extended) argv.push_back("--extended");
            if (c.o.capture) argv.insert(argv.end(), {"--capture", c.rep.path(fmt("pcap/linux-peer-%d.pcap", mtu))});
            argv.push_back(c.t.lib());
            Env env;
            if (!only.empty()) env["PEER_GATE_ONLY"] = only;
            Done d = run(argv, env, c.rep.path(r.log), 3600, name);
            r.seconds = d.seconds;
            r.result = d.rc == 0 ? "PASS" : d.rc == 77 ? "SKIP" : "FAIL";
            size_t p = d.out.rfind("gate: ");
            r.detail = p != std::string::npos ? d.out.substr(p, d.out.find('\n', p) - p) : fmt("exit %d", d.rc);
            if (d.rc == 77) r.detail = "this machine cannot run the guest (tests/peer)";
            if (d.rc == 0 || d.rc == 77)
              unlink(c.rep.path(fmt("pcap/linux-peer-%d.pcap", mtu)).c_str());
            else
              r.pcap = fmt("pcap/linux-peer-%d.pcap", mtu);
            return r;
          }};
}

std::vector<Step> via_linux_peer(Ctx&, const GateSpec& g) {
  return {linux_peer(fmt("rxe guest, MTU 1500 (path MTU 1024): %s", g.peer_only), g.peer_only, 1500,
                     std::string(g.name) == "multi-qp")};
}

// ---- The gates ----------------------------------------------------------------------------------

std::vector<Step> plan_p0(Ctx& c, const GateSpec& g) {
  std::vector<Step> s;
  int n = c.iters(g);
  std::vector<int> sizes = c.q ? std::vector<int>{1, 64, 256, 4096} : std::vector<int>{4096};
  for (bool back : {false, true})
    for (int z : sizes)
      s.push_back(
          pingpong(fmt("SEND/RECV %d B, %s", z, dir_name(back)), "ibv_rc_pingpong", z, n, fmt("-m %d", c.o.mtu), back));
  for (bool back : {false, true})
    s.push_back(bandwidth(fmt("WRITE 1 MiB window 16, %s", dir_name(back)), "ib_write_bw", 1 << 20, c.q ? 1024 : 20,
                          fmt("-t 16 -m %d", c.o.mtu), back));
  std::vector<int> rsizes = c.q ? std::vector<int>{2, 64, 256, 4096} : std::vector<int>{4096};
  std::vector<int> windows = c.q ? std::vector<int>{1, 16} : std::vector<int>{16};
  for (bool back : {false, true})
    for (int z : rsizes)
      for (int w : windows)
        s.push_back(bandwidth(fmt("READ %d B window %d, %s", z, w, dir_name(back)), "ib_read_bw", z, n,
                              fmt("-o %d -m %d", w, c.o.mtu), back));
  s.push_back(bandwidth("WRITE posted 16 at a time (perftest -l 16 post list)", "ib_write_bw", 4096, (n + 15) / 16 * 16,
                        fmt("-l 16 -m %d", c.o.mtu), false));
  return s;
}

std::vector<Step> plan_phase2(Ctx& c, const GateSpec& g) {
  std::vector<Step> s;
  int n = c.iters(g);
  for (int z : {1, 64, 256, c.o.mtu})
    s.push_back(pingpong(fmt("SEND/RECV %d B x %d", z, n), "ibv_rc_pingpong", z, n, fmt("-m %d", c.o.mtu), false));
  for (int i = 1; i <= c.repeats(g); i++)
    s.push_back(pingpong(fmt("recreate cycle %d: fresh QP, CQ, MR, PD", i), "ibv_rc_pingpong", 4096, 20,
                         fmt("-m %d", c.o.mtu), i % 2 == 0));
  return s;
}

std::vector<Step> plan_p3(Ctx& c, const GateSpec& g) {
  int n = c.iters(g);
  std::string m = fmt("-m %d", c.o.mtu);
  std::vector<Step> s = {
      bandwidth("inline SEND 64 B (-I 64)", "ib_send_bw", 64, n, "-I 64 " + m, false),
      bandwidth("atomic FETCH_AND_ADD", "ib_atomic_bw", 8, n, "-A FETCH_AND_ADD " + m, false),
      bandwidth("atomic CMP_AND_SWAP", "ib_atomic_bw", 8, n, "-A CMP_AND_SWAP " + m, false),
      latency("atomic latency FETCH_AND_ADD", "ib_atomic_lat", 8, n, false),
      bandwidth("SEND at SL 3 (--sl 3)", "ib_send_bw", 4096, n, "--sl 3 " + m, false),
      pingpong("SEND/RECV with completion events (CQ arming, -e)", "ibv_rc_pingpong", 256, n, "-e " + m, false),
  };
  if (c.q) {
    s.push_back(bandwidth("inline WRITE 64 B (-I 64)", "ib_write_bw", 64, n, "-I 64 " + m, false));
    s.push_back(pingpong("SEND/RECV at SL 3 (ibv_rc_pingpong -l 3)", "ibv_rc_pingpong", 256, n, "-l 3 " + m, false));
  }
  return s;
}

std::vector<Step> plan_multi_qp(Ctx& c, const GateSpec& g) {
  std::vector<Step> s;
  long size = c.q ? 1 << 20 : 65536;
  for (int q : {1, 2, 4, 8})
    s.push_back(bandwidth(fmt("%d QP%s, WRITE %ld B window 16", q, q > 1 ? "s" : "", size), "ib_write_bw", size,
                          c.iters(g), fmt("-q %d -t 16 -m %d", q, c.o.mtu), false, "qp", std::to_string(q)));
  return s;
}

std::vector<Step> plan_speed(Ctx& c, const GateSpec& g) {
  std::vector<Step> s;
  std::vector<int> windows = c.q ? std::vector<int>{16, 64, 256} : std::vector<int>{16, 64};
  std::vector<long> sizes = c.q ? std::vector<long>{4096, 65536, 1 << 20} : std::vector<long>{4096, 65536};
  for (int mtu : {1024, 4096})
    for (int w : windows)
      for (long z : sizes)
        if (c.q || mtu == 4096 || w == windows[0])  // quick: the second MTU at the first window only
          s.push_back(bandwidth(fmt("WRITE %ld B, window %d, MTU %d", z, w, mtu), "ib_write_bw", z, c.iters(g),
                                fmt("-t %d -m %d", w, mtu), false, "sweep", fmt("%d\t%d", mtu, w)));
  for (const char* t : {"ib_write_lat", "ib_send_lat", "ib_read_lat"})
    if (c.q || strcmp(t, "ib_read_lat") != 0)
      s.push_back(latency(fmt("%s 8 B percentiles", t), t, 8, c.q ? 10000 : 500, false));
  return s;
}

std::vector<Step> plan_bulk(Ctx& c, const GateSpec& g) {
  std::vector<Step> s;
  for (int i = 1; i <= c.repeats(g); i++)
    s.push_back(bandwidth(fmt("run %d: fresh QP/MR, WRITE 1 MiB x %d, window 16", i, c.iters(g)), "ib_write_bw",
                          1 << 20, c.iters(g), fmt("-t 16 -m %d", c.o.mtu), false, "bulk", std::to_string(i),
                          c.o.min_gbps));
  return s;
}

std::vector<Step> plan_soak(Ctx& c, const GateSpec&) {
  auto base = std::make_shared<uapi::UsageResp>();
  std::vector<Step> s;
  if (c.t.is_mlx5()) s.push_back(step_take_baseline(base));
  double dur = c.o.duration;
  s.push_back({fmt("%.0f s of SEND/RECV, WRITE and READ rounds, fresh objects every round", dur), [dur](Ctx& c) {
                 StepRecord r;
                 r.gate = c.gate, r.step = fmt("%.0f s of rounds", dur);
                 double t0 = now_s();
                 int rounds = 0;
                 std::string bad;
                 while (now_s() - t0 < dur && bad.empty()) {
                   Exchange a = exchange(c, "ibv_rc_pingpong", fmt("-s 4096 -n 200 -c -m %d", c.o.mtu), rounds % 2);
                   Exchange b = exchange(c, "ib_write_bw", fmt("-s 65536 -n 100 -m %d", c.o.mtu), rounds % 2 == 0);
                   Exchange d =
                       exchange(c, "ib_read_bw", fmt("-s 4096 -n 100 -m %d%s", c.o.mtu, reads(c).c_str()), false);
                   for (Exchange* x : {&a, &b, &d})
                     if (!x->ok && bad.empty())
                       bad = fmt("round %d: ", rounds + 1) + x->why, r.log = x->log, r.pcap = x->pcap;
                     else if (x->ok) {
                       unlink(c.rep.path(x->log).c_str());
                       if (!x->pcap.empty()) unlink(c.rep.path(x->pcap).c_str());
                     }
                   rounds++;
                 }
                 r.seconds = now_s() - t0;
                 r.result = bad.empty() && rounds > 0 ? "PASS" : "FAIL";
                 r.detail = bad.empty() ? fmt("%d rounds in %.0f s, every one passed", rounds, r.seconds) : bad;
                 r.opcode = "SEND/WRITE/READ";
                 return r;
               }});
  if (c.t.is_mlx5()) s.push_back(step_no_leak("after the soak: the device holds what it held before", base));
  return s;
}

// P0.2: two of our clients at once; one killed (SIGKILL) in mid-traffic; the other completes.
Step kill_one_of_two() {
  const char* name = "two clients at once, one killed with SIGKILL mid-traffic, the other completes";
  return {name, [name](Ctx& c) {
            StepRecord r;
            r.gate = c.gate, r.step = name, r.opcode = "SEND/RECV";
            r.log = fmt("logs/%s-%03d-kill.log", c.gate.c_str(), ++c.seq);
            int pa = free_port(), pb = free_port();
            while (pb == pa) pb = free_port();
            auto cmd = [](Side& s, int port, int n, const std::string& to) {
              return fmt("ibv_rc_pingpong -d %s -g %d -p %d -s 4096 -n %d -c %s", s.dev().c_str(), s.gid(), port, n,
                         to.c_str());
            };
            std::string dir = c.rep.path(r.log);
            Side &oa = c.t.ours(), &ob = c.t.ours2(), &pa_ = c.t.peer(), &pb_ = c.t.peer2();
            Proc as = oa.start(cmd(oa, pa, 1000000, ""), dir + ".a-ours", "victim (ours)");
            Proc bs = ob.start(cmd(ob, pb, 500, ""), dir + ".b-ours", "survivor (ours)");
            double t0 = now_s();
            while (now_s() - t0 < 20 && !(oa.listening(pa) && ob.listening(pb))) usleep(50000);
            Proc ac = pa_.start(cmd(pa_, pa, 1000000, oa.control_addr()), dir + ".a-peer", "victim (peer)");
            usleep(300000);  // the victim is in traffic
            Proc bc = pb_.start(cmd(pb_, pb, 500, ob.control_addr()), dir + ".b-peer", "survivor (peer)");
            usleep(200000);
            bool victim_ran = alive(as);
            stop(as, SIGKILL);
            Done b_client = wait(bc, 120), b_server = wait(bs, 30);
            stop(ac, SIGKILL);
            std::string text = "## victim ours\n" + read_file(dir + ".a-ours") + "\n## victim peer\n" +
                               read_file(dir + ".a-peer") + "\n## survivor ours\n" + b_server.out +
                               "\n## survivor peer\n" + b_client.out;
            write_file(dir, text);
            for (const char* e : {".a-ours", ".a-peer", ".b-ours", ".b-peer"}) unlink((dir + e).c_str());
            bool ok = victim_ran && b_client.rc == 0 && b_server.rc == 0 && pingpong_usec(b_client.out, 500) > 0;
            r.seconds = now_s() - t0;
            r.result = ok ? "PASS" : "FAIL";
            r.detail = ok ? "the survivor did 500 x 4 KiB with its payload checked while the victim was killed"
                          : fmt("victim ran %d, survivor exit %d/%d", victim_ran, b_server.rc, b_client.rc);
            return r;
          }};
}

std::vector<Step> plan_isolation(Ctx& c, const GateSpec& g) {
  auto base = std::make_shared<uapi::UsageResp>();
  std::vector<Step> s;
  if (c.t.is_mlx5()) s.push_back(step_take_baseline(base));
  s.push_back(kill_one_of_two());
  if (c.t.is_mlx5()) {
    s.push_back(step_no_leak("the killed client left nothing behind", base));
    s.push_back(program("server: another client's handle names nothing; events go to their owner only",
                        "tests/uapi/uapi_server_test",
                        {"--gtest_filter=Uapi.AnotherClientsHandleNamesNothingOfIts:Uapi.EventsGoToTheOwnerOnly:"
                         "Uapi.AnEventOfALeftClientDoesNotReachTheNextClientInItsSlot"}));
    std::string f =
        "Emud.BadRequestsGetExactErrorsWhileAnotherClientWorks:Emud.AClientThatTruncatesItsMemfdsHarmsNoOne";
    if (c.q) f += ":Emud.AHostileClientGetsCleanErrorsAndAWellBehavedOneWorksOn";
    s.push_back(program(c.q ? "melon-emud: a hostile client, bad requests and truncated memfds beside a working client"
                            : "melon-emud: bad requests and truncated memfds beside a working client (uapi_emud_test)",
                        "tests/dext/emuhost/uapi_emud_test", {"--gtest_filter=" + f}));
  }
  (void)g;
  return s;
}

std::vector<Step> plan_lifetime(Ctx& c, const GateSpec& g) {
  auto base = std::make_shared<uapi::UsageResp>();
  std::vector<Step> s;
  if (c.t.is_mlx5()) s.push_back(step_take_baseline(base));
  for (int i = 1; i <= c.repeats(g); i++)
    s.push_back(pingpong(fmt("create, use, destroy %d", i), "ibv_rc_pingpong", 64, 10, fmt("-m %d", c.o.mtu), false));
  if (c.t.is_mlx5()) {
    s.push_back(step_no_leak("every object destroyed, nothing held", base));
    s.push_back(program("tokens: type, generation, slot; stale, forged and other clients' tokens refused",
                        "tests/uapi/uapi_server_test",
                        {"--gtest_filter=Uapi.TokensCarryTypeGenerationSlot:Uapi.ForgedHandlesAreRefused:"
                         "Uapi.StaleHandleIsRefusedAfterItsSlotIsReused:Uapi.DestroyWithDependentsIsBusy:"
                         "Uapi.DetachReleasesEverythingDependentsFirst:Uapi.CloseReleasesAndOnlyOpenIsAcceptedAfter:"
                         "Uapi.RequestsFromADetachedClientAreRefused"}));
    s.push_back(program("melon-emud: a client killed while calling leaves nothing behind",
                        "tests/dext/emuhost/uapi_emud_test", {"--gtest_filter=Emud.AKilledClientLeavesNothingBehind"}));
  }
  return s;
}

std::vector<Step> plan_quota(Ctx& c, const GateSpec&) {
  auto base = std::make_shared<uapi::UsageResp>();
  std::vector<Step> s{step_take_baseline(base), step_live_quota(), step_no_leak("the quota left nothing behind", base)};
  s.push_back(program("server: every quota before the firmware, released on free", "tests/uapi/uapi_server_test",
                      {"--gtest_filter=Uapi.*Quota*:Uapi.MrQuotaIs128PerClient:Uapi.SixteenClientsPerDevice:"
                       "Uapi.ClientConnectionsAreLimitedPerUser:Uapi.FirmwareRefusalConsumesNoQuotaOrHandle:"
                       "Uapi.*IsLimitedPer*"}));
  std::string f = "Emud.QueueAndPinnedMemoryAreLimitedInBytes:Emud.OneUserCannotTakeEveryConnection";
  if (c.q)
    f += ":EmudOneUser.SixteenClientsAtOnceAndTheSeventeenthIsRefused:Emud."
         "RequestsAreCheckedAgainstTheLimitsTheDeviceAdvertises";
  s.push_back(program("melon-emud: byte limits and connections (uapi_emud_test)", "tests/dext/emuhost/uapi_emud_test",
                      {"--gtest_filter=" + f}));
  return s;
}

std::vector<Step> plan_abi_fuzz(Ctx& c, const GateSpec& g) {
  auto base = std::make_shared<uapi::UsageResp>();
  int runs = g.fig.iters[c.q];  // MLX_MAX_ROUNDS caps exchanges, not fuzz runs
  return {
      step_take_baseline(base),
      step_live_refusals(),
      step_no_leak("the refused requests left nothing behind", base),
      program("server: each refusal's exact status, no backend call", "tests/uapi/uapi_server_test",
              {"--gtest_filter=Uapi.EverySelectorButOpenIsRefusedBeforeOpen:Uapi.UnknownSelector:"
               "Uapi.TruncatedRequestIsRefused:Uapi.LongerRequestNeedsZeroTail:"
               "Uapi.ShortResponseBufferIsRefusedBeforeAnythingIsCreated:Uapi.ReservedFieldsMustBeZero:"
               "Uapi.*FieldsAreChecked:Uapi.WrongStateTransitionsNeverReachTheFirmware"}),
      fuzzer(fmt("fuzz_uapi_request: %d random request sequences from three clients", runs), "fuzz_uapi_request", runs),
      fuzzer(fmt("fuzz_emud_socket: %d datagrams on melon-emud's socket protocol", runs), "fuzz_emud_socket", runs)};
}

std::vector<Step> plan_stable(Ctx& c, const GateSpec& g) { return plan_stable_driver(c, g); }

}  // namespace

// The table. Figures: {quick iterations, full iterations}, {quick repeats, full repeats}.
const std::vector<GateSpec>& gate_table() {
  static const std::vector<GateSpec> t = {
      {"p0",
       "datapath,p0.1",
       "P0.1 datapath matrix (run_p0_gate.sh)",
       "RC SEND/RECV, RDMA WRITE and RDMA READ move the right bytes both ways, at every size and window",
       "every exchange: both ends exit 0; SEND/RECV payload checked (-c) with nonzero usec/iter; WRITE/READ rows "
       "with nonzero Gbit/s",
       kPeer,
       {{100, 10000}, {1, 1}},
       "ibv_rc_pingpong [14]|ib_write_bw|ib_read_bw",
       plan_p0},
      {"phase2",
       "send-recv,p2",
       "Phase 2 SEND/RECV (run_phase2_gate.sh)",
       "SEND/RECV against the peer at 1/64/256 B and the MTU, then fresh QP/CQ/MR/PD recreate cycles",
       "each size: N exchanges, payload checked, nonzero usec/iter; each recreate cycle passes",
       kPeer,
       {{200, 250000}, {1, 10}},
       "ibv_rc_pingpong",
       plan_phase2},
      {"p3",
       "inline-atomics-sl",
       "P3 inline + atomics + SL (run_p3_gate.sh)",
       "inline SEND/WRITE, 64-bit FETCH_AND_ADD and CMP_AND_SWAP, SL 3, completion-event arming",
       "every exchange passes with nonzero figures; atomic latency min <= typical <= max",
       kPeer,
       {{100, 10000}, {1, 1}},
       "ib_atomic_bw|ib_send_lat",
       plan_p3},
      {"multi-qp",
       "phase3,qp-scaling",
       "Phase 3 multi-QP 1/2/4/8 (run_phase3_multi_qp_gate.sh)",
       "1, 2, 4 and 8 QPs at once, each WRITE window 16; aggregate Gbit/s per QP count (plot)",
       "every QP count passes with nonzero aggregate Gbit/s (scaling reported, not asserted: the anchor's hardware "
       "baseline is 1.95/3.58/4.19x)",
       kPeer,
       {{50, 1024}, {1, 1}},
       "-q 4",
       plan_multi_qp},
      {"speed",
       "phase5,sweep",
       "Phase 5 outstanding-WR speed sweep (run_phase5 speed gate)",
       "WRITE bandwidth over message size x outstanding-WR window x path MTU; WRITE/SEND/READ latency percentiles "
       "(plots)",
       "every point passes with nonzero Gbit/s; latency rows min <= typical <= max",
       kPeer,
       {{100, 5000}, {1, 1}},
       "ib_write_bw|ib_write_lat|ib_send_lat|ib_read_lat",
       plan_speed},
      {"bulk-write",
       "phase5-bulk,stability",
       "Phase 5 bulk write / stability (run_phase5_stability_gate.sh)",
       "repeated fresh-QP 1 MiB WRITE runs hold their bandwidth",
       "every run passes at >= --min-gbps (0: nonzero; the anchor's hardware threshold is 19.0 Gbit/s)",
       kPeer,
       {{50, 1024}, {2, 10}},
       "ib_write_bw",
       plan_bulk},
      {"stable-driver",
       "stable,stable-init",
       "stable-driver (run_stable_driver_gate.sh, mlx_stable_gate)",
       "no-FLR re-init cycles (TEARDOWN_HCA, pages, DISABLE/ENABLE_HCA, pages, SET_HCA_CAP, INIT_HCA) with traffic "
       "between, no leak, and the firmware 14.22 roce_en quirk recovered by FLR with its stage named",
       "STABLE_INIT_CYCLES (1..100) cycles with recovered_flr=0, roce_en 1, port up, same firmware revision and "
       "command-queue IOVA, driver pages = device pages, no ambiguous pages, no object/byte/DMA/IOVA left; the quirk "
       "cycle falls back to FLR naming 'vport roce_en'; traffic passes after every cycle",
       kMlx5,
       {{50, 1000}, {1, 1}},
       "",
       plan_stable},
      {"soak",
       "p1.4",
       "P1.4 soak (mlx_soak_gate)",
       "rounds of SEND/RECV, WRITE and READ with fresh objects for --duration",
       "every round passes; the device holds nothing afterwards (mlx5)",
       kPeer,
       {{1, 1}, {1, 1}},
       "",
       plan_soak},
      {"isolation",
       "p0.2",
       "P0.2 isolation (mlx_isolation_gate)",
       "one client cannot reach another's objects; a client killed mid-traffic harms no other",
       "the survivor completes with its payload checked; (mlx5) nothing of the killed client remains, and the uapi "
       "isolation tests pass",
       kPeer,
       {{1, 1}, {1, 1}},
       "",
       plan_isolation},
      {"lifetime",
       "p0.3",
       "P0.3 lifetime (mlx_lifetime_gate)",
       "objects are created, used and destroyed cleanly; stale, forged and reused tokens are refused",
       "every create/use/destroy round passes; (mlx5) nothing held afterwards and the token tests pass",
       kPeer,
       {{1, 1}, {2, 10}},
       "",
       plan_lifetime},
      {"quota",
       "p1.1",
       "P1.1 quota (mlx_quota_gate)",
       "per-client and per-device quotas are exact, refused before the firmware, and released",
       "exactly max_pd PDs then quota_client, released again; nothing left; the quota tests pass",
       kMlx5 | kLocalOnly,
       {{1, 1}, {1, 1}},
       "",
       plan_quota},
      {"abi-fuzz",
       "p2.2,fuzz",
       "P2.2 ABI fuzz (mlx_abi_fuzz_gate)",
       "every malformed, forged or stale request gets its exact refusal; random request streams break nothing",
       "13/13 live refusals exact; nothing left; the refusal tests pass; the fuzzers run clean",
       kMlx5 | kLocalOnly,
       {{2000, 1000000}, {1, 1}},
       "",
       plan_abi_fuzz},
  };
  return t;
}

const GateSpec* find_gate(const std::string& n) {
  for (const GateSpec& g : gate_table()) {
    if (n == g.name) return &g;
    std::string a = std::string(",") + g.aliases + ",";
    if (a.find("," + n + ",") != std::string::npos) return &g;
  }
  return nullptr;
}

std::string unsupported_reason(const GateSpec& g, const Target& t) {
  if ((g.needs & kMlx5) && !t.is_mlx5()) return "mlx5 provider only (the user-client boundary / device re-init)";
  if ((g.needs & kPeer) && t.is_linux_peer() && !*g.peer_only) return "not in the rxe guest gate (tests/peer/gate.sh)";
  // Two of our clients at once need two soft devices, i.e. two addresses; over ssh we have one.
  if (g.plan == plan_isolation && t.is_ssh() && !t.is_mlx5()) return "soft provider over ssh: one address, one client";
  return "";
}

// Used by main for --peer linux-peer.
std::vector<Step> linux_peer_plan(Ctx& c, const GateSpec& g) { return via_linux_peer(c, g); }
Step linux_peer_full(int mtu) { return linux_peer(fmt("the whole rxe guest gate, MTU %d", mtu), "", mtu, false); }

}  // namespace melon::gate
