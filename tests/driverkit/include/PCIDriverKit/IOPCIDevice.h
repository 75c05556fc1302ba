// Stand-in: PCIDriverKit's IOPCIDevice, the calls MlxPCIDriver makes (see DriverKit/standin.h for
// what a stand-in is and is not). The fake (tests/driverkit/fake) backs it with the emulated
// ConnectX-4 Lx: BAR0 and configuration space are the emulator's, DMA goes through its IOMMU.
#pragma once

#include "DriverKit/standin.h"

// Configuration space offsets (PCIDriverKit/IOPCIFamilyDefinitions.h).
enum {
  kIOPCIConfigurationOffsetVendorID = 0x00,
  kIOPCIConfigurationOffsetDeviceID = 0x02,
  kIOPCIConfigurationOffsetCommand = 0x04,
};

typedef enum tIOPCIDeviceResetTypes : unsigned int {
  kIOPCIDeviceResetTypeHotReset = 0,
  kIOPCIDeviceResetTypeFunctionReset = 1,
} tIOPCIDeviceResetTypes;
typedef enum tIOPCIDeviceResetOptions : unsigned int {
  kIOPCIDeviceResetOptionNone = 0,
} tIOPCIDeviceResetOptions;

class IOPCIDevice : public IOService {
  MELON_STANDIN_META(IOPCIDevice)
 public:
  kern_return_t Open(IOService* forClient, IOOptionBits options = 0);
  void Close(IOService* forClient, IOOptionBits options = 0);
  // Apple's documentation of each: "This method ignores bits 0 and 1" of the offset.
  void ConfigurationRead32(uint64_t offset, uint32_t* readData);
  void ConfigurationRead16(uint64_t offset, uint16_t* readData);
  void ConfigurationWrite32(uint64_t offset, uint32_t data);
  void ConfigurationWrite16(uint64_t offset, uint16_t data);
  void MemoryRead32(uint8_t memoryIndex, uint64_t offset, uint32_t* readData);
  void MemoryWrite32(uint8_t memoryIndex, uint64_t offset, uint32_t data);
  void MemoryWrite64(uint8_t memoryIndex, uint64_t offset, uint64_t data);
  kern_return_t GetBARInfo(uint8_t barIndex, uint8_t* memoryIndex, uint64_t* barSize, uint8_t* barType);
  virtual kern_return_t Reset(IOOptionBits type, IOOptionBits options);
  virtual kern_return_t ConfigureInterrupts(uint32_t interruptType, uint32_t numRequired, uint32_t numRequested,
                                            IOOptionBits options);
  kern_return_t _CopyDeviceMemoryWithIndex(uint64_t memoryIndex, IOMemoryDescriptor** memory, IOService* forClient);
};
