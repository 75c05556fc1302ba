// The model behind emu::Device: one ConnectX-4 Lx function. Every method here runs with mu_ held
// (Device takes it); effects that leave the device (MSI-X, frames) are queued in `out_` and
// delivered by Device after the lock is dropped.
#pragma once

#include <atomic>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "mlx5/emu/device.h"
#include "mlx5/emu/syndromes.h"
#include "mlx5/prm/prm.h"
#include "rc/engine.h"

namespace melon::mlx5::emu {

namespace prm = ::melon::mlx5::prm;

// Life cycle of the function (PRM "HCA initialization"; Linux main.c mlx5_function_setup order).
enum class FwState {
  kBooting,  // after power-up/FLR: `initializing` reads 1 until init_delay_ns passes
  kReady,  // firmware up: the command queue may be programmed; only ENABLE_HCA and a few queries work
  kEnabled,  // ENABLE_HCA done: ISSI, pages, caps
  kInitialized,  // INIT_HCA done: objects and data path
  kFatal,  // fatal health syndrome: nothing completes until FLR
  kRemoved,  // surprise removal: reads all ones, nothing happens
};

// A command's outcome: the status byte and syndrome of its output header.
struct CmdStatus {
  uint8_t status = prm::cmd_status::OK;
  uint32_t syndrome = 0;
  bool ok() const { return status == prm::cmd_status::OK; }
};

// One command as the handlers see it: the whole input (inline part + mailbox data) and an output
// buffer of the length the driver gave.
struct Cmd {
  const uint8_t* in;
  uint32_t in_len;
  uint8_t* out;
  uint32_t out_len;
  uint16_t opcode, op_mod;
};

inline CmdStatus fail(uint8_t status, uint32_t syndrome) { return CmdStatus{status, syndrome}; }

// ---- objects (PRM contexts, the parts the model acts on) ----

struct FwPage {
  uint64_t iova;
  bool used;  // holds ICM (object contexts) now: the device will not give it back
};

struct Eq {
  uint32_t eqn = 0;
  uint8_t log_size = 0, log_page_size = 0, page_offset = 0;
  uint32_t uar = 0;
  uint16_t intr = 0;
  uint64_t mask = 0;  // event types this EQ receives
  std::vector<uint64_t> pas;
  uint32_t cons = 0, prod = 0;  // consumer index from doorbells; producer counter
  bool armed = false;
  uint8_t status = 0;  // prm::eqc_status
  uint64_t overruns = 0;
};

enum class CqArm : uint8_t { kNone, kNext, kSolicited };

class Hca;

// Work completions of one CQ from the transport, as the device turns them into CQEs.
struct CqSink : rc::CompletionSink {
  Hca* hca = nullptr;
  uint32_t cqn = 0;
  bool send = false;  // requester completions (REQ CQEs) or responder ones (RESP CQEs)
  bool push(const rc::Wc& wc) override;
};

struct Cq {
  uint32_t cqn = 0;
  uint8_t log_size = 0, log_page_size = 0, page_offset = 0, cqe_sz = 0;
  bool oi = false;  // overrun ignore
  uint32_t uar = 0, eqn = 0;
  std::vector<uint64_t> pas;
  uint64_t dbr = 0;
  uint32_t prod = 0;
  CqArm arm = CqArm::kNone;
  uint8_t arm_sn = 0;
  bool solicited_pending = false;  // a solicited CQE arrived since the last notification
  uint8_t status = 0;  // prm::cqc_status
  uint16_t cq_period = 0, cq_max_count = 0;
  uint32_t refs = 0;  // QPs/SRQs using it
  std::unique_ptr<CqSink> send_sink, recv_sink;
  uint32_t queued = 0;  // completions taken from the transport, not yet written
  bool overrun_pending = false;  // the transport had a completion with no room: CQ_ERROR after the queued ones
};

struct Mkey {
  uint32_t index = 0;
  uint8_t key8 = 0;
  uint32_t pd = 0;
  uint8_t access_mode = 0;
  bool lr = false, lw = false, rr = false, rw = false, a = false;
  uint64_t start = 0, len = 0;
  bool len64 = false;  // covers the whole address space
  uint8_t log_page_size = 12;
  std::vector<uint64_t> mtt;  // page IOVAs (MTT mode)
  bool free = false;  // invalid until re-enabled (created free, or invalidated remotely)
  bool en_rinval = false;  // a SEND with invalidate may invalidate it
  uint32_t key() const { return (index << 8) | key8; }
};

// A DEVX user memory registration (CREATE_UMEM): the pages of one host buffer, by IOVA.
struct Umem {
  uint32_t id = 0;
  uint8_t log_page_size = 12;
  uint32_t page_offset = 0;
  std::vector<uint64_t> mtt;  // page IOVAs
  bool writable = false;  // every entry has wr_en
};

struct Srq {
  uint32_t srqn = 0;
  bool rmp = false;
  uint8_t log_size = 0, log_stride = 0, log_page_size = 0, page_offset = 0;
  uint32_t pd = 0, cqn = 0;
  std::vector<uint64_t> pas;
  uint64_t dbr = 0;
  uint16_t lwm = 0;
  uint8_t state = 0;
  uint32_t taken = 0;  // receive WQEs handed to the transport so far
  uint16_t head = 0;  // next WQE of the linked list (PRM: follow next_wqe_index)
  uint32_t refs = 0;
  rc::Srq* engine_srq = nullptr;
  uint32_t engine_srqn = 0;  // the transport's number for it (its events name that one)
};

struct Qp {
  uint32_t qpn = 0;
  uint8_t state = prm::qpc_state::RST;
  uint8_t st = 0;
  uint32_t pd = 0, uar = 0, cqn_snd = 0, cqn_rcv = 0, srqn = 0, counter_set = 0;
  uint8_t rq_type = 0;  // 0 regular, 1 SRQ/RMP, 3 zero-length
  bool no_sq = false;
  uint8_t log_rq_size = 0, log_rq_stride = 0, log_sq_size = 0, log_page_size = 0, page_offset = 0;
  std::vector<uint64_t> pas;
  uint64_t dbr = 0;
  uint8_t qpc[prm::qpc::size_bytes] = {};  // the context as last set (create + transitions)
  uint32_t sq_pi = 0;  // send WQEBBs the device has taken (its hw counter)
  uint32_t rq_taken = 0;  // receive WQEs handed to the transport
  uint32_t sq_wqe_cnt = 0;  // WQEs taken
  uint32_t user_index = 0;  // reported in CQEs (cqe_version 1)
  std::vector<rc::AddressVector> avs;  // UD address vectors by SQ slot (the engine keeps a pointer)
};

struct GidEntry {
  bool valid = false;
  uint8_t addr[prm::roce_addr_layout::size_bytes] = {};
  // The address as a 16-byte GID. An IPv4 entry keeps its address in the last 4 bytes of
  // source_l3_address (Linux mlx5_core_roce_gid_set); its GID is the IPv4-mapped ::ffff:a.b.c.d.
  void gid(uint8_t out[16]) const {
    const uint8_t* l3 = prm::addr(addr, prm::roce_addr_layout::source_l3_address);
    if (prm::get(addr, prm::roce_addr_layout::roce_l3_type) == prm::roce_l3_type::IPV4) {
      static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      memcpy(out, kMapped, 12);
      memcpy(out + 12, l3 + 12, 4);
    } else {
      memcpy(out, l3, 16);
    }
  }
};

// A Q counter set: the values at the last clear (queries report the transport's counts minus these).
struct QCounter {
  uint32_t id = 0;
  uint32_t out_of_buffer = 0, out_of_sequence = 0, duplicate_request = 0, rnr_nak_retry_err = 0, packet_seq_err = 0,
           local_ack_timeout_err = 0;
};

class Hca {
 public:
  Hca(const HostPorts& ports, const DeviceConfig& config);
  ~Hca();

  std::mutex mu_;  // the device lock; Device holds it around every call into Hca

  // ---- bar0.cpp ----
  uint32_t mmio_read32(uint64_t off);
  void mmio_write(uint64_t off, const uint8_t* bytes, size_t len);
  uint64_t uar_page_bytes() const;  // as SET_HCA_CAP left log_uar_page_sz

  // ---- config_space.cpp ----
  uint32_t cfg_read(uint32_t off, unsigned width);
  void cfg_write(uint32_t off, unsigned width, uint32_t value);
  void cfg_reset();  // PCIe reset values (FLR, power-up)
  void cfg_enumerate();  // Device::enumerate()
  bool mmio_decoded() const;  // memory space on and BAR0 assigned
  bool msix_blocked(uint16_t vector) const;
  void msix_release_pending();
  uint32_t msix_read(uint64_t off);
  void msix_write(uint64_t off, uint32_t value);

  // ---- hca.cpp ----
  void reset(bool power_on);  // FLR or power-up: lose everything
  bool service();
  uint64_t next_deadline();  // when service() next has work (ns; 0: queued now), or UINT64_MAX
  uint64_t timer_deadline();  // the same for timers alone (queued work kicks the worker itself)
  uint64_t now() { return ports_.clock->now_ns(); }
  void update_fw_state();  // booting -> ready when the delay has passed
  bool dma_read(uint64_t iova, void* dst, size_t len);
  bool dma_write(uint64_t iova, const void* src, size_t len);
  bool dma_writable(uint64_t iova, size_t len);  // dma_write's checks, nothing moved
  void raise_irq(uint16_t vector);
  void enter_fatal(uint8_t syndrome);
  bool alive() const { return state_ != FwState::kFatal && state_ != FwState::kRemoved; }

  // ---- doorbells (bar0.cpp latches them, service() runs them) ----
  enum class DbKind : uint8_t { kCqArm, kEqArm, kEqUpdate, kSend };
  struct Doorbell {
    DbKind kind;
    uint32_t uar;  // UAR page index the write hit
    uint8_t bytes[64];  // the doorbell value (send: the first bytes of the WQE's ctrl segment)
    uint32_t len;
  };
  std::deque<Doorbell> doorbells_;
  void run_doorbell(const Doorbell& db);

  // Effects delivered outside the lock.
  struct Outbox {
    std::vector<uint16_t> irqs;
    std::vector<std::vector<uint8_t>> frames;
  } out_;
  bool sending_ = false;  // a thread is handing out_.frames to the port (device.cpp, Locked)
  // ACKs held for the host's next request (DeviceConfig::ack_hold_ns), until held_until_.
  std::vector<std::vector<uint8_t>> held_;
  std::atomic<bool> holding_{false};  // held_ is not empty (read without the lock)
  uint32_t ack_hold_ns_ = 0;
  uint64_t held_until_ = 0;
  uint64_t recv_cqes_ = 0;  // receive completions written (a held ACK answers one)
  void hold_acks(size_t first_new, uint64_t recv_cqes_before);
  void release_held(bool due);

  HostPorts ports_;
  DeviceConfig cfg_;
  SteadyClock own_clock_;  // used when ports_.clock is null
  Faults faults_;
  Device::Stats stats_;
  FwState state_ = FwState::kBooting;
  uint64_t boot_done_ns_ = 0;  // when `initializing` clears
  uint64_t health_epoch_ns_ = 0;  // health counter = (now - epoch) / period while alive
  uint32_t health_counter_frozen_ = 0;
  void freeze_health_counter() {
    health_counter_frozen_ = uint32_t((now() - health_epoch_ns_) / cfg_.health_period_ns);
  }
  uint8_t health_synd_ = 0;

  // Initialization segment image (big-endian, as the PRM lays it out); dynamic fields are refreshed
  // on every read.
  uint8_t iseg_[prm::initial_seg::size_bytes] = {};
  void iseg_refresh();
  // Init segment registers the driver writes.
  uint32_t cmdq_addr_h_ = 0, cmdq_addr_l_ = 0;  // as written (addr_l keeps nic_interface bits)
  bool cmdq_valid_ = false;  // an address has been programmed since the last reset
  uint32_t pending_cmd_bits_ = 0;  // doorbell bits not yet serviced
  uint32_t busy_cmd_bits_ = 0;  // entries the device owns (taken, maybe never completed)

  // PCI config space image (4 KiB).
  uint8_t pci_[4096] = {};
  std::vector<uint32_t> msix_table_;  // 4 dwords per vector: address lo, hi, data, vector control
  std::vector<bool> msix_pending_;
  bool pci_bar_sizing_ = false;

  // ---- the command engine (cmd_queue.cpp, cmd_table.cpp) ----
  void run_commands();
  void run_command(unsigned idx);
  CmdStatus dispatch(Cmd& c);

  // ---- firmware state the commands change ----
  bool enabled_once_ = false;
  uint16_t issi_ = 0;
  uint8_t cur_caps_[prm::cmd_hca_cap::size_bytes] = {};  // SET_HCA_CAP (general)
  uint8_t max_caps_[prm::cmd_hca_cap::size_bytes] = {};
  uint8_t roce_caps_[prm::roce_cap::size_bytes] = {};
  void build_caps();
  bool torn_down_since_flr_ = false;  // a TEARDOWN_HCA happened with no FLR after it (fw 14.22 quirk)

  // Firmware pages (fw_pages.cpp). Demands are counted in pages; negative = the device gives back.
  std::map<uint64_t, FwPage> pages_;  // by IOVA
  std::set<uint64_t> returned_pages_;  // pages taken back, watched for use-after-take
  int32_t boot_pages_owed_ = 0, init_pages_owed_ = 0, regular_pages_owed_ = 0;
  bool boot_pages_done_ = false, init_pages_done_ = false;
  CmdStatus query_pages(Cmd& c);
  CmdStatus manage_pages(Cmd& c);
  void page_request(int32_t npages);  // PAGE_REQUEST event
  // A slot in a held page for an object context; kNoIcm if none. (IOVA 0 is a page like any other:
  // an IOMMU whose range starts at 0 hands it out, and rdma-core's mlx5_vfio gives it first.)
  static constexpr uint64_t kNoIcm = ~0ull;
  uint64_t icm_alloc(uint32_t bytes);
  void icm_free(uint64_t addr);
  bool icm_write(uint64_t addr, const void* ctx, uint32_t len);
  std::map<uint64_t, uint32_t> icm_slots_;  // ICM address -> bytes
  void release_all_pages_to_driver();

  // Objects.
  std::set<uint32_t> uars_, pds_, tds_;
  std::map<uint32_t, QCounter> qcounters_;
  std::map<uint32_t, Eq> eqs_;
  std::map<uint32_t, Cq> cqs_;
  std::map<uint32_t, Mkey> mkeys_;
  std::map<uint32_t, Qp> qps_;
  std::map<uint32_t, Srq> srqs_;
  std::map<uint32_t, Umem> umems_;
  // ICM slot of each object that has a context in firmware pages, keyed by kind and number.
  enum class IcmObj : uint32_t { eq = 1, cq, mkey, qp, srq };
  static uint32_t icm_key(IcmObj kind, uint32_t n) { return uint32_t(kind) << 24 | n; }
  void icm_keep(IcmObj kind, uint32_t n, uint64_t icm) { icm_of_[icm_key(kind, n)] = icm; }
  void icm_release(IcmObj kind, uint32_t n) {
    auto it = icm_of_.find(icm_key(kind, n));
    if (it == icm_of_.end()) return;
    icm_free(it->second);
    icm_of_.erase(it);
  }
  std::map<uint32_t, uint64_t> icm_of_;
  GidEntry gids_[256];
  bool roce_en_ = false;
  bool roce_en_stuck_ = false;  // fw 14.22 quirk engaged: roce_en stays 0 until FLR
  uint16_t vport_mtu_ = 0;
  uint8_t port_admin_ = prm::kPortUp, port_oper_ = prm::kPortUp;
  uint8_t host_endianness_ = 0;  // HOST_ENDIANNESS.he as written
  uint16_t pmtu_admin_ = 0;
  uint32_t next_index_ = 0x10;  // object numbers come from one counter, like real firmware's spread
  uint32_t alloc_number(uint32_t limit_log);
  void drop_objects();  // TEARDOWN/FLR: every object is gone

  // Events (eq_cq.cpp).
  Eq* eq_for_event(uint8_t type);
  bool post_eqe(Eq& eq, uint8_t type, uint8_t sub_type, const uint8_t* data28);
  void post_async(uint8_t type, uint8_t sub_type, const uint8_t* data28);
  bool queue_addr(const std::vector<uint64_t>& pas, uint8_t log_page_size, uint32_t page_offset_bytes, uint64_t off,
                  uint64_t* iova) const;
  // Writes a CQE (64 bytes, owner bit and opcode filled in here); false on overflow.
  bool post_cqe(Cq& cq, uint8_t* cqe64, bool solicited);
  uint32_t cq_consumer_index(Cq& cq);
  void cq_error(Cq& cq, uint8_t syndrome);
  CmdStatus resize_cq(Cmd& c, Cq& cq);  // MODIFY_CQ with op_mod RESIZE_CQ

  // Command handlers, one per opcode (cmd_*.cpp).
#define MELON_EMU_HANDLER(name) CmdStatus name(Cmd& c);
  MELON_EMU_HANDLER(enable_hca)
  MELON_EMU_HANDLER(disable_hca)
  MELON_EMU_HANDLER(query_issi)
  MELON_EMU_HANDLER(set_issi)
  MELON_EMU_HANDLER(query_hca_cap)
  MELON_EMU_HANDLER(set_hca_cap)
  MELON_EMU_HANDLER(init_hca)
  MELON_EMU_HANDLER(teardown_hca)
  MELON_EMU_HANDLER(nop)
  MELON_EMU_HANDLER(query_adapter)
  MELON_EMU_HANDLER(alloc_uar)
  MELON_EMU_HANDLER(dealloc_uar)
  MELON_EMU_HANDLER(alloc_pd)
  MELON_EMU_HANDLER(dealloc_pd)
  MELON_EMU_HANDLER(alloc_td)
  MELON_EMU_HANDLER(dealloc_td)
  MELON_EMU_HANDLER(alloc_q_counter)
  MELON_EMU_HANDLER(dealloc_q_counter)
  MELON_EMU_HANDLER(query_q_counter)
  MELON_EMU_HANDLER(create_umem)
  MELON_EMU_HANDLER(destroy_umem)
  MELON_EMU_HANDLER(create_eq)
  MELON_EMU_HANDLER(destroy_eq)
  MELON_EMU_HANDLER(query_eq)
  MELON_EMU_HANDLER(create_cq)
  MELON_EMU_HANDLER(destroy_cq)
  MELON_EMU_HANDLER(query_cq)
  MELON_EMU_HANDLER(modify_cq)
  MELON_EMU_HANDLER(create_mkey)
  MELON_EMU_HANDLER(destroy_mkey)
  MELON_EMU_HANDLER(query_mkey)
  MELON_EMU_HANDLER(create_qp)
  MELON_EMU_HANDLER(destroy_qp)
  MELON_EMU_HANDLER(query_qp)
  MELON_EMU_HANDLER(modify_qp)  // every transition command
  MELON_EMU_HANDLER(create_srq)
  MELON_EMU_HANDLER(destroy_srq)
  MELON_EMU_HANDLER(query_srq)
  MELON_EMU_HANDLER(arm_rq)
  MELON_EMU_HANDLER(create_rmp)
  MELON_EMU_HANDLER(destroy_rmp)
  MELON_EMU_HANDLER(query_rmp)
  MELON_EMU_HANDLER(set_roce_address)
  MELON_EMU_HANDLER(query_roce_address)
  MELON_EMU_HANDLER(query_vport_state)
  MELON_EMU_HANDLER(query_nic_vport_context)
  MELON_EMU_HANDLER(modify_nic_vport_context)
  MELON_EMU_HANDLER(access_register)
#undef MELON_EMU_HANDLER

  // Memory keys as the data path uses them (mkey.cpp).
  struct IovaSeg {
    uint64_t iova, len;
  };
  static constexpr uint32_t kAccRead = 1, kAccWrite = 2, kAccAtomic = 4, kAccRemote = 8;
  uint8_t mkey_resolve(uint32_t key, uint32_t pd, uint64_t va, uint64_t len, uint32_t access,
                       std::vector<IovaSeg>* segs);

  // QP and SRQ helpers (qp.cpp, srq.cpp).
  uint64_t rq_bytes(const Qp& qp) const;
  void release_qp(Qp& qp);
  CmdStatus add_srq(Srq& s, const uint8_t* pas, uint32_t npas, const uint8_t* ctx, uint32_t ctx_len, uint32_t* n);
  CmdStatus remove_srq(uint32_t srqn, bool rmp);

  // The transport behind QPs and SRQs (transport.cpp): src/rc through its host seam.
  bool tp_create_qp(Qp& qp, uint32_t* qpn);
  bool tp_modify_qp(Qp& qp, uint8_t to_state);  // the qpc already holds the new attributes
  void tp_query_qp(Qp& qp, uint8_t* qpc_out);  // live PSNs and state
  uint8_t tp_state(Qp& qp);  // the transport's state (it moves QPs to ERR/SQER on its own)
  void tp_destroy_qp(Qp& qp);
  bool tp_create_srq(Srq& s);
  void tp_arm_srq(Srq& s);
  void tp_destroy_srq(Srq& s);

  // Doorbells.
  void eq_doorbell(const Doorbell& db);
  void cq_doorbell(const Doorbell& db);
  void send_doorbell(const Doorbell& db);
  uint32_t cq_cursor_ = 0x80, qp_cursor_ = 0x11, srq_cursor_ = 0x40;
  uint64_t mkey_rng_ = 0;  // xorshift state for mkey indexes, seeded from the OS at the first CREATE_MKEY

  // ---- data path (transport.cpp, datapath.cpp) ----
  class EngineHost;
  std::unique_ptr<EngineHost> eh_;
  std::unique_ptr<rc::Engine> engine_;
  void engine_reset();  // a new, empty transport (power-up, FLR)
  void engine_done();  // after every engine call: staged writes, then CQEs, then events
  struct PendingCqe {
    uint32_t cqn;
    bool send;
    rc::Wc wc;
  };
  std::vector<PendingCqe> pending_cqes_;
  void write_completion(const PendingCqe& p);
  void sq_process(Qp& qp);  // WQEs from the hw counter up to the doorbell record
  void rq_replenish(Qp& qp);  // receive WQEs the driver posted, to the transport
  void srq_replenish(Srq& s);
  void rx_frame(const std::vector<uint8_t>& f);
  bool qp_error_cqe(Qp& qp, uint16_t wqe_index, uint8_t wqe_opcode, uint8_t syndrome);

  // Inbound frames waiting for service().
  std::deque<std::vector<uint8_t>> rx_;

  // Worker.
  std::thread worker_;
  std::condition_variable wake_;
  bool worker_stop_ = false;
  bool kick_ = false;  // work queued for the worker: service() takes it all and clears it
  // The host calls service() after its own doorbell writes and receive_frame calls
  // (Device::set_host_services): those do not wake the worker, which keeps commands and timers.
  bool host_services_ = false;
  // Only a host's own clock (a test's manual one) can move without a kick: the worker then
  // never sleeps more than 1 ms. On the steady clock it sleeps until the next deadline.
  bool manual_clock_ = false;
  uint64_t worker_wake_at_ = 0;  // when the sleeping worker will look again (0: awake, or no worker)
};

}  // namespace melon::mlx5::emu
