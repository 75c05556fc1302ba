// The soft provider's data path: QPs on the transport engine (src/rc), carried by one UDP socket
// per device (udp_transport.h). A Hub joins a device to its engine: it answers the engine's memory
// lookups from the device's MR table, turns engine completions into ibv_wc on the provider's CQs,
// and engine events into async events.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "providers/soft/soft.h"
#include "providers/soft/udp_transport.h"
#include "rc/engine.h"

namespace melon::soft {

// Forwards one QP's completions from the engine to a provider CQ.
struct CqForward final : rc::CompletionSink {
  SoftCq* cq = nullptr;
  bool push(const rc::Wc& wc) override;
};

class Hub final : private rc::HostMemory, private rc::EventSink {
 public:
  // The hub of `dev`, started on first use and kept while any context holds it; errno on failure.
  static Hub* acquire(SoftDevice* dev, int* err);
  static void release(Hub* hub);

  UdpTransport& transport() { return *transport_; }
  SoftDevice* device() const { return dev_; }
  const uint8_t* gid() const { return gid_; }

  void add_qp(uint32_t qpn, ibv_qp* qp);
  void remove_qp(uint32_t qpn);
  void add_srq(uint32_t srqn, ibv_srq* srq);
  void remove_srq(uint32_t srqn);

 private:
  explicit Hub(SoftDevice* dev);
  // Process memory: a key's range is one span.
  rc::MemStatus map(rc::KeyKind kind, uint32_t pd, uint32_t key, uint64_t addr, uint32_t len, uint32_t access,
                    rc::Span* first) override;
  bool invalidate(uint32_t pd, uint32_t rkey) override { return false; }  // no memory windows yet
  void qp_event(uint32_t qpn, rc::AsyncEvent ev) override;
  void srq_event(uint32_t srqn, rc::AsyncEvent ev) override;

  SoftDevice* dev_;
  uint8_t gid_[16];
  int refs_ = 0;
  std::unique_ptr<UdpTransport> transport_;
  std::mutex map_mu_;
  std::map<uint32_t, ibv_qp*> qps_;
  std::map<uint32_t, ibv_srq*> srqs_;
};

struct SoftQp : verbs::QpBase {
  SoftContext* ctx = nullptr;
  Hub* hub = nullptr;
  uint32_t qpn = 0;
  CqForward scq, rcq;
  ibv_qp_init_attr init{};  // as granted, for ibv_query_qp
  static SoftQp* from(ibv_qp* qp) { return static_cast<SoftQp*>(verbs::QpBase::from(qp)); }
};

// ibv_context_ops.post_send / post_recv of a soft context.
int soft_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int soft_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);

}  // namespace melon::soft
