// The HCA objects the core manages: their parameters, records and query results.
//
// Records are allocated through the HAL, linked into the Hca's list (teardown walks it in
// dependency order) and reference-counted by their dependents: a PD with an MR or QP, a CQ with
// a QP, an SRQ with a QP cannot be destroyed (Err::in_use).
#pragma once

#include <stdint.h>

#include "mlx5/core/hal.h"

namespace melon::mlx5::core {

// Dependency order: later kinds depend on earlier ones; teardown destroys from the end.
enum class ObjKind : uint8_t { uar, pd, mr, cq, srq, qp, count };
const char* obj_kind_name(ObjKind k);

struct ObjHeader {
  ObjHeader* next = nullptr;
  ObjHeader* prev = nullptr;
  ObjKind kind = ObjKind::count;
  uint32_t refs = 0;  // dependents
};

// An async event for one object (QP, CQ, SRQ) or for the device (port change, fatal).
struct AsyncEvent {
  uint8_t type;  // prm::event_type
  uint8_t subtype;
  uint32_t number;  // QPN, CQN, SRQN or port
  const char* name;
};

class EventSink {
 public:
  virtual void on_async_event(const AsyncEvent&) {}  // not pure: see VectorHandler
  virtual void on_completion(uint32_t cqn) {}

 protected:
  ~EventSink() = default;
};

// The largest queue (log2 of entries) the core accepts whatever the caps claim: the PRM's log
// size fields are 5 bits, and this keeps every size computation far from overflow.
inline constexpr uint32_t kMaxLogQueueSize = 24;
// The largest UAR page (log2 of 4 KiB units) the core accepts from the caps.
inline constexpr uint32_t kMaxLogUarPage = 8;

// Access flags, with the values of ibv_access_flags.
enum : uint32_t {
  kAccessLocalWrite = 1,
  kAccessRemoteWrite = 2,
  kAccessRemoteRead = 4,
  kAccessRemoteAtomic = 8,
};

struct Uar : ObjHeader {
  uint32_t index = 0;
  // UAR indices held from `index` on: a whole host page of them when UAR pages are smaller than a
  // host page, so that the page a client maps holds no UAR but its own (Hca::alloc_uar).
  uint32_t span = 1;
  uint64_t bar_off = 0;  // the UAR page in BAR0, host-page aligned (CQ/EQ doorbells at prm::kUarCqDoorbell, ...)
  uint32_t bf_off[2] = {};  // the two BlueFlame buffers, BAR0 offsets, used alternately
  uint32_t bf_size = 0;
};

struct Pd : ObjHeader {
  uint32_t pdn = 0;
};

struct Mr : ObjHeader {
  Pd* pd = nullptr;
  uint32_t mkey = 0;  // lkey == rkey: index << 8 | variant
  uint64_t va = 0, len = 0;
  uint32_t access = 0;
  uint32_t page_shift = 0;  // of the MTT pages
  uint32_t mtts = 0;
  PinnedRange pin;
  bool pinned = false;  // the core pinned it (register_user_mr) and unpins it at destroy
};

struct MrQuery {
  uint32_t pd;
  uint64_t start, len;
  uint32_t access;
  uint32_t log_page_size;
  bool free;
};

struct CqParams {
  uint32_t log_size = 6;  // entries, 64-byte CQEs
  uint32_t comp_vector = 0;  // which completion EQ
  Uar* uar = nullptr;  // for arm doorbells; the core's own UAR when null
  const DmaSegment* buf = nullptr;  // the CQE ring
  uint32_t nbuf = 0;
  uint64_t dbr_iova = 0;  // the doorbell record
  EventSink* owner = nullptr;
};

struct Cq : ObjHeader {
  uint32_t cqn = 0, log_size = 0, eqn = 0;
  Uar* uar = nullptr;  // a client UAR it rings, or null for the core's own
  EventSink* owner = nullptr;
  uint64_t completions = 0, errors = 0;
};

struct CqQuery {
  uint32_t log_size, eqn, status, period, max_count, uar_page;
};

struct SrqParams {
  Pd* pd = nullptr;
  Cq* cq = nullptr;  // optional (XRC only); may be null
  uint32_t log_size = 6;  // WQEs
  uint32_t log_stride = 4;  // bytes per WQE = 1 << log_stride (>= 16)
  const DmaSegment* buf = nullptr;
  uint32_t nbuf = 0;
  uint64_t dbr_iova = 0;
  EventSink* owner = nullptr;
};

struct Srq : ObjHeader {
  uint32_t srqn = 0;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  EventSink* owner = nullptr;
  uint64_t errors = 0;
};

struct SrqQuery {
  uint32_t state, log_size, pd, lwm, wqe_cnt;
};

// gsi: QP1, the port's General Services QP (PRM st QP1): a UD QP that is number 1 on the wire and
// takes the GSI's Q_Key; one per port (a second is Err::taken).
enum class QpType : uint8_t { rc, uc, ud, gsi };
const char* qp_type_name(QpType t);

// Software view of the QP state machine (IBA 10.3.1); values are prm::qpc_state.
enum class QpState : uint8_t { rst = 0, init = 1, rtr = 2, rts = 3, sqer = 4, err = 6, sqd = 7 };
const char* qp_state_name(QpState s);

#define MELON_MLX_QP_TRANSITIONS(V) \
  V(rst2init, "RST2INIT")           \
  V(init2init, "INIT2INIT")         \
  V(init2rtr, "INIT2RTR")           \
  V(rtr2rts, "RTR2RTS")             \
  V(rts2rts, "RTS2RTS")             \
  V(sqerr2rts, "SQERR2RTS")         \
  V(sqd2rts, "SQD_RTS")             \
  V(to_err, "2ERR")                 \
  V(to_rst, "2RST")
#define MELON_MLX_QPT_ENUM(n, s) n,
enum class QpTransition : uint8_t { MELON_MLX_QP_TRANSITIONS(MELON_MLX_QPT_ENUM) };
#undef MELON_MLX_QPT_ENUM
const char* qp_transition_name(QpTransition t);

struct QpParams {
  QpType type = QpType::rc;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;  // receives come from the SRQ (log_rq_size ignored)
  Uar* uar = nullptr;  // the core's own UAR when null
  uint32_t log_sq_size = 6;  // send WQE basic blocks (64 B)
  uint32_t log_rq_size = 6;  // receive WQEs
  uint32_t log_rq_stride = 4;  // bytes per receive WQE = 1 << log_rq_stride (>= 16)
  const DmaSegment* buf = nullptr;  // RQ then SQ, as one buffer (PRM)
  uint32_t nbuf = 0;
  uint64_t dbr_iova = 0;
  uint32_t user_index = 0;
  EventSink* owner = nullptr;
  bool scatter_to_cqe = false;  // qpc.cs_res = 1: small SENDs come in the CQE (RC/UC, own RQ)
};

// The RoCEv2 address path (IBA 17.4 + RoCEv2 annex): which local GID, the peer's MAC and GID,
// IP hop limit and traffic class, UDP source port.
struct AddressPath {
  uint8_t port = 1;
  uint8_t sgid_index = 0;
  uint8_t dmac[6] = {};
  uint8_t dgid[16] = {};
  uint8_t hop_limit = 64;
  uint8_t tclass = 0;
  uint32_t flow_label = 0;
  uint16_t udp_sport = 0;  // 0: let the device choose
  uint8_t sl = 0;
  uint8_t ack_timeout = 14;
};

struct QpAttr {
  uint16_t pkey_index = 0;
  uint32_t access = 0;  // kAccess* (remote read/write/atomic enables)
  uint32_t qkey = 0;  // UD
  uint32_t dest_qpn = 0;  // RC/UC
  AddressPath path;  // RC/UC, INIT2RTR
  uint8_t mtu = 3;  // prm::qpc_mtu (IB enumeration, 3 = 1024)
  uint32_t rq_psn = 0;  // INIT2RTR
  uint32_t sq_psn = 0;  // RTR2RTS
  uint8_t max_rd_atomic = 1;  // outstanding as requester (RTR2RTS)
  uint8_t max_dest_rd_atomic = 1;  // as responder (INIT2RTR)
  uint8_t min_rnr_timer = 12;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  // Attributes to change where the transition takes them only on request (prm::qp_optpar bits:
  // RRE/RAE/RWE for `access`, RNR_TIMEOUT, Q_KEY, PKEY_INDEX, PRI_PORT, ACK_TIMEOUT, RETRY_COUNT,
  // RNR_RETRY, SRA_MAX, RRA_MAX). A bit the transition neither requires nor accepts for the QP's
  // type (prm/qp_modify.h) is Err::invalid.
  uint32_t optional = 0;
};

struct Qp : ObjHeader {
  uint32_t qpn = 0;
  QpType type = QpType::rc;
  QpState state = QpState::rst;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  Uar* uar = nullptr;
  EventSink* owner = nullptr;
  uint64_t events = 0;
};

struct QpQuery {
  QpState state;
  uint32_t st;  // prm::qpc_st
  uint32_t pd, remote_qpn, next_send_psn, next_rcv_psn, qkey, mtu;
  uint32_t cqn_snd, cqn_rcv;
  AddressPath path;
};

struct GidEntry {
  uint8_t gid[16] = {};
  uint8_t mac[6] = {};
  bool vlan_valid = false;
  uint16_t vlan_id = 0;
  uint8_t version = 2;  // prm::roce_version (2 = RoCEv2)
  uint8_t l3_type = 0;  // prm::roce_l3_type; set_gid derives it from the GID, query_gid reports it
};
// ::ffff:a.b.c.d (IBA A17.8: a RoCEv2 GID for an IPv4 address)
bool gid_is_v4_mapped(const uint8_t gid[16]);

// The datagram segment (address vector) of a UD send, built from an address handle's attributes
// (mlx5 AHs are not firmware objects: the provider copies this into each UD WQE).
struct AddressVector {
  uint8_t bytes[48];
};
void make_address_vector(const AddressPath& path, uint32_t dest_qpn, uint32_t qkey, AddressVector* av);

struct HcaCaps {
  static constexpr uint32_t kCapBytes = 256;  // cmd_hca_cap / roce_cap
  uint8_t general[kCapBytes] = {};  // current
  uint8_t general_max[kCapBytes] = {};
  uint8_t roce[kCapBytes] = {};  // current
  bool has_roce = false;
  uint32_t log_max_qp = 0, log_max_cq = 0, log_max_srq = 0, log_max_mkey = 0, log_max_pd = 0;
  uint32_t log_max_eq = 0, log_bf_reg_size = 0, gid_table_size = 0, num_ports = 0, port_type = 0;
  uint32_t log_uar_page_sz = 0;
  bool bf = false;
};

struct PortInfo {
  uint8_t vport_state = 0, admin_state = 0;
  uint16_t mtu = 0;
  uint8_t mac[6] = {};
  bool roce_en = false;
};

}  // namespace melon::mlx5::core
