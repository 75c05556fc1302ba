// The kernel-bypass mlx5 provider: device mlx5_0 behind the user-client ABI (src/uapi).
//
// Control (PD, MR, CQ, QP, SRQ, AH, queries) goes through a Transport (transport.h) to the driver
// core; the data path stays in the application: WQEs into the mapped SQ/RQ/SRQ (wqe.h), the
// doorbell record, then the UAR doorbell; CQEs polled from the mapped ring by the owner bit (cq.cpp).
// Completion and asynchronous events arrive on the transport's event fd; a thread per context
// turns them into completion-channel and async-fd events (events.cpp).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "providers/mlx5/transport.h"
#include "providers/mlx5/wqe.h"
#include "verbs/provider.h"

namespace melon::mlx5prov {

class Mlx5Context;

class Mlx5Device : public verbs::Device {
 public:
  explicit Mlx5Device(std::string where) : where_(std::move(where)) {}
  std::string identity() const override { return "mlx5:" + where_; }
  const char* name() const override { return "mlx5_0"; }
  __be64 node_guid() const override { return guid_; }
  // The card's PSID is not in the uapi's DeviceAttr; name the provider instead of inventing one.
  const char* board_id() const override { return "MELON_MLX5"; }
  verbs::ContextBase* open() override;
  const std::string& where() const { return where_; }
  void set_guid(__be64 g) { guid_ = g; }

 private:
  std::string where_;
  __be64 guid_ = 0;
};

struct Mlx5Pd {
  ibv_pd ibv;
  uint32_t handle = 0;
};

struct Mlx5Mr {
  ibv_mr ibv;
  uint32_t mr_handle = 0;
  uint32_t pd_handle = 0;  // the PD it is registered in (ibv.pd may be an import that has gone)
  unsigned access = 0;  // as registered, without the optional bits
};

struct Mlx5Ah {
  ibv_ah ibv;
  uint32_t ah_handle = 0;
  uint8_t av[kDatagramSegBytes];  // the UD WQE's datagram segment, from the driver
};

struct Mapping {
  void* addr = nullptr;
  uint64_t len = 0;
};

struct Mlx5Cq : verbs::CqBase {
  Mlx5Context* ctx = nullptr;
  uint32_t handle = 0, cqn = 0;
  Mapping ring_map, dbr_map;
  uint8_t* ring = nullptr;
  uint32_t cqe_cnt = 0, log_cnt = 0;
  uint32_t* dbrec = nullptr;  // [0] consumer index, [1] arm word
  uint32_t ci = 0;  // consumer index
  std::atomic<uint32_t> arm_sn{0};  // +1 per completion event (rdma-core mlx5_cq_event); read when arming
  std::atomic<int> users{0};
  std::mutex mu;
  static Mlx5Cq* from(ibv_cq* cq) { return static_cast<Mlx5Cq*>(verbs::CqBase::from(cq)); }
};

struct Mlx5Srq : verbs::SrqBase {
  Mlx5Context* ctx = nullptr;
  uint32_t handle = 0;
  Mapping buf_map, dbr_map;
  uint32_t* dbrec = nullptr;
  SrqQueue q;
  std::vector<uint64_t> wrid;
  uint32_t max_wr = 0, limit = 0;
  std::atomic<int> users{0};
  std::mutex mu;
  static Mlx5Srq* from(ibv_srq* s) { return static_cast<Mlx5Srq*>(verbs::SrqBase::from(s)); }
};

struct Mlx5Qp : verbs::QpBase {
  Mlx5Context* ctx = nullptr;
  uint32_t handle = 0;
  Mapping buf_map, dbr_map;
  uint32_t* dbrec = nullptr;  // [0] receive counter, [1] send counter
  SendQueue sq;
  RecvQueue rq;
  std::vector<uint64_t> sq_wrid, rq_wrid;
  std::vector<uint32_t> sq_next_tail;
  std::mutex sq_mu, rq_mu;
  ibv_qp_attr attr{};  // what modify_qp set (query_qp reports the rest from the driver)
  static Mlx5Qp* from(ibv_qp* q) { return static_cast<Mlx5Qp*>(verbs::QpBase::from(q)); }
};

class Mlx5Context : public verbs::ContextBase, public verbs::ContextOps {
 public:
  Mlx5Context(Mlx5Device* dev, std::unique_ptr<Transport> t) : dev_(dev), t_(std::move(t)) {}
  int prepare();  // device attributes, the UAR (before init_context: discard() undoes it)
  int start_events();  // the event thread (after init_context)
  void discard();  // a context that prepare() or init_context() failed for
  static Mlx5Context* from(ibv_context* c) { return static_cast<Mlx5Context*>(verbs::ContextBase::from(c)); }
  Transport& transport() { return *t_; }

  int query_device_ex(ibv_device_attr_ex* attr) override;
  int query_port(uint8_t port, ibv_port_attr* attr) override;
  int query_gid_entry(uint32_t port, uint32_t index, ibv_gid_entry* entry) override;

  ibv_pd* alloc_pd() override;
  int dealloc_pd(ibv_pd* pd) override;
  ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) override;
  int rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, unsigned access) override;
  int dereg_mr(ibv_mr* mr) override;
  ibv_pd* import_pd(uint32_t handle) override;
  void unimport_pd(ibv_pd* pd) override;
  ibv_mr* import_mr(ibv_pd* pd, uint32_t handle) override;
  void unimport_mr(ibv_mr* mr) override;

  ibv_cq_ex* create_cq(const ibv_cq_init_attr_ex* attr) override;
  int resize_cq(ibv_cq* cq, int cqe) override;
  int destroy_cq(ibv_cq* cq) override;

  ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) override;
  int modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) override;
  int query_srq(ibv_srq* srq, ibv_srq_attr* attr) override;
  int destroy_srq(ibv_srq* srq) override;

  ibv_qp* create_qp(ibv_qp_init_attr_ex* attr) override;
  ibv_qp* create_gsi_qp(ibv_qp_init_attr_ex* attr) override;  // QP1, port 1 (the CM's)
  int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) override;
  int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) override;
  int destroy_qp(ibv_qp* qp) override;

  ibv_ah* create_ah(ibv_pd* pd, const ibv_ah_attr* attr) override;
  int destroy_ah(ibv_ah* ah) override;

  int direct(uint32_t request, void* in, void* out) override;  // dv.cpp: libmlx5.so.1's requests
  void close() override;

  // Data path helpers.
  void send_doorbell(Mlx5Qp* qp);  // ring_send_doorbell() on this context's UAR, then the kick
  void arm_cq(Mlx5Cq* cq, bool solicited);
  Mlx5Qp* qp_by_qpn(uint32_t qpn);

  const uapi::DeviceAttr& dev_attr() const { return attr_; }
  // An empty poll gives the CPU away (Transport::device_needs_host_cpu): melon-emud.
  bool yield_when_idle() const { return yield_when_idle_; }
  bool owns(const ibv_pd* pd) const { return pd && pd->context == &vctx.context; }
  bool owns(const ibv_cq* cq) const { return cq && cq->context == &vctx.context; }

 private:
  ibv_qp* make_qp(ibv_qp_init_attr_ex* attr, bool gsi);
  void event_loop();
  // A call whose response is empty (destroy, dealloc): its errno.
  int call_empty(uapi::Selector sel, uint32_t handle);
  void deliver(const uapi::EventResp& ev);
  void free_map(Mapping& m);

  Mlx5Device* dev_;
  std::unique_ptr<Transport> t_;
  const bool yield_when_idle_ = t_->device_needs_host_cpu();
  uapi::DeviceAttr attr_{};
  uapi::UarResp uar_{};
  Mapping uar_map_;
  std::mutex uar_mu_;  // 64-bit doorbell writes from several QPs/CQs, and bf_offset_
  uint32_t bf_offset_ = 0;  // the send doorbell's place in the UAR page (alternates)

  // Objects by driver handle (events) and by queue number (CQEs name the QP by number).
  std::shared_mutex obj_mu_;
  std::unordered_map<uint32_t, Mlx5Qp*> qps_by_qpn_;
  std::unordered_map<uint32_t, void*> by_handle_;  // uapi token -> Mlx5Qp/Mlx5Cq/Mlx5Srq

  // Live PDs and MRs by uapi handle, for ibv_import_pd / _mr (an MR as it was last registered).
  std::mutex import_mu_;
  std::unordered_map<uint32_t, bool> pds_;
  std::unordered_map<uint32_t, Mlx5Mr> mrs_;

  int stop_pipe_[2] = {-1, -1};
  std::thread events_;
};

// A context of `dev` over an opened transport (Mlx5Device::open; tests hand in their own transport).
// nullptr with errno set when the device's answers do not add up (EPROTO) or a call fails.
verbs::ContextBase* open_context(Mlx5Device* dev, std::unique_ptr<Transport> t);

// The uapi form of an address vector; false when it is not a RoCE one (no GRH).
bool to_address(const ibv_ah_attr& ah, uapi::AddressReq* av);

// ibv_context_ops of an mlx5 context (post.cpp, cq.cpp).
int mlx5_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int mlx5_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int mlx5_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
int mlx5_poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int mlx5_req_notify_cq(ibv_cq* cq, int solicited_only);
void init_cq_ex_ops(Mlx5Cq* cq);
// Removes QP `qpn`'s completions from the CQ (its QP reset or destroyed); the caller holds cq->mu.
void clean_cq(Mlx5Cq* cq, uint32_t qpn, Mlx5Srq* srq);

}  // namespace melon::mlx5prov
