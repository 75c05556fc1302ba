// The soft RoCE provider: the control plane (devices, GIDs, PD, MR, CQ, SRQ, AH) and the
// provider-internal interface the transport engine (src/rc) and its progress thread will use:
//
//   SoftDevice::mrs().resolve(...)  an lkey/rkey + range + required access -> host pointer or error
//   SoftCq::push(wc, solicited)     deliver one completion (ring, CQ overrun, notification)
//   SoftSrq::pop(&wqe)              take one receive WQE from a shared receive queue
//   SoftDevice::spec() / gid()      the device's addresses, GID table, port MTU
//   post_async_event()              (src/verbs/provider.h) QP/CQ/SRQ/port events
//
// QPs live in soft_qp.h/.cpp, the device's lanes in hub.h/.cpp (the transport engine behind UDP sockets).
//
// Locks: each object says which mutex guards which fields beside them: the MR table's shared_mutex
// (lookups shared, changes exclusive, gen_ bumped after), a CQ's mu (its ring; `ready` read without
// it), the context's hub_mu_ and import_mu_. Reference counts (`users`) are atomics.
#pragma once

#include "providers/soft/soft_config.h"
#include "rc/engine.h"
#include "verbs/provider.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace melon::soft {

// Device identity (perftest's ib_dev_name() in src/perftest_parameters.c picks its code path by
// vendor_part_id): outside the Mellanox (0x02c9) and EFA (0x1d0f) vendor
// ids and outside perftest's ConnectX/BlueField/EFA part-id tables, so perftest takes the plain
// ibv_post_send path.
constexpr uint32_t kVendorId = 0x4d454c;  // "MEL"
constexpr uint32_t kVendorPartId = 0x534f;  // "SO"
constexpr int kGidTableLen = 16;

class SoftContext;
class Hub;

// ---- memory regions -------------------------------------------------------------------------------

// Why a key did not resolve. The engine maps these to completion statuses
// (local: IBV_WC_LOC_PROT_ERR; remote: IBV_WC_REM_ACCESS_ERR / NAK "remote access error").
enum class MrStatus {
  Ok,
  BadKey,  // no live MR with this key (wrong index or stale generation)
  WrongPd,  // the MR belongs to another protection domain (IBA C10-? : PD check)
  OutOfRange,  // [addr, addr+len) not inside [iova, iova+length)
  NoAccess,  // the MR does not grant the access asked for
};

// What a PD shares with its imports (ibv_import_pd): the count of objects using it (MRs, AHs,
// SRQs, QPs), and whether it still exists: ibv_dealloc_pd through any of them ends it.
struct SoftPdState {
  std::atomic<int> users{0};
  bool live = true;
};

// What an MR shares with its imports (ibv_import_mr): the registration as it is now (a rereg
// through the original changes it; an import keeps the keys it was made with, as in rdma-core).
struct SoftMrState {
  std::shared_ptr<SoftPdState> pd;  // the PD it is registered in, counted in its users
  bool live = true;  // ibv_dereg_mr through any of them ends it
  uint32_t lkey = 0, rkey = 0;
  void* addr = nullptr;
  size_t length = 0;
  uint64_t iova = 0;
  unsigned access = 0;  // IBV_ACCESS_* without the optional bits
};

struct SoftMr {
  ibv_mr ibv;  // first: the application's pointer
  std::shared_ptr<SoftMrState> state = std::make_shared<SoftMrState>();
};

// Which key of an MR: the lkey (local access: gather, scatter, READ response placement) or the rkey
// (an incoming RDMA request). One never stands in for the other.
enum class KeyKind { local, remote };

// Keys of every MR of one device. Each registration, and each re-registration, draws a fresh random
// lkey and rkey (32 unpredictable bits each, distinct, never 0), so a key cannot be guessed from
// another process, another run or an earlier MR, and a stale key stops resolving at once.
class MrTable {
 public:
  struct Keys {
    uint32_t lkey = 0, rkey = 0, slot = 0;
  };
  // Register; false if the table is full.
  bool add(ibv_pd* pd, uint64_t iova, uint64_t length, void* host, unsigned access, Keys* keys);
  void remove(uint32_t lkey);
  // Change an entry in place and give it new keys (rereg); false if `lkey` is not live.
  bool update(uint32_t lkey, ibv_pd* pd, uint64_t iova, uint64_t length, void* host, unsigned access, Keys* keys);

  // The data-path lookup. `need` is the access the operation requires:
  //   0                          local read (gather for SEND/WRITE, the source of a READ response)
  //   IBV_ACCESS_LOCAL_WRITE     local write (scatter of a RECV, READ response, atomic result)
  //   IBV_ACCESS_REMOTE_READ / _REMOTE_WRITE / _REMOTE_ATOMIC   an incoming RDMA request
  // On Ok, *host is the process address of `addr`. Thread-safe (shared lock).
  MrStatus resolve(KeyKind kind, uint32_t key, const ibv_pd* pd, uint64_t addr, uint64_t len, unsigned need,
                   void** host) const;
  // The same check by PD handle (ibv_pd::handle, unique in the process): the form the transport
  // engine's rc::Memory::local()/remote() use (src/rc/engine.h), whose access bits are the
  // IBV_ACCESS_* values.
  MrStatus resolve_by_pd_handle(KeyKind kind, uint32_t key, uint32_t pd_handle, uint64_t addr, uint64_t len,
                                unsigned need, void** host) const;

  struct Entry {
    bool live = false;
    uint32_t lkey = 0, rkey = 0;
    const ibv_pd* pd = nullptr;
    uint32_t pd_handle = 0;
    uint64_t iova = 0, length = 0;
    uintptr_t host = 0;
    unsigned access = 0;
  };
  // The last keys one caller resolved, reused while no registration has changed since (every add,
  // remove and update moves the table's generation), so packets to and from the same buffers take
  // no lock. A cache belongs to one thread at a time (a lane, under its engine lock). A key used
  // after its MR changed is looked up again, as an uncached one: the same answer, at the same
  // moment (the generation is read where the shared lock would be taken).
  struct Cache {
    static constexpr int kSize = 4;
    struct Line {
      uint64_t gen = UINT64_MAX;
      KeyKind kind = KeyKind::local;
      uint32_t key = 0;
      Entry e;
    } line[kSize];
    int next = 0;  // the line the next miss replaces
  };
  // resolve_by_pd_handle through `cache` (the engine's lookups, Hub::map_key).
  MrStatus resolve_cached(Cache& cache, KeyKind kind, uint32_t key, uint32_t pd_handle, uint64_t addr, uint64_t len,
                          unsigned need, void** host) const;

  size_t live() const;

 private:
  std::atomic<uint64_t> gen_{0};  // changed under mu_ held exclusively, after the change
  MrStatus check(const Entry* e, uint64_t addr, uint64_t len, unsigned need, void** host) const;
  const Entry* live_entry(KeyKind kind, uint32_t key) const;  // caller holds mu_
  void new_keys(Entry& e, uint32_t slot);  // caller holds mu_ exclusively
  mutable std::shared_mutex mu_;
  std::vector<Entry> slots_;
  std::vector<uint32_t> free_;
  std::unordered_map<uint32_t, uint32_t> lkeys_, rkeys_;  // key -> slot
};

// ---- devices --------------------------------------------------------------------------------------

class SoftDevice : public verbs::Device {
 public:
  explicit SoftDevice(const DeviceSpec& spec);

  std::string identity() const override { return spec_.identity(); }
  const char* name() const override { return spec_.name.c_str(); }
  __be64 node_guid() const override { return guid_; }
  const char* board_id() const override { return "MELON_SOFT_ROCE"; }
  verbs::ContextBase* open() override;

  const DeviceSpec& spec() const { return spec_; }
  MrTable& mrs() { return mrs_; }

  void device_attr(ibv_device_attr_ex* attr) const;
  void port_attr(ibv_port_attr* attr) const;
  // GID table entry `index` of port 1; false if the slot is empty.
  bool gid(uint32_t index, ibv_gid_entry* entry) const;
  // The address of a GID table entry (what the engine binds/sends from).
  const IpAddr* gid_address(uint32_t index) const;
  // The source address for traffic from GID `index` to `dgid`, or nullptr with *err: EINVAL (no
  // such entry, or IPv4 and IPv6 mixed), EAFNOSUPPORT (this platform cannot use the family; the
  // reason goes to stderr once).
  const IpAddr* source_address(uint32_t index, const uint8_t dgid[16], int* err) const;
  ibv_mtu active_mtu() const;

 private:
  DeviceSpec spec_;
  __be64 guid_;
  MrTable mrs_;
};

// ---- objects --------------------------------------------------------------------------------------

struct SoftPd {
  ibv_pd ibv;
  std::shared_ptr<SoftPdState> state = std::make_shared<SoftPdState>();  // shared with its imports
  static std::atomic<int>& users(const ibv_pd* pd) { return reinterpret_cast<const SoftPd*>(pd)->state->users; }
};

struct SoftAh {
  ibv_ah ibv;
  ibv_ah_attr attr{};
  IpAddr dest;  // from attr.grh.dgid
  IpAddr source;  // GID attr.grh.sgid_index of the device
  rc::AddressVector av;  // the same, as the engine takes it (UD sends)
};

// Completion queue: a ring of ibv_wc, plus the request-notification state.
struct SoftCq : verbs::CqBase {
  SoftContext* ctx = nullptr;
  uint64_t wc_flags = 0;
  bool ignore_overrun = false;
  std::atomic<int> users{0};  // QPs
  std::atomic<uint32_t> lanes{0};  // bit i: a QP of lane i has completed or may complete here (hub.h)

  // `count` as push() and poll() last left it (written under mu): poll() of an empty CQ, which a
  // busy-polling application makes all the time, reads this instead of taking the lock. A push
  // always stores it, so it is never 0 while a completion waits; after an extended-CQ poll it may
  // be high for a while, which only costs a lock.
  std::atomic<size_t> ready{0};

  std::mutex mu;  // guards everything below
  std::vector<ibv_wc> ring;
  size_t head = 0, count = 0;
  bool armed = false, solicited_only = false, overrun = false;

  // Deliver one completion. Returns false if the CQ is full (the completion is lost; an
  // IBV_EVENT_CQ_ERR is queued once, as for a hardware CQ overrun). `solicited`: the message
  // carried the Solicited Event bit (IBA 10.7.2.2 / 11.4.2.2), relevant to solicited-only arming.
  bool push(const ibv_wc& wc, bool solicited);
  int poll(int n, ibv_wc* out);
  static SoftCq* from(ibv_cq* cq) { return static_cast<SoftCq*>(verbs::CqBase::from(cq)); }
};

// A shared receive queue: the engine holds the WQEs (its SRQ is the one the responder takes from).
struct SoftSrq : verbs::SrqBase {
  SoftContext* ctx = nullptr;
  Hub* hub = nullptr;
  size_t lane = 0;  // the SRQ and its QPs live in one lane (hub.h)
  rc::Srq* engine = nullptr;
  uint32_t srqn = 0;
  uint32_t max_wr = 0, max_sge = 0;

  int post(ibv_recv_wr* wr, ibv_recv_wr** bad);
  static SoftSrq* from(ibv_srq* srq) { return static_cast<SoftSrq*>(verbs::SrqBase::from(srq)); }
};

// ---- context --------------------------------------------------------------------------------------

class SoftContext : public verbs::ContextBase, public verbs::ContextOps {
 public:
  explicit SoftContext(SoftDevice* dev) : dev_(dev) {}
  SoftDevice* device() const { return dev_; }
  static SoftContext* from(ibv_context* ctx) { return static_cast<SoftContext*>(verbs::ContextBase::from(ctx)); }

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

  ibv_ah* create_ah(ibv_pd* pd, const ibv_ah_attr* attr) override;
  int destroy_ah(ibv_ah* ah) override;

  ibv_qp* create_qp(ibv_qp_init_attr_ex* attr) override;
  ibv_qp* create_gsi_qp(ibv_qp_init_attr_ex* attr) override;  // QPN 1, in the lane QPN 1 steers to
  int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) override;
  int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) override;
  int destroy_qp(ibv_qp* qp) override;

  void close() override;
  int wait_channel(int fd) override;  // the transport's wait_readable (udp_transport.h)

  // The device's transport, started on first use (QP or SRQ) and held until close.
  Hub* hub(int* err);
  Hub* hub_if_started() const { return hub_.load(std::memory_order_acquire); }
  // A QP of `lane` completes on `cq` (bit in SoftCq::lanes, and in its channel's lanes).
  void cq_uses_lane(SoftCq* cq, size_t lane);
  bool owns(const ibv_pd* pd) const { return pd && pd->context == &vctx.context; }
  bool owns(const ibv_cq* cq) const { return cq && cq->context == &vctx.context; }

 private:
  ibv_qp* make_qp(ibv_qp_init_attr_ex* attr, uint32_t fixed_qpn);
  SoftDevice* dev_;
  std::atomic<Hub*> hub_{nullptr};
  std::mutex hub_mu_;  // also guards channel_lanes_
  std::unordered_map<int, uint32_t> channel_lanes_;  // completion channel fd -> lanes of its CQs' QPs
  std::mutex import_mu_;  // guards the two maps below: live PDs and MRs by handle (ibv_import_*)
  std::unordered_map<uint32_t, std::shared_ptr<SoftPdState>> pds_;
  std::unordered_map<uint32_t, std::shared_ptr<SoftMrState>> mr_handles_;
};

// Access bits that reg_mr accepts (the rest of the defined bits are EOPNOTSUPP / EINVAL).
unsigned validate_mr_access(unsigned access, int* err);

}  // namespace melon::soft
