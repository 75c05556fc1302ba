// PCI configuration space of the function: type 0 header, PCIe capability (with FLR), MSI-X.
// Values follow the PCI Local Bus and PCI Express Base specifications; the IDs are Mellanox's
// ConnectX-4 Lx (15b3:1015) as Linux's mlx5 PCI table lists them.
#include <string.h>

#include "mlx5/emu/hca.h"

namespace melon::mlx5::emu {

namespace {
void put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v), p[1] = uint8_t(v >> 8); }
void put32(uint8_t* p, uint32_t v) { put16(p, uint16_t(v)), put16(p + 2, uint16_t(v >> 16)); }
uint32_t get(const uint8_t* p, unsigned w) {
  uint32_t v = 0;
  for (unsigned i = 0; i < w; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
constexpr uint32_t kBar0 = 0x10;
constexpr uint32_t kCapPtr = 0x34;
}  // namespace

void Hca::cfg_reset() {
  memset(pci_, 0, sizeof pci_);
  put16(pci_ + 0x00, kPciVendorMellanox);
  put16(pci_ + 0x02, cfg_.pci_device_id);
  put16(pci_ + 0x06, 1 << 4);  // status: capabilities list
  pci_[0x08] = 0;  // revision
  pci_[0x09] = 0x00, pci_[0x0a] = 0x00, pci_[0x0b] = 0x02;  // class: network controller, Ethernet
  put32(pci_ + kBar0, 0x0c);  // BAR0: 64-bit, prefetchable memory; upper bits written by the host
  put16(pci_ + 0x2c, kPciVendorMellanox);  // subsystem vendor
  pci_[kCapPtr] = kPciExpCap;
  // PCIe capability (id 0x10), version 2, endpoint; DevCap bit 28: function-level reset capable.
  pci_[kPciExpCap] = 0x10, pci_[kPciExpCap + 1] = uint8_t(kPciMsixCap);
  put16(pci_ + kPciExpCap + 2, 0x0002);
  put32(pci_ + kPciExpCap + 4, 1u << 28);
  // MSI-X capability (id 0x11): table size - 1 in Message Control; table and PBA in BAR0 at 0x2000
  // and 0x3000 (not modelled: vectors are delivered to IrqSink directly).
  pci_[kPciMsixCap] = 0x11, pci_[kPciMsixCap + 1] = 0;
  put16(pci_ + kPciMsixCap + 2, uint16_t(cfg_.msix_vectors - 1));
  put32(pci_ + kPciMsixCap + 4, 0x2000);
  put32(pci_ + kPciMsixCap + 8, 0x3000);
}

uint32_t Hca::cfg_read(uint32_t off, unsigned width) {
  bool bad = (width != 1 && width != 2 && width != 4) || off % width || off + width > sizeof pci_;
  if (state_ == FwState::kRemoved || bad) return width == 1 ? 0xffu : width == 2 ? 0xffffu : 0xffffffffu;
  if (off >= kBar0 && off < kBar0 + 8 && pci_bar_sizing_) {
    // BAR sizing: after all ones is written the BAR reads back its size mask.
    uint64_t mask = ~(kBar0Bytes - 1) | 0x0c;
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = uint8_t(mask >> (8 * i));
    return get(b + (off - kBar0), width);
  }
  return get(pci_ + off, width);
}

void Hca::cfg_write(uint32_t off, unsigned width, uint32_t value) {
  if (state_ == FwState::kRemoved) return;
  if ((width != 1 && width != 2 && width != 4) || off % width || off + width > sizeof pci_) return;
  if (off >= kBar0 && off < kBar0 + 8) {
    pci_bar_sizing_ = width == 4 && value == 0xffffffffu;
    if (pci_bar_sizing_) return;
    uint8_t* p = pci_ + off;
    for (unsigned i = 0; i < width; ++i) p[i] = uint8_t(value >> (8 * i));
    pci_[kBar0] = uint8_t((pci_[kBar0] & 0xf0) | 0x0c);
    return;
  }
  // Writable: command register, PCIe Device Control, MSI-X Message Control (enable/mask bits).
  auto in = [&](uint32_t lo, uint32_t n) { return off >= lo && off + width <= lo + n; };
  if (in(kPciCommand, 2) || in(kPciExpDevCtl, 2) || in(kPciMsixCap + 2, 2)) {
    uint8_t* p = pci_ + off;
    for (unsigned i = 0; i < width; ++i) p[i] = uint8_t(value >> (8 * i));
    if (in(kPciMsixCap + 2, 2))
      put16(pci_ + kPciMsixCap + 2, uint16_t((get(pci_ + kPciMsixCap + 2, 2) & 0xc000) | (cfg_.msix_vectors - 1)));
    if (get(pci_ + kPciExpDevCtl, 2) & kPciExpDevCtlFlr) reset(false);  // the bit self-clears (config reset)
  }
}

}  // namespace melon::mlx5::emu
