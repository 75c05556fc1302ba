// Helpers for tests that inject datagrams into a soft device: read its counter file the way
// another process does (the layout documented in src/providers/soft/soft_counters.h, parsed here
// byte by byte rather than through that header), build RoCEv2 UD SEND packets, and a UD QP with
// one posted receive to catch them.
#pragma once

#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "roce/icrc.h"
#include "roce/icrc_udp.h"
#include "roce/ip_udp.h"

namespace melon::test {

// name -> value from <dir>/<device>.<this pid>; empty if the file is missing or malformed.
inline std::map<std::string, uint64_t> read_counters(const std::string& dir, const std::string& device) {
  std::map<std::string, uint64_t> out;
  std::ifstream f(dir + "/" + device + "." + std::to_string(getpid()), std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (b.size() < 64 || b.compare(0, 8, "MELSTAT1") != 0) return out;
  uint32_t n, pid;
  std::memcpy(&n, b.data() + 8, 4);
  std::memcpy(&pid, b.data() + 12, 4);
  if (pid != uint32_t(getpid()) || std::string(b.data() + 16) != device || b.size() < 64 + n * 40ull) return out;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t v;
    std::memcpy(&v, b.data() + 64 + n * 32 + i * 8, 8);
    out[std::string(b.data() + 64 + i * 32)] = v;
  }
  return out;
}

// Polls until counter `name` reaches `want` (or 5 s pass); returns the last value seen.
inline uint64_t wait_counter(const std::string& dir, const std::string& device, const std::string& name,
                             uint64_t want) {
  uint64_t v = 0;
  for (int i = 0; i < 5000; ++i) {
    auto c = read_counters(dir, device);
    v = c.count(name) ? c[name] : 0;
    if (v >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return v;
}

// UDP header + BTH (UD SEND_ONLY) + DETH + payload + ICRC, as a RoCEv2 sender puts it after the
// IP header. `udp_checksum` goes into the UDP header as is (0: none, as rxe and ConnectX send over
// IPv6). The ICRC is computed for the given addresses unless `break_icrc`.
inline std::vector<uint8_t> ud_send_datagram(bool v6, const uint8_t src_gid[16], const uint8_t dst_gid[16],
                                             uint16_t sport, uint32_t dest_qpn, uint32_t qkey, uint32_t src_qpn,
                                             const std::string& payload, bool break_icrc = false) {
  const size_t pad = (4 - payload.size() % 4) % 4;
  std::vector<uint8_t> roce(12 + 8 + payload.size() + pad + 4, 0);
  roce[0] = 0x64;  // UD SEND_ONLY (IBA 9.2: opcode 011_00100)
  roce[1] = uint8_t(pad << 4);  // SE 0, M 0, PadCnt, TVer 0
  roce[2] = roce[3] = 0xff;  // default P_Key
  roce[5] = uint8_t(dest_qpn >> 16), roce[6] = uint8_t(dest_qpn >> 8), roce[7] = uint8_t(dest_qpn);
  roce[12] = uint8_t(qkey >> 24), roce[13] = uint8_t(qkey >> 16), roce[14] = uint8_t(qkey >> 8),
  roce[15] = uint8_t(qkey);
  roce[17] = uint8_t(src_qpn >> 16), roce[18] = uint8_t(src_qpn >> 8), roce[19] = uint8_t(src_qpn);
  std::memcpy(roce.data() + 20, payload.data(), payload.size());
  roce::IpUdp h;
  h.v6 = v6;
  std::memcpy(h.src, src_gid, 16);
  std::memcpy(h.dst, dst_gid, 16);
  h.sport = sport;
  h.dport = roce::kRoceV2Port;
  uint32_t icrc = roce::icrc_for_udp_payload(h, roce.data(), roce.size() - 4);
  if (break_icrc) icrc ^= 0x1;
  roce::store_icrc(roce.data() + roce.size() - 4, icrc);
  std::vector<uint8_t> dgram(8 + roce.size());
  dgram[0] = uint8_t(sport >> 8), dgram[1] = uint8_t(sport);
  dgram[2] = uint8_t(roce::kRoceV2Port >> 8), dgram[3] = uint8_t(roce::kRoceV2Port & 0xff);
  dgram[4] = uint8_t(dgram.size() >> 8), dgram[5] = uint8_t(dgram.size());
  dgram[6] = dgram[7] = 0;  // UDP checksum 0
  std::memcpy(dgram.data() + 8, roce.data(), roce.size());
  return dgram;
}

// A UD QP in RTS with one receive (40-byte GRH + 64 bytes) posted, on an open context.
struct UdReceiver {
  static constexpr uint32_t kQkey = 0x11111111;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(40 + 64);

  // Returns "" or what failed.
  std::string open(ibv_context* ctx) {
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
    if (!pd || !cq) return "pd/cq";
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return "reg_mr";
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 2;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qp = ibv_create_qp(pd, &ia);
    if (!qp) return std::string("create_qp: ") + std::strerror(errno);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qkey = kQkey;
    if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return "INIT";
    at.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp, &at, IBV_QP_STATE)) return "RTR";
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), uint32_t(buf.size()), mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 7;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(qp, &wr, &bad)) return "post_recv";
    return "";
  }
  // The next completion, or one with status IBV_WC_GENERAL_ERR after `ms` without any.
  ibv_wc wait(int ms) {
    ibv_wc wc{};
    for (int i = 0; i < ms; ++i) {
      if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    wc.status = IBV_WC_GENERAL_ERR;
    return wc;
  }
  std::string payload(size_t n) const { return std::string(reinterpret_cast<const char*>(buf.data()) + 40, n); }
  ~UdReceiver() {
    if (qp) ibv_destroy_qp(qp);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
  }
};

}  // namespace melon::test
