// The stand-in's libkern and IOLib: reference-counted objects and collections, IOMalloc with size
// checking, IOLock, sleeps, mach time, os_log capture. Counters feed the tests' leak checks.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <mach/mach_time.h>
#include <os/log.h>

#include "fake.h"
#include "fake_internal.h"

namespace {
std::atomic<long> g_objects{0}, g_locks{0}, g_mismatches{0};
std::mutex g_malloc_mu;
std::map<void*, size_t>& allocations() {
  static std::map<void*, size_t> m;
  return m;
}
long long g_malloc_bytes = 0;
std::mutex g_log_mu;
std::vector<std::string>& log_buffer() {
  static std::vector<std::string> v;
  return v;
}
}  // namespace

// ---- metaclasses ----------------------------------------------------------------------------------

const OSMetaClass OSMetaClassBase::gMetaClass{"OSMetaClassBase", nullptr};
#define MELON_META(cls, super) const OSMetaClass cls::gMetaClass{#cls, &super::gMetaClass};
MELON_META(OSObject, OSMetaClassBase)
MELON_META(OSString, OSObject)
MELON_META(OSNumber, OSObject)
MELON_META(OSBoolean, OSObject)
MELON_META(OSData, OSObject)
MELON_META(OSArray, OSObject)
MELON_META(OSDictionary, OSObject)
MELON_META(OSAction, OSObject)
MELON_META(IOMemoryDescriptor, OSObject)
MELON_META(IOBufferMemoryDescriptor, IOMemoryDescriptor)
MELON_META(IODispatchQueue, OSObject)
MELON_META(IODispatchSource, OSObject)
MELON_META(IOInterruptDispatchSource, IODispatchSource)
MELON_META(IOTimerDispatchSource, IODispatchSource)
MELON_META(IOService, OSObject)
MELON_META(IOUserClient, IOService)
MELON_META(IODMACommand, OSObject)
MELON_META(IOPCIDevice, IOService)

OSMetaClassBase::OSMetaClassBase() { g_objects++; }
OSMetaClassBase::~OSMetaClassBase() { g_objects--; }

OSMetaClassBase* OSMetaClassBase::safeMetaCast(const OSMetaClassBase* me, const OSMetaClass* to) {
  if (!me) return nullptr;
  for (const OSMetaClass* m = me->getMetaClass(); m; m = m->superclass)
    if (m == to) return const_cast<OSMetaClassBase*>(me);
  return nullptr;
}

void OSMetaClassBase::retain() const { __atomic_add_fetch(&refs_, 1, __ATOMIC_RELAXED); }
void OSMetaClassBase::release() const {
  if (__atomic_sub_fetch(&refs_, 1, __ATOMIC_ACQ_REL) == 0) {
    auto* self = const_cast<OSMetaClassBase*>(this);
    if (auto* o = OSDynamicCast(OSObject, self)) {
      o->free();
      melon::dkfake::free_collection(o);
    }
    delete self;
  }
}

// ---- collections ----------------------------------------------------------------------------------

namespace {
struct StrImpl {
  std::string s;
};
struct DataImpl {
  std::vector<uint8_t> b;
};
struct ArrayImpl {
  std::vector<const OSMetaClassBase*> v;
};
struct DictImpl {
  std::vector<std::pair<std::string, const OSMetaClassBase*>> v;
};
template <class T>
T* impl(void*& p) {
  if (!p) p = new T;
  return static_cast<T*>(p);
}
}  // namespace

OSString* OSString::withCString(const char* c) {
  if (!c) return nullptr;
  auto* s = new OSString;
  impl<StrImpl>(s->impl_)->s = c;
  return s;
}
const char* OSString::getCStringNoCopy() const { return static_cast<StrImpl*>(impl_)->s.c_str(); }
size_t OSString::getLength() const { return static_cast<StrImpl*>(impl_)->s.size(); }
bool OSString::isEqualTo(const char* c) const { return c && static_cast<StrImpl*>(impl_)->s == c; }

OSNumber* OSNumber::withNumber(uint64_t value, size_t bits) {
  auto* n = new OSNumber;
  n->value_ = bits >= 64 ? value : value & ((1ull << bits) - 1);
  return n;
}
uint64_t OSNumber::unsigned64BitValue() const { return value_; }
uint32_t OSNumber::unsigned32BitValue() const { return uint32_t(value_); }

static OSBoolean* make_bool(bool v) {
  auto* b = new OSBoolean;
  b->value_ = v;
  return b;
}
OSBoolean* const kOSBooleanTrue = make_bool(true);
OSBoolean* const kOSBooleanFalse = make_bool(false);

OSData* OSData::withBytes(const void* bytes, size_t n) {
  auto* d = new OSData;
  auto* b = impl<DataImpl>(d->impl_);
  b->b.assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + n);
  return d;
}
const void* OSData::getBytesNoCopy() const { return impl_ ? static_cast<DataImpl*>(impl_)->b.data() : nullptr; }
size_t OSData::getLength() const { return impl_ ? static_cast<DataImpl*>(impl_)->b.size() : 0; }

OSArray* OSArray::withCapacity(uint32_t) {
  auto* a = new OSArray;
  impl<ArrayImpl>(a->impl_);
  return a;
}
uint32_t OSArray::getCount() const { return uint32_t(static_cast<ArrayImpl*>(impl_)->v.size()); }
OSObject* OSArray::getObject(uint32_t i) const {
  auto& v = static_cast<ArrayImpl*>(impl_)->v;
  return i < v.size() ? OSDynamicCast(OSObject, v[i]) : nullptr;
}
bool OSArray::setObject(const OSMetaClassBase* o) {
  if (!o) return false;
  o->retain();
  static_cast<ArrayImpl*>(impl_)->v.push_back(o);
  return true;
}

OSDictionary* OSDictionary::withCapacity(uint32_t) {
  auto* d = new OSDictionary;
  impl<DictImpl>(d->impl_);
  return d;
}
OSObject* OSDictionary::getObject(const char* key) const {
  for (auto& [k, v] : static_cast<DictImpl*>(impl_)->v)
    if (k == key) return OSDynamicCast(OSObject, v);
  return nullptr;
}
bool OSDictionary::setObject(const char* key, const OSMetaClassBase* o) {
  if (!key || !o) return false;
  o->retain();
  for (auto& [k, v] : static_cast<DictImpl*>(impl_)->v)
    if (k == key) {
      v->release();
      v = o;
      return true;
    }
  static_cast<DictImpl*>(impl_)->v.emplace_back(key, o);
  return true;
}
uint32_t OSDictionary::getCount() const { return uint32_t(static_cast<DictImpl*>(impl_)->v.size()); }

namespace melon::dkfake {
// Collections release what they hold and their storage when they go (from OSObject::free()).
void free_collection(OSObject* o) {
  if (auto* s = OSDynamicCast(OSString, o)) delete static_cast<StrImpl*>(s->impl_);
  if (auto* d = OSDynamicCast(OSData, o)) delete static_cast<DataImpl*>(d->impl_);
  if (auto* a = OSDynamicCast(OSArray, o)) {
    auto* ai = static_cast<ArrayImpl*>(a->impl_);
    for (auto* v : ai->v) v->release();
    delete ai;
  }
  if (auto* d = OSDynamicCast(OSDictionary, o)) {
    auto* di = static_cast<DictImpl*>(d->impl_);
    for (auto& [k, v] : di->v) v->release();
    delete di;
  }
  if (auto* a = OSDynamicCast(OSAction, o)) ::free(a->reference_);
}
void each_entry(OSDictionary* d, const std::function<void(const std::string&, OSObject*)>& f) {
  for (auto& [k, v] : static_cast<DictImpl*>(d->impl_)->v) f(k, OSDynamicCast(OSObject, v));
}
}  // namespace melon::dkfake

void* OSAction::GetReference() { return reference_; }
OSAction* OSAction::make(OSObject* target, Call call, size_t size) {
  auto* a = new OSAction;
  a->target_ = target;
  a->call_ = call;
  a->reference_size_ = size;
  a->reference_ = size ? calloc(1, size) : nullptr;
  return a;
}

// ---- IOLib ----------------------------------------------------------------------------------------

extern "C" {
void* IOMalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) return nullptr;
  std::lock_guard<std::mutex> l(g_malloc_mu);
  allocations()[p] = n;
  g_malloc_bytes += (long long)n;
  return p;
}
void* IOMallocZero(size_t n) {
  void* p = IOMalloc(n);
  if (p) memset(p, 0, n);
  return p;
}
void IOFree(void* p, size_t n) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> l(g_malloc_mu);
    auto it = allocations().find(p);
    if (it == allocations().end() || it->second != n) {
      g_mismatches++;
      if (it == allocations().end()) return;  // not ours: leave it alone
    }
    g_malloc_bytes -= (long long)it->second;
    allocations().erase(it);
  }
  free(p);
}
struct IOLock {
  std::mutex m;
};
IOLock* IOLockAlloc(void) {
  g_locks++;
  return new IOLock;
}
void IOLockFree(IOLock* l) {
  if (!l) return;
  g_locks--;
  delete l;
}
void IOLockLock(IOLock* l) { l->m.lock(); }
void IOLockUnlock(IOLock* l) { l->m.unlock(); }
void IOSleep(uint64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
uint64_t IOVMPageSize = 16384;  // Apple silicon; a test sets 4096 for an Intel Mac
void IODelay(uint64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

uint64_t mach_absolute_time(void) {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
int mach_timebase_info(mach_timebase_info_data_t* info) {
  info->numer = info->denom = 1;
  return 0;
}

void melon_standin_os_log(os_log_t, os_log_type_t, const char* fmt, ...) {
  // os_log's privacy qualifiers are not printf's.
  std::string f(fmt);
  for (const char* q : {"{public}", "{private}"})
    for (size_t at; (at = f.find(q)) != std::string::npos;) f.erase(at, strlen(q));
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, f.c_str(), ap);
  va_end(ap);
  if (getenv("MELON_DK_LOG")) fprintf(stderr, "os_log: %s\n", line);
  std::lock_guard<std::mutex> l(g_log_mu);
  if (log_buffer().size() < 200000) log_buffer().emplace_back(line);
}
}

namespace melon::dkfake {
std::vector<std::string> log_lines() {
  std::lock_guard<std::mutex> l(g_log_mu);
  return log_buffer();
}
bool logged(const std::string& needle) {
  std::lock_guard<std::mutex> l(g_log_mu);
  for (auto& s : log_buffer())
    if (s.find(needle) != std::string::npos) return true;
  return false;
}
void clear_log() {
  std::lock_guard<std::mutex> l(g_log_mu);
  log_buffer().clear();
}
long live_objects() { return g_objects.load(); }
long long malloc_bytes() {
  std::lock_guard<std::mutex> l(g_malloc_mu);
  return g_malloc_bytes;
}
long live_locks() { return g_locks.load(); }
long free_mismatches() { return g_mismatches.load(); }
}  // namespace melon::dkfake
