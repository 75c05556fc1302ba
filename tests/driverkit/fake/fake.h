// The fake side of the DriverKit stand-in (tests/driverkit/README.md): an emulated ConnectX-4 Lx
// (src/mlx5/emu) behind a fake IOPCIDevice, a fake kernel that matches, starts and stops the driver
// and opens user clients, and the bookkeeping the tests use to prove nothing leaked. It plays the
// kernel's and the hardware's part; the glue under test (src/dext/driverkit) is compiled unchanged.
#pragma once

#include <DriverKit/standin.h>
#include <PCIDriverKit/IOPCIDevice.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"

namespace melon::dkfake {

struct CardOptions {
  uint16_t msix_vectors = 16;
  uint8_t mac_last = 1;  // the port MAC's last byte (two cards on one link need different ones)
  mlx5::emu::FramePort* wire = nullptr;  // the Ethernet port's link (src/mlx5/emu/wire.h), if any
  bool configure_msix = true;  // false: ConfigureInterrupts fails (the driver must cope)
  uint8_t max_log_uar_page_sz = 0;  // the card's largest UAR page (emu::DeviceConfig)
  uint16_t device_id = mlx5::emu::kPciDeviceConnectX4Lx;  // config space's device ID
  uint64_t dma_segment_bytes = 0;  // PrepareForDMA reports its IOVA range in pieces this size (0: one)
  bool dma_segment_gaps = false;  // ... and the pieces do not follow each other
};

// The page size of the tasks that map memory (the system's, IOVMPageSize: 16 KiB on Apple silicon,
// 4 KiB on Intel): a device-memory mapping covers whole pages of it.
inline uint64_t task_page_size() { return IOVMPageSize; }

// One PCI function: the emulator (worker thread, steady clock) and its IOMMU, as an IOPCIDevice.
class Card {
 public:
  explicit Card(const CardOptions& o = {});
  ~Card();
  Card(const Card&) = delete;
  Card& operator=(const Card&) = delete;

  IOPCIDevice* pci() { return pci_; }
  mlx5::emu::Device& device() { return *dev_; }
  mlx5::emu::TestHost& host() { return host_; }
  // IOVA mappings the fake IODMACommands hold now.
  size_t dma_mappings() const;
  bool no_msix_ = false;  // from CardOptions::configure_msix
  uint64_t dma_segment_bytes_ = 0;  // from CardOptions::dma_segment_bytes
  bool dma_segment_gaps_ = false;
  // Function-level resets the driver started through configuration space (PCIe Device Control).
  std::atomic<int> flrs_{0};

  // An interrupt handler of this card that stores to BAR0 + `bar_offset` (MemoryWrite32) waits
  // there, inside the handler, until release_handler(); wait_handler_blocked says it got there.
  void block_handler_store(uint64_t bar_offset);
  bool wait_handler_blocked(int ms);
  void release_handler();
  void handler_store_hook(uint64_t off);  // the fake's MemoryWrite32

 private:
  mlx5::emu::TestHost host_;
  std::unique_ptr<mlx5::emu::Device> dev_;
  std::mutex hook_mu_;
  std::condition_variable hook_cv_;
  uint64_t hook_off_ = 0;
  bool hook_armed_ = false, hook_blocked_ = false;
  IOPCIDevice* pci_ = nullptr;
};

// The kernel's part. start_driver creates the personality's IOUserClass with the personality's
// properties (read from src/dext/driverkit/Info.plist) and runs Start on the driver's default
// queue; the driver is returned even when Start failed (its properties tell the story).
IOService* start_driver(Card& card, kern_return_t* start_result);
// Stop on the default queue, then the last reference.
kern_return_t stop_driver(IOService* driver);
// The other order: the driver's Stop while its user clients are still open (their Stop comes when
// they close or die); release_stopped() drops the driver's last reference once they are gone.
kern_return_t stop_provider_first(IOService* driver);
void release_stopped(IOService* driver);

// The next `n` IOService::SetProperties calls (any service) fail with kIOReturnNoMemory.
void fail_set_properties(int n);

// IOBufferMemoryDescriptors freed while an interrupt handler (of any card) was running.
long freed_while_a_handler_runs();
// IOBufferMemoryDescriptors alive (memory a device may be given), across cards.
long live_buffers();

// Registry properties as ioreg shows them.
std::string string_property(IOService* s, const char* key);  // "" if absent
long long number_property(IOService* s, const char* key);  // -1 if absent

// What the next IOServiceOpen's task holds (its userclient-access entitlement). as_array false
// gives the single-string form Apple also accepts; an empty `ids` leaves the entitlement out.
void set_task_entitlements(const std::vector<std::string>& ids, bool as_array = true);
// The user client behind a connection (tests/driverkit: the IOKit stand-in's io_connect_t).
IOUserClient* user_client_of(uint32_t connection);
// Client death: the kernel stops the user client without the process closing anything.
void kill_connection(uint32_t connection);
// The BAR offset behind a device-memory mapping IOConnectMapMemory64 made (-1 if not one).
long long device_offset_of(uint32_t connection, uint64_t address);
// The CPU's 8-byte store to a device-memory mapping (a doorbell): the mapping is plain pages here,
// so the test stores through this, and the bytes reach the card's BAR0 at the offset the address
// maps (anywhere in the mapped pages, not only the descriptor's range). Returns false if
// `address` is not inside such a mapping of `connection`.
bool mmio_store64(uint32_t connection, void* address, const void* bytes8);
// ExternalMethod calls the fake kernel has made (all connections): what a client costs the driver.
long external_method_calls();
// While on, IOConnectCallAsyncStructMethod answers kIOReturnUnsupported without calling the driver.
void refuse_async_calls(bool on);
// Messages AsyncCompletion has put on the fake's mach ports, and those it dropped because the
// port's queue was full (kMachPortQueueLimit) or the port was gone.
long async_messages_sent();
long async_messages_dropped();
std::chrono::steady_clock::time_point last_async_message_time();
inline constexpr size_t kMachPortQueueLimit = 5;  // MACH_PORT_QLIMIT_DEFAULT
// The io_service_t of a started driver (to open one of several).
uint32_t service_port(IOService* driver);

// os_log as captured.
std::vector<std::string> log_lines();
bool logged(const std::string& needle);
void clear_log();

// Leak accounting across the stand-in: OSObjects alive, IOMalloc bytes outstanding, locks alive,
// IOMalloc/IOFree size mismatches (a glue bug), timer threads running.
long live_objects();
long long malloc_bytes();
long live_locks();
long free_mismatches();
long live_timers();

}  // namespace melon::dkfake
