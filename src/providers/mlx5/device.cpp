// mlx5 provider: discovery, context (UAR, event thread), device/port/GID queries, PD, MR, AH.
#include "providers/mlx5/byte_order.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "providers/mlx5/mlx5.h"
#include "providers/mlx5/tables.h"

namespace melon::mlx5prov {

namespace {

class Mlx5Provider : public verbs::Provider {
 public:
  const char* name() const override { return "mlx5"; }
  std::vector<std::unique_ptr<verbs::Device>> discover() override {
    std::vector<std::unique_ptr<verbs::Device>> out;
    std::string path = device_location();
    if (path.empty() || !device_present(path)) return out;
    auto dev = std::make_unique<Mlx5Device>(path);
    dev->set_guid(guid_of(path));
    out.push_back(std::move(dev));
    return out;
  }

 private:
  // The node GUID (ibv_get_device_guid works before any open). melon-emud publishes it beside its
  // socket (<socket>.guid, docs/uapi.md), so listing devices opens no connection to the daemon;
  // through IOKit it is asked once per device.
  __be64 guid_of(const std::string& path) {
#ifndef MELON_TRANSPORT_IOKIT
    unsigned long long v = 0;
    if (FILE* f = fopen((path + ".guid").c_str(), "re")) {
      if (fscanf(f, "%llx", &v) != 1) v = 0;
      fclose(f);
    }
    return to_be64(uint64_t(v));
#endif
    std::lock_guard<std::mutex> lock(mu_);
    auto it = guids_.find(path);
    if (it != guids_.end()) return it->second;
    int err = 0;
    __be64 g = 0;
    if (std::unique_ptr<Transport> t = open_transport(path.c_str(), &err)) {
      uapi::DeviceAttr a{};
      if (t->call(uapi::Selector::query_device, uapi::EmptyReq{}, &a) == uapi::Status::ok) g = to_be64(a.node_guid);
    }
    if (g) guids_[path] = g;
    return g;
  }
  std::mutex mu_;
  std::unordered_map<std::string, __be64> guids_;
};

}  // namespace

MELON_VERBS_PROVIDER(Mlx5Provider)

// ---- device and context -------------------------------------------------------------------------

verbs::ContextBase* Mlx5Device::open() {
  int err = 0;
  std::unique_ptr<Transport> t = open_transport(where_.c_str(), &err);
  if (!t) {
    if (getenv("MELON_MLX5_DEBUG")) fprintf(stderr, "melondma mlx5: %s: %s\n", where_.c_str(), strerror(err));
    errno = err;
    return nullptr;
  }
  return open_context(this, std::move(t));
}

verbs::ContextBase* open_context(Mlx5Device* dev, std::unique_ptr<Transport> t) {
  auto* ctx = new Mlx5Context(dev, std::move(t));
  // The device's side first (nothing of the library's to undo if it fails), then the library's,
  // then the event thread.
  int rc = ctx->prepare();
  if (!rc && (rc = verbs::init_context(ctx, ctx, dev)) == 0) {
    if ((rc = ctx->start_events())) {
      ibv_close_device(ctx->ibv());  // undoes init_context, then calls close()
      errno = rc;
      return nullptr;
    }
  } else {
    ctx->discard();
    errno = rc;
    return nullptr;
  }
  ibv_context_ops& ops = ctx->vctx.context.ops;
  ops.poll_cq = mlx5_poll_cq;
  ops.req_notify_cq = mlx5_req_notify_cq;
  ops.post_send = mlx5_post_send;
  ops.post_recv = mlx5_post_recv;
  ops.post_srq_recv = mlx5_post_srq_recv;
  return ctx;
}

int Mlx5Context::prepare() {
  if (uapi::Status s = t_->call(uapi::Selector::query_device, uapi::EmptyReq{}, &attr_); s != uapi::Status::ok)
    return errno_of(s);
  dev_->set_guid(to_be64(attr_.node_guid));
  // One UAR per context: every QP's send doorbells and every CQ's arm doorbells go to it.
  if (uapi::Status s = t_->call(uapi::Selector::alloc_uar, uapi::EmptyReq{}, &uar_); s != uapi::Status::ok)
    return errno_of(s);
  uapi::Status st;
  uar_map_.addr = t_->map(uapi::MapKind::uar, uar_.handle, &uar_map_.len, &st);
  if (!uar_map_.addr) return errno_of(st);
  if (uint64_t(uar_.db_offset) + 2 * uar_.bf_bytes + 8 > uar_map_.len) return EPROTO;
  bf_offset_ = uar_.db_offset;
  if (pipe(stop_pipe_) != 0) return errno;
  for (int fd : stop_pipe_) fcntl(fd, F_SETFD, FD_CLOEXEC);
  return 0;
}

int Mlx5Context::start_events() {
  try {
    events_ = std::thread([this] { event_loop(); });
  } catch (...) {
    return EAGAIN;
  }
  return 0;
}

void Mlx5Context::discard() {
  for (int& fd : stop_pipe_)
    if (fd >= 0) ::close(fd), fd = -1;
  free_map(uar_map_);
  delete this;  // the transport goes with it: the daemon frees the UAR
}

int Mlx5Context::call_empty(uapi::Selector sel, uint32_t handle) {
  uapi::EmptyResp none;
  uapi::Status s = t_->call(sel, uapi::HandleReq{handle, 0}, &none);
  if (s != uapi::Status::ok && getenv("MELON_MLX5_DEBUG"))
    fprintf(stderr, "melondma mlx5: selector %#x handle %#x: uapi status %u\n", unsigned(sel), handle, unsigned(s));
  return errno_of(s);
}

void Mlx5Context::free_map(Mapping& m) {
  if (m.addr) t_->unmap(m.addr, m.len);
  m = Mapping{};
}

void Mlx5Context::close() {
  if (events_.joinable()) {
    char c = 0;
    (void)!write(stop_pipe_[1], &c, 1);
    events_.join();
  }
  for (int& fd : stop_pipe_)
    if (fd >= 0) ::close(fd), fd = -1;
  free_map(uar_map_);
  t_.reset();  // closing the connection releases every object the driver still holds for us
  pthread_mutex_destroy(&vctx.context.mutex);
  delete this;
}

// ---- events -------------------------------------------------------------------------------------

// The transport says when the driver has queued events (Transport::wait_event); each wake-up is
// drained to no_event, which arms the next one.
void Mlx5Context::event_loop() {
  while (t_->wait_event(stop_pipe_[0]) == Transport::Wake::event) {
    for (;;) {
      uapi::EventResp ev{};
      if (t_->call(uapi::Selector::get_event, uapi::EmptyReq{}, &ev) != uapi::Status::ok) break;
      deliver(ev);
    }
  }
}

void Mlx5Context::deliver(const uapi::EventResp& ev) {
  ibv_async_event a{};
  a.event_type = ibv_event_type(ev.event_type);
  if (ev.handle == 0) {  // the device's: port changes, fatal error
    a.element.port_num = 1;
    verbs::post_async_event(&vctx.context, a);
    return;
  }
  std::shared_lock<std::shared_mutex> lock(obj_mu_);
  auto it = by_handle_.find(ev.handle);
  if (it == by_handle_.end()) return;  // destroyed meanwhile
  switch (uapi::token_type(ev.handle)) {
    case uapi::ObjType::cq: {
      auto* cq = static_cast<Mlx5Cq*>(it->second);
      if (ev.kind == uapi::kEventCompletion) {
        cq->arm_sn++;  // the next arm is a new request (PRM: CQ arm sequence number)
        verbs::signal_comp_channel(cq->cq());
        return;
      }
      a.element.cq = cq->cq();
      break;
    }
    case uapi::ObjType::qp: a.element.qp = &static_cast<Mlx5Qp*>(it->second)->ibv.qp_base; break;
    case uapi::ObjType::srq: a.element.srq = &static_cast<Mlx5Srq*>(it->second)->ibv; break;
    default: return;
  }
  verbs::post_async_event(&vctx.context, a);
}

// ---- queries ------------------------------------------------------------------------------------

int Mlx5Context::query_device_ex(ibv_device_attr_ex* ex) {
  memset(ex, 0, sizeof *ex);
  ibv_device_attr& a = ex->orig_attr;
  const uapi::DeviceAttr& d = attr_;
  snprintf(a.fw_ver, sizeof a.fw_ver, "%u.%u.%04u", unsigned(d.fw_ver >> 32), unsigned(d.fw_ver >> 16) & 0xffff,
           unsigned(d.fw_ver & 0xffff));
  a.node_guid = to_be64(d.node_guid);
  a.sys_image_guid = to_be64(d.sys_image_guid);
  a.max_mr_size = d.max_mr_size;
  a.page_size_cap = d.page_size_cap;
  a.vendor_id = d.vendor_id;
  a.vendor_part_id = d.vendor_part_id;
  a.hw_ver = d.hw_ver;
  a.max_qp = int(d.max_qp);
  a.max_qp_wr = int(d.max_qp_wr);
  a.device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_CHANGE_PHY_PORT |
                       IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN;
  a.max_sge = int(d.max_sge);
  a.max_sge_rd = int(d.max_sge);
  a.max_cq = int(d.max_cq);
  a.max_cqe = int(d.max_cqe);
  a.max_mr = int(d.max_mr);
  a.max_pd = int(d.max_pd);
  a.max_qp_rd_atom = int(d.max_qp_rd_atom);
  a.max_qp_init_rd_atom = int(d.max_qp_init_rd_atom);
  a.max_res_rd_atom = int(d.max_qp_rd_atom * d.max_qp);
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_srq = int(d.max_srq);
  a.max_srq_wr = int(d.max_srq_wr);
  a.max_srq_sge = int(d.max_srq_sge);
  a.max_ah = int(d.max_ah);
  a.max_pkeys = 1;
  a.local_ca_ack_delay = 16;
  a.phys_port_cnt = uint8_t(d.phys_port_cnt);
  ex->device_cap_flags_ex = a.device_cap_flags;
  ex->phys_port_cnt_ex = d.phys_port_cnt;
  return 0;
}

int Mlx5Context::query_port(uint8_t port, ibv_port_attr* p) {
  uapi::PortAttr pa{};
  if (uapi::Status s = t_->call(uapi::Selector::query_port, uapi::PortReq{port, 0}, &pa); s != uapi::Status::ok)
    return errno_of(s);
  memset(p, 0, sizeof *p);
  p->state = ibv_port_state(pa.state);
  p->max_mtu = ibv_mtu(pa.max_mtu);
  p->active_mtu = ibv_mtu(pa.active_mtu);
  p->gid_tbl_len = int(pa.gid_tbl_len);
  p->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  p->max_msg_sz = 1u << 30;  // ConnectX: log_max_msg 30
  p->pkey_tbl_len = 1;
  p->max_vl_num = 1;
  p->active_width = uint8_t(pa.active_width);
  p->active_speed = uint8_t(pa.active_speed);
  p->phys_state = pa.state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp : Disabled
  p->link_layer = IBV_LINK_LAYER_ETHERNET;
  p->flags = IBV_QPF_GRH_REQUIRED;
  return 0;
}

int Mlx5Context::query_gid_entry(uint32_t port, uint32_t index, ibv_gid_entry* e) {
  uapi::GidResp g{};
  if (uapi::Status s = t_->call(uapi::Selector::query_gid, uapi::GidReq{port, index}, &g); s != uapi::Status::ok)
    return errno_of(s);
  if (!g.valid) return ENODATA;
  memset(e, 0, sizeof *e);
  memcpy(e->gid.raw, g.gid, 16);
  e->gid_index = index;
  e->port_num = port;
  e->gid_type = g.roce_version == 1 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
  return 0;
}

// ---- PD, MR, AH ---------------------------------------------------------------------------------

ibv_pd* Mlx5Context::alloc_pd() {
  uapi::HandleResp r{};
  if (uapi::Status s = t_->call(uapi::Selector::alloc_pd, uapi::EmptyReq{}, &r); s != uapi::Status::ok) {
    errno = errno_of(s);
    return nullptr;
  }
  auto* pd = new Mlx5Pd();
  pd->ibv.context = &vctx.context;
  pd->ibv.handle = r.handle;
  pd->handle = r.handle;
  std::lock_guard<std::mutex> lock(import_mu_);
  pds_[r.handle] = true;
  return &pd->ibv;
}

int Mlx5Context::dealloc_pd(ibv_pd* pd) {
  if (!owns(pd)) return EINVAL;
  auto* p = reinterpret_cast<Mlx5Pd*>(pd);
  if (int e = call_empty(uapi::Selector::dealloc_pd, p->handle)) return e;
  {
    std::lock_guard<std::mutex> lock(import_mu_);
    pds_.erase(p->handle);
  }
  delete p;
  return 0;
}

// An imported PD is a second Mlx5Pd with the same driver handle; the driver counts what uses it.
ibv_pd* Mlx5Context::import_pd(uint32_t handle) {
  {
    std::lock_guard<std::mutex> lock(import_mu_);
    if (!pds_.count(handle)) {
      errno = EINVAL;  // no live PD with that handle in this (shared) context
      return nullptr;
    }
  }
  auto* pd = new Mlx5Pd();
  pd->ibv.context = &vctx.context;
  pd->ibv.handle = handle;
  pd->handle = handle;
  return &pd->ibv;
}

void Mlx5Context::unimport_pd(ibv_pd* pd) {
  if (owns(pd)) delete reinterpret_cast<Mlx5Pd*>(pd);
}

namespace {

// Access bits for the driver: the optional ones (relaxed ordering and the like) are hints and
// dropped; any other bit the uapi does not know is EINVAL.
bool driver_access(unsigned access, unsigned* known) {
  *known = access & uapi::kAccessKnown;
  return !(access & ~(uapi::kAccessKnown | IBV_ACCESS_OPTIONAL_RANGE));
}

}  // namespace

ibv_mr* Mlx5Context::reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  if (!owns(pd)) {
    errno = EINVAL;
    return nullptr;
  }
  if (iova != uint64_t(uintptr_t(addr))) {
    errno = EOPNOTSUPP;  // the driver maps an MR at its own address (docs/mlx5-provider.md)
    return nullptr;
  }
  unsigned known = 0;
  if (!driver_access(access, &known)) {
    errno = EINVAL;
    return nullptr;
  }
  uapi::RegMrReq rq{reinterpret_cast<Mlx5Pd*>(pd)->handle, known, uint64_t(uintptr_t(addr)), uint64_t(length)};
  if (getenv("MELON_MLX5_DEBUG")) fprintf(stderr, "melondma mlx5: reg_mr %p+%zu access %#x\n", addr, length, access);
  uapi::RegMrResp rp{};
  if (uapi::Status s = t_->call(uapi::Selector::reg_mr, rq, &rp); s != uapi::Status::ok) {
    if (getenv("MELON_MLX5_DEBUG")) fprintf(stderr, "melondma mlx5: reg_mr: uapi status %u\n", unsigned(s));
    errno = errno_of(s);
    return nullptr;
  }
  auto* mr = new Mlx5Mr();
  mr->ibv.context = &vctx.context;
  mr->ibv.pd = pd;
  mr->ibv.addr = addr;
  mr->ibv.length = length;
  mr->ibv.handle = rp.handle;
  mr->ibv.lkey = rp.lkey;
  mr->ibv.rkey = rp.rkey;
  mr->mr_handle = rp.handle;
  mr->pd_handle = rq.pd;
  mr->access = known;
  std::lock_guard<std::mutex> lock(import_mu_);
  mrs_[rp.handle] = *mr;
  return &mr->ibv;
}

// The PRM has no command that changes an mkey in place (Linux does that with a UMR WQE on a QP of
// its own), so a re-registration is a new registration with the changed attributes, then the old
// one goes - what Linux mlx5 does whenever it cannot reuse the mkey (mlx5_ib_rereg_user_mr ->
// create_real_mr). New lkey and rkey; the old keys are refused from then on. A refused new
// registration leaves the MR as it was.
int Mlx5Context::rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, unsigned access) {
  if (mr->context != &vctx.context) return EINVAL;
  auto* m = reinterpret_cast<Mlx5Mr*>(mr);
  if ((flags & IBV_REREG_MR_CHANGE_PD) && !owns(pd)) return EINVAL;
  uint32_t new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? reinterpret_cast<Mlx5Pd*>(pd)->handle : m->pd_handle;
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : mr->addr;
  size_t new_len = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : mr->length;
  unsigned new_access = m->access;
  if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && !driver_access(access, &new_access)) return EINVAL;
  uapi::RegMrReq rq{new_pd, new_access, uint64_t(uintptr_t(new_addr)), uint64_t(new_len)};
  uapi::RegMrResp rp{};
  if (uapi::Status s = t_->call(uapi::Selector::reg_mr, rq, &rp); s != uapi::Status::ok) return errno_of(s);
  if (int e = call_empty(uapi::Selector::dereg_mr, m->mr_handle)) {
    call_empty(uapi::Selector::dereg_mr, rp.handle);  // the old registration stays; so does the MR
    return e;
  }
  std::lock_guard<std::mutex> lock(import_mu_);
  mrs_.erase(m->mr_handle);
  if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
  mr->addr = new_addr;
  mr->length = new_len;
  mr->handle = m->mr_handle = rp.handle;
  mr->lkey = rp.lkey;
  mr->rkey = rp.rkey;
  m->pd_handle = new_pd;
  m->access = new_access;
  mrs_[rp.handle] = *m;
  return 0;
}

int Mlx5Context::dereg_mr(ibv_mr* mr) {
  if (mr->context != &vctx.context) return EINVAL;
  auto* m = reinterpret_cast<Mlx5Mr*>(mr);
  if (int e = call_empty(uapi::Selector::dereg_mr, m->mr_handle)) return e;
  {
    std::lock_guard<std::mutex> lock(import_mu_);
    mrs_.erase(m->mr_handle);
  }
  delete m;
  return 0;
}

// An imported MR is a copy of the MR as last registered, in `pd` (which must be its PD, or an
// import of it); deregistering either ends the registration.
ibv_mr* Mlx5Context::import_mr(ibv_pd* pd, uint32_t handle) {
  std::lock_guard<std::mutex> lock(import_mu_);
  auto it = mrs_.find(handle);
  if (!owns(pd) || it == mrs_.end() || it->second.pd_handle != reinterpret_cast<Mlx5Pd*>(pd)->handle) {
    errno = EINVAL;
    return nullptr;
  }
  auto* mr = new Mlx5Mr(it->second);
  mr->ibv.pd = pd;
  return &mr->ibv;
}

void Mlx5Context::unimport_mr(ibv_mr* mr) {
  if (mr->context == &vctx.context) delete reinterpret_cast<Mlx5Mr*>(mr);
}

// The uapi form of an address vector (modify_qp's AV and create_ah).
bool to_address(const ibv_ah_attr& ah, uapi::AddressReq* av) {
  if (!ah.is_global) return false;  // RoCE: the GRH is the address
  memset(av, 0, sizeof *av);
  memcpy(av->dgid, ah.grh.dgid.raw, 16);
  av->flow_label = verbs::flow_label_of(ah.grh);
  av->sgid_index = ah.grh.sgid_index;
  av->hop_limit = ah.grh.hop_limit ? ah.grh.hop_limit : 64;
  av->traffic_class = ah.grh.traffic_class;
  av->sl = ah.sl;
  av->port = ah.port_num ? ah.port_num : 1;
  return true;
}

ibv_ah* Mlx5Context::create_ah(ibv_pd* pd, const ibv_ah_attr* attr) {
  uapi::CreateAhReq rq{};
  if (!owns(pd) || !to_address(*attr, &rq.av)) {
    errno = EINVAL;
    return nullptr;
  }
  rq.pd = reinterpret_cast<Mlx5Pd*>(pd)->handle;
  uapi::CreateAhResp rp{};
  if (uapi::Status s = t_->call(uapi::Selector::create_ah, rq, &rp); s != uapi::Status::ok) {
    errno = errno_of(s);
    return nullptr;
  }
  auto* ah = new Mlx5Ah();
  ah->ibv.context = &vctx.context;
  ah->ibv.pd = pd;
  ah->ibv.handle = rp.handle;
  ah->ah_handle = rp.handle;
  memcpy(ah->av, rp.av, sizeof ah->av);
  return &ah->ibv;
}

int Mlx5Context::destroy_ah(ibv_ah* ah) {
  if (ah->context != &vctx.context) return EINVAL;
  auto* a = reinterpret_cast<Mlx5Ah*>(ah);
  if (int e = call_empty(uapi::Selector::destroy_ah, a->ah_handle)) return e;
  delete a;
  return 0;
}

}  // namespace melon::mlx5prov
