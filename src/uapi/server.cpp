// The user-client server: request decoding, validation, handle tables, quotas, cleanup.
#include "uapi/server.h"

#include <string.h>

namespace melon::uapi {

const char* status_name(Status s) {
  switch (s) {
#define MELON_UAPI_STATUS_NAME(name, value, text) \
  case Status::name: return text;
    MELON_UAPI_STATUSES(MELON_UAPI_STATUS_NAME)
#undef MELON_UAPI_STATUS_NAME
  }
  return "unknown status";
}

namespace {

uint32_t quota_of(const Quotas& q, ObjType t) {
  switch (t) {
    case ObjType::pd: return q.pd;
    case ObjType::uar: return q.uar;
    case ObjType::cq: return q.cq;
    case ObjType::qp: return q.qp;
    case ObjType::mr: return q.mr;
    case ObjType::ah: return q.ah;
    case ObjType::srq: return q.srq;
    default: return 0;
  }
}

bool all_zero(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i]) return false;
  return true;
}

// Smallest log2 with 1 << log >= n (n >= 1).
uint32_t log2_ceil(uint32_t n) {
  uint32_t l = 0;
  while ((1u << l) < n) l++;
  return l;
}

// Every selector's sizes, from the one list in abi.h.
struct SelInfo {
  uint32_t sel, req_first, req_size, resp_first, resp_size;
};
constexpr SelInfo kSel[] = {
#define MELON_UAPI_SEL_INFO(name, value, req, resp) \
  {value, first_size<req>, wire_size<req>, first_size<resp>, wire_size<resp>},
    MELON_UAPI_SELECTORS(MELON_UAPI_SEL_INFO)
#undef MELON_UAPI_SEL_INFO
};
const SelInfo* sel_info(uint32_t sel) {
  for (const SelInfo& s : kSel)
    if (s.sel == sel) return &s;
  return nullptr;
}
constexpr uint32_t kMaxMsg = 128;  // the largest request or response struct
constexpr bool sizes_fit() {
  for (const SelInfo& s : kSel)
    if (s.req_size > kMaxMsg || s.resp_size > kMaxMsg) return false;
  return true;
}
static_assert(sizes_fit());

// QP transitions (IBA 10.3.1, as ibv_modify_qp checks them): which attributes a transition needs
// and which it may carry, per transport. Index: kQpRc, kQpUd, kQpUc.
struct TransitionRule {
  uint8_t from, to;
  Transition t;
  uint32_t required[3], optional[3];
};
constexpr uint32_t kRcRtr = kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
constexpr uint32_t kUcRtr = kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
constexpr uint32_t kRcRts = kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
constexpr TransitionRule kRules[] = {
    {kStateReset,
     kStateInit,
     Transition::rst2init,
     {kQpPkeyIndex | kQpPort | kQpAccessFlags, kQpPkeyIndex | kQpPort | kQpQkey,
      kQpPkeyIndex | kQpPort | kQpAccessFlags},
     {0, 0, 0}},
    {kStateInit,
     kStateInit,
     Transition::init2init,
     {0, 0, 0},
     {kQpPkeyIndex | kQpPort | kQpAccessFlags, kQpPkeyIndex | kQpPort | kQpQkey,
      kQpPkeyIndex | kQpPort | kQpAccessFlags}},
    {kStateInit,
     kStateRtr,
     Transition::init2rtr,
     {kRcRtr, 0, kUcRtr},
     {kQpAccessFlags | kQpPkeyIndex, kQpPkeyIndex | kQpQkey, kQpAccessFlags | kQpPkeyIndex}},
    {kStateRtr,
     kStateRts,
     Transition::rtr2rts,
     {kRcRts, kQpSqPsn, kQpSqPsn},
     {kQpAccessFlags | kQpMinRnrTimer, kQpQkey, kQpAccessFlags}},
    {kStateRts, kStateRts, Transition::rts2rts, {0, 0, 0}, {kQpAccessFlags | kQpMinRnrTimer, kQpQkey, kQpAccessFlags}},
    {kStateSqe, kStateRts, Transition::sqerr2rts, {0, 0, 0}, {0, kQpQkey, kQpAccessFlags}},
};

}  // namespace

// ---- Client life -------------------------------------------------------------------------------

Status Server::attach(Client* c, void* host, uint32_t uid) {
  if (nclients_ >= lim_.clients || nclients_ >= kMaxClients) return Status::quota_device;
  // The user's row: its own if it has clients, else a free one (there are as many rows as clients).
  uint32_t user = kMaxClients;
  for (uint32_t i = 0; i < kMaxClients && user == kMaxClients; i++)
    if (users_[i].clients && users_[i].uid == uid) user = i;
  for (uint32_t i = 0; i < kMaxClients && user == kMaxClients; i++)
    if (!users_[i].clients) user = i;
  if (user == kMaxClients) return Status::quota_device;  // unreachable: fewer clients than rows
  if (users_[user].clients && users_[user].uid == uid && users_[user].clients >= lim_.clients_per_user)
    return Status::quota_user_clients;
  if (!lim_.clients_per_user) return Status::quota_user_clients;
  for (uint32_t i = 0; i < kMaxClients; i++) {
    if (clients_[i]) continue;
    // Generations survive in the storage the host hands us only if it reuses it; start each
    // client's slots at generation 1 either way.
    memset(c, 0, sizeof(*c));
    for (Entry& e : c->entries) e.gen = 1;
    c->attached = true;
    c->wake_armed = true;
    c->id = i + 1;
    c->host = host;
    c->uid = uid;
    c->user = user;
    c->serial = ++serial_ ? serial_ : ++serial_;
    if (!users_[user].clients) users_[user] = User{uid, 0, 0, 0};
    users_[user].clients++;
    clients_[i] = c;
    nclients_++;
    return Status::ok;
  }
  return Status::quota_device;
}

uint32_t Server::detach(Client& c) {
  if (!c.attached) return 0;
  uint32_t failures = release_all(c);
  clients_[c.id - 1] = nullptr;
  nclients_--;
  users_[c.user].clients--;
  c.attached = false;
  c.open = false;
  return failures;
}

uint32_t Server::release_all(Client& c) {
  uint32_t failures = 0;
  // Dependents first: QPs hold CQs, SRQs, PDs and UARs; AHs, MRs and SRQs hold PDs; CQs hold UARs.
  static constexpr ObjType kOrder[] = {ObjType::qp, ObjType::ah,  ObjType::mr, ObjType::srq,
                                       ObjType::cq, ObjType::uar, ObjType::pd};
  for (ObjType t : kOrder) {
    if (!c.count[uint8_t(t)]) continue;
    const uint32_t base = slot_base(uint8_t(t));
    for (uint32_t s = 0; s < kSlots[uint8_t(t)]; s++) {
      Entry& e = c.entries[base + s];
      if (!e.live) continue;
      if (backend_destroy(t, e.obj) != Status::ok) failures++;
      release(c, t, s);
    }
  }
  stats_.cleanup_failures += failures;
  // Events for objects that are gone mean nothing now.
  c.ev_head = c.ev_count = c.ev_dropped = 0;
  return failures;
}

// ---- Handle table ------------------------------------------------------------------------------

Entry* Server::lookup(Client& c, uint32_t token, ObjType t) {
  if ((token >> 24) || token_type(token) != t || t == ObjType::none) return nullptr;
  uint32_t slot = token_slot(token);
  if (slot >= kSlots[uint8_t(t)]) return nullptr;
  Entry& e = c.entries[slot_base(uint8_t(t)) + slot];
  if (!e.live || e.gen != token_gen(token)) return nullptr;
  return &e;
}

Status Server::reserve(Client& c, ObjType t, uint32_t* slot) {
  uint8_t ti = uint8_t(t);
  if (c.count[ti] >= quota_of(lim_.client, t) || c.count[ti] >= kSlots[ti]) return Status::quota_client;
  if (dev_count_[ti] >= quota_of(lim_.device, t)) return Status::quota_device;
  for (uint32_t s = 0; s < kSlots[ti]; s++) {
    if (!c.entries[slot_base(ti) + s].live) {
      *slot = s;
      return Status::ok;
    }
  }
  return Status::quota_client;
}

// Byte quotas, the client's, then its user's, then the device's (the order docs/uapi.md gives).
Status Server::afford(const Client& c, uint64_t queue, uint64_t pinned) const {
  const User& u = users_[c.user];
  if (queue) {
    if (queue > lim_.queue_bytes.client || c.queue_bytes > lim_.queue_bytes.client - queue)
      return Status::quota_queue_client;
    if (queue > lim_.queue_bytes.user || u.queue_bytes > lim_.queue_bytes.user - queue) return Status::quota_queue_user;
    if (queue > lim_.queue_bytes.device || queue_bytes_ > lim_.queue_bytes.device - queue)
      return Status::quota_queue_device;
  }
  if (pinned) {
    if (pinned > lim_.pinned_bytes.client || c.pinned_bytes > lim_.pinned_bytes.client - pinned)
      return Status::quota_pinned_client;
    if (pinned > lim_.pinned_bytes.user || u.pinned_bytes > lim_.pinned_bytes.user - pinned)
      return Status::quota_pinned_user;
    if (pinned > lim_.pinned_bytes.device || pinned_bytes_ > lim_.pinned_bytes.device - pinned)
      return Status::quota_pinned_device;
  }
  return Status::ok;
}

uint32_t Server::commit(Client& c, ObjType t, uint32_t slot, void* obj, const uint32_t* parents, uint32_t nparents,
                        uint64_t queue_bytes, uint64_t pinned_bytes) {
  uint8_t ti = uint8_t(t);
  Entry& e = c.entries[slot_base(ti) + slot];
  uint16_t gen = e.gen;
  e = Entry{};
  e.gen = gen;
  e.live = true;
  e.obj = obj;
  e.queue_bytes = queue_bytes;
  e.pinned_bytes = pinned_bytes;
  User& u = users_[c.user];
  c.queue_bytes += queue_bytes, u.queue_bytes += queue_bytes, queue_bytes_ += queue_bytes;
  c.pinned_bytes += pinned_bytes, u.pinned_bytes += pinned_bytes, pinned_bytes_ += pinned_bytes;
  for (uint32_t i = 0; i < nparents; i++) {
    e.parents[i] = parents[i];
    if (Entry* p = lookup(c, parents[i], token_type(parents[i]))) p->refs++;
  }
  c.count[ti]++;
  dev_count_[ti]++;
  return make_token(t, gen, slot);
}

void Server::release(Client& c, ObjType t, uint32_t slot) {
  uint8_t ti = uint8_t(t);
  Entry& e = c.entries[slot_base(ti) + slot];
  for (uint32_t p : e.parents)
    if (p)
      if (Entry* pe = lookup(c, p, token_type(p))) pe->refs--;
  if (e.gsi_port) gsi_ports_ &= ~(1u << e.gsi_port);  // the port's QP1 is free for the next owner
  User& u = users_[c.user];
  c.queue_bytes -= e.queue_bytes, u.queue_bytes -= e.queue_bytes, queue_bytes_ -= e.queue_bytes;
  c.pinned_bytes -= e.pinned_bytes, u.pinned_bytes -= e.pinned_bytes, pinned_bytes_ -= e.pinned_bytes;
  // A new generation makes every token naming the old object stale (0 is never issued).
  uint16_t gen = uint16_t((e.gen + 1) & kGenMask);
  e = Entry{};
  e.gen = gen ? gen : 1;
  c.count[ti]--;
  dev_count_[ti]--;
}

Status Server::backend_destroy(ObjType t, void* obj) {
  stats_.backend_calls++;
  switch (t) {
    case ObjType::pd: return be_.dealloc_pd(obj);
    case ObjType::uar: return be_.free_uar(obj);
    case ObjType::cq: return be_.destroy_cq(obj);
    case ObjType::qp: return be_.destroy_qp(obj);
    case ObjType::mr: return be_.dereg_mr(obj);
    case ObjType::srq: return be_.destroy_srq(obj);
    case ObjType::ah: stats_.backend_calls--; return Status::ok;  // software only
    default: return Status::invalid;
  }
}

// ---- Decoding ----------------------------------------------------------------------------------

Reply Server::handle(Client& c, uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap) {
  stats_.requests++;
  auto refuse = [&](Status s) {
    stats_.refused++;
    return Reply{s, 0};
  };
  if (!c.attached) return refuse(Status::not_open);
  const SelInfo* si = sel_info(selector);
  if (!si) return refuse(Status::unknown_selector);
  if (in_len && !in) return refuse(Status::truncated);
  if (in_len < si->req_first) return refuse(Status::truncated);
  if (in_len > si->req_size && !all_zero(static_cast<const uint8_t*>(in) + si->req_size, in_len - si->req_size))
    return refuse(Status::trailing_nonzero);
  if (out_cap < si->resp_first || (si->resp_first && !out)) return refuse(Status::out_too_small);
  if (!c.open && Selector(selector) != Selector::open) return refuse(Status::not_open);

  // The request as the current struct: missing appended fields read as zero.
  alignas(8) uint8_t req[kMaxMsg] = {};
  alignas(8) uint8_t resp[kMaxMsg] = {};
  uint32_t n_in = in_len < si->req_size ? in_len : si->req_size;
  if (n_in) memcpy(req, in, n_in);
  Reply r = dispatch(c, Selector(selector), req, resp);
  if (r.status != Status::ok) {
    stats_.refused++;
    return Reply{r.status, 0};
  }
  uint32_t n = out_cap < si->resp_size ? out_cap : si->resp_size;
  if (n) memcpy(out, resp, n);
  return Reply{Status::ok, n};
}

Reply Server::dispatch(Client& c, Selector s, const void* in, void* out) {
  auto ok = [](Status st) { return Reply{st, 0}; };
  switch (s) {
    case Selector::open: return ok(open(c, *static_cast<const OpenReq*>(in), static_cast<OpenResp*>(out)));
    case Selector::close:
      // Everything goes now; the connection stays, and only Open is accepted on it.
      release_all(c);
      c.open = false;
      return ok(Status::ok);
    case Selector::query_device: stats_.backend_calls++; return ok(be_.query_device(static_cast<DeviceAttr*>(out)));
    case Selector::query_port: {
      const PortReq& rq = *static_cast<const PortReq*>(in);
      if (rq.port < 1 || rq.port > lim_.ports || rq.reserved) return ok(Status::invalid);
      stats_.backend_calls++;
      return ok(be_.query_port(rq.port, static_cast<PortAttr*>(out)));
    }
    case Selector::query_gid: {
      const GidReq& rq = *static_cast<const GidReq*>(in);
      if (rq.port < 1 || rq.port > lim_.ports || rq.index >= lim_.gid_tbl_len) return ok(Status::invalid);
      stats_.backend_calls++;
      return ok(be_.query_gid(rq.port, rq.index, static_cast<GidResp*>(out)));
    }
    case Selector::alloc_pd: return ok(alloc_pd(c, static_cast<HandleResp*>(out)));
    case Selector::alloc_uar: return ok(alloc_uar(c, static_cast<UarResp*>(out)));
    case Selector::reg_mr: return ok(reg_mr(c, *static_cast<const RegMrReq*>(in), static_cast<RegMrResp*>(out)));
    case Selector::create_cq:
      return ok(create_cq(c, *static_cast<const CreateCqReq*>(in), static_cast<CreateCqResp*>(out)));
    case Selector::resize_cq:
      return ok(resize_cq(c, *static_cast<const ResizeCqReq*>(in), static_cast<ResizeCqResp*>(out)));
    case Selector::create_srq:
      return ok(create_srq(c, *static_cast<const CreateSrqReq*>(in), static_cast<CreateSrqResp*>(out)));
    case Selector::modify_srq: return ok(modify_srq(c, *static_cast<const ModifySrqReq*>(in)));
    case Selector::create_qp:
      return ok(create_qp(c, *static_cast<const CreateQpReq*>(in), static_cast<CreateQpResp*>(out)));
    case Selector::modify_qp: return ok(modify_qp(c, *static_cast<const ModifyQpReq*>(in)));
    case Selector::query_qp: return ok(query_qp(c, *static_cast<const HandleReq*>(in), static_cast<QpAttr*>(out)));
    case Selector::create_ah:
      return ok(create_ah(c, *static_cast<const CreateAhReq*>(in), static_cast<CreateAhResp*>(out)));
    case Selector::dealloc_pd: return ok(destroy(c, ObjType::pd, *static_cast<const HandleReq*>(in)));
    case Selector::free_uar: return ok(destroy(c, ObjType::uar, *static_cast<const HandleReq*>(in)));
    case Selector::destroy_qp: return ok(destroy(c, ObjType::qp, *static_cast<const HandleReq*>(in)));
    case Selector::destroy_cq: return ok(destroy(c, ObjType::cq, *static_cast<const HandleReq*>(in)));
    case Selector::dereg_mr: return ok(destroy(c, ObjType::mr, *static_cast<const HandleReq*>(in)));
    case Selector::destroy_ah: return ok(destroy(c, ObjType::ah, *static_cast<const HandleReq*>(in)));
    case Selector::destroy_srq: return ok(destroy(c, ObjType::srq, *static_cast<const HandleReq*>(in)));
    case Selector::map: return ok(map(c, *static_cast<const MapReq*>(in), static_cast<MapResp*>(out)));
    case Selector::get_event: return ok(get_event(c, static_cast<EventResp*>(out)));
    case Selector::query_usage: {
      UsageResp* u = static_cast<UsageResp*>(out);
      u->clients = nclients_;
      for (uint32_t t = 0; t < kObjTypes; t++) u->server_live[t] = dev_count_[t];
      be_.usage(u);
      return ok(Status::ok);
    }
    case Selector::stable_cycle: {
      if (!lim_.diagnostics) return ok(Status::not_permitted);
      const CycleReq& rq = *static_cast<const CycleReq*>(in);
      if ((rq.flags & ~kCycleInjectRoceEnQuirk) || rq.reserved) return ok(Status::invalid);
      // A re-init destroys every firmware object: refused while any client holds one.
      for (uint32_t t = 0; t < kObjTypes; t++)
        if (dev_count_[t]) return ok(Status::busy);
      return ok(be_.stable_cycle(rq, static_cast<CycleResp*>(out)));
    }
  }
  return ok(Status::unknown_selector);  // unreachable: sel_info() admitted only listed selectors
}

// ---- Selectors ---------------------------------------------------------------------------------

Status Server::open(Client& c, const OpenReq& rq, OpenResp* rp) {
  if (c.open) return Status::already_open;
  if (rq.abi_version != kAbiVersion) return Status::bad_version;
  if (rq.reserved) return Status::invalid;
  c.open = true;
  rp->abi_version = kAbiVersion;
  rp->client_id = c.id;
  rp->features = rq.features & lim_.features;
  const Quotas& q = lim_.client;
  rp->max_pd = q.pd;
  rp->max_qp = q.qp;
  rp->max_cq = q.cq;
  rp->max_mr = q.mr;
  rp->max_ah = q.ah;
  rp->max_srq = q.srq;
  rp->max_uar = q.uar;
  return Status::ok;
}

Status Server::alloc_pd(Client& c, HandleResp* rp) {
  uint32_t slot;
  if (Status s = reserve(c, ObjType::pd, &slot); s != Status::ok) return s;
  void* obj = nullptr;
  stats_.backend_calls++;
  if (Status s = be_.alloc_pd(&obj); s != Status::ok) return s;
  rp->handle = commit(c, ObjType::pd, slot, obj, nullptr, 0);
  return Status::ok;
}

Status Server::alloc_uar(Client& c, UarResp* rp) {
  uint32_t slot;
  if (Status s = reserve(c, ObjType::uar, &slot); s != Status::ok) return s;
  Created cr;
  stats_.backend_calls++;
  if (Status s = be_.alloc_uar(&cr, rp); s != Status::ok) return s;
  rp->handle = commit(c, ObjType::uar, slot, cr.obj, nullptr, 0);
  Entry* e = lookup(c, rp->handle, ObjType::uar);
  for (uint32_t i = 0; i < kMaxMaps; i++) e->maps[i] = cr.maps[i];
  return Status::ok;
}

Status Server::reg_mr(Client& c, const RegMrReq& rq, RegMrResp* rp) {
  Entry* pd = lookup(c, rq.pd, ObjType::pd);
  if (!pd) return Status::bad_handle;
  if (rq.access & ~kAccessKnown) return Status::invalid;
  // IBA 10.6.3.1 (as ibv_reg_mr): remote write or atomic needs local write.
  if ((rq.access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(rq.access & kAccessLocalWrite))
    return Status::invalid;
  if (rq.length == 0 || rq.length > lim_.max_mr_size || rq.addr + rq.length < rq.addr) return Status::invalid;
  uint32_t slot;
  if (Status s = reserve(c, ObjType::mr, &slot); s != Status::ok) return s;
  uint64_t pinned = be_.pin_cost(rq.addr, rq.length);
  if (Status s = afford(c, 0, pinned); s != Status::ok) return s;
  void* obj = nullptr;
  stats_.backend_calls++;
  if (Status s = be_.reg_mr(c.host, pd->obj, rq, &obj, rp); s != Status::ok) return s;
  rp->handle = commit(c, ObjType::mr, slot, obj, &rq.pd, 1, 0, pinned);
  return Status::ok;
}

Status Server::create_cq(Client& c, const CreateCqReq& rq, CreateCqResp* rp) {
  Entry* uar = lookup(c, rq.uar, ObjType::uar);
  if (!uar) return Status::bad_handle;
  if (rq.cqe < 1 || rq.cqe > lim_.max_cqe || rq.comp_vector >= lim_.comp_vectors || rq.flags) return Status::invalid;
  uint32_t slot;
  if (Status s = reserve(c, ObjType::cq, &slot); s != Status::ok) return s;
  // The ring holds at least cqe + 1 entries (the provider keeps one free, as rdma-core's mlx5 does).
  uint32_t log = log2_ceil(rq.cqe + 1);
  CqSpec spec{log, rq.comp_vector, uar->obj,
              tag_of(c, make_token(ObjType::cq, c.entries[slot_base(3) + slot].gen, slot))};
  uint64_t bytes = be_.queue_cost(ring_bytes(spec));
  if (Status s = afford(c, bytes, 0); s != Status::ok) return s;
  Created cr;
  stats_.backend_calls++;
  if (Status s = be_.create_cq(spec, &cr, rp); s != Status::ok) return s;
  rp->handle = commit(c, ObjType::cq, slot, cr.obj, &rq.uar, 1, bytes);
  Entry* e = lookup(c, rp->handle, ObjType::cq);
  e->id = rp->cqn;
  e->log_entries = log;
  for (uint32_t i = 0; i < kMaxMaps; i++) e->maps[i] = cr.maps[i];
  return Status::ok;
}

// The queue bytes move from the old ring's size to the new one's: a bigger ring is charged its
// difference first, a smaller one gives it back once the device has moved.
Status Server::resize_cq(Client& c, const ResizeCqReq& rq, ResizeCqResp* rp) {
  Entry* e = lookup(c, rq.handle, ObjType::cq);
  if (!e) return Status::bad_handle;
  if (rq.cqe < 1 || rq.cqe > lim_.max_cqe) return Status::invalid;
  uint32_t log = log2_ceil(rq.cqe + 1);  // as create_cq rounds
  rp->cqe_bytes = 64;
  if (log == e->log_entries) {  // the ring it has already (rdma-core's mlx5 does nothing either)
    rp->cqe = 1u << log;
    return Status::ok;
  }
  CqSpec spec{log, 0, nullptr, 0};
  uint64_t bytes = be_.queue_cost(ring_bytes(spec));
  if (bytes > e->queue_bytes)
    if (Status s = afford(c, bytes - e->queue_bytes, 0); s != Status::ok) return s;
  MapRegion ring;
  stats_.backend_calls++;
  if (Status s = be_.resize_cq(e->obj, log, &ring, rp); s != Status::ok) return s;
  User& u = users_[c.user];
  c.queue_bytes = c.queue_bytes - e->queue_bytes + bytes;
  u.queue_bytes = u.queue_bytes - e->queue_bytes + bytes;
  queue_bytes_ = queue_bytes_ - e->queue_bytes + bytes;
  e->queue_bytes = bytes;
  e->log_entries = log;
  for (MapRegion& m : e->maps)
    if (m.kind == uint8_t(MapKind::cqe)) m = ring;
  return Status::ok;
}

Status Server::create_srq(Client& c, const CreateSrqReq& rq, CreateSrqResp* rp) {
  Entry* pd = lookup(c, rq.pd, ObjType::pd);
  if (!pd) return Status::bad_handle;
  if (rq.max_wr < 1 || rq.max_wr > lim_.max_srq_wr || rq.max_sge < 1 || rq.max_sge > lim_.max_srq_sge ||
      rq.srq_limit > rq.max_wr)
    return Status::invalid;
  uint32_t slot;
  if (Status s = reserve(c, ObjType::srq, &slot); s != Status::ok) return s;
  // A receive WQE is a next segment (16 B) and its scatter entries (16 B each), a power of two.
  uint32_t log_stride = log2_ceil(16 * (rq.max_sge + 1));
  SrqSpec spec{pd->obj, log2_ceil(rq.max_wr + 1), log_stride,
               tag_of(c, make_token(ObjType::srq, c.entries[slot_base(7) + slot].gen, slot))};
  uint64_t bytes = be_.queue_cost(ring_bytes(spec));
  if (Status s = afford(c, bytes, 0); s != Status::ok) return s;
  Created cr;
  stats_.backend_calls++;
  if (Status s = be_.create_srq(spec, &cr, rp); s != Status::ok) return s;
  // Arming the limit is part of the create: if the device refuses it, the SRQ goes again and the
  // client hears why (as ibv_create_srq fails when mlx5 cannot set srq_limit).
  if (rq.srq_limit) {
    stats_.backend_calls++;
    if (Status s = be_.modify_srq(cr.obj, rq.srq_limit); s != Status::ok) {
      if (backend_destroy(ObjType::srq, cr.obj) != Status::ok) stats_.cleanup_failures++;
      return s;
    }
  }
  rp->handle = commit(c, ObjType::srq, slot, cr.obj, &rq.pd, 1, bytes);
  Entry* e = lookup(c, rp->handle, ObjType::srq);
  for (uint32_t i = 0; i < kMaxMaps; i++) e->maps[i] = cr.maps[i];
  e->state = rq.srq_limit != 0;
  e->srq_wrs = rp->wqe_cnt;
  return Status::ok;
}

Status Server::modify_srq(Client& c, const ModifySrqReq& rq) {
  Entry* e = lookup(c, rq.handle, ObjType::srq);
  if (!e) return Status::bad_handle;
  // Against this SRQ's size, not the device's largest (Linux mlx5_ib_modify_srq: limit < max).
  if (rq.srq_limit >= e->srq_wrs) return Status::invalid;
  stats_.backend_calls++;
  Status s = be_.modify_srq(e->obj, rq.srq_limit);
  if (s == Status::ok) e->state = rq.srq_limit != 0;
  return s;
}

Status Server::create_qp(Client& c, const CreateQpReq& rq, CreateQpResp* rp) {
  Entry* pd = lookup(c, rq.pd, ObjType::pd);
  Entry* scq = lookup(c, rq.send_cq, ObjType::cq);
  Entry* rcq = lookup(c, rq.recv_cq, ObjType::cq);
  Entry* uar = lookup(c, rq.uar, ObjType::uar);
  Entry* srq = rq.srq ? lookup(c, rq.srq, ObjType::srq) : nullptr;
  if (!pd || !scq || !rcq || !uar || (rq.srq && !srq)) return Status::bad_handle;
  const bool gsi = rq.qp_type == kQpGsi;
  if (rq.qp_type > kQpGsi || rq.reserved0 || (rq.flags & ~kCreateQpScatterToCqe)) return Status::invalid;
  if (gsi ? (rq.port < 1 || rq.port > lim_.ports || srq) : rq.port != 0) return Status::invalid;
  if ((rq.qp_type == kQpUc && !(lim_.features & kFeatUc)) ||
      ((rq.qp_type == kQpUd || gsi) && !(lim_.features & kFeatUd)))
    return Status::unsupported;
  // One owner of a port's QP1 at a time, across clients (the CM of one process: docs/rdmacm.md).
  if (gsi && (gsi_ports_ & (1u << rq.port))) return Status::taken;
  if (rq.max_send_wr < 1 || rq.max_send_wr > lim_.max_qp_wr || rq.max_send_sge > lim_.max_sge ||
      rq.max_inline_data > lim_.max_inline)
    return Status::invalid;
  if (srq ? (rq.max_recv_wr || rq.max_recv_sge)
          : (rq.max_recv_wr < 1 || rq.max_recv_wr > lim_.max_qp_wr || rq.max_recv_sge < 1 ||
             rq.max_recv_sge > lim_.max_sge))
    return Status::invalid;
  uint32_t slot;
  if (Status s = reserve(c, ObjType::qp, &slot); s != Status::ok) return s;
  // Send WQE size (64-byte basic blocks): control 16 + (UD: address vector 48) + either the
  // scatter list (16 per entry) or the inline data (4-byte header + data, 16-byte aligned).
  uint32_t ctrl = 16 + (rq.qp_type == kQpUd || gsi ? 48 : 0) + (rq.qp_type == kQpRc ? 16 : 0);  // + raddr seg
  uint32_t data = 16 * (rq.max_send_sge ? rq.max_send_sge : 1);
  uint32_t inl = (4 + rq.max_inline_data + 15) & ~15u;
  uint32_t wqe = ctrl + (inl > data ? inl : data);
  uint32_t bbs = (wqe + 63) / 64;
  QpSpec spec{};
  spec.type = rq.qp_type;
  spec.pd = pd->obj;
  spec.send_cq = scq->obj;
  spec.recv_cq = rcq->obj;
  spec.srq = srq ? srq->obj : nullptr;
  spec.uar = uar->obj;
  spec.scatter_to_cqe = (rq.flags & kCreateQpScatterToCqe) && !srq && (rq.qp_type == kQpRc || rq.qp_type == kQpUc);
  spec.log_sq_size = log2_ceil(rq.max_send_wr * bbs);
  spec.log_rq_size = srq ? 0 : log2_ceil(rq.max_recv_wr);
  spec.log_rq_stride = srq ? 0 : log2_ceil(16 * rq.max_recv_sge);
  if (spec.log_rq_stride < 4) spec.log_rq_stride = 4;
  spec.event_tag = tag_of(c, make_token(ObjType::qp, c.entries[slot_base(4) + slot].gen, slot));
  uint64_t bytes = be_.queue_cost(ring_bytes(spec));
  if (Status s = afford(c, bytes, 0); s != Status::ok) return s;
  Created cr;
  stats_.backend_calls++;
  if (Status s = be_.create_qp(spec, &cr, rp); s != Status::ok) return s;
  uint32_t parents[5] = {rq.pd, rq.send_cq, rq.recv_cq, rq.uar, rq.srq};
  rp->handle = commit(c, ObjType::qp, slot, cr.obj, parents, rq.srq ? 5 : 4, bytes);
  Entry* e = lookup(c, rp->handle, ObjType::qp);
  e->id = rp->qpn;
  e->qp_type = rq.qp_type;
  e->state = kStateReset;
  if (gsi) e->gsi_port = rq.port, gsi_ports_ |= 1u << rq.port;
  rp->max_inline_data = rq.max_inline_data;
  for (uint32_t i = 0; i < kMaxMaps; i++) e->maps[i] = cr.maps[i];
  return Status::ok;
}

Status Server::check_av(const AddressReq& av) const {
  if (av.port < 1 || av.port > lim_.ports || av.sgid_index >= lim_.gid_tbl_len || av.flow_label > 0xfffff ||
      av.sl > 15 || !all_zero(av.reserved, sizeof(av.reserved)))
    return Status::invalid;
  return Status::ok;
}

Status Server::modify_qp(Client& c, const ModifyQpReq& rq) {
  Entry* e = lookup(c, rq.handle, ObjType::qp);
  if (!e) return Status::bad_handle;
  uint32_t m = rq.attr_mask;
  if ((m & ~kQpMaskKnown) || rq.reserved) return Status::invalid;
  if ((m & kQpCurState) && rq.cur_qp_state != e->state) return Status::wrong_state;
  uint8_t to = (m & kQpState) ? rq.qp_state : e->state;
  if (to > kStateErr) return Status::invalid;
  // Field ranges, for every attribute the mask names.
  if ((m & kQpPathMtu) && (rq.path_mtu < 1 || rq.path_mtu > 5)) return Status::invalid;
  if ((m & kQpPort) && (rq.port < 1 || rq.port > lim_.ports)) return Status::invalid;
  if ((m & kQpPkeyIndex) && rq.pkey_index != 0) return Status::invalid;  // one default P_Key
  if ((m & kQpAccessFlags) &&
      (rq.access & ~(kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic | kAccessLocalWrite)))
    return Status::invalid;
  if ((m & kQpRqPsn) && rq.rq_psn > 0xffffff) return Status::invalid;
  if ((m & kQpSqPsn) && rq.sq_psn > 0xffffff) return Status::invalid;
  if ((m & kQpDestQpn) && rq.dest_qpn > 0xffffff) return Status::invalid;
  if ((m & kQpTimeout) && rq.timeout > 31) return Status::invalid;
  if ((m & kQpRetryCnt) && rq.retry_cnt > 7) return Status::invalid;
  if ((m & kQpRnrRetry) && rq.rnr_retry > 7) return Status::invalid;
  if ((m & kQpMinRnrTimer) && rq.min_rnr_timer > 31) return Status::invalid;
  if ((m & kQpMaxQpRdAtomic) && rq.max_rd_atomic > lim_.max_rd_atomic) return Status::invalid;
  if ((m & kQpMaxDestRdAtomic) && rq.max_dest_rd_atomic > lim_.max_rd_atomic) return Status::invalid;
  if (m & kQpAv)
    if (Status s = check_av(rq.av); s != Status::ok) return s;

  Transition t;
  uint8_t from = e->state;
  uint32_t qt = e->qp_type == kQpGsi ? kQpUd : e->qp_type;  // QP1 takes UD's attributes
  if (to == kStateReset || to == kStateErr) {
    if (m & ~(kQpState | kQpCurState)) return Status::invalid;
    if (to == kStateReset && from == kStateReset) return Status::ok;  // nothing to tell the device
    t = to == kStateReset ? Transition::to_rst : Transition::to_err;
  } else {
    const TransitionRule* rule = nullptr;
    for (const TransitionRule& r : kRules)
      if (r.from == from && r.to == to) rule = &r;
    if (!rule) return Status::wrong_state;
    if (rule->t == Transition::sqerr2rts && qt == kQpRc) return Status::wrong_state;  // RC has no SQE state
    uint32_t attrs = m & ~(kQpState | kQpCurState);
    if ((attrs & rule->required[qt]) != rule->required[qt]) return Status::invalid;
    if (attrs & ~(rule->required[qt] | rule->optional[qt])) return Status::invalid;
    t = rule->t;
  }
  stats_.backend_calls++;
  Status s = be_.modify_qp(e->obj, t, rq);
  if (s == Status::ok) e->state = to;
  return s;
}

Status Server::query_qp(Client& c, const HandleReq& rq, QpAttr* rp) {
  Entry* e = lookup(c, rq.handle, ObjType::qp);
  if (!e) return Status::bad_handle;
  if (rq.reserved) return Status::invalid;
  stats_.backend_calls++;
  Status s = be_.query_qp(e->obj, rp);
  // The device may have moved the QP (to SQE or ERR on an error): follow it.
  if (s == Status::ok) e->state = rp->state;
  return s;
}

Status Server::create_ah(Client& c, const CreateAhReq& rq, CreateAhResp* rp) {
  if (!lookup(c, rq.pd, ObjType::pd)) return Status::bad_handle;
  if (rq.reserved) return Status::invalid;
  if (Status s = check_av(rq.av); s != Status::ok) return s;
  uint32_t slot;
  if (Status s = reserve(c, ObjType::ah, &slot); s != Status::ok) return s;
  if (Status s = be_.make_av(rq.av, rp->av); s != Status::ok) return s;
  rp->handle = commit(c, ObjType::ah, slot, nullptr, &rq.pd, 1);
  return Status::ok;
}

Status Server::destroy(Client& c, ObjType t, const HandleReq& rq) {
  Entry* e = lookup(c, rq.handle, t);
  if (!e) return Status::bad_handle;
  if (rq.reserved) return Status::invalid;
  if (e->refs) return Status::busy;
  if (Status s = backend_destroy(t, e->obj); s != Status::ok) return s;
  release(c, t, token_slot(rq.handle));
  return Status::ok;
}

Status Server::mapping(Client& c, uint32_t memory_type, MapRegion* out) {
  uint32_t kind = memory_type >> 24;
  uint32_t token = memory_type & 0xffffffu;
  if (kind < uint32_t(MapKind::uar) || kind > uint32_t(MapKind::rq)) return Status::invalid;
  ObjType t = token_type(token);
  if (t != ObjType::uar && t != ObjType::cq && t != ObjType::qp && t != ObjType::srq) return Status::bad_handle;
  Entry* e = lookup(c, token, t);
  if (!e) return Status::bad_handle;
  for (const MapRegion& m : e->maps) {
    if (m.kind == kind && m.length) {
      *out = m;
      return Status::ok;
    }
  }
  return Status::invalid;  // this object has no mapping of that kind
}

Status Server::map(Client& c, const MapReq& rq, MapResp* rp) {
  if (rq.kind > 0xff || (rq.handle >> 24)) return Status::invalid;
  MapRegion m;
  if (Status s = mapping(c, map_type(MapKind(rq.kind), rq.handle), &m); s != Status::ok) return s;
  rp->memory = 0;  // the platform's memory object (a DEXT pointer, the daemon's fd) is the host's
  rp->offset = m.offset;
  rp->length = m.length;
  rp->flags = m.flags;
  return Status::ok;
}

// ---- Events ------------------------------------------------------------------------------------

void Server::push_event(Client& c, const EventResp& e) {
  if (c.ev_count == Client::kEvents) {
    c.ev_dropped++;
    stats_.events_dropped++;
    return;
  }
  c.events[(c.ev_head + c.ev_count) % Client::kEvents] = e;
  c.ev_count++;
  if (c.wake_armed && notify_) {
    c.wake_armed = false;
    notify_->event_queued(c);
  }
}

Client* Server::client_of(uint64_t tag) {
  uint32_t id = uint32_t(tag >> 24) & 0xff;
  if (id < 1 || id > kMaxClients || !clients_[id - 1]) return nullptr;
  Client* c = clients_[id - 1];
  return c->serial == uint32_t(tag >> 32) ? c : nullptr;  // the slot may have a new client since
}

void Server::deliver_completion(uint64_t tag) {
  Client* cp = client_of(tag);
  if (!cp) return;
  Client& c = *cp;
  // The CQ may be gone (destroyed while the event was in flight): drop it then.
  uint32_t token = uint32_t(tag) & 0xffffffu;
  if (!c.open || !lookup(c, token, ObjType::cq)) return;
  push_event(c, EventResp{kEventCompletion, token, 0, 0});
}

void Server::deliver_async(uint64_t tag, uint32_t ibv_event_type) {
  Client* cp = client_of(tag);
  if (!cp) return;
  Client& c = *cp;
  uint32_t token = uint32_t(tag) & 0xffffffu;
  if (!c.open || (token && !lookup(c, token, token_type(token)))) return;
  push_event(c, EventResp{kEventAsync, token, ibv_event_type, 0});
}

void Server::deliver_device(uint32_t ibv_event_type) {
  for (Client* c : clients_)
    if (c && c->open) push_event(*c, EventResp{kEventAsync, 0, ibv_event_type, 0});
}

Status Server::get_event(Client& c, EventResp* rp) {
  if (!c.ev_count) {
    c.wake_armed = true;
    return Status::no_event;
  }
  *rp = c.events[c.ev_head];
  rp->dropped = c.ev_dropped;
  c.ev_dropped = 0;
  c.ev_head = (c.ev_head + 1) % Client::kEvents;
  c.ev_count--;
  return Status::ok;
}

}  // namespace melon::uapi
