// Hand-written equivalent of what iig generates from src/dext/driverkit/MlxPCIDriver.iig, for the
// stand-in build (tests/driverkit/README.md). Keep it in step with the .iig: same methods, same
// signatures; iig's RPC plumbing is replaced by direct calls.
#pragma once

#include <DriverKit/IOInterruptDispatchSource.h>
#include <DriverKit/IOService.h>
#include <DriverKit/IOTimerDispatchSource.h>
#include <DriverKit/IOUserClient.h>

#include "iig_support.h"

struct MlxPCIDriver_IVars;

#define MlxPCIDriver_Start_Args IOService* provider
#define MlxPCIDriver_Stop_Args IOService* provider
#define MlxPCIDriver_NewUserClient_Args uint32_t type, IOUserClient **userClient
#define MlxPCIDriver_InterruptOccurred_Args OSAction *action, uint64_t count, uint64_t time
#define MlxPCIDriver_ServiceTimer_Args OSAction *action, uint64_t time

class MlxPCIDriver : public IOService {
  MELON_STANDIN_META(MlxPCIDriver)
 public:
  typedef IOService super;
  bool init() override;
  void free() override;

  kern_return_t Start(IOService* provider) override { return Start_Impl(provider); }
  kern_return_t Stop(IOService* provider) override { return Stop_Impl(provider); }
  kern_return_t NewUserClient(uint32_t type, IOUserClient** userClient) override {
    return NewUserClient_Impl(type, userClient);
  }
  kern_return_t Start(IOService* provider, MelonSuperDispatch) { return IOService::Start_Impl(provider); }
  kern_return_t Stop(IOService* provider, MelonSuperDispatch) { return IOService::Stop_Impl(provider); }

  kern_return_t Start_Impl(IOService* provider);
  kern_return_t Stop_Impl(IOService* provider);
  kern_return_t NewUserClient_Impl(uint32_t type, IOUserClient** userClient);
  void InterruptOccurred_Impl(OSAction* action, uint64_t count, uint64_t time);
  void ServiceTimer_Impl(OSAction* action, uint64_t time);

  kern_return_t CreateActionInterruptOccurred(size_t referenceSize, OSAction** action) {
    *action = OSAction::make(
        this,
        [](OSObject* t, OSAction* a, uint64_t count, uint64_t time) {
          static_cast<MlxPCIDriver*>(t)->InterruptOccurred_Impl(a, count, time);
        },
        referenceSize);
    return *action ? kIOReturnSuccess : kIOReturnNoMemory;
  }
  kern_return_t CreateActionServiceTimer(size_t referenceSize, OSAction** action) {
    *action = OSAction::make(
        this,
        [](OSObject* t, OSAction* a, uint64_t time, uint64_t) {
          static_cast<MlxPCIDriver*>(t)->ServiceTimer_Impl(a, time);
        },
        referenceSize);
    return *action ? kIOReturnSuccess : kIOReturnNoMemory;
  }

  void* CoreDevice();
  void KickService();

  MlxPCIDriver_IVars* ivars = nullptr;
};

inline const OSMetaClass MlxPCIDriver::gMetaClass{"MlxPCIDriver", &IOService::gMetaClass};
inline const bool melon_registered_MlxPCIDriver =
    melon_standin_register_class("MlxPCIDriver", []() -> IOService* { return new MlxPCIDriver; });
