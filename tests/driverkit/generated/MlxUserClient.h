// Hand-written equivalent of iig's output for src/dext/driverkit/MlxUserClient.iig (stand-in build;
// tests/driverkit/README.md). Keep it in step with the .iig.
#pragma once

#include <DriverKit/IOUserClient.h>

#include "iig_support.h"

struct MlxUserClient_IVars;

#define MlxUserClient_Start_Args IOService* provider
#define MlxUserClient_Stop_Args IOService* provider
#define MlxUserClient_CopyClientMemoryForType_Args uint64_t type, uint64_t *options, IOMemoryDescriptor **memory

class MlxUserClient : public IOUserClient {
  MELON_STANDIN_META(MlxUserClient)
 public:
  typedef IOUserClient super;
  bool init() override;
  void free() override;

  kern_return_t Start(IOService* provider) override { return Start_Impl(provider); }
  kern_return_t Stop(IOService* provider) override { return Stop_Impl(provider); }
  kern_return_t Start(IOService* provider, MelonSuperDispatch) { return IOUserClient::Start_Impl(provider); }
  kern_return_t Stop(IOService* provider, MelonSuperDispatch) { return IOUserClient::Stop_Impl(provider); }
  kern_return_t Start_Impl(IOService* provider);
  kern_return_t Stop_Impl(IOService* provider);

  kern_return_t ExternalMethod(uint64_t selector, IOUserClientMethodArguments* arguments,
                               const IOUserClientMethodDispatch* dispatch, OSObject* target, void* reference) override;
  kern_return_t CopyClientMemoryForType(uint64_t type, uint64_t* options, IOMemoryDescriptor** memory) override {
    return CopyClientMemoryForType_Impl(type, options, memory);
  }
  kern_return_t CopyClientMemoryForType_Impl(uint64_t type, uint64_t* options, IOMemoryDescriptor** memory);

  MlxUserClient_IVars* ivars = nullptr;
};

inline const OSMetaClass MlxUserClient::gMetaClass{"MlxUserClient", &IOUserClient::gMetaClass};
inline const bool melon_registered_MlxUserClient =
    melon_standin_register_class("MlxUserClient", []() -> IOService* { return new MlxUserClient; });
