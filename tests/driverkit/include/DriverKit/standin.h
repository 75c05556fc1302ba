// The DriverKit stand-in (tests/driverkit/README.md): declarations of exactly the DriverKit and
// PCIDriverKit surface src/dext/driverkit uses, with Apple's names and signatures as Apple's
// DriverKit documentation gives them, so the glue compiles unchanged on Linux. Behaviour lives in
// tests/driverkit/fake (the emulated ConnectX behind IOPCIDevice). This file is our own text; it
// proves our logic, not Apple's API: only the real SDK (check-dext on macOS) decides that.
//
// Differences from the SDK, on purpose: no OSSharedPtr, no IORPC, no blocks (cancel handlers are
// plain function pointers; the glue only ever passes nullptr), OSDynamicCast without RTTI through a
// small metaclass chain, and iig's generated parts (IMPL, SUPERDISPATCH, CreateAction*) are
// spelled by the hand-written headers in tests/driverkit/generated.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "DriverKit/IOReturn.h"

typedef uint32_t IOOptionBits;

// ---- OSObject and the collections -----------------------------------------------------------------

struct OSMetaClass {
  const char* name;
  const OSMetaClass* superclass;
};

class OSMetaClassBase {
 public:
  static const OSMetaClass gMetaClass;
  virtual const OSMetaClass* getMetaClass() const { return &gMetaClass; }
  static OSMetaClassBase* safeMetaCast(const OSMetaClassBase* me, const OSMetaClass* to);
  virtual void retain() const;
  virtual void release() const;

 protected:
  OSMetaClassBase();
  virtual ~OSMetaClassBase();

 private:
  mutable int refs_ = 1;
};

#define OSDynamicCast(type, inst) ((type*)OSMetaClassBase::safeMetaCast((inst), &type::gMetaClass))
#define OSSafeReleaseNULL(p) \
  do {                       \
    if (p) (p)->release();   \
    (p) = nullptr;           \
  } while (0)

// Declares a stand-in class's metaclass (the SDK's classes carry one through iig).
#define MELON_STANDIN_META(cls)                                            \
 public:                                                                   \
  static const OSMetaClass gMetaClass;                                     \
  const OSMetaClass* getMetaClass() const override { return &gMetaClass; } \
                                                                           \
 private:

class OSObject : public OSMetaClassBase {
  MELON_STANDIN_META(OSObject)
 public:
  virtual bool init() { return true; }
  virtual void free() {}
};

class OSString : public OSObject {
  MELON_STANDIN_META(OSString)
 public:
  static OSString* withCString(const char* cString);
  const char* getCStringNoCopy() const;
  size_t getLength() const;
  bool isEqualTo(const char* cString) const;
  void* impl_ = nullptr;
};

class OSNumber : public OSObject {
  MELON_STANDIN_META(OSNumber)
 public:
  static OSNumber* withNumber(uint64_t value, size_t numberOfBits);
  uint64_t unsigned64BitValue() const;
  uint32_t unsigned32BitValue() const;
  uint64_t value_ = 0;
};

class OSBoolean : public OSObject {
  MELON_STANDIN_META(OSBoolean)
 public:
  bool getValue() const { return value_; }
  bool value_ = false;
};
extern OSBoolean* const kOSBooleanTrue;
extern OSBoolean* const kOSBooleanFalse;

class OSData : public OSObject {
  MELON_STANDIN_META(OSData)
 public:
  static OSData* withBytes(const void* bytes, size_t numBytes);
  const void* getBytesNoCopy() const;
  size_t getLength() const;
  void* impl_ = nullptr;
};

class OSArray : public OSObject {
  MELON_STANDIN_META(OSArray)
 public:
  static OSArray* withCapacity(uint32_t capacity);
  uint32_t getCount() const;
  OSObject* getObject(uint32_t index) const;
  bool setObject(const OSMetaClassBase* anObject);
  void* impl_ = nullptr;
};

class OSDictionary : public OSObject {
  MELON_STANDIN_META(OSDictionary)
 public:
  static OSDictionary* withCapacity(uint32_t capacity);
  OSObject* getObject(const char* aKey) const;
  bool setObject(const char* aKey, const OSMetaClassBase* anObject);
  uint32_t getCount() const;
  void* impl_ = nullptr;
};

// An action: a target and one of its methods, with reference storage (iig's CreateAction*).
class OSAction : public OSObject {
  MELON_STANDIN_META(OSAction)
 public:
  void* GetReference();
  // Stand-in plumbing: how a dispatch source calls the method the action names.
  typedef void (*Call)(OSObject* target, OSAction* action, uint64_t a, uint64_t b);
  static OSAction* make(OSObject* target, Call call, size_t referenceSize);
  OSObject* target_ = nullptr;
  Call call_ = nullptr;
  void* reference_ = nullptr;
  size_t reference_size_ = 0;
};

// ---- IOLib --------------------------------------------------------------------------------------

extern "C" {
void* IOMalloc(size_t length);
void* IOMallocZero(size_t length);
void IOFree(void* address, size_t length);
typedef struct IOLock IOLock;
IOLock* IOLockAlloc(void);
void IOLockFree(IOLock* lock);
void IOLockLock(IOLock* lock);
void IOLockUnlock(IOLock* lock);
void IOSleep(uint64_t ms);
extern uint64_t IOVMPageSize;  // "the number of bytes in a virtual memory page" (DriverKit/IOLib.h)
void IODelay(uint64_t us);
}
#define IONewZero(type, count) ((type*)IOMallocZero(sizeof(type) * (count)))
#define IOSafeDeleteNULL(ptr, type, count)        \
  do {                                            \
    if (ptr) IOFree(ptr, sizeof(type) * (count)); \
    (ptr) = nullptr;                              \
  } while (0)

// ---- memory -------------------------------------------------------------------------------------

struct IOAddressSegment {
  uint64_t address;
  uint64_t length;
};

enum {
  kIOMemoryDirectionIn = 0x00000001,
  kIOMemoryDirectionOut = 0x00000002,
  kIOMemoryDirectionInOut = kIOMemoryDirectionIn | kIOMemoryDirectionOut,
};
enum { kIOUserClientMemoryReadOnly = 0x00000001 };

class IOMemoryDescriptor : public OSObject {
  MELON_STANDIN_META(IOMemoryDescriptor)
 public:
  kern_return_t GetLength(uint64_t* returnLength);
  static kern_return_t CreateSubMemoryDescriptor(uint64_t memoryDescriptorCreateOptions, uint64_t offset,
                                                 uint64_t length, IOMemoryDescriptor* ofDescriptor,
                                                 IOMemoryDescriptor** memory);
  // Stand-in plumbing: the bytes behind the descriptor in this process (nullptr for device memory).
  uint8_t* fake_base_ = nullptr;
  uint64_t fake_length_ = 0;
  uint64_t fake_device_offset_ = 0;  // device memory: the offset into the BAR
  bool fake_device_ = false;
  IOMemoryDescriptor* fake_parent_ = nullptr;  // a sub-descriptor's parent (retained)
  void* fake_card_ = nullptr;  // device memory: the fake card behind it
  void free() override;
};

class IOBufferMemoryDescriptor : public IOMemoryDescriptor {
  MELON_STANDIN_META(IOBufferMemoryDescriptor)
 public:
  static kern_return_t Create(uint64_t options, uint64_t capacity, uint64_t alignment,
                              IOBufferMemoryDescriptor** memory);
  kern_return_t SetLength(uint64_t length);
  kern_return_t GetAddressRange(IOAddressSegment* range);
  uint64_t fake_capacity_ = 0;
  void free() override;
};

// ---- dispatch -----------------------------------------------------------------------------------

typedef void (*IODispatchSourceCancelHandler)(void);  // a block in the SDK

class IODispatchQueue : public OSObject {
  MELON_STANDIN_META(IODispatchQueue)
 public:
  static kern_return_t Create(const char* name, uint64_t options, uint64_t priority, IODispatchQueue** queue);
  void* impl_ = nullptr;  // the fake's serializing lock
  void free() override;
};

class IODispatchSource : public OSObject {
  MELON_STANDIN_META(IODispatchSource)
 public:
  virtual kern_return_t SetEnableWithCompletion(bool enable, IODispatchSourceCancelHandler handler);
  virtual kern_return_t Cancel(IODispatchSourceCancelHandler handler);
};

enum {
  kIOInterruptTypeEdge = 0x00000000,
  kIOInterruptTypeLevel = 0x00000001,
  kIOInterruptTypePCIMessaged = 0x00010000,
  kIOInterruptTypePCIMessagedX = 0x00020000,
};

class IOService;

class IOInterruptDispatchSource : public IODispatchSource {
  MELON_STANDIN_META(IOInterruptDispatchSource)
 public:
  static kern_return_t Create(IOService* provider, uint32_t index, IODispatchQueue* queue,
                              IOInterruptDispatchSource** source);
  static kern_return_t GetInterruptType(IOService* provider, uint32_t index, uint64_t* interruptType);
  kern_return_t SetHandler(OSAction* action);
  kern_return_t SetEnableWithCompletion(bool enable, IODispatchSourceCancelHandler handler) override;
  kern_return_t Cancel(IODispatchSourceCancelHandler handler) override;
  void* impl_ = nullptr;
  void free() override;
};

enum {
  kIOTimerClockUptimeRaw = 0x00000008,  // the SDK's values are not asserted here
  kIOTimerClockMachAbsoluteTime = 0x00000020,
};

class IOTimerDispatchSource : public IODispatchSource {
  MELON_STANDIN_META(IOTimerDispatchSource)
 public:
  static kern_return_t Create(IODispatchQueue* queue, IOTimerDispatchSource** source);
  kern_return_t SetHandler(OSAction* action);
  kern_return_t WakeAtTime(uint64_t options, uint64_t deadline, uint64_t leeway);
  kern_return_t SetEnableWithCompletion(bool enable, IODispatchSourceCancelHandler handler) override;
  kern_return_t Cancel(IODispatchSourceCancelHandler handler) override;
  void* impl_ = nullptr;
  void free() override;
};

// ---- services -----------------------------------------------------------------------------------

class IOUserClient;

class IOService : public OSObject {
  MELON_STANDIN_META(IOService)
 public:
  // RPCs iig dispatches to <Class>::<Method>_Impl (tests/driverkit/generated).
  virtual kern_return_t Start(IOService* provider) { return Start_Impl(provider); }
  virtual kern_return_t Stop(IOService* provider) { return Stop_Impl(provider); }
  virtual kern_return_t NewUserClient(uint32_t type, IOUserClient** userClient) {
    return NewUserClient_Impl(type, userClient);
  }
  kern_return_t SetProperties(OSDictionary* properties);
  kern_return_t CopyProperties(OSDictionary** properties);
  kern_return_t RegisterService();
  kern_return_t Create(IOService* provider, const char* propertiesKey, IOService** result);
  IOService* GetProvider() const;
  kern_return_t CopyDispatchQueue(const char* name, class IODispatchQueue** queue);

  kern_return_t Start_Impl(IOService* provider);
  kern_return_t Stop_Impl(IOService* provider);
  kern_return_t NewUserClient_Impl(uint32_t type, IOUserClient** userClient);

  void* impl_ = nullptr;  // the fake's registry entry (properties, provider)
  void free() override;
};

// ---- user clients -------------------------------------------------------------------------------

struct IOUserClientMethodDispatch;

enum { kIOUserClientAsyncArgumentsCountMax = 16 };
typedef uint64_t IOUserClientAsyncArgumentsArray[kIOUserClientAsyncArgumentsCountMax];

struct IOUserClientMethodArguments {
  uint64_t version;
  uint64_t selector;
  OSAction* completion;
  const uint64_t* scalarInput;
  uint32_t scalarInputCount;
  OSData* structureInput;
  IOMemoryDescriptor* structureInputDescriptor;
  uint64_t* scalarOutput;
  uint32_t scalarOutputCount;
  OSData* structureOutput;
  IOMemoryDescriptor* structureOutputDescriptor;
  uint64_t structureOutputMaximumSize;
};

class IOUserClient : public IOService {
  MELON_STANDIN_META(IOUserClient)
 public:
  virtual kern_return_t ExternalMethod(uint64_t selector, IOUserClientMethodArguments* arguments,
                                       const IOUserClientMethodDispatch* dispatch, OSObject* target, void* reference);
  virtual kern_return_t CopyClientMemoryForType(uint64_t type, uint64_t* options, IOMemoryDescriptor** memory) {
    return CopyClientMemoryForType_Impl(type, options, memory);
  }
  kern_return_t CopyClientMemoryForType_Impl(uint64_t type, uint64_t* options, IOMemoryDescriptor** memory);
  kern_return_t CopyClientEntitlements(OSDictionary** entitlements);
  // Answers an asynchronous ExternalMethod call (its `completion`): one message to the wake port
  // the caller gave, carrying `status` and the arguments (the fake queues it on its mach port).
  void AsyncCompletion(OSAction* action, IOReturn status, const IOUserClientAsyncArgumentsArray asyncData,
                       uint32_t asyncDataCount);
  kern_return_t CreateMemoryDescriptorFromClient(uint64_t memoryDescriptorCreateOptions, uint32_t segmentsCount,
                                                 const IOAddressSegment segments[32], IOMemoryDescriptor** memory);
};

// ---- DMA ----------------------------------------------------------------------------------------

struct IODMACommandSpecification {
  uint64_t options;
  uint64_t maxAddressBits;
  uint64_t _resv[16];
};
enum {
  kIODMACommandCreateNoOptions = 0,
  kIODMACommandSpecificationNoOptions = 0,
  kIODMACommandPrepareForDMANoOptions = 0,
  kIODMACommandCompleteDMANoOptions = 0,
};

class IODMACommand : public OSObject {
  MELON_STANDIN_META(IODMACommand)
 public:
  static kern_return_t Create(IOService* device, uint64_t options, const IODMACommandSpecification* specification,
                              IODMACommand** command);
  kern_return_t PrepareForDMA(uint64_t options, IOMemoryDescriptor* memory, uint64_t offset, uint64_t length,
                              uint64_t* flags, uint32_t* segmentsCount, IOAddressSegment segments[32]);
  kern_return_t CompleteDMA(uint64_t options);
  void* impl_ = nullptr;
  void free() override;
};
