// MadPort over the provider's GSI QP (QP1) in this process: a UD QP with Q_Key 0x80010000 whose
// receive buffers hold the 40-byte GRH area and one MAD each (IBA 13.4.6).
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cm/messages.h"
#include "rdmacm/mad_port.h"
#include "verbs/provider.h"

namespace melon::rdmacm {
namespace {

constexpr int kRecvDepth = 64, kSendDepth = 64;
constexpr size_t kGrh = 40;
constexpr size_t kRecvSlot = kGrh + cm::kMadSize;

class GsiPort final : public MadPort {
 public:
  ~GsiPort() override {
    if (qp_) ibv_destroy_qp(qp_);
    for (auto& a : ahs_) ibv_destroy_ah(a.ah);
    if (cq_) ibv_destroy_cq(cq_);
    if (ch_) ibv_destroy_comp_channel(ch_);
    if (mr_) ibv_dereg_mr(mr_);
    if (pd_) ibv_dealloc_pd(pd_);
  }

  int open(ibv_context* ctx) {
    ctx_ = ctx;
    verbs::ContextOps* ops = verbs::ContextBase::from(ctx)->ops;
    buf_.assign(kRecvDepth * kRecvSlot + kSendDepth * cm::kMadSize, 0);
    if (!(pd_ = ibv_alloc_pd(ctx))) return errno;
    if (!(mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE))) return errno;
    if (!(ch_ = ibv_create_comp_channel(ctx))) return errno;
    fcntl(ch_->fd, F_SETFL, fcntl(ch_->fd, F_GETFL) | O_NONBLOCK);
    if (!(cq_ = ibv_create_cq(ctx, kRecvDepth + kSendDepth, this, ch_, 0))) return errno;
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_UD;
    a.send_cq = a.recv_cq = cq_;
    a.cap.max_send_wr = kSendDepth;
    a.cap.max_recv_wr = kRecvDepth;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pd_;
    step_ = 1;
    if (!(qp_ = ops->create_gsi_qp(&a))) return errno ? errno : EOPNOTSUPP;
    ibv_qp_attr m{};
    m.qp_state = IBV_QPS_INIT;
    m.pkey_index = 0;
    m.port_num = 1;
    m.qkey = cm::kGsiQkey;
    step_ = 2;
    if (int e = ibv_modify_qp(qp_, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return e;
    m = {};
    m.qp_state = IBV_QPS_RTR;
    step_ = 3;
    if (int e = ibv_modify_qp(qp_, &m, IBV_QP_STATE)) return e;
    step_ = 4;
    m.qp_state = IBV_QPS_RTS;
    m.sq_psn = 0;
    if (int e = ibv_modify_qp(qp_, &m, IBV_QP_STATE | IBV_QP_SQ_PSN)) return e;
    for (int i = 0; i < kRecvDepth; ++i)
      if (int e = post_recv(i)) return e;
    for (int i = 0; i < kSendDepth; ++i) free_send_.push_back(i);
    return ibv_req_notify_cq(cq_, 0);
  }

  int send(const uint8_t* mad, const MadAddress& to) override {
    if (free_send_.empty()) reap(nullptr, nullptr);
    if (free_send_.empty()) return ENOBUFS;
    ibv_ah* ah = ah_for(to);
    if (!ah) return errno ? errno : EINVAL;
    const int slot = free_send_.back();
    free_send_.pop_back();
    uint8_t* p = send_slot(slot);
    std::memcpy(p, mad, cm::kMadSize);
    ibv_sge sge{reinterpret_cast<uintptr_t>(p), uint32_t(cm::kMadSize), mr_->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = kSendTag | uint64_t(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = to.remote_qpn;
    wr.wr.ud.remote_qkey = cm::kGsiQkey;
    if (int e = ibv_post_send(qp_, &wr, &bad)) {
      free_send_.push_back(slot);
      return e;
    }
    return 0;
  }

  int fd() const override { return ch_->fd; }

  void flush(int ms) override {
    timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (free_send_.size() < size_t(kSendDepth) && reap(nullptr, nullptr) >= 0) {
      if (free_send_.size() == size_t(kSendDepth)) break;
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms) break;
      usleep(100);
    }
  }
  int step() const { return step_; }

  int receive(uint8_t* mad, MadAddress* from) override {
    // Take the channel's event (non-blocking) and re-arm before polling, so nothing is missed.
    ibv_cq* ev_cq;
    void* ev_ctx;
    if (ibv_get_cq_event(ch_, &ev_cq, &ev_ctx) == 0) {
      ibv_ack_cq_events(cq_, 1);
      ibv_req_notify_cq(cq_, 0);
    }
    return reap(mad, from);
  }

 private:
  static constexpr uint64_t kSendTag = 1ull << 63;

  uint8_t* recv_slot(int i) { return buf_.data() + size_t(i) * kRecvSlot; }
  uint8_t* send_slot(int i) { return buf_.data() + kRecvDepth * kRecvSlot + size_t(i) * cm::kMadSize; }

  int post_recv(int i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_slot(i)), uint32_t(kRecvSlot), mr_->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = uint64_t(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(qp_, &wr, &bad);
  }

  // Polls one completion at a time: send completions free their slot; the first good receive is
  // returned (1). 0 when the CQ is empty.
  int reap(uint8_t* mad, MadAddress* from) {
    ibv_wc wc;
    for (;;) {
      int n = ibv_poll_cq(cq_, 1, &wc);
      if (n < 0) return -EIO;
      if (n == 0) return 0;
      if (wc.wr_id & kSendTag) {
        free_send_.push_back(int(wc.wr_id & 0xffff));
        continue;
      }
      const int i = int(wc.wr_id);
      if (wc.status != IBV_WC_SUCCESS || !mad || wc.byte_len < kGrh + cm::kMadSize) {
        post_recv(i);
        continue;
      }
      ibv_ah_attr ah{};
      const bool ok = ibv_init_ah_from_wc(ctx_, 1, &wc, reinterpret_cast<ibv_grh*>(recv_slot(i)), &ah) == 0;
      std::memcpy(mad, recv_slot(i) + kGrh, cm::kMadSize);
      post_recv(i);
      if (!ok) continue;
      from->peer_gid = ah.grh.dgid;
      from->sgid_index = ah.grh.sgid_index;
      from->hop_limit = 64;
      from->traffic_class = ah.grh.traffic_class;
      from->flow_label = 0;
      from->remote_qpn = wc.src_qp;
      return 1;
    }
  }

  ibv_ah* ah_for(const MadAddress& to) {
    for (auto& a : ahs_)
      if (!std::memcmp(&a.gid, &to.peer_gid, sizeof(ibv_gid)) && a.sgid_index == to.sgid_index) return a.ah;
    ibv_ah_attr attr{};
    attr.is_global = 1;
    attr.port_num = 1;
    attr.grh.dgid = to.peer_gid;
    attr.grh.sgid_index = to.sgid_index;
    attr.grh.hop_limit = to.hop_limit;
    attr.grh.traffic_class = to.traffic_class;
    attr.grh.flow_label = to.flow_label;
    ibv_ah* ah = ibv_create_ah(pd_, &attr);
    if (ah) ahs_.push_back({to.peer_gid, to.sgid_index, ah});
    return ah;
  }

  struct CachedAh {
    ibv_gid gid;
    uint8_t sgid_index;
    ibv_ah* ah;
  };
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::vector<uint8_t> buf_;
  std::vector<int> free_send_;
  std::vector<CachedAh> ahs_;
  int step_ = 0;  // how far open() got (MELON_CM_DEBUG)
};

}  // namespace

std::unique_ptr<MadPort> open_gsi_port(ibv_context* ctx) {
  auto p = std::make_unique<GsiPort>();
  if (int e = p->open(ctx)) {
    if (std::getenv("MELON_CM_DEBUG")) fprintf(stderr, "librdmacm: QP1: step %d: %s\n", p->step(), strerror(e));
    errno = e;
    return nullptr;
  }
  return p;
}

}  // namespace melon::rdmacm
