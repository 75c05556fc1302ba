// The emulated device's DMA port in melon-emud: the daemon's own memory through the emulator's
// TestHost (IOMMU with guard pages), plus windows onto client processes' memory for their memory
// regions. A window is what pinning means here: the device reads and writes the client's pages
// with process_vm_readv/writev, so an application's malloc'd buffer is reached where it lives,
// and a window closes when its MR goes (or its client dies) - afterwards the IOVA faults.
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include <map>
#include <mutex>

#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"

namespace melon::dext {

class ClientDma final : public mlx5::emu::DmaPort {
 public:
  static constexpr uint64_t kWindowBase = 0x00000cc000000000ull;
  explicit ClientDma(mlx5::emu::TestHost& host) : host_(host) {}

  // A window onto [addr, addr+len) of process `pid` (page aligned). Returns its IOVA, 0 if the
  // range is not readable there.
  uint64_t open_window(pid_t pid, uint64_t addr, uint64_t len, bool writable);
  void close_window(uint64_t iova);
  size_t windows() const;
  uint64_t faults() const { return faults_; }

  bool read(uint64_t iova, void* dst, size_t len) override;
  bool write(uint64_t iova, const void* src, size_t len) override;

 private:
  struct Window {
    pid_t pid;
    uint64_t addr, len;
    bool writable;
  };
  const Window* find(uint64_t iova, size_t len, uint64_t* off) const;

  mlx5::emu::TestHost& host_;
  mutable std::mutex mu_;
  std::map<uint64_t, Window> wins_;
  uint64_t next_ = kWindowBase;
  uint64_t faults_ = 0;
};

}  // namespace melon::dext
