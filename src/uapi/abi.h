// The user-client ABI: what crosses the boundary between an application's mlx5 provider and the
// driver core (docs/uapi.md). On macOS these structs travel through IOConnectCallStructMethod and
// the mapping types through IOConnectMapMemory64; on Linux through melon-emud's Unix socket.
//
// Rules that keep the ABI stable:
//   - every struct is a POD with a static_assert'ed size and explicit padding (all zero);
//   - fields are only ever appended; a request shorter than the current struct but at least as
//     long as its first version has the missing fields read as zero, and a longer one is accepted
//     only when the extra bytes are zero (a newer client asking for nothing this server lacks);
//   - handles are opaque per-client tokens, never firmware numbers (QPN, CQN and memory keys
//     are the exceptions the data path needs: WQEs, CQ arm doorbells and remote access carry them).
//
// Freestanding: <stdint.h> only.
#pragma once

#include <stdint.h>

namespace melon::uapi {

inline constexpr uint32_t kAbiVersion = 1;

// Feature bits reported by Open (one per line; the anchor's numbering where it has one).
enum Feature : uint64_t {
  kFeatRc = 1ull << 0,
  kFeatRoceV2 = 1ull << 1,
  kFeatDirectPath = 1ull << 2,  // WQEs, doorbells and CQEs in the application
  kFeatAsyncEvents = 1ull << 3,
  kFeatImmediate = 1ull << 7,
  kFeatInline = 1ull << 10,
  kFeatAtomic = 1ull << 11,
  kFeatBlueFlame = 1ull << 13,
  kFeatCqEvents = 1ull << 16,  // completion events through GetEvent
  kFeatUc = 1ull << 18,
  kFeatUd = 1ull << 19,
  kFeatSrq = 1ull << 20,
};

// Selectors (IOUserClient ExternalMethod numbers).
#define MELON_UAPI_SELECTORS(V)                      \
  V(open, 0x1000, OpenReq, OpenResp)                 \
  V(close, 0x1001, EmptyReq, EmptyResp)              \
  V(query_device, 0x1002, EmptyReq, DeviceAttr)      \
  V(query_port, 0x1003, PortReq, PortAttr)           \
  V(alloc_pd, 0x1010, EmptyReq, HandleResp)          \
  V(dealloc_pd, 0x1011, HandleReq, EmptyResp)        \
  V(alloc_uar, 0x1012, EmptyReq, UarResp)            \
  V(free_uar, 0x1013, HandleReq, EmptyResp)          \
  V(create_qp, 0x1020, CreateQpReq, CreateQpResp)    \
  V(modify_qp, 0x1021, ModifyQpReq, EmptyResp)       \
  V(destroy_qp, 0x1022, HandleReq, EmptyResp)        \
  V(query_qp, 0x1023, HandleReq, QpAttr)             \
  V(create_cq, 0x1030, CreateCqReq, CreateCqResp)    \
  V(destroy_cq, 0x1031, HandleReq, EmptyResp)        \
  V(reg_mr, 0x1040, RegMrReq, RegMrResp)             \
  V(dereg_mr, 0x1041, HandleReq, EmptyResp)          \
  V(create_ah, 0x1050, CreateAhReq, CreateAhResp)    \
  V(destroy_ah, 0x1051, HandleReq, EmptyResp)        \
  V(query_gid, 0x1063, GidReq, GidResp)              \
  V(map, 0x1090, MapReq, MapResp)                    \
  V(get_event, 0x1093, EmptyReq, EventResp)          \
  V(query_usage, 0x10b6, EmptyReq, UsageResp)        \
  V(stable_cycle, 0x10a6, CycleReq, CycleResp)       \
  V(create_srq, 0x10b8, CreateSrqReq, CreateSrqResp) \
  V(destroy_srq, 0x10b9, HandleReq, EmptyResp)       \
  V(modify_srq, 0x10bc, ModifySrqReq, EmptyResp)     \
  V(resize_cq, 0x1032, ResizeCqReq, ResizeCqResp) /* last: the fuzz corpus indexes this list */

#define MELON_UAPI_SEL_ENUM(name, value, req, resp) name = value,
enum class Selector : uint32_t { MELON_UAPI_SELECTORS(MELON_UAPI_SEL_ENUM) };
#undef MELON_UAPI_SEL_ENUM

// Every answer's status. Kept apart from errno (Darwin and Linux numbers differ); the provider
// maps them (errno_name() in docs/uapi.md gives the intended errno for each).
#define MELON_UAPI_STATUSES(V)                                                                      \
  V(ok, 0, "ok")                                                                                    \
  V(unknown_selector, 1, "unknown selector")                                                        \
  V(truncated, 2, "request shorter than the selector's first version")                              \
  V(trailing_nonzero, 3, "request longer than this server knows, with nonzero extra")               \
  V(out_too_small, 4, "response buffer shorter than the selector's first version")                  \
  V(not_open, 5, "Open has not been called (or Close has)")                                         \
  V(already_open, 6, "Open called twice")                                                           \
  V(bad_version, 7, "ABI version not served")                                                       \
  V(invalid, 8, "a field is out of range or a reserved field is nonzero")                           \
  V(bad_handle, 9, "handle stale, forged, of the wrong type or another client's")                   \
  V(quota_client, 10, "the client's quota for this object is used up")                              \
  V(quota_device, 11, "the device's quota for this object is used up")                              \
  V(wrong_state, 12, "the object is not in a state that allows this")                               \
  V(busy, 13, "the object still has dependents")                                                    \
  V(no_memory, 14, "out of memory")                                                                 \
  V(firmware, 15, "the firmware refused the command")                                               \
  V(device_dead, 16, "the device is in a fatal state")                                              \
  V(unsupported, 17, "not supported")                                                               \
  V(no_event, 18, "no event pending")                                                               \
  V(quota_queue_client, 19, "the client's queue memory limit is used up (queue_bytes.client)")      \
  V(quota_queue_user, 20, "the user's queue memory limit is used up (queue_bytes.user)")            \
  V(quota_queue_device, 21, "the device's queue memory limit is used up (queue_bytes.device)")      \
  V(quota_pinned_client, 22, "the client's pinned memory limit is used up (pinned_bytes.client)")   \
  V(quota_pinned_user, 23, "the user's pinned memory limit is used up (pinned_bytes.user)")         \
  V(quota_pinned_device, 24, "the device's pinned memory limit is used up (pinned_bytes.device)")   \
  V(quota_user_clients, 25, "the user's client connections are used up (clients_per_user)")         \
  V(bad_address, 26, "the range is not the client's memory with the access asked")                  \
  V(not_permitted, 27, "a diagnostic selector this host does not allow (melon-emud --diagnostics)") \
  V(taken, 28, "the port's QP1 (GSI) belongs to another client")

#define MELON_UAPI_STATUS_ENUM(name, value, text) name = value,
enum class Status : uint32_t { MELON_UAPI_STATUSES(MELON_UAPI_STATUS_ENUM) };
#undef MELON_UAPI_STATUS_ENUM
#define MELON_UAPI_STATUS_COUNT(name, value, text) +1
inline constexpr uint32_t kStatusCount = 0 MELON_UAPI_STATUSES(MELON_UAPI_STATUS_COUNT);  // values 0..count-1
#undef MELON_UAPI_STATUS_COUNT
const char* status_name(Status s);

// ---- Handles: token = type << 21 | generation << 9 | slot, 24 bits (fits IOConnectMapMemory64's
// memory type together with a mapping kind). Type 0 and generation 0 are never issued, so 0 is
// never a valid handle.
enum class ObjType : uint8_t { none = 0, pd = 1, uar = 2, cq = 3, qp = 4, mr = 5, ah = 6, srq = 7 };
inline constexpr uint32_t kObjTypes = 8;
inline constexpr uint32_t kSlotBits = 9, kGenBits = 12, kTypeBits = 3;
inline constexpr uint32_t kMaxSlots = 1u << kSlotBits;
inline constexpr uint32_t kGenMask = (1u << kGenBits) - 1;
inline constexpr uint32_t make_token(ObjType t, uint32_t gen, uint32_t slot) {
  return uint32_t(t) << (kSlotBits + kGenBits) | (gen & kGenMask) << kSlotBits | (slot & (kMaxSlots - 1));
}
inline constexpr ObjType token_type(uint32_t tok) { return ObjType((tok >> (kSlotBits + kGenBits)) & 7); }
inline constexpr uint32_t token_gen(uint32_t tok) { return (tok >> kSlotBits) & kGenMask; }
inline constexpr uint32_t token_slot(uint32_t tok) { return tok & (kMaxSlots - 1); }
static_assert(make_token(ObjType::srq, kGenMask, kMaxSlots - 1) == 0xffffffu);

// ---- Mappings: memory type = kind << 24 | token.
enum class MapKind : uint8_t { uar = 1, db_record = 2, cqe = 3, sq = 4, rq = 5 };
inline constexpr uint32_t map_type(MapKind k, uint32_t token) { return uint32_t(k) << 24 | (token & 0xffffffu); }

// ---- Per-client quotas (the anchor's figures) and the device's limit on clients.
struct Quotas {
  uint32_t pd = 16, qp = 64, cq = 64, mr = 128, ah = 8, srq = 16, uar = 4;
};
inline constexpr uint32_t kMaxClients = 16;

// ---- Requests and responses.
struct EmptyReq {};
struct EmptyResp {};
struct HandleReq {
  uint32_t handle;
  uint32_t reserved;
};
static_assert(sizeof(HandleReq) == 8);
struct HandleResp {
  uint32_t handle;
  uint32_t reserved;
};
static_assert(sizeof(HandleResp) == 8);

struct OpenReq {
  uint32_t abi_version;  // kAbiVersion
  uint32_t reserved;
  uint64_t features;  // what the client wants; answered with what it gets
};
static_assert(sizeof(OpenReq) == 16);
struct OpenResp {
  uint32_t abi_version;
  uint32_t client_id;  // 1..kMaxClients, for logs
  uint64_t features;
  uint32_t max_pd, max_qp, max_cq, max_mr, max_ah, max_srq, max_uar;
  uint32_t reserved;
};
static_assert(sizeof(OpenResp) == 48);

// ibv_device_attr's fields a provider needs (the rest it fills itself).
struct DeviceAttr {
  uint64_t fw_ver;  // major << 32 | minor << 16 | subminor
  uint64_t node_guid;
  uint64_t sys_image_guid;
  uint64_t max_mr_size;
  uint64_t page_size_cap;
  uint32_t vendor_id, vendor_part_id, hw_ver;
  uint32_t max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd;
  uint32_t max_qp_rd_atom, max_qp_init_rd_atom, max_srq, max_srq_wr, max_srq_sge, max_ah;
  uint32_t phys_port_cnt, max_inline_data;
  uint32_t uar_page_size, bf_reg_size;  // BlueFlame buffer bytes (0: no BlueFlame)
  uint32_t reserved;
};
static_assert(sizeof(DeviceAttr) == 128);

struct PortReq {
  uint32_t port;  // 1
  uint32_t reserved;
};
static_assert(sizeof(PortReq) == 8);
struct PortAttr {
  uint32_t state;  // ibv_port_state
  uint32_t max_mtu, active_mtu;  // ibv_mtu
  uint32_t gid_tbl_len;
  uint32_t active_speed, active_width;
  uint8_t mac[6];
  uint8_t reserved[2];
};
static_assert(sizeof(PortAttr) == 32);

struct GidReq {
  uint32_t port;
  uint32_t index;
};
static_assert(sizeof(GidReq) == 8);
struct GidResp {
  uint8_t gid[16];
  uint32_t valid;
  uint32_t roce_version;  // 1 or 2
};
static_assert(sizeof(GidResp) == 24);

struct UarResp {
  uint32_t handle;
  uint32_t page_bytes;  // the mapping's length
  uint32_t db_offset;  // send doorbell / first BlueFlame buffer within the page
  uint32_t bf_bytes;  // each of the two BlueFlame buffers (0: doorbell only)
};
static_assert(sizeof(UarResp) == 16);

// Access flags carry ibv_access_flags values.
inline constexpr uint32_t kAccessLocalWrite = 1, kAccessRemoteWrite = 2, kAccessRemoteRead = 4, kAccessRemoteAtomic = 8;
inline constexpr uint32_t kAccessKnown = 15;

struct RegMrReq {
  uint32_t pd;
  uint32_t access;
  uint64_t addr;  // in the client's address space
  uint64_t length;
};
static_assert(sizeof(RegMrReq) == 24);
struct RegMrResp {
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
  uint32_t reserved;
};
static_assert(sizeof(RegMrResp) == 16);

struct CreateCqReq {
  uint32_t cqe;  // entries wanted (rounded up to a power of two)
  uint32_t comp_vector;
  uint32_t uar;  // the client's UAR the CQ arm doorbell goes to
  uint32_t flags;  // reserved, 0
};
static_assert(sizeof(CreateCqReq) == 16);
struct CreateCqResp {
  uint32_t handle;
  uint32_t cqn;  // CQ arm doorbells carry it
  uint32_t cqe;  // entries (a power of two)
  uint32_t cqe_bytes;  // 64
  uint32_t dbr_offset;  // within the DbRecord mapping
  uint32_t reserved;
};
static_assert(sizeof(CreateCqResp) == 24);

// A new ring for the CQ (docs/uapi.md "Resizing a CQ"): same handle, CQN and doorbell record; the
// CQ's Cqe mapping names the new ring from now on, and the old one stays mapped for the copy.
struct ResizeCqReq {
  uint32_t handle;  // first, as in HandleReq
  uint32_t cqe;  // entries wanted (rounded up to a power of two above it, as in CreateCqReq)
};
static_assert(sizeof(ResizeCqReq) == 8);
struct ResizeCqResp {
  uint32_t cqe;  // entries of the new ring (a power of two)
  uint32_t cqe_bytes;  // 64
};
static_assert(sizeof(ResizeCqResp) == 8);

struct CreateSrqReq {
  uint32_t pd;
  uint32_t max_wr;
  uint32_t max_sge;
  uint32_t srq_limit;
};
static_assert(sizeof(CreateSrqReq) == 16);
struct CreateSrqResp {
  uint32_t handle;
  uint32_t wqe_cnt;
  uint32_t stride;  // bytes per receive WQE
  uint32_t dbr_offset;
};
static_assert(sizeof(CreateSrqResp) == 16);

struct ModifySrqReq {
  uint32_t handle;
  uint32_t srq_limit;  // arm the limit event
};
static_assert(sizeof(ModifySrqReq) == 8);

// qp_type values (the anchor's): RC 0, UD 1, UC 2; GSI 3 is QP1 of `port` (a UD QP numbered 1 with
// the GSI's Q_Key, the IB CM's), one per port and device: another client asking while it lives gets
// `taken`; it is free again once its owner destroys it or goes.
enum : uint8_t { kQpRc = 0, kQpUd = 1, kQpUc = 2, kQpGsi = 3 };
struct CreateQpReq {
  uint32_t pd, send_cq, recv_cq;
  uint32_t srq;  // 0: the QP has its own RQ
  uint32_t uar;  // the client's UAR the send doorbells go to
  uint8_t qp_type;
  uint8_t port;  // kQpGsi: the port (1); 0 for the other types
  uint8_t flags;  // kCreateQpScatterToCqe; other bits must be 0
  uint8_t reserved0;
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
};
static_assert(sizeof(CreateQpReq) == 44);
// CreateQpReq::flags. Scatter to CQE: a SEND of up to 32 bytes that completes a receive of an RC or
// UC QP with its own RQ comes inside its 64-byte CQE (cqe format 1, PRM qpc.cs_res = 1), and the
// provider copies it into the receive's buffers when it polls (rdma-core: MLX5_QP_FLAG_SCATTER_CQE,
// on unless MLX5_SCATTER_TO_CQE=0). Asked for other QPs, it is not used; the CQE says which.
inline constexpr uint8_t kCreateQpScatterToCqe = 1 << 0;
struct CreateQpResp {
  uint32_t handle;
  uint32_t qpn;
  uint32_t sq_wqe_cnt;  // 64-byte basic blocks
  uint32_t rq_wqe_cnt;  // 0 with an SRQ
  uint32_t rq_stride;  // bytes per receive WQE
  uint32_t max_inline_data;
  uint32_t dbr_offset;  // within the DbRecord mapping: [0] receive counter, [1] send counter
  uint32_t sq_offset;  // the SQ within the Sq mapping (PRM: the RQ comes first in one buffer)
};
static_assert(sizeof(CreateQpResp) == 32);

// ModifyQp mirrors ibv_modify_qp: attr_mask holds IBV_QP_* bits, states are ibv_qp_state values.
enum : uint32_t {
  kQpState = 1 << 0,
  kQpCurState = 1 << 1,
  kQpAccessFlags = 1 << 3,
  kQpPkeyIndex = 1 << 4,
  kQpPort = 1 << 5,
  kQpQkey = 1 << 6,
  kQpAv = 1 << 7,
  kQpPathMtu = 1 << 8,
  kQpTimeout = 1 << 9,
  kQpRetryCnt = 1 << 10,
  kQpRnrRetry = 1 << 11,
  kQpRqPsn = 1 << 12,
  kQpMaxQpRdAtomic = 1 << 13,
  kQpMinRnrTimer = 1 << 15,
  kQpSqPsn = 1 << 16,
  kQpMaxDestRdAtomic = 1 << 17,
  kQpDestQpn = 1 << 20,
};
inline constexpr uint32_t kQpMaskKnown = kQpState | kQpCurState | kQpAccessFlags | kQpPkeyIndex | kQpPort | kQpQkey |
                                         kQpAv | kQpPathMtu | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpRqPsn |
                                         kQpMaxQpRdAtomic | kQpMinRnrTimer | kQpSqPsn | kQpMaxDestRdAtomic | kQpDestQpn;
enum : uint8_t {
  kStateReset = 0,
  kStateInit = 1,
  kStateRtr = 2,
  kStateRts = 3,
  kStateSqd = 4,
  kStateSqe = 5,
  kStateErr = 6
};

struct AddressReq {
  uint8_t dgid[16];
  uint8_t dmac[6];
  uint16_t udp_sport;  // 0: the device chooses
  uint32_t flow_label;
  uint8_t sgid_index, hop_limit, traffic_class, sl;
  uint8_t port;
  uint8_t reserved[3];
};
static_assert(sizeof(AddressReq) == 36);

struct ModifyQpReq {
  uint32_t handle;
  uint32_t attr_mask;
  uint8_t qp_state, cur_qp_state, path_mtu, port;
  uint32_t qkey, rq_psn, sq_psn, dest_qpn, access;
  uint16_t pkey_index;
  uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic, max_dest_rd_atomic;
  AddressReq av;
  uint32_t reserved;
};
static_assert(sizeof(ModifyQpReq) == 80);

struct QpAttr {
  uint8_t state, path_mtu, reserved0[2];
  uint32_t qpn, dest_qpn, qkey, rq_psn, sq_psn;
  uint32_t reserved1;
  AddressReq av;
};
static_assert(sizeof(QpAttr) == 64);

struct CreateAhReq {
  uint32_t pd;
  uint32_t reserved;
  AddressReq av;
};
static_assert(sizeof(CreateAhReq) == 44);
struct CreateAhResp {
  uint32_t handle;
  uint32_t reserved;
  uint8_t av[48];  // the UD WQE's datagram segment (mlx5 AHs are not firmware objects)
};
static_assert(sizeof(CreateAhResp) == 56);

struct MapReq {
  uint32_t kind;  // MapKind
  uint32_t handle;
};
static_assert(sizeof(MapReq) == 8);
struct MapResp {
  uint64_t memory;  // always 0 (no host object or address crosses); the daemon passes an fd with the answer
  uint64_t offset;  // where the mapping starts in it
  uint64_t length;
  uint32_t flags;  // kMapWriteCombine
  uint32_t reserved;
};
static_assert(sizeof(MapResp) == 32);
inline constexpr uint32_t kMapWriteCombine = 1;
// A `uar` mapping that is memory the host watches, not MMIO: after a doorbell the client follows the
// wake-up protocol of uapi/doorbell.h (melon-emud sets it; a real card's UAR page never has it).
inline constexpr uint32_t kMapWatched = 2;

enum : uint32_t { kEventCompletion = 1, kEventAsync = 2 };
struct EventResp {
  uint32_t kind;  // kEventCompletion / kEventAsync
  uint32_t handle;  // the CQ, QP or SRQ; 0 for a device event
  uint32_t event_type;  // ibv_event_type for async events
  uint32_t dropped;  // events lost to a full queue since the last call
};
static_assert(sizeof(EventResp) == 16);
// EventResp.event_type: libibverbs' enum ibv_event_type values (verbs.h), the ones this ABI delivers.
// tests/mlx5/core/uapi_events_test checks them against the installed verbs.h.
enum IbvEvent : uint32_t {
  kIbvEventCqErr = 0,
  kIbvEventQpFatal = 1,
  kIbvEventQpReqErr = 2,
  kIbvEventQpAccessErr = 3,
  kIbvEventCommEst = 4,
  kIbvEventSqDrained = 5,
  kIbvEventPathMig = 6,
  kIbvEventPathMigErr = 7,
  kIbvEventDeviceFatal = 8,
  kIbvEventPortActive = 9,
  kIbvEventPortErr = 10,
  kIbvEventSrqErr = 14,
  kIbvEventSrqLimitReached = 15,
  kIbvEventQpLastWqeReached = 16,
};

// What the device holds, across all clients: the server's counts and the driver's own (firmware
// objects, queue memory, pinned client memory). Tests read it to prove a dead client left nothing.
struct UsageResp {
  uint32_t clients;
  uint32_t server_live[kObjTypes];  // by ObjType
  uint32_t core_live[8];  // the driver core's objects: uar, pd, mr, cq, srq, qp
  uint32_t reserved;
  uint64_t queue_bytes, pinned_bytes, dma_buffers, fw_pages;
};
static_assert(sizeof(UsageResp) == 104);

// The stable-driver gate (docs/gates.md): one no-FLR re-init of the whole function (TEARDOWN_HCA,
// pages taken, DISABLE_HCA, ENABLE_HCA, pages, SET_HCA_CAP, INIT_HCA, ... roce_en), refused with
// `busy` while any client holds an object and with `not_permitted` unless the host allows
// diagnostics. The anchor's StableInitCycle has the same number.
enum : uint32_t {
  kCycleInjectRoceEnQuirk = 1u << 0,  // emulated device: firmware 14.22's roce_en quirk for this cycle
};
struct CycleReq {
  uint32_t flags;  // kCycle*
  uint32_t reserved;
};
static_assert(sizeof(CycleReq) == 8);
struct CycleResp {
  uint32_t used_reset;  // 1: the no-FLR path failed and a function reset (FLR) brought the device up
  uint32_t ok;  // 1: the device is up (by either path)
  // The no-FLR path's failure when used_reset: stage (its name below), error, firmware command.
  uint32_t fail_opcode, fail_status, fail_syndrome, fail_err;
  char fail_stage[24];  // NUL-terminated stage name ("vport roce_en"), empty when none
  uint32_t roce_en, port_state;  // after the cycle
  uint32_t fw_rev[3];  // major, minor, subminor: the same before and after
  uint32_t reinits, fallbacks, resets;  // the core's counts since it started
  uint64_t cmdq_iova;  // the command queue's page: the same before and after
  uint64_t pages_given, pages_device;  // firmware pages the driver counts given, and the device holds
  uint32_t pages_quarantined, unknown_returns;
  uint32_t dma_buffers, reserved;  // the driver's DMA buffers
  uint64_t iova_bytes;  // bytes mapped in the IOMMU (0: the host cannot tell)
};
static_assert(sizeof(CycleResp) == 128);

// A struct's size on the wire (the empty ones are 0 bytes, not C++'s 1).
template <class T>
inline constexpr uint32_t wire_size = sizeof(T) == 1 ? 0 : uint32_t(sizeof(T));
// The size of a request or response at its first version: shorter requests are truncated. All
// structs are at their first version; an appended field adds a specialization here.
template <class T>
inline constexpr uint32_t first_size = wire_size<T>;

}  // namespace melon::uapi
