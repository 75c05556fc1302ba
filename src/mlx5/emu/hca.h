// The model behind emu::Device: one ConnectX-4 Lx function. Every method here runs with mu_ held
// (Device takes it); effects that leave the device (MSI-X, frames) are queued in `out_` and
// delivered by Device after the lock is dropped.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "mlx5/emu/device.h"
#include "mlx5/prm/prm.h"

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

class Hca {
 public:
  Hca(const HostPorts& ports, const DeviceConfig& config);
  ~Hca();

  std::mutex mu_;  // the device lock; Device holds it around every call into Hca

  // ---- bar0.cpp ----
  uint32_t mmio_read32(uint64_t off);
  void mmio_write(uint64_t off, const uint8_t* bytes, size_t len);

  // ---- config_space.cpp ----
  uint32_t cfg_read(uint32_t off, unsigned width);
  void cfg_write(uint32_t off, unsigned width, uint32_t value);
  void cfg_reset();

  // ---- hca.cpp ----
  void reset(bool power_on);  // FLR or power-up: lose everything
  bool service();
  uint64_t next_deadline();  // when service() next has timed work (ns), or UINT64_MAX
  uint64_t now() { return ports_.clock->now_ns(); }
  void update_fw_state();  // booting -> ready when the delay has passed
  bool dma_read(uint64_t iova, void* dst, size_t len);
  bool dma_write(uint64_t iova, const void* src, size_t len);
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

  HostPorts ports_;
  DeviceConfig cfg_;
  SteadyClock own_clock_;  // used when ports_.clock is null
  Faults faults_;
  Device::Stats stats_;
  FwState state_ = FwState::kBooting;
  uint64_t boot_done_ns_ = 0;  // when `initializing` clears
  uint64_t health_epoch_ns_ = 0;  // health counter = (now - epoch) / period while alive
  uint32_t health_counter_frozen_ = 0;
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
  bool pci_bar_sizing_ = false;

  // Inbound frames waiting for service().
  std::deque<std::vector<uint8_t>> rx_;

  // Worker.
  std::thread worker_;
  std::condition_variable wake_;
  bool worker_stop_ = false;
  bool kick_ = false;
};

}  // namespace melon::mlx5::emu
