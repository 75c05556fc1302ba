// The interface between libibverbs (src/verbs) and the providers compiled into it
// (src/providers/*). C++ inside; the C ABI is only at the exported ibv_* boundary.
//
// Ownership: a Provider discovers Devices; a Device opens Contexts; a Context creates the verbs
// objects. Every object the application sees is an rdma-core struct (ibv_pd, ibv_cq_ex, ...) placed
// FIRST in one of the *Base structs below, so the library can go from the application's pointer to
// ours with a reinterpret_cast (the Base structs are standard-layout) and the provider can
// static_cast further to its own derived type.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace melon::verbs {

// The GRH's flow label is 20 bits (IBA 8.3). Callers may set more - UCX puts ~0 there on RoCE,
// relying on the device to keep the field's width, as mlx5's MLX5_SET does - so the bits above are
// dropped, never an error.
inline uint32_t flow_label_of(const ibv_global_route& grh) { return grh.flow_label & 0xfffff; }

class ContextOps;
class Device;

// ---- objects whose generic behaviour (events, acknowledgements) the library implements ----------

struct ContextBase {
  verbs_context vctx;  // application sees &vctx.context
  ContextOps* ops = nullptr;  // the provider's implementation of this context
  Device* device = nullptr;
  struct AsyncQueue* async = nullptr;  // library-owned; see post_async_event()
  struct ContextShare* share = nullptr;  // library-owned: the contexts sharing `ops` (import.cpp)

  static ContextBase* from(ibv_context* ctx) {
    return reinterpret_cast<ContextBase*>(reinterpret_cast<char*>(ctx) - offsetof(verbs_context, context));
  }
  ibv_context* ibv() { return &vctx.context; }
};

// Every CQ is an ibv_cq_ex (its first fields are ibv_cq), so both creation calls share one object.
struct CqBase {
  ibv_cq_ex ibv;
  uint32_t comp_events_delivered = 0;  // guarded by ibv.mutex; compared with comp_events_completed
  uint32_t async_events_delivered = 0;  // guarded by ibv.mutex
  ibv_wc cur{};  // the completion an extended poll (ibv_start_poll/ibv_next_poll) is positioned on

  // Positions the extended poll on `wc`: ibv_wc_read_* read it, status and wr_id are published.
  void position_on(const ibv_wc& wc) {
    cur = wc;
    ibv.status = wc.status;
    ibv.wr_id = wc.wr_id;
  }

  static CqBase* from(ibv_cq* cq) { return reinterpret_cast<CqBase*>(cq); }
  ibv_cq* cq() { return reinterpret_cast<ibv_cq*>(&ibv); }
};

struct SrqBase {
  ibv_srq ibv;
  uint32_t async_events_delivered = 0;  // guarded by ibv.mutex
  static SrqBase* from(ibv_srq* srq) { return reinterpret_cast<SrqBase*>(srq); }
};

struct WrBatch;

struct QpBase {
  ibv_qp_ex ibv;  // ibv.qp_base is the ibv_qp
  uint32_t async_events_delivered = 0;  // guarded by ibv.qp_base.mutex
  bool extended = false;  // created with send_ops_flags: ibv_qp_to_qp_ex works
  bool reliable_uc = false;  // a UC QP run as RC on the wire (reliable_uc_wanted, below)
  ibv_qp_init_attr init{};  // as created, with the capabilities granted: what ibv_query_qp reports
  WrBatch* batch = nullptr;  // state of the generic wr_* builders (init_qp_ex_ops)
  static QpBase* from(ibv_qp* qp) { return reinterpret_cast<QpBase*>(qp); }
};

// ---- what a provider implements -------------------------------------------------------------------

// One open context. Each method gets arguments the library has already checked for NULL (where a
// NULL is never valid) and returns an errno value (0 = success) or, for creators, the object or
// nullptr with errno set. Default implementations report EOPNOTSUPP.
class ContextOps {
 public:
  virtual ~ContextOps() = default;

  virtual int query_device_ex(ibv_device_attr_ex* attr) = 0;  // fills all 400 bytes
  virtual int query_port(uint8_t port, ibv_port_attr* attr) = 0;
  virtual int query_gid_entry(uint32_t port, uint32_t index, ibv_gid_entry* entry) = 0;
  virtual int query_pkey(uint8_t port, int index, __be16* pkey);

  virtual ibv_pd* alloc_pd();
  virtual int dealloc_pd(ibv_pd* pd);
  virtual ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access);
  virtual int rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, unsigned access);
  virtual int dereg_mr(ibv_mr* mr);
  // ibv_import_pd / ibv_import_mr: a new object naming the PD or MR of this provider context with
  // that handle (made through any context sharing it); ibv_unimport_* frees only that object.
  // Default: EOPNOTSUPP, and unimport does nothing.
  virtual ibv_pd* import_pd(uint32_t handle);
  virtual void unimport_pd(ibv_pd* pd);
  virtual ibv_mr* import_mr(ibv_pd* pd, uint32_t handle);
  virtual void unimport_mr(ibv_mr* mr);

  virtual ibv_cq_ex* create_cq(const ibv_cq_init_attr_ex* attr);
  virtual int resize_cq(ibv_cq* cq, int cqe);
  virtual int destroy_cq(ibv_cq* cq);

  virtual ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr);
  virtual int modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask);
  virtual int query_srq(ibv_srq* srq, ibv_srq_attr* attr);
  virtual int destroy_srq(ibv_srq* srq);

  virtual ibv_qp* create_qp(ibv_qp_init_attr_ex* attr);
  virtual int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  virtual int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init);
  virtual int destroy_qp(ibv_qp* qp);
  // The GSI, QP1 (IBA 13.4): the UD QP on which our librdmacm's CM agent sends and receives MADs
  // (src/rdmacm/mad_port.h). One per device at a time; ibv_create_qp never makes QPN 0 or 1.
  // `attr` as for create_qp, qp_type IBV_QPT_UD; destroyed, modified and posted to as any QP.
  // Default: EOPNOTSUPP (the device has no GSI in this process).
  virtual ibv_qp* create_gsi_qp(ibv_qp_init_attr_ex* attr);

  virtual ibv_ah* create_ah(ibv_pd* pd, const ibv_ah_attr* attr);
  virtual int destroy_ah(ibv_ah* ah);

  virtual int attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid);
  virtual int detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid);

  // Requests of the vendor's direct-verbs library (libmlx5.so.1 -> the mlx5 provider). A virtual
  // call, so that library needs no symbol beyond rdma-core's exports; `request` is that pair's own
  // code (src/providers/mlx5/dv_types.h). EOPNOTSUPP by default.
  virtual int direct(uint32_t request, void* in, void* out);

  // ibv_get_cq_event on a channel of this context calls this before it reads `fd`: if `fd` is
  // blocking, a provider may return once it is readable, doing its receive work in this thread
  // meanwhile, so a software provider wakes the waiter itself rather than through a thread of its
  // own (a non-blocking fd must return at once). An errno value leaves the waiting to the read.
  // An event this thread signals meanwhile for this channel is returned without passing through
  // `fd` (signal_comp_channel, channel_event_taken). The default returns 0 at once. A signal
  // handler run in this thread ends the wait with EINTR: ibv_get_cq_event then fails with it or
  // reads on, as a read of rdma-core's channel fd would (read_restarts_after_signal).
  virtual int wait_channel(int fd);

  // Called once from ibv_close_device after the library has released its own resources.
  virtual void close() = 0;
};

// One device as listed by ibv_get_device_list. Never freed while the process runs: applications
// may keep ibv_device pointers after ibv_free_device_list.
class Device {
 public:
  virtual ~Device() = default;

  // Stable identity: a rediscovered device with the same identity is the same device.
  virtual std::string identity() const = 0;
  virtual const char* name() const = 0;
  virtual __be64 node_guid() const = 0;  // network byte order
  virtual const char* board_id() const = 0;
  // Open a context: allocate a derived ContextBase+ContextOps and call init_context() on it.
  virtual ContextBase* open() = 0;

  ibv_device ibdev{};  // filled by the library when the device is registered
  int index = -1;  // ibv_get_device_index
};

class Provider {
 public:
  virtual ~Provider() = default;
  virtual const char* name() const = 0;
  // Current devices. The library keeps earlier objects whose identity() is unchanged.
  virtual std::vector<std::unique_ptr<Device>> discover() = 0;
};

// Register a compiled-in provider (static initialisation; see MELON_VERBS_PROVIDER).
void register_provider(Provider* provider);

#define MELON_VERBS_PROVIDER(type)                  \
  namespace {                                       \
  struct type##_registrar {                         \
    type##_registrar() {                            \
      static type instance;                         \
      ::melon::verbs::register_provider(&instance); \
    }                                               \
  } type##_registrar_instance;                      \
  }

// ---- reliable UC (src/verbs/reliable_uc.cpp) ---------------------------------------------------

// Reliable UC (MELON_UC_RELIABLE; docs/verbs.md "Reliable UC"): a UC QP that runs as RC on the wire,
// so a SEND that arrives before its receive is posted is RNR-NAKed and sent again instead of being
// dropped. For peers that both run MelonDMA: the verbs still see UC (its opcodes, its modify_qp
// attributes, its query_qp answers); a spec UC peer (rxe, a ConnectX with stock drivers) sees RC
// opcodes on a UC QP and drops them, so the sender ends with IBV_WC_RETRY_EXC_ERR.

// True when the environment asks for reliable UC on `device`: MELON_UC_RELIABLE=1 (every device)
// or a comma-separated list of device names. `device_option` is the device's own setting (the soft
// provider's config file), which MELON_UC_RELIABLE=0 overrides.
bool reliable_uc_wanted(const char* device, bool device_option);

// The RC attributes IBA 10.3.1 (Table 91) requires for INIT->RTR and RTR->RTS, which a UC modify
// never carries, as a reliable-UC QP runs them: no RDMA READ or atomics (UC has neither), the
// shortest RNR timer, and RNR retries for ever. Adds them to *attr and returns the mask to use.
int reliable_uc_complete(ibv_qp_state current, ibv_qp_attr* attr, int mask);

// What query_qp reports of those attributes for a UC QP: nothing (zero), as for any UC QP.
void reliable_uc_hide(ibv_qp_attr* attr);

constexpr uint8_t kReliableUcMinRnrTimer = 1;  // IBA Table 45: 0.01 ms
// 4.096 us * 2^18 = 1.07 s, NCCL's default for its RC QPs: a collective moves windows of large
// messages, and a peer that is slow to answer (a loaded host, melon-emud) should not draw spurious
// retransmissions of the whole window. A packet really lost on a LAN costs about a second.
constexpr uint8_t kReliableUcTimeout = 18;
constexpr uint8_t kReliableUcRetryCnt = 7;
constexpr uint8_t kReliableUcRnrRetry = 7;  // an RNR retry count of 7 means for ever (IBA)

// ---- library services for providers --------------------------------------------------------------

// Fill the verbs_context (sz, abi_compat, op slots, async fd) of a freshly allocated context and
// link it to `ops` and `dev`. Returns an errno value.
int init_context(ContextBase* base, ContextOps* ops, Device* dev);

// Initialise / tear down the application-visible synchronisation fields of an object.
void init_cq_fields(CqBase* cq, ibv_context* ctx, ibv_comp_channel* channel, void* cq_context, int cqe);
void init_srq_fields(SrqBase* srq, ibv_context* ctx, ibv_pd* pd, void* srq_context);
void init_qp_fields(QpBase* qp, ibv_context* ctx, const ibv_qp_init_attr_ex* attr);
// Keeps in qp->init what ibv_query_qp reports of the creation: `attr` with the capabilities granted.
void record_qp_init(QpBase* qp, const ibv_qp_init_attr_ex* attr, const ibv_qp_cap& granted);

// The ibv_wc_read_* callbacks of an extended CQ whose provider positions the poll with
// CqBase::position_on (the provider sets start_poll, next_poll and end_poll itself).
void init_cq_ex_readers(CqBase* cq);
void destroy_sync_fields(pthread_mutex_t* mutex, pthread_cond_t* cond);

// The ibv_qp_ex "new post send" builders, implemented on top of the context's post_send (each
// wr_* call records an ibv_send_wr; wr_complete posts the chain). For a provider whose native
// interface is ibv_post_send. Sets qp->extended. EOPNOTSUPP if send_ops_flags asks for an
// operation that has no ibv_send_wr form (IBV_QP_EX_WITH_ATOMIC_WRITE). Release on destroy.
int init_qp_ex_ops(QpBase* qp, uint64_t send_ops_flags);
void release_qp_ex_ops(QpBase* qp);

// Queue an asynchronous event on the context's async fd. Safe from any thread.
void post_async_event(ibv_context* ctx, const ibv_async_event& event);

// Queue a completion event for `cq` on its completion channel (no-op without one). The provider
// calls this when an armed CQ receives a completion (IBA 11.4.2.2 "request completion
// notification"). Safe from any thread. Called from a thread inside ContextOps::wait_channel for
// that same channel, the first such event is handed straight to that thread's ibv_get_cq_event
// instead (no byte through the channel's socket, which it would only read back).
void signal_comp_channel(ibv_cq* cq);

// Inside ContextOps::wait_channel: true once this thread's own work has signalled the channel it
// waits for (the wait may end; ibv_get_cq_event returns that event).
bool channel_event_taken();

// A wait other than read() (poll in wait_channel) ended with EINTR: whether the kernel would have
// restarted a read() of the channel fd instead, as it does when every handler of a signal this thread
// can take has SA_RESTART. rdma-core's ibv_get_cq_event is that read, and an application whose
// handler lacks SA_RESTART (qperf's SIGALRM ends its test) expects -1/EINTR from it.
bool read_restarts_after_signal();

}  // namespace melon::verbs
