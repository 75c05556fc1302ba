// Exported verbs that act on an open context: queries, PD, MR, CQ, SRQ, QP, AH, multicast. Each
// checks what is generic (NULL pointers, flags no provider could accept), then dispatches to the
// provider's ContextOps. Errors: the errno value is returned (int verbs) or set (creators).
#include "verbs/internal.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace melon::verbs {

// ---- ContextOps defaults: not supported -------------------------------------------------------

int ContextOps::query_pkey(uint8_t port, int index, __be16* pkey) {
  ibv_port_attr pa{};
  if (int rc = query_port(port, &pa)) return rc;
  if (index < 0 || index >= pa.pkey_tbl_len) return EINVAL;
  *pkey = 0xffff;  // the default partition, full membership (same in either byte order)
  return 0;
}

namespace {
template <class T>
T* unsupported() {
  errno = EOPNOTSUPP;
  return nullptr;
}
}  // namespace

ibv_pd* ContextOps::alloc_pd() { return unsupported<ibv_pd>(); }
int ContextOps::dealloc_pd(ibv_pd*) { return EOPNOTSUPP; }
ibv_mr* ContextOps::reg_mr(ibv_pd*, void*, size_t, uint64_t, unsigned) { return unsupported<ibv_mr>(); }
int ContextOps::rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, unsigned) { return EOPNOTSUPP; }
ibv_pd* ContextOps::import_pd(uint32_t) { return unsupported<ibv_pd>(); }
void ContextOps::unimport_pd(ibv_pd*) {}
ibv_mr* ContextOps::import_mr(ibv_pd*, uint32_t) { return unsupported<ibv_mr>(); }
void ContextOps::unimport_mr(ibv_mr*) {}
int ContextOps::dereg_mr(ibv_mr*) { return EOPNOTSUPP; }
ibv_cq_ex* ContextOps::create_cq(const ibv_cq_init_attr_ex*) { return unsupported<ibv_cq_ex>(); }
int ContextOps::resize_cq(ibv_cq*, int) { return EOPNOTSUPP; }
int ContextOps::direct(uint32_t, void*, void*) { return EOPNOTSUPP; }
ibv_qp* ContextOps::create_gsi_qp(ibv_qp_init_attr_ex*) { return unsupported<ibv_qp>(); }
int ContextOps::wait_channel(int) { return 0; }
int ContextOps::destroy_cq(ibv_cq*) { return EOPNOTSUPP; }
ibv_srq* ContextOps::create_srq(ibv_pd*, ibv_srq_init_attr*) { return unsupported<ibv_srq>(); }
int ContextOps::modify_srq(ibv_srq*, ibv_srq_attr*, int) { return EOPNOTSUPP; }
int ContextOps::query_srq(ibv_srq*, ibv_srq_attr*) { return EOPNOTSUPP; }
int ContextOps::destroy_srq(ibv_srq*) { return EOPNOTSUPP; }
ibv_qp* ContextOps::create_qp(ibv_qp_init_attr_ex*) { return unsupported<ibv_qp>(); }
int ContextOps::modify_qp(ibv_qp*, ibv_qp_attr*, int) { return EOPNOTSUPP; }
int ContextOps::query_qp(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*) { return EOPNOTSUPP; }
int ContextOps::destroy_qp(ibv_qp*) { return EOPNOTSUPP; }
ibv_ah* ContextOps::create_ah(ibv_pd*, const ibv_ah_attr*) { return unsupported<ibv_ah>(); }
int ContextOps::destroy_ah(ibv_ah*) { return EOPNOTSUPP; }
int ContextOps::attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
int ContextOps::detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }

}  // namespace melon::verbs

using namespace melon::verbs;

namespace {

ContextOps* ops_of(ibv_context* ctx) { return ContextBase::from(ctx)->ops; }

template <class T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

// The old (pre-v1.1-extension) port attributes: everything up to and including `flags`.
constexpr size_t kCompatPortAttrSize = offsetof(ibv_port_attr, port_cap_flags2);
static_assert(kCompatPortAttrSize == 48);

// Access bits a consumer may pass to reg_mr: the defined ones plus the optional range, which a
// device that does not know a bit must ignore (ib_user_ioctl_verbs.h).
constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;

}  // namespace

// ---- queries ------------------------------------------------------------------------------------

MELON_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* device_attr) {
  if (!context || !device_attr) return EINVAL;
  ibv_device_attr_ex ex{};
  if (int rc = ops_of(context)->query_device_ex(&ex)) return rc;
  *device_attr = ex.orig_attr;
  return 0;
}

// Exported under the old prototype: writes the 48-byte form only (rdma-core's verbs.h: the
// ibv_query_port macro reaches this symbol only with the pre-1.1 struct layout).
MELON_EXPORT int ibv_query_port(ibv_context* context, uint8_t port_num, struct _compat_ibv_port_attr* port_attr) {
  if (!context || !port_attr) return EINVAL;
  ibv_port_attr full{};
  if (int rc = ops_of(context)->query_port(port_num, &full)) return rc;
  std::memcpy(port_attr, &full, kCompatPortAttrSize);
  return 0;
}

MELON_EXPORT int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                                   uint32_t flags, size_t entry_size) {
  if (!context || !entry || flags || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  ibv_gid_entry e{};
  if (int rc = ops_of(context)->query_gid_entry(port_num, gid_index, &e)) return rc;  // ENODATA: an empty slot
  std::memset(entry, 0, entry_size);
  std::memcpy(entry, &e, sizeof(e));
  return 0;
}

MELON_EXPORT ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries,
                                          uint32_t flags, size_t entry_size) {
  if (!context || (!entries && max_entries) || flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  ibv_device_attr_ex dev{};
  if (int rc = ops_of(context)->query_device_ex(&dev)) return -rc;
  size_t n = 0;
  for (uint32_t port = 1; port <= dev.orig_attr.phys_port_cnt; port++) {
    ibv_port_attr pa{};
    if (int rc = ops_of(context)->query_port(static_cast<uint8_t>(port), &pa)) return -rc;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
      ibv_gid_entry e{};
      int rc = ops_of(context)->query_gid_entry(port, static_cast<uint32_t>(i), &e);
      if (rc == ENODATA) continue;
      if (rc) return -rc;
      if (n == max_entries) return -EINVAL;  // the caller's array is too small
      auto* slot = reinterpret_cast<char*>(entries) + n * entry_size;
      std::memset(slot, 0, entry_size);
      std::memcpy(slot, &e, sizeof(e));
      n++;
    }
  }
  return static_cast<ssize_t>(n);
}

MELON_EXPORT int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, union ibv_gid* gid) {
  if (!context || !gid || index < 0) {
    errno = EINVAL;
    return -1;
  }
  ibv_gid_entry e{};
  int rc = ops_of(context)->query_gid_entry(port_num, static_cast<uint32_t>(index), &e);
  if (rc == ENODATA) {
    std::memset(gid, 0, sizeof(*gid));  // an empty slot reads as the null GID
    return 0;
  }
  if (rc) {
    errno = rc;
    return -1;
  }
  *gid = e.gid;
  return 0;
}

// IBVERBS_PRIVATE: uses the sysfs numbering (0 = IB/RoCE v1, 1 = RoCE v2), not enum ibv_gid_type.
// Exported through a versioned alias in private_symbols.cpp.
extern "C" int melon_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                                    ibv_gid_type_sysfs* type) {
  if (!context || !type) {
    errno = EINVAL;
    return -1;
  }
  ibv_gid_entry e{};
  if (int rc = ops_of(context)->query_gid_entry(port_num, index, &e)) {
    errno = rc;
    return -1;
  }
  *type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  return 0;
}

MELON_EXPORT int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (!context || !pkey) {
    errno = EINVAL;
    return -1;
  }
  if (int rc = ops_of(context)->query_pkey(port_num, index, pkey)) {
    errno = rc;
    return -1;
  }
  return 0;
}

MELON_EXPORT int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (!context) return -EINVAL;
  ibv_port_attr pa{};
  if (int rc = ops_of(context)->query_port(port_num, &pa)) return -rc;
  for (int i = 0; i < pa.pkey_tbl_len; i++) {
    __be16 p;
    if (ops_of(context)->query_pkey(port_num, i, &p) == 0 && p == pkey) return i;
  }
  return -ENOENT;
}

// ---- protection domains and memory regions -------------------------------------------------------

MELON_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (!context) return fail<ibv_pd>(EINVAL);
  return no_throw([&] { return ops_of(context)->alloc_pd(); });
}

MELON_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return EINVAL;
  return ops_of(pd->context)->dealloc_pd(pd);
}

MELON_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  if (access & ~(kKnownAccess | IBV_ACCESS_OPTIONAL_RANGE)) return fail<ibv_mr>(EINVAL);
  return no_throw([&] { return ops_of(pd->context)->reg_mr(pd, addr, length, iova, access); });
}

MELON_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned>(access));
}

MELON_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

MELON_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t, size_t, uint64_t, int, int) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  return fail<ibv_mr>(EOPNOTSUPP);  // no dma-buf importer in a userspace transport
}

MELON_EXPORT int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  // Bad input: IBV_REREG_MR_ERR_INPUT with errno EINVAL (rdma-core's libibverbs/verbs.c does both).
  auto bad_input = [] {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  };
  if (!mr || flags <= 0 || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)) return bad_input();
  if ((flags & IBV_REREG_MR_CHANGE_PD) && !pd) return bad_input();
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) return bad_input();
  if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) return bad_input();  // as rdma-core's verbs.c
  if ((flags & IBV_REREG_MR_CHANGE_ACCESS) &&
      (static_cast<unsigned>(access) & ~(kKnownAccess | IBV_ACCESS_OPTIONAL_RANGE)))
    return bad_input();
  int rc = no_throw(
      [&] { return ops_of(mr->context)->rereg_mr(mr, flags, pd, addr, length, static_cast<unsigned>(access)); });
  if (rc) {
    errno = rc;
    return rc == EINVAL ? IBV_REREG_MR_ERR_INPUT : IBV_REREG_MR_ERR_CMD;
  }
  return 0;
}

MELON_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return EINVAL;
  return ops_of(mr->context)->dereg_mr(mr);
}

// ibv_import_pd/_mr/_dm and the unimport calls: import.cpp.

// ---- completion queues ---------------------------------------------------------------------------

MELON_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                                   int comp_vector) {
  if (!context || cqe <= 0 || comp_vector < 0) return fail<ibv_cq>(EINVAL);
  ibv_cq_init_attr_ex attr{};
  attr.cqe = static_cast<uint32_t>(cqe);
  attr.cq_context = cq_context;
  attr.channel = channel;
  attr.comp_vector = static_cast<uint32_t>(comp_vector);
  attr.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cq = ContextBase::from(context)->vctx.create_cq_ex(context, &attr);
  return cq ? ibv_cq_ex_to_cq(cq) : nullptr;
}

MELON_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!cq || cqe <= 0) return EINVAL;
  return no_throw([&] { return ops_of(cq->context)->resize_cq(cq, cqe); });
}

MELON_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  if (!cq) return EINVAL;
  ibv_comp_channel* channel = cq->channel;
  CqBase* base = CqBase::from(cq);
  // Events not yet read are dropped; events read must be acknowledged before the CQ goes.
  if (channel) CompChannel::from(channel)->queue->purge([cq](ibv_cq* c) { return c == cq; });
  retire_async_events(cq->context, cq);
  pthread_mutex_lock(&cq->mutex);
  while (cq->comp_events_completed != base->comp_events_delivered ||
         cq->async_events_completed != base->async_events_delivered)
    pthread_cond_wait(&cq->cond, &cq->mutex);
  pthread_mutex_unlock(&cq->mutex);

  int rc = ops_of(cq->context)->destroy_cq(cq);
  if (rc == 0 && channel) {
    std::lock_guard<std::mutex> lock(CompChannel::from(channel)->queue->mu);
    channel->refcnt--;
  }
  return rc;
}

// ---- shared receive queues -----------------------------------------------------------------------

MELON_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* srq_init_attr) {
  if (!pd || !srq_init_attr) return fail<ibv_srq>(EINVAL);
  return no_throw([&] { return ops_of(pd->context)->create_srq(pd, srq_init_attr); });
}

MELON_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* srq_attr, int srq_attr_mask) {
  if (!srq || !srq_attr || (srq_attr_mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))) return EINVAL;
  return no_throw([&] { return ops_of(srq->context)->modify_srq(srq, srq_attr, srq_attr_mask); });
}

MELON_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* srq_attr) {
  if (!srq || !srq_attr) return EINVAL;
  return ops_of(srq->context)->query_srq(srq, srq_attr);
}

MELON_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  if (!srq) return EINVAL;
  SrqBase* base = SrqBase::from(srq);
  retire_async_events(srq->context, srq);
  pthread_mutex_lock(&srq->mutex);
  while (srq->events_completed != base->async_events_delivered) pthread_cond_wait(&srq->cond, &srq->mutex);
  pthread_mutex_unlock(&srq->mutex);
  return ops_of(srq->context)->destroy_srq(srq);
}

// ---- queue pairs ---------------------------------------------------------------------------------

MELON_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!pd || !qp_init_attr) return fail<ibv_qp>(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = no_throw([&] { return ops_of(pd->context)->create_qp(&ex); });
  if (qp) qp_init_attr->cap = ex.cap;  // the provider reports the capabilities it granted
  return qp;
}

MELON_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (!qp || !attr) return EINVAL;
  return ops_of(qp->context)->modify_qp(qp, attr, attr_mask);
}

MELON_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  if (!qp || !attr || !init_attr) return EINVAL;
  return ops_of(qp->context)->query_qp(qp, attr, attr_mask, init_attr);
}

MELON_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  if (!qp) return EINVAL;
  QpBase* base = QpBase::from(qp);
  retire_async_events(qp->context, qp);
  pthread_mutex_lock(&qp->mutex);
  while (qp->events_completed != base->async_events_delivered) pthread_cond_wait(&qp->cond, &qp->mutex);
  pthread_mutex_unlock(&qp->mutex);
  return ops_of(qp->context)->destroy_qp(qp);
}

MELON_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (!qp) return fail<ibv_qp_ex>(EINVAL);
  QpBase* base = QpBase::from(qp);
  return base->extended ? &base->ibv : nullptr;
}

MELON_EXPORT int ibv_query_qp_data_in_order(ibv_qp* qp, enum ibv_wr_opcode, uint32_t flags) {
  // 0: no guarantee that data lands in order before the completion (always a safe answer).
  (void)qp;
  (void)flags;
  return 0;
}

// ECE is not offered (EOPNOTSUPP); a missing QP or ECE is still the caller's EINVAL.
MELON_EXPORT int ibv_set_ece(ibv_qp* qp, ibv_ece* ece) {
  errno = !qp || !ece ? EINVAL : EOPNOTSUPP;
  return errno;
}

MELON_EXPORT int ibv_query_ece(ibv_qp* qp, ibv_ece* ece) {
  errno = !qp || !ece ? EINVAL : EOPNOTSUPP;
  return errno;
}

MELON_EXPORT int ibv_attach_mcast(ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  if (!qp || !gid) return EINVAL;
  return ops_of(qp->context)->attach_mcast(qp, gid, lid);
}

MELON_EXPORT int ibv_detach_mcast(ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  if (!qp || !gid) return EINVAL;
  return ops_of(qp->context)->detach_mcast(qp, gid, lid);
}

// ---- address handles -----------------------------------------------------------------------------

MELON_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return fail<ibv_ah>(EINVAL);
  return no_throw([&] { return ops_of(pd->context)->create_ah(pd, attr); });
}

MELON_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  return ops_of(ah->context)->destroy_ah(ah);
}

namespace {

bool is_ipv4_mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof(prefix)) == 0;
}

void ipv4_mapped(ibv_gid* g, const uint8_t addr[4]) {
  std::memset(g->raw, 0, 10);
  g->raw[10] = g->raw[11] = 0xff;
  std::memcpy(g->raw + 12, addr, 4);
}

}  // namespace

// A reply address for a received UD message (IBA 11.2.5.3 / RoCEv2 Annex A17.4.5.1): the
// sender's address becomes the destination, the address the message arrived on the source.
MELON_EXPORT int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                     ibv_ah_attr* ah_attr) {
  if (!context || !wc || !ah_attr) return EINVAL;
  ibv_port_attr pa{};
  if (int rc = ops_of(context)->query_port(port_num, &pa)) return rc;
  std::memset(ah_attr, 0, sizeof(*ah_attr));
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH)) {
    // RoCE cannot address without a GRH.
    return pa.link_layer == IBV_LINK_LAYER_ETHERNET ? EINVAL : 0;
  }
  if (!grh) return EINVAL;

  ibv_gid sgid{}, dgid{};
  uint32_t flow_label = 0;
  uint8_t tclass = 0;
  // RoCEv2 over IPv4 places the IPv4 header in the last 20 bytes of the 40-byte GRH area.
  const uint8_t* ip4 = reinterpret_cast<const uint8_t*>(grh) + 20;
  if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && (ip4[0] >> 4) == 4) {
    ipv4_mapped(&dgid, ip4 + 12);  // the sender's source address
    ipv4_mapped(&sgid, ip4 + 16);  // our address it was sent to
    tclass = ip4[1];
  } else {
    uint32_t vtf = ntohl(grh->version_tclass_flow);
    dgid = grh->sgid;
    sgid = grh->dgid;
    flow_label = vtf & 0xfffff;
    tclass = static_cast<uint8_t>((vtf >> 20) & 0xff);
  }

  // The source GID index: the entry of our table that equals the address we were sent to.
  int found = -1;
  for (int i = 0; i < pa.gid_tbl_len && found < 0; i++) {
    ibv_gid_entry e{};
    if (ops_of(context)->query_gid_entry(port_num, static_cast<uint32_t>(i), &e)) continue;
    if (std::memcmp(e.gid.raw, sgid.raw, 16) == 0 &&
        (pa.link_layer != IBV_LINK_LAYER_ETHERNET || e.gid_type == IBV_GID_TYPE_ROCE_V2 || !is_ipv4_mapped(sgid)))
      found = i;
  }
  if (found < 0) return ENOENT;
  ah_attr->is_global = 1;
  ah_attr->grh.dgid = dgid;
  ah_attr->grh.sgid_index = static_cast<uint8_t>(found);
  ah_attr->grh.flow_label = flow_label;
  ah_attr->grh.hop_limit = 0xff;
  ah_attr->grh.traffic_class = tclass;
  return 0;
}

MELON_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd || !wc) return fail<ibv_ah>(EINVAL);
  ibv_ah_attr attr{};
  if (int rc = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return fail<ibv_ah>(rc);
  return ibv_create_ah(pd, &attr);
}

MELON_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[ETHERNET_LL_SIZE],
                                             uint16_t* vid) {
  // A UDP transport lets the host's IP stack resolve neighbours; there is no MAC to report.
  (void)vid;
  return !context || !attr || !eth_mac ? EINVAL : EOPNOTSUPP;
}
