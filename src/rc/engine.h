// The RC/UC/UD transport engine (IBA chapters 9 and 10). Portable C++ with nothing of its own that
// touches the world: memory, packets out, completions, events and time all go through the Host
// (rc/host.h); packets come in through Engine::receive. Tests drive it deterministically; the soft
// provider and the emulated ConnectX host it. This header (with host.h, limits.h and
// verbs_values.h) is the engine's whole public API.
//
// Not thread-safe: the host serialises calls (one lock per engine).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

#include "rc/host.h"
#include "rc/limits.h"
#include "rc/verbs_values.h"
#include "roce/ip_udp.h"
#include "roce/packet.h"

namespace melon::rc {

// One scatter/gather entry: `length` bytes at `addr` of the region `lkey` names (HostMemory::map).
// With kInline, `addr` is instead a host pointer the engine copies from during post_send.
struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::send;
  uint32_t send_flags = 0;  // SendFlag
  const Sge* sg_list = nullptr;
  int num_sge = 0;
  uint32_t imm = 0;  // host order (verbs' __be32 converted by the host)
  uint32_t invalidate_rkey = 0;
  uint64_t remote_addr = 0;  // RDMA and atomics
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // CMP_SWAP compare / FETCH_ADD add
  uint64_t swap = 0;
  const AddressVector* ah = nullptr;  // UD
  uint32_t remote_qpn = 0;  // UD
  uint32_t remote_qkey = 0;  // UD
};

struct RecvWr {
  uint64_t wr_id = 0;
  const Sge* sg_list = nullptr;
  int num_sge = 0;
};

struct QpCaps {
  uint32_t max_send_wr = 64;
  uint32_t max_recv_wr = 64;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 256;
};

class Srq;

struct QpInit {
  QpType type = QpType::rc;
  uint32_t pd = 0;
  CompletionSink* send_cq = nullptr;
  CompletionSink* recv_cq = nullptr;
  Srq* srq = nullptr;
  QpCaps cap;
  bool sq_sig_all = false;
  bool uc_verbs = false;  // an RC QP the verbs see as UC (reliable UC): UC's opcodes only
  // Nonzero: exactly this QPN, EBUSY if its slot is taken. Only the provider asks, for the GSI
  // (QP1, a UD QP carrying the CM's MADs: IBA 13.4); verbs QPNs are never 0 or 1.
  uint32_t fixed_qpn = 0;
  // Nonzero (RC/UC with its own RQ): a SEND that fits one packet and at most this many bytes
  // (<= kWcInlineMax) is not placed in the receive's buffers but handed in its completion
  // (Wc::data_inline, Wc::inline_data), whose host puts it there: the mlx5 emulator's scatter to CQE. The
  // receive's keys and length are checked as for any SEND.
  uint8_t scatter_to_wc = 0;
};

// ibv_qp_attr, the parts a RoCEv2 engine uses.
struct QpAttr {
  QpState qp_state = QpState::reset;
  QpState cur_qp_state = QpState::reset;
  uint8_t path_mtu = 3;  // ibv_mtu
  uint32_t qkey = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint32_t dest_qp_num = 0;
  uint32_t qp_access_flags = 0;  // Access
  uint16_t pkey_index = 0;
  AddressVector av;
  uint8_t max_rd_atomic = 1;  // outstanding READ/atomic as requester
  uint8_t max_dest_rd_atomic = 1;  // as responder (replay cache size)
  uint8_t min_rnr_timer = 0;  // code we send in RNR NAKs
  uint8_t timeout = 14;  // local ACK timeout exponent
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;  // 7 = retry forever
  uint8_t sq_draining = 0;  // query: SQD and requests still unacknowledged
  uint8_t en_sqd_async_notify = 0;  // with kAttrEnSqdAsyncNotify on RTS -> SQD: raise sq_drained when drained
  QpCaps cap;
};

// Counters a host can show (melonctl status, tests).
struct QpCounters {
  uint64_t tx_packets = 0, rx_packets = 0, retransmits = 0, timeouts = 0, rnr_naks_sent = 0, rnr_naks_received = 0,
           seq_naks_sent = 0, seq_naks_received = 0, duplicates = 0, dropped = 0;
  uint64_t acks_coalesced = 0;  // AckReq'd packets answered by a later packet's ACK (Engine::end_batch)
};
void add_counters(QpCounters& sum, const QpCounters& c);

struct EngineConfig {
  // QPNs: with random_qpn, each is drawn from the host's random source (unpredictable to anyone who
  // can reach the port, as a QPN and a PSN in the window are all a forged packet needs); without,
  // sequential from first_qpn, for deterministic tests and replays. Either way QPN 0 and 1 (SMI,
  // GSI), 0xFFFFFF (the multicast QPN), QPNs whose slot is in use and those in QP1's slot are
  // skipped. A random QPN keeps
  // bits 16..23 of a value random_qpn returned, even when the table is nearly full (the soft
  // provider's lanes name a QP's lane there: providers/soft/udp_socket.h, lane_qpn).
  uint32_t first_qpn = 0x11;  // rxe starts here too
  uint32_t (*random_qpn)(void* arg) = nullptr;
  void* random_qpn_arg = nullptr;
  uint32_t max_inflight_packets = 128;  // requester window per QP
  // Non-zero: the packets in flight of all RC QPs of this engine together, shared out evenly among
  // the QPs that have some in flight (each still gets at least kMinSharedWindow and at most
  // max_inflight_packets). A host sizes it to the receive buffer one peer socket has for all of
  // them; per-QP windows alone overflow it once enough QPs stream at once. 0: per-QP windows only.
  uint32_t max_inflight_total = 0;
  uint32_t ack_every = 64;  // AckReq at least every N packets of a long message
  // READ response packets (or atomic ACKs) one QP sends per turn, a receive or a tick(); a longer
  // READ goes on at the next ticks (next_deadline() is then due), so one request from a peer never
  // has the host queue more than this at once. Our requester asks for at most a window per READ.
  uint32_t max_read_burst = 128;
};

class Qp;
class EngineImpl;

class Engine {
 public:
  explicit Engine(const Host& host, const EngineConfig& config = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Control path. Return 0 or an errno value (EINVAL, ENOMEM, ...); on error nothing changes.
  int create_qp(const QpInit& init, uint32_t* qpn);
  int modify_qp(uint32_t qpn, const QpAttr& attr, uint32_t mask);
  int query_qp(uint32_t qpn, QpAttr* attr, QpInit* init) const;
  int destroy_qp(uint32_t qpn);
  int create_srq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit, Srq** srq, uint32_t* srqn);
  int modify_srq(Srq* srq, uint32_t limit);
  int query_srq(const Srq* srq, uint32_t* limit) const;
  int destroy_srq(Srq* srq);

  // Data path. Return 0 or an errno value; the WR is then not queued.
  int post_send(uint32_t qpn, const SendWr& wr);
  int post_recv(uint32_t qpn, const RecvWr& wr);
  int post_srq_recv(Srq* srq, const RecvWr& wr);
  // An RC QP with packets sent and not yet acknowledged, and its retransmit timer armed: an ACK or
  // a timer expiry is still to come. A host may hold further packets of a post to such a QP for a
  // batched send (soft provider: doorbell batching), since handling that ACK or timer sends them.
  // False with timeout 0 (no timer): a lost ACK would then hold them for ever.
  bool awaiting_ack(uint32_t qpn) const;

  // One arriving RoCE packet: `roce` points at the BTH, `len` counts to the end of the ICRC (which the
  // host has already checked). `ip` says where it came from (source address for UD, GRH contents).
  // Malformed or unexpected packets are dropped and counted; never an error to the caller.
  void receive(const roce::IpUdp& ip, const uint8_t* roce, size_t len);

  // A receive batch: the packets a host read in one go, passed to receive() between these two.
  // Inside it the responder coalesces ACKs: one ACK per QP for its newest AckReq'd SEND/WRITE
  // packet, sent by end_batch() (or before that QP's next NAK, READ response or atomic ACK, which
  // are never delayed). Outside a batch every AckReq'd packet is answered at once.
  void begin_batch();
  void end_batch();

  // Fire due timers (retransmit, RNR back-off) and push out anything the window now allows.
  void tick();
  // When tick() next has work, or UINT64_MAX.
  uint64_t next_deadline() const;

  const QpCounters* counters(uint32_t qpn) const;
  // Every QP's counters summed, destroyed QPs included (O(QPs): for statistics, not per packet).
  QpCounters totals() const;
  uint64_t dropped_packets() const;  // packets no QP took (bad opcode, unknown QP, bad state)

 private:
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace melon::rc
