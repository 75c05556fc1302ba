// uapi::Backend over src/mlx5/core.
#include "mlx5/core/uapi_backend.h"

#include <string.h>

#include "mlx5/core/bar.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

using namespace melon::uapi;  // the ABI this backend serves

namespace c = mlx5::core;
namespace p = prm;

Status status_of(c::Err e) {
  switch (e) {
    case c::Err::ok: return Status::ok;
    case c::Err::no_memory: return Status::no_memory;
    case c::Err::invalid: return Status::invalid;
    case c::Err::busy:
    case c::Err::in_use: return Status::busy;
    case c::Err::dead: return Status::device_dead;
    case c::Err::unsupported: return Status::unsupported;
    case c::Err::bad_state: return Status::wrong_state;
    case c::Err::not_found: return Status::bad_handle;
    case c::Err::taken: return Status::taken;
    default: return Status::firmware;  // timeout, cmd_status, delivery, leak
  }
}

// Queue memory: the ring, page-rounded, then one page holding the doorbell record(s), so each can
// be mapped on its own.
struct UapiBackend::Queue {
  QueuePlatform::Mem mem;
  uint64_t ring_bytes = 0;
  // A resized CQ's ring, on its own (the doorbell record stays in `mem`, with the first ring,
  // which goes only with the CQ); empty until the first resize.
  QueuePlatform::Mem resized;
  c::Cq* cq = nullptr;
  c::Srq* srq = nullptr;
  c::Qp* qp = nullptr;
  uint8_t bound_kind = 0;  // doorbell_bind()'s kind and number, undone when the memory goes
  uint32_t bound_number = 0;
  Queue* next_dead = nullptr;  // on dead_queues_ once destroyed while the device was dead
  uint64_t dead_resets = 0;  // the core's reset count when it was parked
};

namespace {
// Route::kind: which object an event names (device events name none; route_add/route_del take
// the same numbers).
enum RouteKind : uint8_t { kDevice = 0, kCq = 1, kQp = 2, kSrq = 3 };
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

UapiBackend::UapiBackend(c::Hca& hca, QueuePlatform& plat, uint32_t routes) : hca_(hca), plat_(plat), nroutes_(routes) {
  lock_ = hca_.hal().lock_create();
  routes_ = static_cast<Route*>(hca_.hal().mem_alloc(sizeof(Route) * nroutes_));
  if (!routes_) nroutes_ = 0;  // every create then fails: no event could reach its client
  pending_ = static_cast<Pending*>(hca_.hal().mem_alloc(sizeof(Pending) * kPending));
  hca_.set_device_sink(this);  // port changes and fatal errors go to every client
}

UapiBackend::~UapiBackend() {
  release_dead();  // a host that forgot to is still safe: nothing goes while the device is fatal
  hca_.set_device_sink(nullptr);
  if (routes_) hca_.hal().mem_free(routes_, sizeof(Route) * nroutes_);
  if (pending_) hca_.hal().mem_free(pending_, sizeof(Pending) * kPending);
  if (lock_) hca_.hal().lock_destroy(lock_);
}

namespace {
uint32_t min32(uint32_t a, uint32_t b) { return a < b ? a : b; }
}  // namespace

void UapiBackend::fill_limits(uapi::Limits* lim) {
  // What the server admits is what query_device tells the client, field for field: a request the
  // device attributes allow is never refused, and one they do not is never passed on.
  DeviceAttr a{};
  query_device(&a);
  lim->max_qp_wr = a.max_qp_wr;
  lim->max_sge = a.max_sge;
  lim->max_inline = a.max_inline_data;
  lim->max_cqe = a.max_cqe;
  lim->max_srq_wr = a.max_srq_wr;
  lim->max_srq_sge = a.max_srq_sge;
  lim->max_rd_atomic = min32(a.max_qp_rd_atom, a.max_qp_init_rd_atom);
  lim->ports = a.phys_port_cnt;
  if (a.max_mr_size < lim->max_mr_size) lim->max_mr_size = a.max_mr_size;
  const c::HcaCaps& caps = hca_.caps();
  lim->gid_tbl_len = caps.gid_table_size ? caps.gid_table_size : 16;
  lim->comp_vectors = hca_.comp_eq_count() ? hca_.comp_eq_count() : 1;
  // Device quotas: no more objects than the device has, and every CQ, QP and SRQ with an event
  // route (the largest gives way first).
  uapi::Quotas& d = lim->device;
  d.pd = min32(d.pd, a.max_pd), d.cq = min32(d.cq, a.max_cq), d.qp = min32(d.qp, a.max_qp);
  d.mr = min32(d.mr, a.max_mr / 2), d.srq = min32(d.srq, a.max_srq);  // an MR may take two mkeys
  uint32_t* order[] = {&d.qp, &d.cq, &d.srq};
  for (uint32_t* q : order) {
    uint64_t sum = uint64_t(d.cq) + d.qp + d.srq;
    if (sum > nroutes_) *q -= min32(*q, uint32_t(sum - nroutes_));
  }
}

// ---- Queries -----------------------------------------------------------------------------------

Status UapiBackend::query_device(DeviceAttr* a) {
  const c::HcaCaps& caps = hca_.caps();
  uint32_t fw_major = 14, fw_minor = 32, fw_sub = 1010;  // what the emulated card reports
  a->fw_ver = uint64_t(fw_major) << 32 | uint64_t(fw_minor) << 16 | fw_sub;
  const uint8_t* mac = hca_.port().mac;
  // EUI-64 from the port MAC (as mlx5 derives node_guid for Ethernet ports).
  uint64_t guid = uint64_t(mac[0] ^ 2) << 56 | uint64_t(mac[1]) << 48 | uint64_t(mac[2]) << 40 | 0xfffeull << 24 |
                  uint64_t(mac[3]) << 16 | uint64_t(mac[4]) << 8 | mac[5];
  a->node_guid = a->sys_image_guid = guid;
  a->max_mr_size = ~0ull;
  a->page_size_cap = ~0xfffull;
  a->vendor_id = 0x02c9;  // Mellanox
  a->vendor_part_id = 4117;  // ConnectX-4 Lx
  a->hw_ver = 0;
  a->max_qp = 1u << caps.log_max_qp;
  uint32_t log_wq = p::get(caps.general, p::cmd_hca_cap::log_max_wq_sz);
  a->max_qp_wr = log_wq ? (1u << log_wq) : 16384;
  if (a->max_qp_wr > 16384) a->max_qp_wr = 16384;
  a->max_sge = 30;
  a->max_cq = 1u << caps.log_max_cq;
  uint32_t log_cq = p::get(caps.general, p::cmd_hca_cap::log_max_cq_sz);
  a->max_cqe = log_cq ? (1u << log_cq) - 1 : (1u << 22) - 1;
  a->max_mr = 1u << caps.log_max_mkey;
  a->max_pd = 1u << caps.log_max_pd;
  a->max_qp_rd_atom = a->max_qp_init_rd_atom = 16;
  a->max_srq = 1u << caps.log_max_srq;
  a->max_srq_wr = a->max_qp_wr - 1;
  a->max_srq_sge = 31;
  a->max_ah = 0x7fffffff;
  a->phys_port_cnt = 1;
  a->max_inline_data = 512;
  a->uar_page_size = p::kUarPageBytes << caps.log_uar_page_sz;
  a->bf_reg_size = caps.bf ? p::bf_buffer_bytes(caps.log_bf_reg_size) : 0;
  return Status::ok;
}

Status UapiBackend::query_port(uint32_t, PortAttr* a) {
  const c::PortInfo& pi = hca_.port();
  a->state = pi.vport_state == 1 ? 4 : 1;  // ACTIVE : DOWN
  uint32_t ib_mtu = pi.mtu >= 4096 ? 5 : pi.mtu >= 2048 ? 4 : pi.mtu >= 1024 ? 3 : pi.mtu >= 512 ? 2 : 1;
  a->max_mtu = a->active_mtu = ib_mtu;
  a->gid_tbl_len = hca_.caps().gid_table_size;
  a->active_speed = 32;  // 25 Gb/s (IBV_SPEED_EDR per lane)
  a->active_width = 1;  // 1x
  memcpy(a->mac, pi.mac, 6);
  return Status::ok;
}

Status UapiBackend::query_gid(uint32_t, uint32_t index, GidResp* g) {
  c::GidEntry e;
  if (Status s = status_of(hca_.query_gid(index, &e)); s != Status::ok) return s;
  memcpy(g->gid, e.gid, 16);
  static const uint8_t zero[16] = {};
  g->valid = memcmp(e.gid, zero, 16) != 0;
  g->roce_version = e.version;
  return Status::ok;
}

// ---- PD, UAR, MR ---------------------------------------------------------------------------------

Status UapiBackend::alloc_pd(void** out) {
  c::Pd* pd = nullptr;
  Status s = status_of(hca_.alloc_pd(&pd));
  *out = pd;
  return s;
}

// After a fatal error a destroy that cannot reach the firmware still succeeds for the client (as
// Linux mlx5 destroys do in internal-error state): the handle goes, and what the device might still
// write is kept until release_dead(). A PD or UAR holds no memory the device writes; their core
// records go with the function reset.
Status UapiBackend::dealloc_pd(void* o) {
  Status s = status_of(hca_.free_pd(static_cast<c::Pd*>(o)));
  return s != Status::ok && dead(s) ? Status::ok : s;
}

Status UapiBackend::alloc_uar(Created* cr, UarResp* r) {
  c::Uar* u = nullptr;
  if (Status s = status_of(hca_.alloc_uar(&u)); s != Status::ok) return s;
  if (plat_.uar_map(*u, &cr->maps[0]) != c::kHalOk) {
    hca_.free_uar(u);
    return Status::no_memory;
  }
  cr->maps[0].kind = uint8_t(MapKind::uar);
  cr->maps[0].flags |= kMapWriteCombine;  // the platform may add kMapWatched
  cr->obj = u;
  r->page_bytes = uint32_t(cr->maps[0].length);
  r->db_offset = p::kUarBlueFlame;
  r->bf_bytes = u->bf_size;
  return Status::ok;
}

Status UapiBackend::free_uar(void* o) {
  c::Uar* u = static_cast<c::Uar*>(o);
  c::Uar copy = *u;
  Status s = status_of(hca_.free_uar(u));
  // Dead: the queues that rang through it were unbound when they were parked, so the page goes now.
  if (s != Status::ok && dead(s)) s = Status::ok;
  if (s == Status::ok) plat_.uar_unmap(copy);
  return s;
}

// An MR is two memory keys over the same pages when it grants remote access: the L_Key with local
// rights only, the R_Key with the rest. A peer that learns the L_Key (or an application that
// sends it by mistake) reaches nothing, and the two share no bits (ReDMArk; the soft provider's
// keys are the same way). Without remote access there is no R_Key (0).
struct UapiBackend::MrObj {
  c::Mr* mr;  // the L_Key's
  c::Mr* remote;  // the R_Key's, or null
  uint64_t pin;
  uint64_t pinned_len;  // page-rounded, counted in pinned_
  MrObj* next_dead;
  uint64_t dead_resets;
};

Status UapiBackend::reg_mr(void* host, void* pd, const RegMrReq& rq, void** out, RegMrResp* r) {
  uint64_t first = rq.addr & ~0xfffull, end = round_up(rq.addr + rq.length, 4096);
  uint64_t iova = 0, pin = 0;
  // A range that is not all the client's memory with the access asked: EFAULT, as ibv_reg_mr.
  if (int e = plat_.pin_client(host, first, end - first, (rq.access & ~kAccessRemoteRead) != 0, &iova, &pin);
      e != c::kHalOk)
    return e == c::kHalFault ? Status::bad_address : Status::invalid;
  MrObj* m = static_cast<MrObj*>(hca_.hal().mem_alloc(sizeof(MrObj)));
  if (!m) {
    plat_.unpin_client(pin);
    return Status::no_memory;
  }
  // The segment starts at the address itself (its in-page offset is the MR's first page offset).
  c::DmaSegment seg{iova + (rq.addr - first), end - rq.addr};
  c::Pd* p = static_cast<c::Pd*>(pd);
  constexpr uint32_t kRemote = kAccessRemoteRead | kAccessRemoteWrite | kAccessRemoteAtomic;
  m->remote = nullptr;
  Status s = status_of(hca_.create_mr(p, rq.addr, rq.length, rq.access & ~kRemote, &seg, 1, &m->mr));
  if (s == Status::ok && (rq.access & kRemote)) {
    s = status_of(hca_.create_mr(p, rq.addr, rq.length, rq.access, &seg, 1, &m->remote));
    if (s != Status::ok) hca_.destroy_mr(m->mr);
  }
  if (s != Status::ok) {
    plat_.unpin_client(pin);
    hca_.hal().mem_free(m, sizeof(MrObj));
    return s;
  }
  m->pin = pin;
  m->pinned_len = end - first;
  m->next_dead = nullptr;
  pinned_ += end - first;
  r->lkey = m->mr->mkey;
  r->rkey = m->remote ? m->remote->mkey : 0;
  *out = m;
  return Status::ok;
}

Status UapiBackend::dereg_mr(void* o) {
  MrObj* m = static_cast<MrObj*>(o);
  // The R_Key first: once it is gone no peer reaches the pages. A key destroyed is forgotten, so
  // a retry after a failure destroys only what is left.
  Status s = Status::ok;
  c::Mr** keys[] = {&m->remote, &m->mr};
  for (c::Mr** k : keys) {
    if (!*k) continue;
    s = status_of(hca_.destroy_mr(*k));
    if (s != Status::ok) break;
    *k = nullptr;
  }
  if (s != Status::ok && dead(s)) {
    // The mkey may still be in use by the device: the pin stays until the reset.
    m->dead_resets = hca_.stats().resets;
    m->next_dead = dead_mrs_;
    dead_mrs_ = m;
    ndead_++;
    return Status::ok;
  }
  if (s != Status::ok) return s;
  free_mr(m);
  return Status::ok;
}

void UapiBackend::free_mr(MrObj* m) {
  plat_.unpin_client(m->pin);
  pinned_ -= m->pinned_len;
  hca_.hal().mem_free(m, sizeof(MrObj));
}

// ---- Queues ------------------------------------------------------------------------------------

uint64_t UapiBackend::queue_cost(uint64_t ring) {
  uint64_t page = hca_.hal().host_page_size();
  return round_up(ring, page) + page;  // as queue_mem() allocates
}

Status UapiBackend::queue_mem(uint64_t ring_bytes, Queue* q, Created* cr, MapKind ring_kind, MapKind second_kind) {
  uint64_t page = hca_.hal().host_page_size();
  uint64_t ring = round_up(ring_bytes, page);
  if (plat_.queue_alloc(queue_cost(ring_bytes), &q->mem) != c::kHalOk) return Status::no_memory;
  q->ring_bytes = ring;
  queue_bytes_ += q->mem.size;
  cr->maps[0] = MapRegion{uint8_t(ring_kind), 0, q->mem.memory, 0, ring};
  cr->maps[1] = MapRegion{uint8_t(MapKind::db_record), 0, q->mem.memory, ring, page};
  if (second_kind != MapKind::db_record) cr->maps[2] = MapRegion{uint8_t(second_kind), 0, q->mem.memory, 0, ring};
  return Status::ok;
}

void UapiBackend::free_queue(Queue* q) {
  // The platform stops reading the doorbell record before its memory is freed, whenever that is.
  if (q->bound_kind) plat_.doorbell_unbind(q->bound_kind, q->bound_number);
  queue_bytes_ -= q->mem.size;
  plat_.queue_free(q->mem);
  if (q->resized.size) {
    queue_bytes_ -= q->resized.size;
    plat_.queue_free(q->resized);
  }
  hca_.hal().mem_free(q, sizeof(Queue));
}

// Destroyed while the device is fatal: no more events for it and no more doorbells forwarded from
// its record (the memory stays, so unbinding now is safe), but the device may still DMA into the
// ring until the function reset, after which release_dead() frees it.
void UapiBackend::park_queue(Queue* q, uint8_t route_kind, uint32_t number) {
  route_del(route_kind, number);
  if (q->bound_kind) plat_.doorbell_unbind(q->bound_kind, q->bound_number);
  q->bound_kind = 0;
  q->cq = nullptr, q->srq = nullptr, q->qp = nullptr;  // the core drops its records at the reset
  q->dead_resets = hca_.stats().resets;
  q->next_dead = dead_queues_;
  dead_queues_ = q;
  ndead_++;
}

// Only what a function reset has since made safe: parked before the core's latest reset, and the
// device not fatal again.
uint32_t UapiBackend::release_dead() {
  if (fatal()) return 0;
  uint64_t resets = hca_.stats().resets;
  uint32_t n = 0;
  for (Queue** pq = &dead_queues_; *pq;) {
    Queue* q = *pq;
    if (q->dead_resets == resets) {
      pq = &q->next_dead;
      continue;
    }
    *pq = q->next_dead;
    free_queue(q);
    n++;
  }
  for (MrObj** pm = &dead_mrs_; *pm;) {
    MrObj* m = *pm;
    if (m->dead_resets == resets) {
      pm = &m->next_dead;
      continue;
    }
    *pm = m->next_dead;
    free_mr(m);
    n++;
  }
  ndead_ -= n;
  return n;
}

Status UapiBackend::create_cq(const CqSpec& spec, Created* cr, CreateCqResp* r) {
  Queue* q = static_cast<Queue*>(hca_.hal().mem_alloc(sizeof(Queue)));
  if (!q) return Status::no_memory;
  *q = Queue{};
  if (Status s = queue_mem(ring_bytes(spec), q, cr, MapKind::cqe, MapKind::db_record); s != Status::ok) {
    hca_.hal().mem_free(q, sizeof(Queue));
    return s;
  }
  // Every CQE starts owned by software with an invalid opcode (PRM: the initial ownership bit is 1
  // so the first pass's hardware-owned value 0 reads as new).
  uint8_t* ring_va = static_cast<uint8_t*>(q->mem.va);
  for (uint64_t i = 0; i < (1ull << spec.log_size); i++) ring_va[i * 64 + 63] = 0xf1;
  c::DmaSegment seg{q->mem.iova, q->ring_bytes};
  c::CqParams cp;
  cp.log_size = spec.log_size;
  cp.comp_vector = spec.comp_vector;
  cp.uar = static_cast<c::Uar*>(spec.uar);
  cp.buf = &seg;
  cp.nbuf = 1;
  cp.dbr_iova = q->mem.iova + q->ring_bytes;
  cp.owner = this;
  if (Status s = status_of(hca_.create_cq(cp, &q->cq)); s != Status::ok) {
    free_queue(q);
    return s;
  }
  if (!route_add(kCq, q->cq->cqn, spec.event_tag)) {  // no event could reach the client: refuse
    hca_.destroy_cq(q->cq);
    free_queue(q);
    return Status::no_memory;
  }
  q->bound_kind = kCq, q->bound_number = q->cq->cqn;
  plat_.doorbell_bind(*cp.uar, kCq, q->cq->cqn, static_cast<uint8_t*>(q->mem.va) + q->ring_bytes);
  r->cqn = q->cq->cqn;
  r->cqe = 1u << spec.log_size;
  r->cqe_bytes = 64;
  r->dbr_offset = 0;
  cr->obj = q;
  return Status::ok;
}

Status UapiBackend::destroy_cq(void* o) {
  Queue* q = static_cast<Queue*>(o);
  uint32_t cqn = q->cq->cqn;
  if (Status s = status_of(hca_.destroy_cq(q->cq)); s != Status::ok) {
    if (!dead(s)) return s;
    park_queue(q, kCq, cqn);
    return Status::ok;
  }
  route_del(kCq, cqn);
  free_queue(q);
  return Status::ok;
}

// The new ring, initialized as create_cq's, then MODIFY_CQ. The ring before it goes only now that
// the device writes the new one: by the time a client resizes again it has copied out of it (its
// mapping keeps the pages on hosts whose memory is refcounted, as after destroy_cq).
Status UapiBackend::resize_cq(void* o, uint32_t log_size, MapRegion* ring, ResizeCqResp* r) {
  Queue* q = static_cast<Queue*>(o);
  uint64_t bytes = round_up(64ull << log_size, hca_.hal().host_page_size());
  QueuePlatform::Mem m;
  if (plat_.queue_alloc(bytes, &m) != c::kHalOk) return Status::no_memory;
  uint8_t* va = static_cast<uint8_t*>(m.va);
  for (uint64_t i = 0; i < (1ull << log_size); i++) va[i * 64 + 63] = 0xf1;
  c::DmaSegment seg{m.iova, bytes};
  c::CmdFailure f;
  c::Err e = hca_.resize_cq(q->cq, log_size, &seg, 1, &f);
  if (e != c::Err::ok) {
    plat_.queue_free(m);
    // The firmware's refusals a client can cause: a ring smaller than its unpolled CQEs (bad
    // parameter), a CQ in error or with a full ring (bad state).
    if (e == c::Err::cmd_status && f.status == p::cmd_status::BAD_PARAM_ERR) return Status::invalid;
    if (e == c::Err::cmd_status && f.status == p::cmd_status::BAD_RES_STATE_ERR) return Status::wrong_state;
    return status_of(e);
  }
  if (q->resized.size) {
    queue_bytes_ -= q->resized.size;
    plat_.queue_free(q->resized);
  }
  q->resized = m;
  queue_bytes_ += m.size;
  *ring = MapRegion{uint8_t(MapKind::cqe), 0, m.memory, 0, bytes};
  r->cqe = 1u << log_size;
  r->cqe_bytes = 64;
  return Status::ok;
}

Status UapiBackend::create_srq(const SrqSpec& spec, Created* cr, CreateSrqResp* r) {
  Queue* q = static_cast<Queue*>(hca_.hal().mem_alloc(sizeof(Queue)));
  if (!q) return Status::no_memory;
  *q = Queue{};
  if (Status s = queue_mem(ring_bytes(spec), q, cr, MapKind::rq, MapKind::db_record); s != Status::ok) {
    hca_.hal().mem_free(q, sizeof(Queue));
    return s;
  }
  c::DmaSegment seg{q->mem.iova, q->ring_bytes};
  c::SrqParams sp;
  sp.pd = static_cast<c::Pd*>(spec.pd);
  sp.log_size = spec.log_size;
  sp.log_stride = spec.log_stride;
  sp.buf = &seg;
  sp.nbuf = 1;
  sp.dbr_iova = q->mem.iova + q->ring_bytes;
  sp.owner = this;
  if (Status s = status_of(hca_.create_srq(sp, &q->srq)); s != Status::ok) {
    free_queue(q);
    return s;
  }
  if (!route_add(kSrq, q->srq->srqn, spec.event_tag)) {  // no event could reach the client: refuse
    hca_.destroy_srq(q->srq);
    free_queue(q);
    return Status::no_memory;
  }
  r->wqe_cnt = 1u << spec.log_size;
  r->stride = 1u << spec.log_stride;
  r->dbr_offset = 0;
  cr->obj = q;
  return Status::ok;
}

Status UapiBackend::modify_srq(void* o, uint32_t limit) {
  return status_of(hca_.arm_srq(static_cast<Queue*>(o)->srq, uint16_t(limit)));
}

Status UapiBackend::destroy_srq(void* o) {
  Queue* q = static_cast<Queue*>(o);
  uint32_t n = q->srq->srqn;
  if (Status s = status_of(hca_.destroy_srq(q->srq)); s != Status::ok) {
    if (!dead(s)) return s;
    park_queue(q, kSrq, n);
    return Status::ok;
  }
  route_del(kSrq, n);
  free_queue(q);
  return Status::ok;
}

Status UapiBackend::create_qp(const QpSpec& spec, Created* cr, CreateQpResp* r) {
  Queue* q = static_cast<Queue*>(hca_.hal().mem_alloc(sizeof(Queue)));
  if (!q) return Status::no_memory;
  *q = Queue{};
  // PRM: one buffer, the RQ first, then the SQ (ring_bytes()).
  uint64_t rq = spec.srq ? 0 : (1ull << spec.log_rq_size) << spec.log_rq_stride;
  if (Status s = queue_mem(ring_bytes(spec), q, cr, MapKind::sq, MapKind::rq); s != Status::ok) {
    hca_.hal().mem_free(q, sizeof(Queue));
    return s;
  }
  if (spec.srq) cr->maps[2] = MapRegion{};
  c::DmaSegment seg{q->mem.iova, q->ring_bytes};
  c::QpParams qp;
  qp.type = spec.type == kQpUd    ? c::QpType::ud
            : spec.type == kQpUc  ? c::QpType::uc
            : spec.type == kQpGsi ? c::QpType::gsi
                                  : c::QpType::rc;
  qp.pd = static_cast<c::Pd*>(spec.pd);
  qp.send_cq = static_cast<Queue*>(spec.send_cq)->cq;
  qp.recv_cq = static_cast<Queue*>(spec.recv_cq)->cq;
  qp.srq = spec.srq ? static_cast<Queue*>(spec.srq)->srq : nullptr;
  qp.uar = static_cast<c::Uar*>(spec.uar);
  qp.log_sq_size = spec.log_sq_size;
  qp.log_rq_size = spec.srq ? 0 : spec.log_rq_size;
  qp.log_rq_stride = spec.srq ? 4 : spec.log_rq_stride;
  qp.buf = &seg;
  qp.nbuf = 1;
  qp.dbr_iova = q->mem.iova + q->ring_bytes;
  qp.owner = this;
  qp.scatter_to_cqe = spec.scatter_to_cqe;
  if (Status s = status_of(hca_.create_qp(qp, &q->qp)); s != Status::ok) {
    free_queue(q);
    return s;
  }
  if (!route_add(kQp, q->qp->qpn, spec.event_tag)) {  // no event could reach the client: refuse
    hca_.destroy_qp(q->qp);
    free_queue(q);
    return Status::no_memory;
  }
  q->bound_kind = kQp, q->bound_number = q->qp->qpn;
  plat_.doorbell_bind(*qp.uar, kQp, q->qp->qpn, static_cast<uint8_t*>(q->mem.va) + q->ring_bytes);
  r->qpn = q->qp->qpn;
  r->sq_wqe_cnt = 1u << spec.log_sq_size;
  r->rq_wqe_cnt = spec.srq ? 0 : 1u << spec.log_rq_size;
  r->rq_stride = spec.srq ? 0 : 1u << spec.log_rq_stride;
  r->max_inline_data = 0;  // the server fills in what it granted
  r->dbr_offset = 0;
  r->sq_offset = uint32_t(rq);
  cr->obj = q;
  return Status::ok;
}

namespace {
c::QpTransition core_transition(Transition t) {
  switch (t) {
    case Transition::rst2init: return c::QpTransition::rst2init;
    case Transition::init2init: return c::QpTransition::init2init;
    case Transition::init2rtr: return c::QpTransition::init2rtr;
    case Transition::rtr2rts: return c::QpTransition::rtr2rts;
    case Transition::rts2rts: return c::QpTransition::rts2rts;
    case Transition::sqerr2rts: return c::QpTransition::sqerr2rts;
    case Transition::sqd2rts: return c::QpTransition::sqd2rts;
    case Transition::to_err: return c::QpTransition::to_err;
    case Transition::to_rst: return c::QpTransition::to_rst;
  }
  return c::QpTransition::to_err;
}

void path_of(const AddressReq& av, c::AddressPath* path) {
  path->port = av.port ? av.port : 1;
  path->sgid_index = av.sgid_index;
  memcpy(path->dmac, av.dmac, 6);
  memcpy(path->dgid, av.dgid, 16);
  path->hop_limit = av.hop_limit;
  path->tclass = av.traffic_class;
  path->flow_label = av.flow_label;
  path->udp_sport = av.udp_sport;
  path->sl = av.sl;
}
}  // namespace

Status UapiBackend::modify_qp(void* o, Transition t, const ModifyQpReq& rq) {
  Queue* q = static_cast<Queue*>(o);
  c::QpAttr a;
  uint32_t m = rq.attr_mask;
  if (m & kQpPkeyIndex) a.pkey_index = rq.pkey_index;
  if (m & kQpPort) a.path.port = rq.port;
  // ibv_qp_attr_mask -> the PRM's optional-parameter bits (as Linux mlx5_ib ib_nr_to_mlx5_nr); the
  // core keeps those the transition takes anyway out of opt_param_mask.
  namespace po = p::qp_optpar;
  static constexpr struct {
    uint32_t ibv, prm;
  } kOpt[] = {{kQpAccessFlags, po::RRE | po::RAE | po::RWE},
              {kQpPkeyIndex, po::PKEY_INDEX},
              {kQpPort, po::PRI_PORT},
              {kQpQkey, po::Q_KEY},
              {kQpTimeout, po::ACK_TIMEOUT},
              {kQpRetryCnt, po::RETRY_COUNT},
              {kQpRnrRetry, po::RNR_RETRY},
              {kQpMaxQpRdAtomic, po::SRA_MAX},
              {kQpMaxDestRdAtomic, po::RRA_MAX},
              {kQpMinRnrTimer, po::RNR_TIMEOUT}};
  for (const auto& x : kOpt)
    if (m & x.ibv) a.optional |= x.prm;
  // Access bits a QP type has no field for (UC: no read/atomic, UD: none) are not asked for.
  if (q->qp->type != c::QpType::rc) a.optional &= ~uint32_t(po::RRE | po::RAE);
  if (q->qp->type == c::QpType::ud || q->qp->type == c::QpType::gsi) a.optional &= ~uint32_t(po::RWE);
  if (m & kQpAccessFlags) a.access = rq.access;
  if (m & kQpQkey) a.qkey = rq.qkey;
  if (m & kQpDestQpn) a.dest_qpn = rq.dest_qpn;
  if (m & kQpAv) path_of(rq.av, &a.path);
  if (m & kQpTimeout) a.path.ack_timeout = rq.timeout;
  if (m & kQpPathMtu) a.mtu = rq.path_mtu;
  if (m & kQpRqPsn) a.rq_psn = rq.rq_psn;
  if (m & kQpSqPsn) a.sq_psn = rq.sq_psn;
  if (m & kQpMaxQpRdAtomic) a.max_rd_atomic = rq.max_rd_atomic;
  if (m & kQpMaxDestRdAtomic) a.max_dest_rd_atomic = rq.max_dest_rd_atomic;
  if (m & kQpMinRnrTimer) a.min_rnr_timer = rq.min_rnr_timer;
  if (m & kQpRetryCnt) a.retry_cnt = rq.retry_cnt;
  if (m & kQpRnrRetry) a.rnr_retry = rq.rnr_retry;
  Status s = status_of(hca_.modify_qp(q->qp, core_transition(t), a));
  if (s == Status::ok && t == Transition::to_rst) plat_.doorbell_rewind(kQp, q->qp->qpn);
  return s;
}

Status UapiBackend::query_qp(void* o, uapi::QpAttr* r) {
  Queue* q = static_cast<Queue*>(o);
  c::QpQuery qq;
  if (Status s = status_of(hca_.query_qp(q->qp, &qq)); s != Status::ok) return s;
  // prm::qpc_state -> ibv_qp_state (they differ for SQE/SQD and ERR).
  switch (qq.state) {
    case c::QpState::rst: r->state = kStateReset; break;
    case c::QpState::init: r->state = kStateInit; break;
    case c::QpState::rtr: r->state = kStateRtr; break;
    case c::QpState::rts: r->state = kStateRts; break;
    case c::QpState::sqer: r->state = kStateSqe; break;
    case c::QpState::sqd: r->state = kStateSqd; break;
    default: r->state = kStateErr; break;
  }
  r->path_mtu = uint8_t(qq.mtu);
  r->qpn = q->qp->qpn;
  r->dest_qpn = qq.remote_qpn;
  r->qkey = qq.qkey;
  r->rq_psn = qq.next_rcv_psn;
  r->sq_psn = qq.next_send_psn;
  memcpy(r->av.dgid, qq.path.dgid, 16);
  memcpy(r->av.dmac, qq.path.dmac, 6);
  r->av.udp_sport = qq.path.udp_sport;
  r->av.flow_label = qq.path.flow_label;
  r->av.sgid_index = qq.path.sgid_index;
  r->av.hop_limit = qq.path.hop_limit;
  r->av.traffic_class = qq.path.tclass;
  r->av.sl = qq.path.sl;
  r->av.port = qq.path.port;
  return Status::ok;
}

Status UapiBackend::destroy_qp(void* o) {
  Queue* q = static_cast<Queue*>(o);
  uint32_t n = q->qp->qpn;
  if (Status s = status_of(hca_.destroy_qp(q->qp)); s != Status::ok) {
    if (!dead(s)) return s;
    park_queue(q, kQp, n);
    return Status::ok;
  }
  route_del(kQp, n);
  free_queue(q);
  return Status::ok;
}

Status UapiBackend::make_av(const AddressReq& av, uint8_t* out) {
  c::AddressPath path;
  path_of(av, &path);
  c::AddressVector v;
  // The destination QPN and Q_Key go into each WQE's copy; the provider patches them.
  c::make_address_vector(path, 0, 0, &v);
  memcpy(out, v.bytes, sizeof(v.bytes));
  return Status::ok;
}

void UapiBackend::usage(UsageResp* u) {
  for (uint32_t k = 0; k < uint32_t(c::ObjKind::count) && k < 8; k++) u->core_live[k] = hca_.live(c::ObjKind(k));
  u->queue_bytes = queue_bytes_;
  u->pinned_bytes = pinned_;
  u->dma_buffers = hca_.dma().live_buffers();
  u->fw_pages = hca_.pages().given();
}

// ---- The stable-driver gate ----------------------------------------------------------------------

namespace {
// What the gate compares across a cycle, read from the device: firmware revision, command queue page.
void read_identity(c::Hal& hal, CycleResp* r) {
  r->fw_rev[0] = c::bar_field(hal, p::initial_seg::fw_rev_major);
  r->fw_rev[1] = c::bar_field(hal, p::initial_seg::fw_rev_minor);
  r->fw_rev[2] = c::bar_field(hal, p::initial_seg::fw_rev_subminor);
  r->cmdq_iova = uint64_t(c::bar_field(hal, p::initial_seg::cmdq_phy_addr_63_32)) << 32 |
                 uint64_t(c::bar_field(hal, p::initial_seg::cmdq_phy_addr_31_12)) << 12;
}
}  // namespace

Status UapiBackend::stable_cycle(const CycleReq& rq, CycleResp* r) {
  if (hca_.state() != c::HcaState::up) return Status::device_dead;
  bool quirk = rq.flags & kCycleInjectRoceEnQuirk;
  if (quirk && plat_.set_roce_en_quirk(true) != 0) return Status::unsupported;
  // The GID table is the host's configuration (the wire address), not an object of a client: put
  // back after the cycle what was there before.
  constexpr uint32_t kKeep = 16;
  c::GidEntry gids[kKeep];
  bool had[kKeep] = {};
  static const uint8_t zero[16] = {};
  uint32_t n = hca_.caps().gid_table_size < kKeep ? hca_.caps().gid_table_size : kKeep;
  for (uint32_t i = 0; i < n; i++)
    had[i] = hca_.query_gid(i, &gids[i]) == c::Err::ok && memcmp(gids[i].gid, zero, 16) != 0;
  bool used_reset = false;
  c::Err e = hca_.reinit(&used_reset);
  if (quirk) plat_.set_roce_en_quirk(false);
  r->used_reset = used_reset;
  if (used_reset) {
    const c::Failure& f = hca_.last_reinit_fallback();
    r->fail_opcode = f.cmd.opcode, r->fail_status = f.cmd.status, r->fail_syndrome = f.cmd.syndrome;
    r->fail_err = uint32_t(f.err);
    const char* sn = c::stage_name(f.stage);
    size_t len = strlen(sn) < sizeof r->fail_stage - 1 ? strlen(sn) : sizeof r->fail_stage - 1;
    memcpy(r->fail_stage, sn, len);
  }
  for (uint32_t i = 0; e == c::Err::ok && i < n; i++)
    if (had[i]) e = hca_.set_gid(i, gids[i]);
  r->ok = e == c::Err::ok && hca_.state() == c::HcaState::up;
  r->roce_en = hca_.port().roce_en;
  r->port_state = hca_.port().vport_state;
  read_identity(hca_.hal(), r);
  const c::HcaStats& st = hca_.stats();
  r->reinits = uint32_t(st.reinits), r->fallbacks = uint32_t(st.reinit_fallbacks), r->resets = uint32_t(st.resets);
  r->pages_given = hca_.pages().given();
  r->pages_quarantined = hca_.pages().count(c::PageState::quarantined);
  r->unknown_returns = hca_.pages().unknown_returns();
  r->dma_buffers = uint32_t(hca_.dma().live_buffers());
  if (!plat_.device_counts(&r->pages_device, &r->iova_bytes)) r->pages_device = r->iova_bytes = 0;
  // Answered ok whenever the cycle ran, so the caller gets the report; r->ok says how it ended.
  return Status::ok;
}

// ---- Events ------------------------------------------------------------------------------------

bool UapiBackend::route_add(uint8_t kind, uint32_t number, uint64_t tag) {
  c::HalLock l(hca_.hal(), lock_);
  for (uint32_t i = 0; i < nroutes_; i++) {
    if (routes_[i].kind == 0) {
      routes_[i] = Route{kind, number, tag};
      return true;
    }
  }
  return false;
}

void UapiBackend::route_del(uint8_t kind, uint32_t number) {
  c::HalLock l(hca_.hal(), lock_);
  for (uint32_t i = 0; i < nroutes_; i++)
    if (routes_[i].kind == kind && routes_[i].number == number) routes_[i] = Route{};
}

// The route is looked up now, when the device posts the event: by the time the host drains it the
// object may be gone and its number (CQN, QPN) given to another client's object.
void UapiBackend::push(uint8_t kind, uint32_t number, uint32_t event_type) {
  {
    c::HalLock l(hca_.hal(), lock_);
    uint64_t tag = 0;
    if (kind != kDevice) {
      for (uint32_t i = 0; i < nroutes_ && !tag; i++)
        if (routes_[i].kind == kind && routes_[i].number == number) tag = routes_[i].tag;
      if (!tag) return;  // the object is gone
    }
    if (pend_count_ == kPending) return;  // the Server counts its own drops; these are rare
    pending_[(pend_head_ + pend_count_) % kPending] = Pending{kind, event_type, tag};
    pend_count_++;
  }
  plat_.events_pending();
}

void UapiBackend::on_completion(uint32_t cqn) { push(kCq, cqn, ~0u); }

// The one table from the device's event types (PRM, mlx5_ifc.h MLX5_EVENT_TYPE_*) to what a client
// sees (ibv_event_type), with the kind of object the event names. It follows Linux mlx5_ib's
// translation (main.c / qp.c / srq.c / cq.c event handlers).
namespace {
struct EventMap {
  uint8_t prm, kind;
  uint32_t ibv;
};
constexpr EventMap kEventMap[] = {
    {p::event_type::CQ_ERROR, kCq, kIbvEventCqErr},
    {p::event_type::WQ_CATAS_ERROR, kQp, kIbvEventQpFatal},
    {p::event_type::WQ_INVAL_REQ_ERROR, kQp, kIbvEventQpReqErr},
    {p::event_type::WQ_ACCESS_ERROR, kQp, kIbvEventQpAccessErr},
    {p::event_type::COMM_EST, kQp, kIbvEventCommEst},
    {p::event_type::SQ_DRAINED, kQp, kIbvEventSqDrained},
    {p::event_type::PATH_MIG, kQp, kIbvEventPathMig},
    {p::event_type::PATH_MIG_FAILED, kQp, kIbvEventPathMigErr},
    {p::event_type::SRQ_CATAS_ERROR, kSrq, kIbvEventSrqErr},
    {p::event_type::SRQ_RQ_LIMIT, kSrq, kIbvEventSrqLimitReached},
    {p::event_type::SRQ_LAST_WQE, kQp, kIbvEventQpLastWqeReached},  // about the QP on the SRQ
    {p::event_type::INTERNAL_ERROR, kDevice, kIbvEventDeviceFatal},
};
}  // namespace

void UapiBackend::on_async_event(const c::AsyncEvent& e) {
  // The port went up or down: the PORT_CHANGE subtype decides which device event it is.
  if (e.type == uint8_t(p::event_type::PORT_CHANGE)) {
    push(kDevice, 0, e.subtype == uint8_t(p::port_change_subtype::ACTIVE) ? kIbvEventPortActive : kIbvEventPortErr);
    return;
  }
  for (const EventMap& m : kEventMap)
    if (m.prm == e.type) push(m.kind, m.kind == kDevice ? 0 : e.number & 0xffffff, m.ibv);
}

void UapiBackend::drain_events(uapi::Server& srv) {
  for (;;) {
    Pending ev;
    {
      c::HalLock l(hca_.hal(), lock_);
      if (!pend_count_) return;
      ev = pending_[pend_head_];
      pend_head_ = (pend_head_ + 1) % kPending;
      pend_count_--;
    }
    if (ev.kind == kDevice) {
      srv.deliver_device(ev.event_type);
      continue;
    }
    // The server drops it if the tag's object (or client) has gone since.
    if (ev.event_type == ~0u)
      srv.deliver_completion(ev.tag);
    else
      srv.deliver_async(ev.tag, ev.event_type);
  }
}

}  // namespace melon::mlx5::core
