#include "uapi_steps.h"

#include <string.h>
#include <unistd.h>

#include <memory>

#include "exchange.h"
#include "uapi/socket/client.h"

namespace melon::gate {

namespace u = melon::uapi;

namespace {

bool connect_open(u::SocketClient& cl, const std::string& sock, std::string* why, u::OpenResp* rp = nullptr) {
  if (!cl.connect(sock.c_str())) return *why = "cannot connect to " + sock, false;
  u::Status s = cl.open(rp);
  if (s != u::Status::ok) return *why = std::string("open: ") + u::status_name(s), false;
  return true;
}

StepRecord base_record(Ctx& c, const std::string& step) {
  StepRecord r;
  r.gate = c.gate;
  r.step = step;
  r.log = "logs/melon-emud.log";
  return r;
}

const char* const kObjNames[] = {"none", "pd", "uar", "cq", "qp", "mr", "ah", "srq"};

}  // namespace

bool query_usage(const std::string& sock, u::UsageResp* out, std::string* why) {
  u::SocketClient cl;
  if (!connect_open(cl, sock, why)) return false;
  u::Status s = cl.call(u::Selector::query_usage, u::EmptyReq{}, out);
  if (s != u::Status::ok) return *why = std::string("query_usage: ") + u::status_name(s), false;
  return true;
}

std::string leaks(const u::UsageResp& b, const u::UsageResp& n) {
  std::string w;
  for (uint32_t t = 1; t < u::kObjTypes; t++)
    if (n.server_live[t] != b.server_live[t])
      w += fmt(" server %s %u->%u", kObjNames[t], b.server_live[t], n.server_live[t]);
  for (uint32_t k = 0; k < 8; k++)
    if (n.core_live[k] != b.core_live[k]) w += fmt(" core object kind %u %u->%u", k, b.core_live[k], n.core_live[k]);
  if (n.queue_bytes != b.queue_bytes)
    w += fmt(" queue bytes %llu->%llu", (unsigned long long)b.queue_bytes, (unsigned long long)n.queue_bytes);
  if (n.pinned_bytes != b.pinned_bytes)
    w += fmt(" pinned bytes %llu->%llu", (unsigned long long)b.pinned_bytes, (unsigned long long)n.pinned_bytes);
  if (n.dma_buffers != b.dma_buffers)
    w += fmt(" DMA buffers %llu->%llu", (unsigned long long)b.dma_buffers, (unsigned long long)n.dma_buffers);
  if (n.fw_pages != b.fw_pages)
    w += fmt(" firmware pages %llu->%llu", (unsigned long long)b.fw_pages, (unsigned long long)n.fw_pages);
  return w;
}

// After a client exits the daemon notices its closed socket on its next poll: wait (at most 5 s)
// for the counts to settle before calling anything a leak.
static bool settled_usage(const std::string& sock, const u::UsageResp& base, u::UsageResp* now, std::string* why) {
  double t0 = now_s();
  for (;;) {
    if (!query_usage(sock, now, why)) return false;
    if (leaks(base, *now).empty() || now_s() - t0 > 5) return true;
    usleep(50000);
  }
}

Step step_take_baseline(std::shared_ptr<u::UsageResp> base) {
  return {"baseline: what the device holds before the gate", [base](Ctx& c) {
            StepRecord r = base_record(c, "baseline: what the device holds before the gate");
            std::string why;
            bool ok = query_usage(c.t.emud_socket(), base.get(), &why);
            r.result = ok ? "PASS" : "FAIL";
            r.detail = ok ? fmt("clients %u, DMA buffers %llu, firmware pages %llu", base->clients,
                                (unsigned long long)base->dma_buffers, (unsigned long long)base->fw_pages)
                          : why;
            return r;
          }};
}

Step step_no_leak(const std::string& name, std::shared_ptr<u::UsageResp> base) {
  return {name, [name, base](Ctx& c) {
            StepRecord r = base_record(c, name);
            u::UsageResp now{};
            std::string why;
            if (!settled_usage(c.t.emud_socket(), *base, &now, &why)) {
              r.result = "FAIL", r.detail = why;
              return r;
            }
            std::string l = leaks(*base, now);
            r.result = l.empty() ? "PASS" : "FAIL";
            r.stage = l.empty() ? "-" : "leak accounting";
            r.detail = l.empty()
                           ? fmt("nothing left: objects 0, queue/pinned bytes 0, DMA buffers %llu, firmware pages %llu",
                                 (unsigned long long)now.dma_buffers, (unsigned long long)now.fw_pages)
                           : "left behind:" + l;
            return r;
          }};
}

// ---- stable-driver ------------------------------------------------------------------------------

namespace {

struct CycleState {
  u::UsageResp base{};
  u::CycleResp first{};  // the first no-FLR cycle: the reference for pages, DMA and IOVA
  bool have_first = false;
  uint64_t cmdq_ref = 0;  // the command queue page since the last FLR
  uint32_t fallbacks = 0, resets = 0;
};

std::string fw_rev(const u::CycleResp& r) { return fmt("%u.%u.%u", r.fw_rev[0], r.fw_rev[1], r.fw_rev[2]); }

// One cycle through the ABI; busy (a client that just exited not yet released) is retried.
u::Status call_cycle(const std::string& sock, uint32_t flags, u::CycleResp* rp, std::string* why) {
  u::SocketClient cl;
  if (!connect_open(cl, sock, why)) return u::Status::device_dead;
  u::CycleReq rq{flags, 0};
  double t0 = now_s();
  for (;;) {
    *rp = {};
    u::Status s = cl.call(u::Selector::stable_cycle, rq, rp);
    if (s != u::Status::busy || now_s() - t0 > 5) return s;
    usleep(50000);
  }
}

void fill_failure(StepRecord& r, const u::CycleResp& rp) {
  if (!rp.used_reset) return;
  r.stage = rp.fail_stage[0] ? std::string(rp.fail_stage, strnlen(rp.fail_stage, sizeof rp.fail_stage)) : "?";
  r.opcode = fmt("0x%x", rp.fail_opcode);
  r.status = fmt("0x%x", rp.fail_status);
  r.syndrome = fmt("0x%x", rp.fail_syndrome);
}

Step cycle_step(std::shared_ptr<CycleState> st, int i, bool quirk) {
  std::string name =
      quirk ? "quirk: a no-FLR cycle meets firmware 14.22's roce_en loss -> FLR recovery"
            : fmt("cycle %d: TEARDOWN_HCA, pages, DISABLE/ENABLE_HCA, pages, SET_HCA_CAP, INIT_HCA (no FLR)", i);
  return {name, [st, name, quirk](Ctx& c) {
            StepRecord r = base_record(c, name);
            u::CycleResp rp{};
            std::string why;
            u::Status s = call_cycle(c.t.emud_socket(), quirk ? u::kCycleInjectRoceEnQuirk : 0, &rp, &why);
            fill_failure(r, rp);
            std::string bad;
            if (s != u::Status::ok) bad = why.empty() ? std::string("stable_cycle: ") + u::status_name(s) : why;
            if (bad.empty() && !rp.ok) bad = "device not up after the cycle";
            if (bad.empty() && !quirk && rp.used_reset)
              bad = "the no-FLR path failed at stage '" + r.stage + "' and needed an FLR";
            if (bad.empty() && quirk && !rp.used_reset) bad = "the quirk went unnoticed: no FLR fallback";
            if (bad.empty() && quirk && r.stage != "vport roce_en")
              bad = "the fallback names stage '" + r.stage + "', not 'vport roce_en'";
            if (bad.empty() && quirk && (rp.fallbacks != st->fallbacks + 1 || rp.resets != st->resets + 1))
              bad = fmt("fallbacks %u->%u, resets %u->%u: expected one each", st->fallbacks, rp.fallbacks, st->resets,
                        rp.resets);
            if (bad.empty() && !quirk && (rp.fallbacks != st->fallbacks || rp.resets != st->resets))
              bad = fmt("recovered_flr: resets %u->%u", st->resets, rp.resets);
            if (bad.empty() && (!rp.roce_en || rp.port_state != 1))
              bad = fmt("roce_en %u, vport state %u", rp.roce_en, rp.port_state);
            if (bad.empty() && st->have_first && memcmp(rp.fw_rev, st->first.fw_rev, sizeof rp.fw_rev))
              bad = "firmware revision changed: " + fw_rev(st->first) + " -> " + fw_rev(rp);
            if (bad.empty() && st->cmdq_ref && !quirk && rp.cmdq_iova != st->cmdq_ref)
              bad = fmt("command queue IOVA moved: 0x%llx -> 0x%llx", (unsigned long long)st->cmdq_ref,
                        (unsigned long long)rp.cmdq_iova);
            if (bad.empty() && rp.pages_device && rp.pages_given != rp.pages_device)
              bad = fmt("firmware pages: driver counts %llu given, device holds %llu",
                        (unsigned long long)rp.pages_given, (unsigned long long)rp.pages_device);
            if (bad.empty() && (rp.pages_quarantined || rp.unknown_returns))
              bad =
                  fmt("ambiguous pages: %u quarantined, %u returned unknown", rp.pages_quarantined, rp.unknown_returns);
            u::UsageResp now{};
            if (bad.empty() && !settled_usage(c.t.emud_socket(), st->base, &now, &why)) bad = why;
            std::string l = bad.empty() ? leaks(st->base, now) : "";
            if (bad.empty() && !l.empty()) bad = "leak accounting:" + l;
            // IOVA: what the device can reach may not change from one settled cycle to the next (a leak).
            // The answer is taken as the cycle ends; the firmware's regular page demand may still be in
            // flight then (fewer pages and DMA buffers than at the baseline): compared only once settled.
            bool settled = rp.pages_given == st->base.fw_pages && rp.dma_buffers == st->base.dma_buffers;
            if (bad.empty() && settled && st->have_first && rp.iova_bytes != st->first.iova_bytes && !quirk)
              bad = fmt("IOVA mapped changed %llu -> %llu bytes", (unsigned long long)st->first.iova_bytes,
                        (unsigned long long)rp.iova_bytes);
            if (s == u::Status::ok) {
              st->fallbacks = rp.fallbacks, st->resets = rp.resets;
              // After an FLR the command queue may sit elsewhere: the next cycles compare with this one. Pages,
              // DMA and IOVA are compared with the first no-FLR cycle only: right after an FLR bring-up the
              // firmware's regular page demand may still be in flight.
              st->cmdq_ref = rp.cmdq_iova;
              if (!st->have_first && !quirk && settled) st->first = rp, st->have_first = true;
            }
            r.result = bad.empty() ? "PASS" : "FAIL";
            if (bad.empty() && r.stage == "-") r.stage = "INIT_HCA";
            r.detail = bad.empty()
                           ? fmt("%s; fw %s, cmdq 0x%llx, pages %llu (device %llu), DMA buffers %u, IOVA %llu B, "
                                 "objects 0%s",
                                 rp.used_reset ? "FLR fallback reported" : "recovered_flr=0", fw_rev(rp).c_str(),
                                 (unsigned long long)rp.cmdq_iova, (unsigned long long)rp.pages_given,
                                 (unsigned long long)rp.pages_device, rp.dma_buffers, (unsigned long long)rp.iova_bytes,
                                 rp.used_reset ? (", failed stage '" + r.stage + "' opcode " + r.opcode + " status " +
                                                  r.status + " syndrome " + r.syndrome)
                                                     .c_str()
                                               : "")
                           : bad;
            return r;
          }};
}

Step traffic_step(const std::string& name, int iters) {
  return {name, [name, iters](Ctx& c) {
            Exchange x = exchange(c, "ibv_rc_pingpong", fmt("-s 4096 -n %d -m %d -c", iters, c.o.mtu), false);
            double us = pingpong_usec(x.client.out, iters);
            return record(c, name, x, "SEND/RECV", us > 0,
                          fmt("%d x 4 KiB SEND/RECV, %.1f usec/iter, payload checked", iters, us));
          }};
}

}  // namespace

std::vector<Step> plan_stable_driver(Ctx& c, const GateSpec& g) {
  auto st = std::make_shared<CycleState>();
  auto base = std::shared_ptr<u::UsageResp>(st, &st->base);
  std::vector<Step> s;
  s.push_back(step_take_baseline(base));
  int n = c.o.cycles;
  int iters = c.iters(g);
  for (int i = 1; i <= n; i++) {
    s.push_back(cycle_step(st, i, false));
    if (c.t.has_peer()) s.push_back(traffic_step(fmt("cycle %d: traffic after the re-init", i), iters));
  }
  s.push_back(cycle_step(st, 0, true));
  if (c.t.has_peer()) s.push_back(traffic_step("after the FLR recovery: traffic", iters));
  s.push_back(cycle_step(st, n + 1, false));
  s.push_back(cycle_step(st, n + 2, false));
  s.push_back(step_no_leak("leak accounting at the end: the device holds what it held before", base));
  return s;
}

// ---- P1.1 quota, P2.2 refusals (live, against the running device) -------------------------------

Step step_live_quota() {
  const char* name = "live: the PD quota is exact, refused with quota_client, and released";
  return {name, [name](Ctx& c) {
            StepRecord r = base_record(c, name);
            u::SocketClient cl;
            u::OpenResp op{};
            std::string why;
            if (!connect_open(cl, c.t.emud_socket(), &why, &op)) return r.result = "FAIL", r.detail = why, r;
            std::vector<uint32_t> pds;
            u::Status s = u::Status::ok;
            while (pds.size() <= op.max_pd + 1) {
              u::HandleResp h{};
              s = cl.call(u::Selector::alloc_pd, u::EmptyReq{}, &h);
              if (s != u::Status::ok) break;
              pds.push_back(h.handle);
            }
            std::string bad;
            if (pds.size() != op.max_pd)
              bad = fmt("%zu PDs allocated, quota says %u", pds.size(), op.max_pd);
            else if (s != u::Status::quota_client)
              bad = std::string("the refusal was ") + u::status_name(s) + ", not quota_client";
            for (uint32_t h : pds)
              cl.call(u::Selector::dealloc_pd, u::HandleReq{h, 0}, static_cast<u::EmptyResp*>(nullptr));
            u::HandleResp h{};
            if (bad.empty() && cl.call(u::Selector::alloc_pd, u::EmptyReq{}, &h) != u::Status::ok)
              bad = "no PD after releasing the quota";
            r.result = bad.empty() ? "PASS" : "FAIL";
            r.status = bad.empty() ? "quota_client" : u::status_name(s);
            r.detail = bad.empty()
                           ? fmt("%u PDs, the %uth refused with quota_client (EDQUOT/ENOMEM at verbs), all released",
                                 op.max_pd, op.max_pd + 1)
                           : bad;
            return r;
          }};
}

Step step_live_refusals() {
  const char* name = "live: malformed, forged and stale requests get their exact status";
  return {name, [name](Ctx& c) {
            StepRecord r = base_record(c, name);
            std::string why;
            u::SocketClient cl, fresh;
            if (!connect_open(cl, c.t.emud_socket(), &why)) return r.result = "FAIL", r.detail = why, r;
            u::HandleResp pd{};
            cl.call(u::Selector::alloc_pd, u::EmptyReq{}, &pd);
            u::HandleResp gone{};
            cl.call(u::Selector::alloc_pd, u::EmptyReq{}, &gone);
            cl.call(u::Selector::dealloc_pd, u::HandleReq{gone.handle, 0}, static_cast<u::EmptyResp*>(nullptr));
            struct Case {
              const char* what;
              u::SocketClient* who;
              uint32_t sel;
              std::vector<uint32_t> words;  // the request, 32-bit words
              uint32_t in_len, out_cap;
              u::Status want;
            };
            using S = u::Status;
            auto sel = [](u::Selector s) { return uint32_t(s); };
            std::vector<Case> cases = {
                {"unknown selector", &cl, 0x1fff, {}, 0, 64, S::unknown_selector},
                {"truncated request", &cl, sel(u::Selector::dealloc_pd), {pd.handle}, 4, 0, S::truncated},
                {"longer request with nonzero tail",
                 &cl,
                 sel(u::Selector::dealloc_pd),
                 {pd.handle, 0, 7, 0},
                 16,
                 0,
                 S::trailing_nonzero},
                {"response buffer too small", &cl, sel(u::Selector::alloc_pd), {}, 0, 4, S::out_too_small},
                {"forged token", &cl, sel(u::Selector::dealloc_pd), {0x00ffffffu, 0}, 8, 0, S::bad_handle},
                {"token bits above 24",
                 &cl,
                 sel(u::Selector::dealloc_pd),
                 {pd.handle | 0x01000000u, 0},
                 8,
                 0,
                 S::bad_handle},
                {"a PD's token as a CQ", &cl, sel(u::Selector::destroy_cq), {pd.handle, 0}, 8, 0, S::bad_handle},
                {"stale token (freed PD)", &cl, sel(u::Selector::dealloc_pd), {gone.handle, 0}, 8, 0, S::bad_handle},
                {"reserved field nonzero", &cl, sel(u::Selector::dealloc_pd), {pd.handle, 1}, 8, 0, S::invalid},
                {"port 2 of a one-port device", &cl, sel(u::Selector::query_port), {2, 0}, 8, 64, S::invalid},
                {"open twice", &cl, sel(u::Selector::open), {u::kAbiVersion, 0, 0, 0}, 16, 48, S::already_open},
                {"unknown stable_cycle flags", &cl, sel(u::Selector::stable_cycle), {0x80, 0}, 8, 128, S::invalid},
                {"a call before open", &fresh, sel(u::Selector::alloc_pd), {}, 0, 8, S::not_open},
            };
            if (!fresh.connect(c.t.emud_socket().c_str())) return r.result = "FAIL", r.detail = "second connection", r;
            int good = 0;
            std::string bad;
            for (const Case& k : cases) {
              uint8_t out[256] = {};
              S got = k.who->call(k.sel, k.words.data(), k.in_len, out, k.out_cap);
              if (got == k.want)
                good++;
              else
                bad += fmt(" %s: %s (want %s);", k.what, u::status_name(got), u::status_name(k.want));
            }
            cl.call(u::Selector::dealloc_pd, u::HandleReq{pd.handle, 0}, static_cast<u::EmptyResp*>(nullptr));
            r.result = bad.empty() ? "PASS" : "FAIL";
            r.detail =
                fmt("%d/%zu refusals with the exact status", good, cases.size()) + (bad.empty() ? "" : ":" + bad);
            return r;
          }};
}

}  // namespace melon::gate
