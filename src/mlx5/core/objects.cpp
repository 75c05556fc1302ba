// Object records and the simple objects: the object list, UARs (with BlueFlame registers), PDs,
// GID table entries (SET_ROCE_ADDRESS) and address vectors.
#include <string.h>

#include "mlx5/core/hca.h"
#include "mlx5/core/log.h"
#include "mlx5/prm/prm.h"

namespace melon::mlx5::core {

namespace p = prm;

const char* obj_kind_name(ObjKind k) {
  static const char* const names[] = {"UAR", "PD", "MR", "CQ", "SRQ", "QP"};
  return uint8_t(k) < uint8_t(ObjKind::count) ? names[uint8_t(k)] : "?";
}

const char* qp_type_name(QpType t) {
  switch (t) {
    case QpType::rc: return "RC";
    case QpType::uc: return "UC";
    case QpType::ud: return "UD";
    case QpType::gsi: return "GSI";
  }
  return "?";
}

const char* qp_state_name(QpState s) {
  const char* n = p::qpc_state::name_of(uint8_t(s));
  return n ? n : "?";
}

const char* qp_transition_name(QpTransition t) {
#define MELON_MLX_QPT_NAME(n, s) \
  case QpTransition::n: return s;
  switch (t) { MELON_MLX_QP_TRANSITIONS(MELON_MLX_QPT_NAME) }
#undef MELON_MLX_QPT_NAME
  return "?";
}

// ---- the object list --------------------------------------------------------------------------

void Hca::link(ObjHeader* o, ObjKind k) {
  HalLock l(*hal_, obj_lock_);
  o->kind = k;
  o->prev = nullptr;
  o->next = objs_;
  if (objs_) objs_->prev = o;
  objs_ = o;
  live_[uint8_t(k)]++;
}

void Hca::unlink(ObjHeader* o) {
  HalLock l(*hal_, obj_lock_);
  if (o->prev)
    o->prev->next = o->next;
  else if (objs_ == o)
    objs_ = o->next;
  if (o->next) o->next->prev = o->prev;
  o->next = o->prev = nullptr;
  live_[uint8_t(o->kind)]--;
}

template <class T>
T* Hca::new_obj(ObjKind k) {
  void* mem = hal_->mem_alloc(sizeof(T));
  if (!mem) return nullptr;
  // Records are trivially copyable (no placement new without a C++ library).
  static_assert(__is_trivially_copyable(T));
  T* t = static_cast<T*>(mem);
  *t = T();
  link(t, k);
  return t;
}

template Mr* Hca::new_obj<Mr>(ObjKind);
template Cq* Hca::new_obj<Cq>(ObjKind);
template Srq* Hca::new_obj<Srq>(ObjKind);
template Qp* Hca::new_obj<Qp>(ObjKind);

void Hca::delete_obj(ObjHeader* o, size_t size) {
  unlink(o);
  hal_->mem_free(o, size);
}

// Teardown order: QPs, SRQs, CQs, MRs, PDs, UARs (each kind after everything that uses it).
Err Hca::destroy_all_objects() {
  Err first = Err::ok;
  for (int k = int(ObjKind::count) - 1; k >= 0; --k) {
    while (live_[k]) {
      ObjHeader* victim = nullptr;
      {
        HalLock l(*hal_, obj_lock_);
        for (ObjHeader* o = objs_; o; o = o->next)
          if (int(o->kind) == k) {
            victim = o;
            break;
          }
      }
      if (!victim) break;
      Err e = Err::ok;
      switch (ObjKind(k)) {
        case ObjKind::qp: e = destroy_qp(static_cast<Qp*>(victim)); break;
        case ObjKind::srq: e = destroy_srq(static_cast<Srq*>(victim)); break;
        case ObjKind::cq: e = destroy_cq(static_cast<Cq*>(victim)); break;
        case ObjKind::mr: e = destroy_mr(static_cast<Mr*>(victim)); break;
        case ObjKind::pd: e = free_pd(static_cast<Pd*>(victim)); break;
        case ObjKind::uar: e = free_uar(static_cast<Uar*>(victim)); break;
        default: break;
      }
      if (e != Err::ok) {
        MLX_ERR(*hal_, pci, "could not destroy %s: %s", obj_kind_name(ObjKind(k)), err_name(e));
        if (first == Err::ok) first = e;
        return first;  // the device refuses: teardown falls back to a function reset
      }
    }
  }
  return first;
}

void Hca::drop_all_objects() {
  while (objs_) {
    ObjHeader* o = objs_;
    size_t size = sizeof(ObjHeader);
    switch (o->kind) {
      case ObjKind::qp: size = sizeof(Qp); break;
      case ObjKind::srq: size = sizeof(Srq); break;
      case ObjKind::cq: size = sizeof(Cq); break;
      case ObjKind::mr: {
        Mr* mr = static_cast<Mr*>(o);
        if (mr->pinned) hal_->dma_unpin(mr->pin);  // after the reset nothing can reach it
        size = sizeof(Mr);
        break;
      }
      case ObjKind::pd: size = sizeof(Pd); break;
      case ObjKind::uar: size = sizeof(Uar); break;
      default: break;
    }
    delete_obj(o, size);
  }
}

// ---- UAR --------------------------------------------------------------------------------------

Err Hca::alloc_uar_index(uint32_t* index) {
  uint8_t in[p::alloc_uar_in::size_bytes] = {}, out[p::alloc_uar_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ALLOC_UAR, 0);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  *index = uint32_t(p::alloc_uar_out::cview(out).get(p::alloc_uar_out::uar));
  return Err::ok;
}

Err Hca::dealloc_uar_index(uint32_t index) {
  uint8_t in[p::dealloc_uar_in::size_bytes] = {}, out[p::dealloc_uar_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DEALLOC_UAR, 0);
  p::dealloc_uar_in::view(in).set(p::dealloc_uar_in::uar, index);
  return cmd(in, sizeof in, out, sizeof out);
}

// A UAR page sits at index * UAR page size in BAR0; its two BlueFlame buffers follow the
// doorbells at 0x800 (PRM "UAR page format").
void Hca::fill_uar(Uar* u, uint32_t index) {
  uint64_t page = uint64_t(p::kUarPageBytes) << caps_.log_uar_page_sz;
  u->index = index;
  u->bar_off = uint64_t(index) * page;
  uint32_t log_bf = caps_.log_bf_reg_size ? caps_.log_bf_reg_size : 9;
  u->bf_size = p::bf_buffer_bytes(log_bf);
  u->bf_off[0] = uint32_t(u->bar_off + p::kUarBlueFlame);
  u->bf_off[1] = u->bf_off[0] + u->bf_size;
}

// ALLOC_UAR until it has handed out every UAR of one host page, then give back the others. A host
// page holding a UAR of anyone else (or the initialization segment, host page 0) is never
// complete, so no client mapping of a host page can reach another client's doorbells, the core's
// EQ doorbells or the command doorbell. Firmware hands out low indices first; a bounded number of
// tries covers the holes others leave.
Err Hca::alloc_uar_span(uint32_t per_page, uint32_t* first) {
  constexpr uint32_t kMaxTries = 64;
  uint32_t got[kMaxTries];
  uint32_t n = 0, page = 0;
  bool found = false;
  Err e = Err::ok;
  while (!found && n < kMaxTries) {
    if ((e = alloc_uar_index(&got[n])) != Err::ok) break;
    uint32_t pg = got[n++] / per_page, have = 0;
    for (uint32_t i = 0; i < n; ++i) have += got[i] / per_page == pg;
    if (pg != 0 && have == per_page) found = true, page = pg;
  }
  for (uint32_t i = 0; i < n; ++i)
    if (!found || got[i] / per_page != page) dealloc_uar_index(got[i]);
  if (found) {
    *first = page * per_page;
    return Err::ok;
  }
  MLX_ERR(*hal_, uar, "no host page of %u UARs free after %u ALLOC_UAR", per_page, n);
  return e != Err::ok ? e : Err::no_memory;
}

Err Hca::release_uar_indices(const Uar& u) {
  Err first = Err::ok;
  for (uint32_t i = 0; i < u.span; ++i)
    if (Err e = dealloc_uar_index(u.index + i); e != Err::ok && first == Err::ok) first = e;
  return first;
}

Err Hca::alloc_uar(Uar** out) {
  if (state() == HcaState::fatal) return Err::dead;
  uint64_t uar_page = uint64_t(p::kUarPageBytes) << caps_.log_uar_page_sz;
  uint32_t host_page = hal_->host_page_size();
  uint32_t per_page = uar_page < host_page ? uint32_t(host_page / uar_page) : 1;
  uint32_t index;
  if (Err e = per_page > 1 ? alloc_uar_span(per_page, &index) : alloc_uar_index(&index); e != Err::ok) return e;
  Uar* u = new_obj<Uar>(ObjKind::uar);
  if (!u) {
    for (uint32_t i = 0; i < per_page; ++i) dealloc_uar_index(index + i);
    return Err::no_memory;
  }
  fill_uar(u, index);
  u->span = per_page;
  if (u->bar_off + uar_page * per_page > hal_->bar_size()) {
    MLX_ERR(*hal_, uar, "UAR %u lies outside BAR0", index);
    release_uar_indices(*u);
    delete_obj(u, sizeof(Uar));
    return Err::invalid;
  }
  MLX_DBG(*hal_, uar, "UAR %u (+%u) at BAR0+0x%llx, BlueFlame 0x%x/0x%x", index, per_page - 1,
          (unsigned long long)u->bar_off, u->bf_off[0], u->bf_off[1]);
  *out = u;
  return Err::ok;
}

Err Hca::free_uar(Uar* u) {
  if (!u || u->kind != ObjKind::uar) return Err::invalid;
  if (u->refs) return Err::in_use;
  if (Err e = release_uar_indices(*u); e != Err::ok && e != Err::dead) return e;
  delete_obj(u, sizeof(Uar));
  return Err::ok;
}

// ---- PD ---------------------------------------------------------------------------------------

Err Hca::alloc_pd(Pd** out) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  uint8_t in[p::alloc_pd_in::size_bytes] = {}, o[p::alloc_pd_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::ALLOC_PD, 0);
  if (Err e = cmd(in, sizeof in, o, sizeof o); e != Err::ok) return e;
  uint32_t pdn = uint32_t(p::alloc_pd_out::cview(o).get(p::alloc_pd_out::pd));
  Pd* pd = new_obj<Pd>(ObjKind::pd);
  if (!pd) {
    uint8_t din[p::dealloc_pd_in::size_bytes] = {}, dout[p::dealloc_pd_out::size_bytes] = {};
    p::cmd_set_header(din, p::opcode::DEALLOC_PD, 0);
    p::dealloc_pd_in::view(din).set(p::dealloc_pd_in::pd, pdn);
    cmd(din, sizeof din, dout, sizeof dout);
    return Err::no_memory;
  }
  pd->pdn = pdn;
  MLX_DBG(*hal_, pd, "PD %u", pdn);
  *out = pd;
  return Err::ok;
}

Err Hca::free_pd(Pd* pd) {
  if (!pd || pd->kind != ObjKind::pd) return Err::invalid;
  if (pd->refs) return Err::in_use;
  uint8_t in[p::dealloc_pd_in::size_bytes] = {}, out[p::dealloc_pd_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::DEALLOC_PD, 0);
  p::dealloc_pd_in::view(in).set(p::dealloc_pd_in::pd, pd->pdn);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok && e != Err::dead) return e;
  delete_obj(pd, sizeof(Pd));
  return Err::ok;
}

// ---- GID table --------------------------------------------------------------------------------

Err Hca::set_gid(uint32_t index, const GidEntry& g) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  if (caps_.gid_table_size && index >= caps_.gid_table_size) return Err::invalid;
  uint8_t in[p::set_roce_address_in::size_bytes] = {}, out[p::set_roce_address_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::SET_ROCE_ADDRESS, 0);
  p::set_roce_address_in::view v(in);
  v.set(p::set_roce_address_in::roce_address_index, index);
  auto a = v.at(p::set_roce_address_in::roce_address);
  // An IPv4-mapped GID is an IPv4 address: the device wants it alone in the last 4 bytes (Linux
  // mlx5_core_roce_gid_set does the same); anything else is IPv6.
  bool v4 = gid_is_v4_mapped(g.gid);
  uint8_t l3[16] = {};
  if (v4)
    memcpy(l3 + 12, g.gid + 12, 4);
  else
    memcpy(l3, g.gid, 16);
  a.set_bytes(p::roce_addr_layout::source_l3_address, l3)
      .set(p::roce_addr_layout::vlan_valid, g.vlan_valid)
      .set(p::roce_addr_layout::vlan_id, g.vlan_id)
      .set(p::roce_addr_layout::roce_l3_type, v4 ? p::roce_l3_type::IPV4 : p::roce_l3_type::IPV6)
      .set(p::roce_addr_layout::roce_version, g.version);
  p::set_mac(a.data(), p::roce_addr_layout::source_mac_47_32, p::roce_addr_layout::source_mac_31_0, g.mac);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  MLX_DBG(*hal_, gid, "GID %u set (RoCE v%u)", index, g.version == p::roce_version::VERSION_2 ? 2 : 1);
  return Err::ok;
}

Err Hca::clear_gid(uint32_t index) { return set_gid(index, GidEntry{{}, {}, false, 0, 0, 0}); }

Err Hca::query_gid(uint32_t index, GidEntry* g) {
  if (state() != HcaState::up) return state() == HcaState::fatal ? Err::dead : Err::bad_state;
  if (caps_.gid_table_size && index >= caps_.gid_table_size) return Err::invalid;
  uint8_t in[p::query_roce_address_in::size_bytes] = {}, out[p::query_roce_address_out::size_bytes] = {};
  p::cmd_set_header(in, p::opcode::QUERY_ROCE_ADDRESS, 0);
  p::query_roce_address_in::view(in).set(p::query_roce_address_in::roce_address_index, index);
  if (Err e = cmd(in, sizeof in, out, sizeof out); e != Err::ok) return e;
  auto a = p::query_roce_address_out::cview(out).at(p::query_roce_address_out::roce_address);
  g->l3_type = uint8_t(a.get(p::roce_addr_layout::roce_l3_type));
  const uint8_t* l3 = a.bytes(p::roce_addr_layout::source_l3_address);
  memcpy(g->gid, l3, 16);
  static const uint8_t zero[16] = {};
  if (g->l3_type == p::roce_l3_type::IPV4 && memcmp(l3 + 12, zero, 4) != 0) {
    memset(g->gid, 0, 10);  // back to the ::ffff:a.b.c.d GID the client set
    g->gid[10] = g->gid[11] = 0xff;
  }
  p::get_mac(a.data(), p::roce_addr_layout::source_mac_47_32, p::roce_addr_layout::source_mac_31_0, g->mac);
  g->vlan_valid = a.get(p::roce_addr_layout::vlan_valid);
  g->vlan_id = uint16_t(a.get(p::roce_addr_layout::vlan_id));
  g->version = uint8_t(a.get(p::roce_addr_layout::roce_version));
  return Err::ok;
}

bool gid_is_v4_mapped(const uint8_t gid[16]) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(gid, prefix, 12) == 0;
}

// ---- address vectors (AH) ---------------------------------------------------------------------

void make_address_vector(const AddressPath& path, uint32_t dest_qpn, uint32_t qkey, AddressVector* av) {
  memset(av->bytes, 0, sizeof av->bytes);
  p::wqe_datagram_seg::view v(av->bytes);
  v.set(p::wqe_datagram_seg::qkey, qkey)
      .set(p::wqe_datagram_seg::ext, 1)
      .set(p::wqe_datagram_seg::dqpn, dest_qpn)
      .set(p::wqe_datagram_seg::sl, path.sl)
      .set(p::wqe_datagram_seg::rlid, path.udp_sport)  // RoCE: the UDP source port
      .set(p::wqe_datagram_seg::tclass, path.tclass)
      .set(p::wqe_datagram_seg::hop_limit, path.hop_limit)
      .set(p::wqe_datagram_seg::grh, 1)
      .set(p::wqe_datagram_seg::sgid_index, path.sgid_index)
      .set(p::wqe_datagram_seg::flow_label, path.flow_label)
      .set_bytes(p::wqe_datagram_seg::rgid, path.dgid);
  uint64_t mac = 0;
  for (int i = 0; i < 6; ++i) mac = (mac << 8) | path.dmac[i];
  v.set(p::wqe_datagram_seg::rmac, mac);
}

}  // namespace melon::mlx5::core
