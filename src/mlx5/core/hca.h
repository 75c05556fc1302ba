// The HCA driver core: one ConnectX function, from reset to a working RoCE device and back.
//
//   Hca hca;  hca.attach(&hal);  hca.bring_up();   ... objects ...   hca.teardown();
//
// bring_up() follows Linux's mlx5_function_setup/mlx5_load order, one named stage per step
// (Stage). Any failure returns at once with the stage, opcode, status and syndrome kept in
// last_failure() and logged. reinit() cycles the function without a reset (TEARDOWN_HCA, pages
// taken, DISABLE/ENABLE_HCA, ... INIT_HCA) and falls back to a function reset when it meets the
// roce_en quirk. The health poller (service()/health_check()) detects fatal firmware states and
// surprise removal; recover() resets the function and brings it up again.
//
// Objects (UAR, PD, MR, CQ, QP, SRQ, GID entries) live in objects.h; this class owns them all
// and destroys them in dependency order at teardown.
#pragma once

#include "mlx5/core/cmd_queue.h"
#include "mlx5/core/dma.h"
#include "mlx5/core/error.h"
#include "mlx5/core/hal.h"
#include "mlx5/core/objects.h"
#include "mlx5/core/pages.h"

namespace melon::mlx5::core {

#define MELON_MLX_STAGES(V)           \
  V(none, "none")                     \
  V(pci_enable, "PCI enable")         \
  V(wait_fw, "wait for firmware")     \
  V(cmd_init, "command queue")        \
  V(enable_hca, "ENABLE_HCA")         \
  V(issi, "ISSI")                     \
  V(boot_pages, "boot pages")         \
  V(hca_ctrl, "HOST_ENDIANNESS")      \
  V(set_hca_cap, "SET_HCA_CAP")       \
  V(init_pages, "init pages")         \
  V(init_hca, "INIT_HCA")             \
  V(query_caps, "query caps")         \
  V(uar, "UAR")                       \
  V(eqs, "EQs")                       \
  V(pd_td, "PD and transport domain") \
  V(roce_en, "vport roce_en")         \
  V(port_query, "port query")         \
  V(teardown_hca, "TEARDOWN_HCA")     \
  V(reclaim_pages, "reclaim pages")   \
  V(disable_hca, "DISABLE_HCA")       \
  V(function_reset, "function reset") \
  V(objects, "objects")

#define MELON_MLX_STAGE_ENUM(n, s) n,
enum class Stage : uint8_t { MELON_MLX_STAGES(MELON_MLX_STAGE_ENUM) };
#undef MELON_MLX_STAGE_ENUM
const char* stage_name(Stage s);

// Where and why a life-cycle operation failed.
struct Failure {
  Stage stage = Stage::none;
  Err err = Err::ok;
  CmdFailure cmd;
};

enum class HcaState : uint8_t { detached, down, up, fatal };
const char* hca_state_name(HcaState s);

// Why the health poller declared the device fatal (Linux health.c's sensors).
#define MELON_MLX_FATAL_REASONS(V)                               \
  V(none, "none")                                                \
  V(pci_gone, "PCI link lost (BAR reads all ones)")              \
  V(nic_disabled, "NIC interface disabled")                      \
  V(nic_sw_reset, "NIC interface in software reset")             \
  V(fw_syndrome, "firmware health syndrome (recovery required)") \
  V(health_stalled, "health counter stopped")

#define MELON_MLX_FATAL_ENUM(n, s) n,
enum class FatalReason : uint8_t { MELON_MLX_FATAL_REASONS(MELON_MLX_FATAL_ENUM) };
#undef MELON_MLX_FATAL_ENUM
const char* fatal_reason_name(FatalReason r);

struct HcaConfig {
  uint32_t cmd_timeout_ms = CmdQueue::kDefaultTimeoutMs;
  uint32_t fw_init_timeout_ms = 120000;  // Linux FW_INIT_TIMEOUT_MILI
  uint32_t async_eq_log_size = 7;
  uint32_t comp_eq_log_size = 8;
  uint32_t comp_eqs = 1;  // completion EQs (one vector each when the HAL has vectors)
  uint32_t health_misses = 3;  // health counter unchanged this many polls -> fatal
  uint32_t health_interval_ms = 2000;  // service() polls health this often (Linux: 2 s)
  bool enable_roce = true;
  uint32_t max_fw_pages = 1u << 20;  // 4 GiB of firmware pages at most
};

// Counters a benchmark or a test reads.
struct HcaStats {
  uint64_t bring_ups = 0, reinits = 0, reinit_fallbacks = 0, resets = 0, fatal_events = 0;
  uint64_t last_bring_up_ns = 0;
  uint64_t events = 0, page_requests = 0, unrouted_events = 0;
};

class Hca : private CmdWaitHooks, private VectorHandler {
 public:
  Hca() = default;
  ~Hca() { detach(); }
  Hca(const Hca&) = delete;
  Hca& operator=(const Hca&) = delete;

  void attach(Hal* hal, const HcaConfig& cfg = {});
  // Releases the core's own locks; the device must be down (teardown() first).
  void detach();
  // Reset to a working RoCE device. Returns ok or the first failure (see last_failure()).
  Err bring_up();
  // Every object destroyed in dependency order, every page taken back, every DMA buffer freed:
  // returns Err::leak when anything is left.
  Err teardown();
  // The failure that made the last reinit() fall back to a function reset.
  const Failure& last_reinit_fallback() const { return reinit_failure_; }
  // No-FLR re-init; on the roce_en quirk (or any failure past TEARDOWN_HCA) it reports the
  // stage and falls back to recover(). `used_reset` says which path succeeded.
  Err reinit(bool* used_reset = nullptr);
  // Function reset, then a full bring-up. Safe in any state, including fatal.
  Err recover();

  // Deferred work (page requests, health): the platform calls this after schedule_service()
  // and from a periodic timer.
  void service();
  // One health poll (Linux poll_health): returns true when the device is (now) fatal.
  bool health_check();
  // Event queues: drain them now (polling mode, or a test).
  void poll_events();

  HcaState state() const { return HcaState(__atomic_load_n(&state_, __ATOMIC_ACQUIRE)); }
  const Failure& last_failure() const { return failure_; }
  FatalReason fatal_reason() const { return fatal_reason_; }
  uint8_t fatal_syndrome() const { return fatal_syndrome_; }
  const HcaCaps& caps() const { return caps_; }
  const PortInfo& port() const { return port_; }
  const HcaStats& stats() const { return stats_; }
  const PageManager& pages() const { return pages_; }
  const DmaLedger& dma() const { return ledger_; }
  const CmdQueue& cmdq() const { return cmd_; }
  Hal& hal() { return *hal_; }
  uint32_t pdn() const { return pdn_; }
  uint32_t tdn() const { return tdn_; }
  uint32_t comp_eqn(uint32_t i) const { return i < ncomp_eqs_ ? comp_eqs_[i].eqn : 0; }
  uint32_t comp_eq_count() const { return ncomp_eqs_; }

  // Runs one command (for objects and tests). Returns Err::dead once fatal.
  Err cmd(const void* in, uint32_t in_len, void* out, uint32_t out_len, CmdFailure* fail = nullptr,
          uint32_t timeout_ms = 0);
  // Objects (objects.cpp and friends) ----------------------------------------------------------
  Err alloc_uar(Uar** out);
  Err free_uar(Uar* u);
  Err alloc_pd(Pd** out);
  Err free_pd(Pd* pd);
  // A memory key over HAL DMA segments (already pinned) or over a user range the core pins.
  Err create_mr(Pd* pd, uint64_t va, uint64_t len, uint32_t access, const DmaSegment* segs, uint32_t nsegs, Mr** out,
                uint32_t max_page_shift = 0);
  Err register_user_mr(Pd* pd, uint64_t addr, uint64_t len, uint32_t access, Mr** out);
  Err query_mr(Mr* mr, MrQuery* q);
  Err destroy_mr(Mr* mr);
  Err create_cq(const CqParams& p, Cq** out);
  Err query_cq(Cq* cq, CqQuery* q);
  Err modify_cq(Cq* cq, uint16_t period, uint16_t max_count);
  // A new ring of 1 << log_size 64-byte CQEs (docs/prm.md "Resizing a CQ"); unsupported without cq_resize.
  // `fail` gets the firmware's refusal (a ring too small for the unpolled CQEs is BAD_PARAM_ERR).
  Err resize_cq(Cq* cq, uint32_t log_size, const DmaSegment* buf, uint32_t nbuf, CmdFailure* fail = nullptr);
  Err destroy_cq(Cq* cq);
  Err create_srq(const SrqParams& p, Srq** out);
  Err query_srq(Srq* srq, SrqQuery* q);
  Err arm_srq(Srq* srq, uint16_t limit);
  Err destroy_srq(Srq* srq);
  Err create_qp(const QpParams& p, Qp** out);
  Err modify_qp(Qp* qp, QpTransition t, const QpAttr& a);
  Err query_qp(Qp* qp, QpQuery* q);
  Err destroy_qp(Qp* qp);
  // Port administrative state through the PAOS register (ACCESS_REG); a change comes back as a
  // PORT_CHANGE event, and service() then refreshes port().
  Err set_port_admin(bool up);
  Err query_port_oper(bool* up);
  Err set_gid(uint32_t index, const GidEntry& g);
  Err query_gid(uint32_t index, GidEntry* g);
  Err clear_gid(uint32_t index);
  // Live objects, by kind.
  uint32_t live(ObjKind k) const { return live_[uint8_t(k)]; }

  // Async events not owned by an object (port changes, fatal) go to this sink.
  void set_device_sink(EventSink* s) { device_sink_ = s; }

  // Vector handler (HAL interrupt context): drains the vector's EQ, defers page work.
  void on_vector(uint32_t vector) override;

 private:
  friend class HcaTestAccess;
  struct Eq {
    DmaBuffer buf;
    uint32_t eqn = 0, log_size = 0, cc = 0, vector = 0;
    bool live = false;
    void* lock = nullptr;
  };

  // CmdWaitHooks
  void cmd_wait_idle() override;
  bool cmd_device_dead() override;

  // Bring-up steps (hca_init.cpp): each one builds its commands and checks the answers.
  Err wait_fw(uint32_t timeout_ms);
  Err enable_hca();
  Err disable_hca();
  Err set_issi();
  Err set_host_endianness();
  Err query_caps(uint8_t type, uint8_t mode, uint8_t* out_cap);
  Err set_hca_caps();
  Err init_hca();
  Err teardown_hca();
  Err query_all_caps();
  Err setup_eqs();
  Err alloc_pd_td();
  Err set_roce_en(bool on);
  Err query_port();
  Err setup_from_enable();  // ENABLE_HCA .. port query (shared by bring_up and reinit)
  Err unload();  // objects .. EQs .. PD/TD .. UAR (shared by teardown and reinit)
  Err release_hca();  // TEARDOWN_HCA, pages, DISABLE_HCA
  void reset_software_state();

  Err alloc_uar_index(uint32_t* index);
  Err dealloc_uar_index(uint32_t index);
  Err alloc_uar_span(uint32_t per_page, uint32_t* first);
  Err release_uar_indices(const Uar& u);
  void fill_uar(Uar* u, uint32_t index);
  Err create_eq(Eq& eq, uint32_t log_size, uint64_t mask, uint32_t vector);
  void destroy_eq(Eq& eq);
  void drain_eq(Eq& eq, bool from_vector = false);
  void dispatch_eqe(const uint8_t* eqe);
  void route_async(uint8_t type, uint8_t sub, uint32_t number, bool srq_obj);

  void enter_fatal(FatalReason r, uint8_t syndrome);
  bool fatal_syndrome_sensor();  // the health buffer says fatal: enter_fatal, true
  void notify_lost();
  void fence_bus_master();
  void log_health_buffer();

  Err fail(Err e);
  Err step(Stage s, Err e) {
    if (e != Err::ok) {
      failure_.stage = s;
      return fail(e);
    }
    return e;
  }
  Err destroy_all_objects();
  void drop_all_objects();  // after a reset: the device forgot them; free our records
  void link(ObjHeader* o, ObjKind k);
  void unlink(ObjHeader* o);
  template <class T>
  T* new_obj(ObjKind k);
  void delete_obj(ObjHeader* o, size_t size);

  Hal* hal_ = nullptr;
  HcaConfig cfg_;
  uint8_t state_ = uint8_t(HcaState::detached);  // HcaState, read from event contexts
  void set_state(HcaState s) { __atomic_store_n(&state_, uint8_t(s), __ATOMIC_RELEASE); }
  Stage stage_ = Stage::none;
  Failure failure_, reinit_failure_;
  CmdFailure last_cmd_;
  FatalReason fatal_reason_ = FatalReason::none;
  uint8_t fatal_syndrome_ = 0;
  DmaLedger ledger_;
  CmdQueue cmd_;
  PageManager pages_;
  HcaCaps caps_;
  PortInfo port_;
  HcaStats stats_;
  bool cmd_ready_ = false, hca_enabled_ = false, hca_inited_ = false, roce_enabled_ = false;
  uint32_t pdn_ = 0, tdn_ = 0;
  bool pd_live_ = false, td_live_ = false;
  bool port_dirty_ = false;  // a PORT_CHANGE arrived: service() re-reads the port
  Uar* eq_uar_ = nullptr;
  Eq async_eq_;
  static constexpr uint32_t kMaxCompEqs = 8;
  Eq comp_eqs_[kMaxCompEqs];
  uint32_t ncomp_eqs_ = 0;
  bool vectors_ = false;
  uint32_t health_count_ = 0, health_miss_ = 0;
  uint64_t last_health_ns_ = 0;
  ObjHeader* objs_ = nullptr;  // every live object, newest first
  uint32_t live_[uint8_t(ObjKind::count)] = {};
  EventSink* device_sink_ = nullptr;
  void* obj_lock_ = nullptr;
};

}  // namespace melon::mlx5::core
