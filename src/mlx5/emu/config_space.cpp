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
  put32(pci_ + kPciMsixCap + 4, kMsixTableOffset);
  put32(pci_ + kPciMsixCap + 8, kMsixPbaOffset);
  // The table's reset state (PCIe 6.8.2.9): every vector masked, address and data zero.
  msix_table_.assign(size_t(cfg_.msix_vectors) * 4, 0);
  for (uint32_t v = 0; v < cfg_.msix_vectors; ++v) msix_table_[v * 4 + 3] = 1;
  msix_pending_.assign(cfg_.msix_vectors, false);
}

void Hca::cfg_enumerate() {
  put32(pci_ + kBar0, uint32_t(kBar0HostAddress) | 0x0c);
  put32(pci_ + kBar0 + 4, uint32_t(kBar0HostAddress >> 32));
  put16(pci_ + kPciCommand, uint16_t(get(pci_ + kPciCommand, 2) | kPciCommandMemory));
  put16(pci_ + kPciMsixCap + 2, uint16_t(get(pci_ + kPciMsixCap + 2, 2) | kPciMsixEnable));
  for (uint32_t v = 0; v < cfg_.msix_vectors; ++v) {
    msix_table_[v * 4 + 0] = 0xfee00000u + v * 16;  // some message address; the sink does not care
    msix_table_[v * 4 + 2] = v;
    msix_table_[v * 4 + 3] = 0;
  }
  msix_release_pending();
}

bool Hca::mmio_decoded() const {
  uint64_t bar = (uint64_t(get(pci_ + kBar0 + 4, 4)) << 32) | (get(pci_ + kBar0, 4) & ~0xfu);
  return (pci_[kPciCommand] & kPciCommandMemory) && bar != 0;
}

bool Hca::msix_blocked(uint16_t v) const {
  uint32_t ctl = get(pci_ + kPciMsixCap + 2, 2);
  return !(ctl & kPciMsixEnable) || (ctl & kPciMsixFunctionMask) || (msix_table_[v * 4 + 3] & 1);
}

void Hca::msix_release_pending() {
  for (uint16_t v = 0; v < cfg_.msix_vectors; ++v)
    if (msix_pending_[v] && !msix_blocked(v)) msix_pending_[v] = false, out_.irqs.push_back(v);
}

// The table and the Pending Bit Array, dword accesses in BAR0 (PCIe 6.8.2).
uint32_t Hca::msix_read(uint64_t off) {
  if (off >= kMsixPbaOffset) {
    uint32_t word = uint32_t(off - kMsixPbaOffset) / 4, bits = 0;
    for (uint32_t b = 0; b < 32 && word * 32 + b < cfg_.msix_vectors; ++b)
      if (msix_pending_[word * 32 + b]) bits |= 1u << b;
    return bits;
  }
  return msix_table_[(off - kMsixTableOffset) / 4];
}

void Hca::msix_write(uint64_t off, uint32_t value) {
  if (off >= kMsixPbaOffset) return;  // read-only
  uint32_t i = uint32_t(off - kMsixTableOffset) / 4;
  msix_table_[i] = i % 4 == 3 ? (value & 1) : value;
  msix_release_pending();
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
  if (off == kPciExpDevStatus && width == 2 && faults_.transactions_pending_reads) {
    --faults_.transactions_pending_reads;  // a DMA still in flight: Transactions Pending reads 1
    return get(pci_ + off, 2) | kPciExpDevStatusTransPending;
  }
  if (off == kPciExpDevCtl && width == 4 && faults_.transactions_pending_reads) {
    --faults_.transactions_pending_reads;
    return get(pci_ + off, 4) | uint32_t(kPciExpDevStatusTransPending) << 16;
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
  if (width == 4 && (off == kPciCommand || off == kPciExpDevCtl || off == kPciMsixCap)) {
    // A dword write reaches the writable half in it (Status and Device Status are write-one-to-clear
    // and hold nothing to clear in this model; the capability header is read-only).
    if (off == kPciMsixCap) return cfg_write(off + 2, 2, value >> 16);
    return cfg_write(off, 2, value & 0xffff);
  }
  if (in(kPciCommand, 2) || in(kPciExpDevCtl, 2) || in(kPciMsixCap + 2, 2)) {
    uint8_t* p = pci_ + off;
    for (unsigned i = 0; i < width; ++i) p[i] = uint8_t(value >> (8 * i));
    if (in(kPciMsixCap + 2, 2)) {
      put16(pci_ + kPciMsixCap + 2, uint16_t((get(pci_ + kPciMsixCap + 2, 2) & 0xc000) | (cfg_.msix_vectors - 1)));
      msix_release_pending();
    }
    if (get(pci_ + kPciExpDevCtl, 2) & kPciExpDevCtlFlr) reset(false);  // the bit self-clears (config reset)
  }
}

}  // namespace melon::mlx5::emu
