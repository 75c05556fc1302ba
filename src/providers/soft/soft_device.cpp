// Soft provider: discovery, device and port attributes, GID table, context, PD, AH.
#include "providers/soft/soft.h"
#include "providers/soft/soft_qp.h"
#include "providers/soft/udp_socket.h"
#include "roce/ip_udp.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>

namespace melon::soft {

namespace {

// Node GUID: EUI-64 of the interface MAC (as rxe and mlx5 do) for interface devices; for a device
// on an explicit address, a locally administered GUID derived from the address, so two such
// devices on one host differ.
__be64 make_guid(const DeviceSpec& s) {
  uint8_t g[8];
  if (s.has_mac && !s.configured) {
    g[0] = s.mac[0] ^ 0x02;  // flip the universal/local bit
    g[1] = s.mac[1];
    g[2] = s.mac[2];
    g[3] = 0xff;
    g[4] = 0xfe;
    g[5] = s.mac[3];
    g[6] = s.mac[4];
    g[7] = s.mac[5];
  } else {
    uint32_t h = 2166136261u;  // FNV-1a over name and addresses
    auto mix = [&h](const void* p, size_t n) {
      for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 16777619u;
    };
    mix(s.name.data(), s.name.size());
    for (const IpAddr& a : s.addrs) mix(a.bytes, sizeof(a.bytes));
    g[0] = 0x02;  // locally administered
    g[1] = 'M';
    g[2] = 'L';
    g[3] = 'N';
    g[4] = static_cast<uint8_t>(h >> 24);
    g[5] = static_cast<uint8_t>(h >> 16);
    g[6] = static_cast<uint8_t>(h >> 8);
    g[7] = static_cast<uint8_t>(h);
  }
  __be64 be;
  std::memcpy(&be, g, 8);  // bytes already in network order
  return be;
}

class SoftProvider : public verbs::Provider {
 public:
  const char* name() const override { return "soft"; }
  std::vector<std::unique_ptr<verbs::Device>> discover() override {
    std::vector<std::string> errors;
    std::vector<DeviceSpec> specs = discover_devices(host_interfaces(), &errors);
    if (soft_tunables().debug)
      for (const std::string& e : errors) std::fprintf(stderr, "melondma soft: %s\n", e.c_str());
    std::vector<std::unique_ptr<verbs::Device>> out;
    for (const DeviceSpec& s : specs) out.push_back(std::make_unique<SoftDevice>(s));
    return out;
  }
};

}  // namespace

MELON_VERBS_PROVIDER(SoftProvider)

// ---- device ---------------------------------------------------------------------------------------

SoftDevice::SoftDevice(const DeviceSpec& spec) : spec_(spec), guid_(make_guid(spec)) {}

verbs::ContextBase* SoftDevice::open() {
  // The socket options RoCEv2 needs, tried now: a host that cannot set them fails here with the
  // reason, not later as packets every peer drops (udp_socket.h).
  bool v4 = false, v6 = false;
  for (const IpAddr& a : spec_.addrs) (a.family == AF_INET6 ? v6 : v4) = true;
  std::string why;
  if (int e = check_roce_host(v4, v6, &why)) {
    std::fprintf(stderr, "melondma soft: %s: cannot open: %s\n", name(), why.c_str());
    errno = e;
    return nullptr;
  }
  auto* ctx = new SoftContext(this);
  if (int rc = verbs::init_context(ctx, ctx, this)) {
    delete ctx;
    errno = rc;
    return nullptr;
  }
  ibv_context_ops& ops = ctx->vctx.context.ops;
  ops.poll_cq = [](ibv_cq* cq, int n, ibv_wc* wc) {
    SoftCq* c = SoftCq::from(cq);
    int got = c->poll(n, wc);
    // An empty CQ: send what posts left queued (doorbell batching: the application now waits for
    // it), and do the progress threads' work here rather than wait for them to be scheduled, on the
    // lanes of this CQ's QPs. Then read the ring again, whatever this thread received: a progress
    // thread may have completed work while this one was in those system calls (or descheduled
    // there), and a poll that returns empty must not have looked before they ended
    // (docs/rdmacm.md, "Teardown").
    if (got == 0)
      if (Hub* h = c->ctx->hub_if_started()) {
        const uint32_t lanes = c->lanes.load(std::memory_order_relaxed);
        h->each_lane(lanes, [](UdpTransport& l) { l.flush_held(); });
        h->poll_progress(lanes);
        got = c->poll(n, wc);
      }
    return got;
  };
  ops.req_notify_cq = [](ibv_cq* cq, int solicited_only) {
    SoftCq* c = SoftCq::from(cq);
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->armed = true;
      c->solicited_only = solicited_only != 0;
    }
    // The application will block on the channel: arrivals must wake the progress thread, not wait
    // for a busy-poll lease to run out (udp_transport.h).
    if (Hub* h = c->ctx->hub_if_started())
      h->each_lane(c->lanes.load(std::memory_order_relaxed), [](UdpTransport& l) { l.app_waits(); });
    return 0;
  };
  ops.post_srq_recv = [](ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    return SoftSrq::from(srq)->post(wr, bad);
  };
  ops.post_send = soft_post_send;
  ops.post_recv = soft_post_recv;
  return ctx;
}

ibv_mtu SoftDevice::active_mtu() const {
  bool v6 = !spec_.addrs.empty() && spec_.addrs.front().family == AF_INET6;
  switch (ib_mtu_for_interface(spec_.if_mtu, v6)) {
    case 4096: return IBV_MTU_4096;
    case 2048: return IBV_MTU_2048;
    case 1024: return IBV_MTU_1024;
    case 512: return IBV_MTU_512;
    default: return IBV_MTU_256;
  }
}

void SoftDevice::device_attr(ibv_device_attr_ex* ex) const {
  std::memset(ex, 0, sizeof(*ex));
  ibv_device_attr& a = ex->orig_attr;
  std::snprintf(a.fw_ver, sizeof(a.fw_ver), "0.1.0");
  a.node_guid = guid_;
  a.sys_image_guid = guid_;
  a.max_mr_size = UINT64_MAX;
  a.page_size_cap = 0xfffff000;  // any power of two from 4 KiB
  a.vendor_id = kVendorId;
  a.vendor_part_id = kVendorPartId;
  a.hw_ver = 1;
  a.max_qp = rc::kMaxQp;
  a.max_qp_wr = rc::kMaxQpWr;
  a.device_cap_flags = IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
                       IBV_DEVICE_N_NOTIFY_CQ | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a.max_sge = rc::kMaxSge;
  a.max_sge_rd = rc::kMaxSge;
  a.max_cq = rc::kMaxCq;
  a.max_cqe = rc::kMaxCqe;
  a.max_mr = 65536;
  a.max_pd = 65536;
  a.max_qp_rd_atom = rc::kMaxRdAtomic;  // perftest sizes outstanding READs from this; must be > 0
  a.max_res_rd_atom = rc::kMaxRdAtomic * rc::kMaxQp;
  a.max_qp_init_rd_atom = rc::kMaxRdAtomic;
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_ah = 65536;
  a.max_srq = rc::kMaxSrq;
  a.max_srq_wr = rc::kMaxSrqWr;
  a.max_srq_sge = rc::kMaxSge;
  a.max_pkeys = 1;
  a.local_ca_ack_delay = 15;
  a.phys_port_cnt = 1;
  ex->device_cap_flags_ex = a.device_cap_flags;
  ex->phys_port_cnt_ex = 1;
}

void SoftDevice::port_attr(ibv_port_attr* p) const {
  std::memset(p, 0, sizeof(*p));
  p->state = IBV_PORT_ACTIVE;
  p->max_mtu = IBV_MTU_4096;
  p->active_mtu = active_mtu();
  p->gid_tbl_len = kGidTableLen;
  p->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  p->max_msg_sz = 0x80000000u;  // 2 GiB (IBA: messages up to 2^31 bytes)
  p->pkey_tbl_len = 1;
  p->max_vl_num = 1;
  p->active_width = 1;  // 1X
  p->active_speed = 32;  // EDR (25 Gb/s per lane)
  p->phys_state = 5;  // LinkUp
  p->link_layer = IBV_LINK_LAYER_ETHERNET;
  p->flags = IBV_QPF_GRH_REQUIRED;  // RoCE: every address handle carries a GRH
}

bool SoftDevice::gid(uint32_t index, ibv_gid_entry* e) const {
  const IpAddr* a = gid_address(index);
  if (!a) return false;
  std::memset(e, 0, sizeof(*e));
  a->to_gid(e->gid.raw);
  e->gid_index = index;
  e->port_num = 1;
  e->gid_type = IBV_GID_TYPE_ROCE_V2;  // the soft transport speaks RoCEv2 (UDP) only
  e->ndev_ifindex = spec_.ifindex;
  return true;
}

const IpAddr* SoftDevice::gid_address(uint32_t index) const {
  if (index >= static_cast<uint32_t>(kGidTableLen)) return nullptr;
  if (!spec_.gid_map.empty()) {
    if (index >= spec_.gid_map.size()) return nullptr;
    index = spec_.gid_map[index];
  }
  return index < spec_.addrs.size() ? &spec_.addrs[index] : nullptr;
}

const IpAddr* SoftDevice::source_address(uint32_t index, const uint8_t dgid[16], int* err) const {
  const IpAddr* a = gid_address(index);
  if (!a || roce::gid_is_v4_mapped(dgid) != (a->family == AF_INET)) {
    *err = EINVAL;  // RoCEv2 cannot carry IPv4 from an IPv6 source or the reverse
    return nullptr;
  }
  if (const char* no = gid_family_unusable(a->family == AF_INET6)) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) std::fprintf(stderr, "melondma soft: %s: GID %u: %s\n", name(), index, no);
    *err = EAFNOSUPPORT;
    return nullptr;
  }
  return a;
}

// ---- context: queries -----------------------------------------------------------------------------

int SoftContext::query_device_ex(ibv_device_attr_ex* attr) {
  dev_->device_attr(attr);
  return 0;
}

int SoftContext::query_port(uint8_t port, ibv_port_attr* attr) {
  if (port != 1) return EINVAL;
  dev_->port_attr(attr);
  return 0;
}

int SoftContext::query_gid_entry(uint32_t port, uint32_t index, ibv_gid_entry* entry) {
  if (port != 1 || index >= static_cast<uint32_t>(kGidTableLen)) return EINVAL;
  return dev_->gid(index, entry) ? 0 : ENODATA;
}

int SoftContext::wait_channel(int fd) {
  // The waiter receives for the one lane whose QPs complete on this channel's CQs. Where they are
  // in several lanes (or none yet) it leaves the receiving to the progress threads, which wake it
  // through the channel.
  Hub* h = hub_if_started();
  if (!h) return 0;
  uint32_t lanes = h->lanes() == 1 ? 1u : 0u;
  if (!lanes) {
    std::lock_guard<std::mutex> g(hub_mu_);
    auto it = channel_lanes_.find(fd);
    if (it != channel_lanes_.end()) lanes = it->second;
  }
  if (!lanes || (lanes & (lanes - 1))) return 0;
  const int fl = fcntl(fd, F_GETFL);  // an O_NONBLOCK channel must not block here
  if (fl < 0 || (fl & O_NONBLOCK)) return 0;
  return h->lane(size_t(__builtin_ctz(lanes))).wait_readable(fd, verbs::channel_event_taken);
}

void SoftContext::close() {
  if (hub_) Hub::release(hub_);
  pthread_mutex_destroy(&vctx.context.mutex);
  delete this;
}

// ---- protection domains ---------------------------------------------------------------------------

ibv_pd* SoftContext::alloc_pd() {
  static std::atomic<uint32_t> next_handle{1};
  auto* pd = new SoftPd();  // value-initialised: every ibv_* member starts zeroed, as rdma-core providers do
  pd->ibv.context = &vctx.context;
  pd->ibv.handle = next_handle++;
  std::lock_guard<std::mutex> lock(import_mu_);
  pds_[pd->ibv.handle] = pd->state;
  return &pd->ibv;
}

int SoftContext::dealloc_pd(ibv_pd* pd) {
  if (!owns(pd)) return EINVAL;
  auto* p = reinterpret_cast<SoftPd*>(pd);
  {
    std::lock_guard<std::mutex> lock(import_mu_);
    if (!p->state->live) return EINVAL;  // already deallocated through an import (or the original)
    if (p->state->users.load()) return EBUSY;  // IBA 11.2.1.2: a PD in use cannot be deallocated
    p->state->live = false;
    pds_.erase(pd->handle);
  }
  delete p;
  return 0;
}

// An import is a second SoftPd sharing the state: the handle is what the engine matches MRs by.
ibv_pd* SoftContext::import_pd(uint32_t handle) {
  std::lock_guard<std::mutex> lock(import_mu_);
  auto it = pds_.find(handle);
  if (it == pds_.end()) {
    errno = EINVAL;  // no live PD with that handle in this (shared) context
    return nullptr;
  }
  auto* pd = new SoftPd();
  pd->ibv.context = &vctx.context;
  pd->ibv.handle = handle;
  pd->state = it->second;
  return &pd->ibv;
}

void SoftContext::unimport_pd(ibv_pd* pd) {
  if (owns(pd)) delete reinterpret_cast<SoftPd*>(pd);
}

// ---- address handles ------------------------------------------------------------------------------

ibv_ah* SoftContext::create_ah(ibv_pd* pd, const ibv_ah_attr* attr) {
  static const uint8_t zero[16] = {};
  if (!owns(pd) || attr->port_num != 1 || !attr->is_global || std::memcmp(attr->grh.dgid.raw, zero, 16) == 0) {
    errno = EINVAL;  // RoCE: the GRH is the address (IBV_QPF_GRH_REQUIRED)
    return nullptr;
  }
  int err = 0;
  const IpAddr* src = dev_->source_address(attr->grh.sgid_index, attr->grh.dgid.raw, &err);
  if (!src) {
    errno = err;
    return nullptr;
  }
  auto* ah = new SoftAh();
  ah->ibv.context = &vctx.context;
  ah->ibv.pd = pd;
  ah->attr = *attr;
  ah->source = *src;
  // The engine's form of the address (UD sends carry a pointer to it while queued).
  std::memcpy(ah->av.dgid, attr->grh.dgid.raw, 16);
  src->to_gid(ah->av.sgid);
  ah->av.flow_label = verbs::flow_label_of(attr->grh);
  ah->av.hop_limit = attr->grh.hop_limit ? attr->grh.hop_limit : 64;
  ah->av.traffic_class = attr->grh.traffic_class;
  const uint8_t* g = attr->grh.dgid.raw;
  static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(g, v4_prefix, 12) == 0) {
    ah->dest.family = AF_INET;
    std::memcpy(ah->dest.bytes, g + 12, 4);
  } else {
    ah->dest.family = AF_INET6;
    std::memcpy(ah->dest.bytes, g, 16);
  }
  SoftPd::users(pd)++;
  return &ah->ibv;
}

int SoftContext::destroy_ah(ibv_ah* ah) {
  if (ah->context != &vctx.context) return EINVAL;
  auto* a = reinterpret_cast<SoftAh*>(ah);
  SoftPd::users(a->ibv.pd)--;
  delete a;
  return 0;
}

}  // namespace melon::soft
