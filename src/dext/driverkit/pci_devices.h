// The PCI functions MlxPCIDriver drives: the one list. Info.plist's IOPCIMatch and the
// transport.pci entitlement hold exactly these (tests/macos/plist_test.py reads the rows below and
// checks the family names against pci.ids), and Start refuses any other function before it touches
// it, so the card stays with Apple's driver. A row joins only when the driver core has been run
// against that part: ConnectX-5/6/7 (15b3:1017, 1019, 101d, 101f, 1021) are left out until then.
#pragma once

#include <stdint.h>

namespace melon::dext {

struct PciDevice {
  uint16_t vendor, device;
  const char* family;
};

inline constexpr PciDevice kPciDevices[] = {
    {0x15b3, 0x1015, "ConnectX-4 Lx"},
};

inline const PciDevice* find_pci_device(uint16_t vendor, uint16_t device) {
  for (const PciDevice& d : kPciDevices)
    if (d.vendor == vendor && d.device == device) return &d;
  return nullptr;
}

}  // namespace melon::dext
