// The device side of the HAL (docs/DESIGN.md "The HAL"): an emulated ConnectX-4 Lx (PCI 15b3:1015,
// firmware 14.x) as a PCI function. The host (a test, or src/dext/emuhost) sees exactly what a
// driver sees on real hardware: BAR0 MMIO, PCI config space, MSI-X messages, and DMA through IOVAs.
//
// The emulator owns no host memory. Every byte it reads or writes on the host side (command queue,
// mailboxes, firmware pages, EQ/CQ/WQ rings, doorbell records, data buffers) goes through the
// DmaPort the host gives it, by IOVA; a false return is an IOMMU fault and the device reacts as
// hardware would (bad delivery status, CQ/EQ write failure, error CQE, health syndrome).
//
// Threading. The device is internally locked: any thread may call any method. MMIO writes only
// latch registers and doorbells; the work they start (running a command, reading WQEs, moving
// packets, firing timers) is done by service(). A host either calls service() itself (deterministic
// tests; a HAL's poll/delay hook) or starts the device's own worker thread with start_worker(),
// which runs service() whenever a doorbell, an inbound frame or a timer needs it. MSI-X messages
// (IrqSink::raise) and outbound frames (FramePort::transmit) are delivered from whichever thread
// runs service(), with the device lock released.
//
// Not freestanding: this is userspace (C++ library, threads).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <vector>

namespace melon::mlx5::emu {

// ---- what the host provides ---------------------------------------------------------------------

// Host memory as the device sees it through the IOMMU. Both calls move `len` bytes at `iova` and
// return false (moving nothing) if any byte of the range is not mapped: an IOMMU fault.
class DmaPort {
 public:
  virtual ~DmaPort() = default;
  virtual bool read(uint64_t iova, void* dst, size_t len) = 0;
  virtual bool write(uint64_t iova, const void* src, size_t len) = 0;
  // Whether write() of `len` bytes at `iova` would land now, moving nothing: the device asks before
  // it stages a buffer it will overwrite whole, instead of reading the old bytes. The default reads
  // the range into scratch space (right for any port); a port with a cheap lookup overrides it.
  virtual bool writable(uint64_t iova, size_t len);
};

// MSI-X: the device raises vector `vector` (an EQ's `intr`, 0..msix_vectors-1). Masking and
// coalescing are the host's business.
class IrqSink {
 public:
  virtual ~IrqSink() = default;
  virtual void raise(uint16_t vector) = 0;
};

// Monotonic time in nanoseconds. Drives the initializing delay, the health counter, the internal
// timer and the transport's retransmit/RNR timers. Tests pass a manual clock to step time.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() = 0;
};

// The Ethernet-side port: whole RoCEv2 frames (IPv4/IPv6 + UDP + BTH.. + ICRC, no L2 header), as
// src/roce/frame.h writes and reads them. Inbound frames enter through Device::receive_frame.
// src/mlx5/emu/wire.h has an in-memory link between devices and a UDP socket on port 4791.
class FramePort {
 public:
  virtual ~FramePort() = default;
  virtual void transmit(const uint8_t* frame, size_t len) = 0;
  // The frames one service() produced, in order. The port may rewrite their bytes (they are the
  // device's copies, dropped afterwards). By default one transmit() each; a port that can hand the
  // kernel several at once (UdpWire: sendmmsg) overrides it.
  virtual void transmit_many(std::vector<uint8_t>* frames, size_t n) {
    for (size_t i = 0; i < n; i++) transmit(frames[i].data(), frames[i].size());
  }
  // The UDP source port every frame leaves with whatever the frame says (a socket's bound port), or
  // 0: the frame's own. The ICRC covers that port, so a device that writes its frames with it spares
  // the port computing the ICRC a second time.
  virtual uint16_t source_port() const { return 0; }
};

// The machine's monotonic clock (CLOCK_MONOTONIC): what the device uses when the host gives none.
class SteadyClock : public Clock {
 public:
  uint64_t now_ns() override;
};

struct HostPorts {
  DmaPort* dma = nullptr;  // required
  IrqSink* irq = nullptr;  // optional: no interrupts (polling host)
  Clock* clock = nullptr;  // optional: the steady clock
  FramePort* wire = nullptr;  // optional: frames are dropped (port link down)
};

// ---- identity and geometry ------------------------------------------------------------------------

struct DeviceConfig {
  uint16_t fw_major = 14, fw_minor = 32, fw_subminor = 1010;  // firmware revision in the init segment
  uint8_t mac[6] = {0x02, 0x4d, 0x45, 0x4c, 0x00, 0x01};  // port MAC (permanent_address)
  uint64_t node_guid = 0x024d45fffe4c0001ull;
  uint16_t msix_vectors = 16;  // MSI-X table size
  uint32_t init_delay_ns = 2'000'000;  // `initializing` reads 1 this long after power-up/FLR
  uint32_t health_period_ns = 1'000'000;  // the health counter advances once per period while alive
  uint16_t port_mtu = 4096;  // PMTU max_mtu (bytes); RoCE path MTU up to 4096
  // Check the XOR signatures of queue entries and mailboxes (cmd_hca_cap.cmdif_checksum = 3).
  // Off by default, as Linux drives the card (cmd.c leaves checksums disabled).
  bool cmd_signatures = false;
  // The largest UAR page the device takes (cmd_hca_cap.log_uar_page_sz maximum, 4 KiB << n). 0 as
  // this model always had: a driver on 16 KiB host pages cannot get UAR pages of its page size. A
  // driver sets the size with SET_HCA_CAP; UAR n then sits at n * (4 KiB << size), its doorbells
  // in every 4 KiB of it (uar_4k).
  uint8_t max_log_uar_page_sz = 0;
  uint16_t pci_device_id = 0x1015;  // config space's device ID (ConnectX-4 Lx; tests give others)
  // Firmware pages the device asks for at each stage (QUERY_PAGES boot / init, then a regular demand
  // announced by PAGE_REQUEST once an EQ takes that event).
  uint32_t boot_pages = 8, init_pages = 24, regular_pages = 32;
  // Every command's opcode, op_mod, lengths, status and syndrome to stderr (bring-up of an unknown
  // driver: tests/vfio's MELON_VFIO_LOG).
  bool trace_commands = false;
};

// BAR0: 32 MiB. The initialization segment sits at 0 (its last field ends at 0x400c); UAR page n is
// at n * the UAR page size (4 KiB unless set larger), and ALLOC_UAR hands out n >= kFirstUarIndex
// so no UAR overlaps the init segment.
inline constexpr uint64_t kBar0Bytes = 32ull << 20;
inline constexpr uint32_t kFirstUarIndex = 8;
inline constexpr uint16_t kPciVendorMellanox = 0x15b3;
inline constexpr uint16_t kPciDeviceConnectX4Lx = 0x1015;

// PCI configuration space (4 KiB, PCIe). Standard header, a PCIe capability and an MSI-X capability.
// Command register bit 2 (bus master) must be set before the device does any DMA: without it every
// DMA the device attempts fails as if unmapped. PCIe Device Control (kPciExpCap + 8) bit 15 is
// "Initiate Function Level Reset".
inline constexpr uint32_t kPciCommand = 0x04;
inline constexpr uint16_t kPciCommandMemory = 1 << 1, kPciCommandBusMaster = 1 << 2;
inline constexpr uint32_t kPciExpCap = 0x60;  // PCIe capability offset in this model
inline constexpr uint32_t kPciExpDevCtl = kPciExpCap + 0x08;
inline constexpr uint16_t kPciExpDevCtlFlr = 1 << 15;
inline constexpr uint32_t kPciMsixCap = 0x9c;  // MSI-X capability offset in this model
inline constexpr uint16_t kPciMsixEnable = 1 << 15, kPciMsixFunctionMask = 1 << 14;  // Message Control
inline constexpr uint32_t kMsixTableOffset = 0x2000, kMsixPbaOffset = 0x3000;  // in BAR0 (BIR 0)
inline constexpr uint32_t kPciExpDevStatus = kPciExpCap + 0x0a;
inline constexpr uint16_t kPciExpDevStatusTransPending = 1 << 5;
inline constexpr uint64_t kBar0HostAddress = 0x6000000000ull;  // where enumerate() puts BAR0

// ---- fault injection switchboard ----------------------------------------------------------------

struct Faults {
  // Commands are taken (the doorbell is accepted) but never completed: the ownership bit stays with
  // the device and no completion EQE comes. Cleared by FLR.
  bool cmd_timeout = false;
  // The next command whose opcode matches (0 = any) completes with this status and syndrome
  // instead of running. One-shot: cleared once it fires.
  uint16_t bad_status_opcode = 0;
  uint8_t bad_status = 0;  // 0 = switch off
  uint32_t bad_status_syndrome = 0;
  // Firmware 14.22 behaviour the anchor project hit: after TEARDOWN_HCA and INIT_HCA with no FLR in
  // between, the NIC vport context's roce_en reads back 0, and MODIFY_NIC_VPORT_CONTEXT(roce_en=1)
  // completes OK without taking effect, until an FLR. RoCE traffic is not delivered meanwhile.
  bool fw_14_22_roce_en_lost = false;
  // PCIe Device Status' Transactions Pending reads 1 for this many more reads (a DMA the function
  // has not seen completed), then 0.
  uint32_t transactions_pending_reads = 0;
  // The health counter stops advancing and nothing else shows it: firmware hung without writing a
  // syndrome (a driver's only sensor is the counter). Cleared by FLR.
  bool health_stall = false;
};

// ---- the device ---------------------------------------------------------------------------------

class Hca;  // the model behind the interface (src/mlx5/emu/hca.h)

class Device {
 public:
  explicit Device(const HostPorts& ports, const DeviceConfig& config = {});
  ~Device();  // stops the worker if it runs
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // BAR0 MMIO, `off` in bytes from the start of BAR0. BAR0 is a byte array and these calls move the
  // bytes of `value` in little-endian order, as PCI memory transactions from a little-endian CPU do
  // (DriverKit MemoryRead32, Linux readl). The device's registers and doorbells are big-endian, so a
  // driver swaps: Linux's ioread32be/iowrite32be for the init segment, and a doorbell's 8 bytes in
  // memory order for write64. Accesses must be naturally aligned and inside the BAR; others read all
  // ones and write nothing. After surprise_remove() every read returns all ones.
  uint32_t read32(uint64_t off);
  void write32(uint64_t off, uint32_t value);
  void write64(uint64_t off, uint64_t value);  // doorbells (CQ arm, send doorbell, BlueFlame)
  // A BlueFlame write: the first 64 bytes of a WQE copied to UAR + 0x800/0x900 (write-combining).
  void write_block(uint64_t off, const void* src, size_t len);

  // PCI configuration space, little-endian as PCI defines it. `width` is 1, 2 or 4.
  uint32_t config_read(uint32_t off, unsigned width);
  void config_write(uint32_t off, unsigned width, uint32_t value);
  // Function-level reset, as if Initiate FLR were written: every object, page and register is lost,
  // the init segment reads `initializing` for init_delay_ns, doorbells are ignored until the
  // command queue is set up again. Configuration space goes back to its reset values (PCIe 6.6.2):
  // BAR0 unassigned, memory space and bus master off, MSI-X disabled with every table entry masked,
  // so MMIO reads all ones and no interrupt leaves until someone restores them.
  void flr();
  // What the host's PCI code does to a function after power-up (and Linux's pci_restore_state after
  // a reset): BAR0 at kBar0HostAddress, memory space on, MSI-X enabled with every entry unmasked.
  // Power-up does it by itself; after flr() the caller must, as a real host's kernel would.
  void enumerate();

  // Runs everything due now: commands rung on the doorbell, send/receive doorbells, inbound frames,
  // timers, health. Returns true if it did any work.
  bool service();
  // The device's own worker thread, running service() on demand (doorbells, frames) and at the next
  // timer deadline. Idempotent.
  void start_worker();
  void stop_worker();

  // The host promises to call service() itself after each send or CQ arm doorbell it writes and each
  // receive_frame (melon-emud: its doorbell watcher and wire threads run the work they bring, one
  // thread hand-off less per packet). The worker then wakes for commands and timers only.
  void set_host_services(bool on);

  // An inbound frame from the wire (same format as FramePort::transmit). Queued; handled in service().
  void receive_frame(const uint8_t* frame, size_t len);

  // Fault injection.
  void set_faults(const Faults& f);
  Faults faults() const;
  // Firmware reports a fatal error: the health buffer gets `syndrome` (prm::health_syndrome), the
  // health counter stops advancing, commands complete with no status at all (timeout), the data
  // path stops. Only FLR recovers.
  void inject_fatal(uint8_t syndrome);
  // The card is gone: MMIO reads return all ones, writes are dropped, no DMA, no interrupts.
  void surprise_remove();

  // Diagnostics for tests: things hardware would log or hang on, counted.
  // ACK holding, for a host thread that polls the device without pause (melon-emud's doorbell
  // watcher while it is awake): a ping-pong's ACK waits up to `ns` for the next request the host
  // posts and leaves after it, in the same port call (UdpWire: one GSO send, one receive at the
  // peer). Held only when a received packet completed a receive and was answered by ACKs alone;
  // anything the device sends meanwhile takes them along. The polling thread calls
  // release_due_acks() while it polls and set_ack_hold(0) before it stops polling (which sends what
  // is held): nothing else wakes for them. 0 (the default): every ACK leaves at once.
  void set_ack_hold(uint32_t ns);
  void release_due_acks();  // sends held ACKs whose time is up; no lock taken when none are held
  struct Stats {
    uint64_t commands = 0;  // commands executed (any status)
    uint64_t dma_faults = 0;  // DMA attempts the host refused (or with bus master off)
    uint64_t page_use_after_take = 0;  // the device touched a firmware page it had given back
    uint64_t doorbells_ignored = 0;  // doorbells on dead/unknown objects or before init
    uint64_t mmio_unclaimed = 0;  // MMIO while memory space is disabled or BAR0 unassigned (reads all ones)
    uint64_t irqs_held = 0;  // MSI-X messages held pending: disabled, function or vector masked
    uint64_t frames_tx = 0, frames_rx = 0, frames_dropped = 0;
    uint32_t fw_pages_held = 0;  // firmware pages the device holds now
  };
  Stats stats() const;

  const DeviceConfig& config() const;
  Hca& hca();  // the model, for white-box tests in tests/mlx5/emu

 private:
  std::unique_ptr<Hca> hca_;
};

}  // namespace melon::mlx5::emu
