// The fake kernel: services and their registry entries, IOService::Create from a personality's
// properties, matching and starting the driver, user-client connections (IOServiceOpen and the
// rest of the IOKit user side the provider's transport calls), and client death.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>

#include <IOKit/IOKitLib.h>

#include "fake.h"
#include "fake_internal.h"
#include "iig_support.h"

#ifndef MELON_DEXT_INFO_PLIST
#error "MELON_DEXT_INFO_PLIST: path of src/dext/driverkit/Info.plist"
#endif

namespace melon::dkfake {

namespace {
std::mutex g_reg_mu;
std::map<std::string, MelonStandinFactory>& factories() {
  static std::map<std::string, MelonStandinFactory> m;
  return m;
}
std::map<uint32_t, IOService*>& services() {  // io_service_t -> registered service
  static std::map<uint32_t, IOService*> m;
  return m;
}
struct Mapping {
  IOMemoryDescriptor* md;
  void* shadow;  // device memory: whole pages standing in for the BAR window they map
  uint64_t len;  // from the returned address to the descriptor's end
  uint64_t win_off = 0, win_len = 0;  // device memory: the BAR range the task can store to
  uint64_t win_base = 0;  // the task address of win_off
};
struct Connection {
  IOService* driver = nullptr;
  IOUserClient* client = nullptr;
  std::multimap<uint64_t, Mapping> maps;  // by address (a ring's SQ and RQ share one)
};
std::map<uint32_t, Connection>& connections() {
  static std::map<uint32_t, Connection> m;
  return m;
}
uint32_t g_next_port = 0x1000;
std::atomic<long> g_external_method_calls{0};
std::atomic<bool> g_refuse_async{false};
std::vector<std::string> g_task_ids;
bool g_task_array = true;
}  // namespace

ServiceImpl* service_impl(IOService* s) {
  if (!s->impl_) s->impl_ = new ServiceImpl;
  return static_cast<ServiceImpl*>(s->impl_);
}

// ---- the personality, from the driver's own Info.plist ----------------------------------------------

// The user client's IOUserClass and the entitlement keys the personality's MlxUserClientProperties
// name. A plist reader would be more than this test needs: the file's shape is checked by
// tests/macos (plist_test.py); here two values are read out of it.
static OSDictionary* personality_properties() {
  std::ifstream f(MELON_DEXT_INFO_PLIST);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string xml = ss.str();
  auto after = [&](const std::string& from, const char* key) -> std::string {
    std::smatch m;
    std::regex re(std::string("<key>") + key + "</key>\\s*<string>([^<]*)</string>");
    std::string tail = xml.substr(xml.find(from) == std::string::npos ? xml.size() : xml.find(from));
    return std::regex_search(tail, m, re) ? m[1].str() : "";
  };
  OSDictionary* props = OSDictionary::withCapacity(4);
  OSDictionary* uc = OSDictionary::withCapacity(3);
  OSString* cls = OSString::withCString(after("<key>MlxUserClientProperties</key>", "IOUserClass").c_str());
  uc->setObject("IOUserClass", cls);
  props->setObject("MlxUserClientProperties", uc);
  OSString* dcls = OSString::withCString(after("<key>MlxPCIDriver</key>", "IOUserClass").c_str());
  props->setObject("IOUserClass", dcls);
  cls->release(), uc->release(), dcls->release();
  return props;
}

static OSString* str(OSObject* o) { return OSDynamicCast(OSString, o); }

IOService* start_driver(Card& card, kern_return_t* result) {
  OSDictionary* props = personality_properties();
  std::string cls =
      str(props->getObject("IOUserClass")) ? str(props->getObject("IOUserClass"))->getCStringNoCopy() : "";
  MelonStandinFactory make = nullptr;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    if (factories().count(cls)) make = factories()[cls];
  }
  if (!make) {
    props->release();
    *result = kIOReturnNotFound;
    return nullptr;
  }
  IOService* drv = make();
  if (!drv->init()) {
    props->release();
    drv->release();
    *result = kIOReturnNoMemory;
    return nullptr;
  }
  ServiceImpl* si = service_impl(drv);
  si->props = props;
  si->provider = card.pci();
  IODispatchQueue::Create("Default", 0, 0, &si->queue);
  std::lock_guard<std::recursive_mutex> q(queue_lock(si->queue));
  *result = drv->Start(card.pci());
  return drv;
}

kern_return_t stop_driver(IOService* drv) {
  if (!drv) return kIOReturnBadArgument;
  // Usually the kernel stops a service's user clients before the service (stop_provider_first is
  // the other order, which Apple does not rule out).
  std::vector<uint32_t> mine;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    for (auto& [port, c] : connections())
      if (c.driver == drv) mine.push_back(port);
  }
  for (uint32_t p : mine) kill_connection(p);
  kern_return_t r = stop_provider_first(drv);
  release_stopped(drv);
  return r;
}

kern_return_t stop_provider_first(IOService* drv) {
  if (!drv) return kIOReturnBadArgument;
  std::lock_guard<std::recursive_mutex> q(queue_lock(service_impl(drv)->queue));
  return drv->Stop(service_impl(drv)->provider);
}

void release_stopped(IOService* drv) {
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    for (auto it = services().begin(); it != services().end();)
      it = it->second == drv ? services().erase(it) : std::next(it);
  }
  drv->release();
}

std::string string_property(IOService* s, const char* key) {
  OSDictionary* p = service_impl(s)->props;
  OSString* v = p ? str(p->getObject(key)) : nullptr;
  return v ? v->getCStringNoCopy() : "";
}

long long number_property(IOService* s, const char* key) {
  OSDictionary* p = service_impl(s)->props;
  OSNumber* v = p ? OSDynamicCast(OSNumber, p->getObject(key)) : nullptr;
  return v ? (long long)v->unsigned64BitValue() : -1;
}

void set_task_entitlements(const std::vector<std::string>& ids, bool as_array) {
  g_task_ids = ids;
  g_task_array = as_array;
}

static OSDictionary* task_entitlements() {
  OSDictionary* d = OSDictionary::withCapacity(1);
  if (g_task_ids.empty()) return d;
  const char* key = "com.apple.developer.driverkit.userclient-access";
  if (g_task_array) {
    OSArray* a = OSArray::withCapacity(uint32_t(g_task_ids.size()));
    for (auto& id : g_task_ids) {
      OSString* s = OSString::withCString(id.c_str());
      a->setObject(s);
      s->release();
    }
    d->setObject(key, a);
    a->release();
  } else {
    OSString* s = OSString::withCString(g_task_ids[0].c_str());
    d->setObject(key, s);
    s->release();
  }
  return d;
}

IOUserClient* user_client_of(uint32_t port) {
  std::lock_guard<std::mutex> l(g_reg_mu);
  auto it = connections().find(port);
  return it == connections().end() ? nullptr : it->second.client;
}

// Stop on the client's queue, mappings dropped, the last reference released: what the kernel does
// when the task closes the connection or dies.
void kill_connection(uint32_t port) {
  Connection c;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    auto it = connections().find(port);
    if (it == connections().end()) return;
    c = it->second;
    connections().erase(it);
  }
  for (auto& [addr, m] : c.maps) {
    free(m.shadow);
    m.md->release();
  }
  ServiceImpl* si = service_impl(c.client);
  {
    std::lock_guard<std::recursive_mutex> q(queue_lock(si->queue));
    c.client->Stop(c.driver);
  }
  c.client->release();
}

}  // namespace melon::dkfake

using namespace melon::dkfake;

// ---- IOService ----------------------------------------------------------------------------------------

kern_return_t IOService::Start_Impl(IOService* provider) {
  if (!provider) return kIOReturnBadArgument;
  service_impl(this)->provider = provider;
  return kIOReturnSuccess;
}
kern_return_t IOService::Stop_Impl(IOService*) { return kIOReturnSuccess; }
kern_return_t IOService::NewUserClient_Impl(uint32_t, IOUserClient**) { return kIOReturnUnsupported; }

// Merges into the registry entry, as a driver publishing its own properties sees it in ioreg.
namespace {
std::atomic<int> g_fail_set_properties{0};
}  // namespace

// SetProperties is an IPC to the kernel and can fail (Apple returns an IOReturn): the fake fails
// the next fail_set_properties(n) calls with kIOReturnNoMemory, storing nothing.
kern_return_t IOService::SetProperties(OSDictionary* properties) {
  if (!properties) return kIOReturnBadArgument;
  for (int n = g_fail_set_properties.load(); n > 0;)
    if (g_fail_set_properties.compare_exchange_weak(n, n - 1)) return kIOReturnNoMemory;
  ServiceImpl* si = service_impl(this);
  if (!si->props) si->props = OSDictionary::withCapacity(4);
  each_entry(properties, [&](const std::string& k, OSObject* v) { si->props->setObject(k.c_str(), v); });
  return kIOReturnSuccess;
}

kern_return_t IOService::CopyProperties(OSDictionary** properties) {
  ServiceImpl* si = service_impl(this);
  if (!si->props) return kIOReturnNotFound;
  si->props->retain();
  *properties = si->props;
  return kIOReturnSuccess;
}

kern_return_t IOService::RegisterService() {
  std::lock_guard<std::mutex> l(g_reg_mu);
  service_impl(this)->registered = true;
  services()[g_next_port++] = this;
  return kIOReturnSuccess;
}

kern_return_t IOService::Create(IOService* provider, const char* key, IOService** result) {
  ServiceImpl* si = service_impl(this);
  OSDictionary* p = si->props ? OSDynamicCast(OSDictionary, si->props->getObject(key)) : nullptr;
  OSString* cls = p ? OSDynamicCast(OSString, p->getObject("IOUserClass")) : nullptr;
  if (!cls) return kIOReturnBadArgument;
  MelonStandinFactory make = nullptr;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    auto it = factories().find(cls->getCStringNoCopy());
    if (it != factories().end()) make = it->second;
  }
  if (!make) return kIOReturnNotFound;
  IOService* s = make();
  if (!s->init()) {
    s->release();
    return kIOReturnNoMemory;
  }
  ServiceImpl* ni = service_impl(s);
  ni->props = OSDictionary::withCapacity(4);
  each_entry(p, [&](const std::string& k, OSObject* v) { ni->props->setObject(k.c_str(), v); });
  ni->provider = provider;
  IODispatchQueue::Create("Default", 0, 0, &ni->queue);
  *result = s;
  return kIOReturnSuccess;
}

IOService* IOService::GetProvider() const { return service_impl(const_cast<IOService*>(this))->provider; }

kern_return_t IOService::CopyDispatchQueue(const char* name, IODispatchQueue** queue) {
  ServiceImpl* si = service_impl(this);
  if (!name || strcmp(name, "Default") || !si->queue) return kIOReturnNotFound;
  si->queue->retain();
  *queue = si->queue;
  return kIOReturnSuccess;
}

void IOService::free() {
  if (auto* si = static_cast<ServiceImpl*>(impl_)) {
    OSSafeReleaseNULL(si->props);
    OSSafeReleaseNULL(si->queue);
    OSSafeReleaseNULL(si->entitlements);
    delete si;
  }
  impl_ = nullptr;
  OSObject::free();
}

bool melon_standin_register_class(const char* name, MelonStandinFactory make) {
  std::lock_guard<std::mutex> l(g_reg_mu);
  factories()[name] = make;
  return true;
}

// ---- IOUserClient -------------------------------------------------------------------------------------

kern_return_t IOUserClient::ExternalMethod(uint64_t, IOUserClientMethodArguments*, const IOUserClientMethodDispatch*,
                                           OSObject*, void*) {
  return kIOReturnUnsupported;
}
kern_return_t IOUserClient::CopyClientMemoryForType_Impl(uint64_t, uint64_t*, IOMemoryDescriptor**) {
  return kIOReturnUnsupported;
}
kern_return_t IOUserClient::CopyClientEntitlements(OSDictionary** entitlements) {
  ServiceImpl* si = service_impl(this);
  if (!si->entitlements) return kIOReturnNotFound;
  si->entitlements->retain();
  *entitlements = si->entitlements;
  return kIOReturnSuccess;
}
// The client task is this process: its range is used in place.
// Whether the calling task (this process) maps [addr, addr + len) readable, and writable when
// `write` (/proc/self/maps, mapping after mapping with no gap).
static bool task_maps(uint64_t addr, uint64_t len, bool write) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return false;
  uint64_t at = addr, end = addr + len;
  char line[512];
  while (at < end && fgets(line, sizeof line, f)) {
    unsigned long long lo, hi;
    char perms[8] = {};
    if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3 || hi <= at) continue;
    if (lo > at || perms[0] != 'r' || (write && perms[1] != 'w')) break;
    at = hi;
  }
  fclose(f);
  return at >= end;
}

// As the kernel does: only memory the client task maps, and writable where the device will write
// (kIOMemoryDirectionIn); otherwise kIOReturnBadArgument and no descriptor.
kern_return_t IOUserClient::CreateMemoryDescriptorFromClient(uint64_t options, uint32_t count,
                                                             const IOAddressSegment segs[32],
                                                             IOMemoryDescriptor** memory) {
  if (count != 1 || !segs[0].address || !segs[0].length) return kIOReturnBadArgument;
  if (segs[0].address + segs[0].length < segs[0].address) return kIOReturnBadArgument;
  if (!task_maps(segs[0].address, segs[0].length, (options & kIOMemoryDirectionIn) != 0)) return kIOReturnBadArgument;
  auto* md = new IOMemoryDescriptor;
  md->fake_base_ = reinterpret_cast<uint8_t*>(uintptr_t(segs[0].address));
  md->fake_length_ = segs[0].length;
  *memory = md;
  return kIOReturnSuccess;
}

// ---- the IOKit user side --------------------------------------------------------------------------------

const mach_port_t kIOMainPortDefault = 0;

extern "C" {
mach_port_t mach_task_self(void) { return 1; }

// The matching dictionary is the wanted class name, owned by the caller until consumed.
CFMutableDictionaryRef IOServiceNameMatching(const char* name) {
  return reinterpret_cast<CFMutableDictionaryRef>(strdup(name ? name : ""));
}

io_service_t IOServiceGetMatchingService(mach_port_t, CFDictionaryRef matching) {
  char* name = reinterpret_cast<char*>(const_cast<__CFDictionary*>(matching));
  io_service_t found = IO_OBJECT_NULL;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    for (auto& [port, s] : services())
      if (name && !strcmp(s->getMetaClass()->name, name)) found = port;
  }
  free(name);
  return found;
}

kern_return_t IOObjectRelease(io_object_t) { return kIOReturnSuccess; }

kern_return_t IOServiceOpen(io_service_t service, task_port_t, uint32_t type, io_connect_t* connect) {
  IOService* drv = nullptr;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    auto it = services().find(service);
    if (it == services().end()) return kIOReturnNotFound;
    drv = it->second;
  }
  IOUserClient* uc = nullptr;
  kern_return_t r;
  {
    std::lock_guard<std::recursive_mutex> q(queue_lock(service_impl(drv)->queue));
    r = drv->NewUserClient(type, &uc);
  }
  if (r != kIOReturnSuccess) return r;
  service_impl(uc)->entitlements = task_entitlements();
  {
    std::lock_guard<std::recursive_mutex> q(queue_lock(service_impl(uc)->queue));
    r = uc->Start(drv);
  }
  if (r != kIOReturnSuccess) {
    uc->release();
    return r;
  }
  std::lock_guard<std::mutex> l(g_reg_mu);
  uint32_t port = g_next_port++;
  connections()[port] = Connection{drv, uc, {}};
  *connect = port;
  return kIOReturnSuccess;
}

kern_return_t IOServiceClose(io_connect_t connect) {
  if (!user_client_of(connect)) return kIOReturnBadArgument;
  kill_connection(connect);
  return kIOReturnSuccess;
}

}  // extern "C"

// One ExternalMethod call on the user client's queue, as the kernel makes it: `completion` is the
// action of an asynchronous call (nullptr for a synchronous one).
static kern_return_t call_method(mach_port_t connection, uint32_t selector, OSAction* completion, const void* in,
                                 size_t in_len, void* out, size_t* out_len) {
  IOUserClient* uc = user_client_of(connection);
  if (!uc) return kIOReturnBadArgument;
  IOUserClientMethodArguments args{};
  args.version = 2;
  args.selector = selector;
  args.completion = completion;
  OSData* input = in_len ? OSData::withBytes(in, in_len) : nullptr;
  args.structureInput = input;
  args.structureOutputMaximumSize = out_len ? *out_len : 0;
  kern_return_t r;
  {
    std::lock_guard<std::recursive_mutex> q(queue_lock(service_impl(uc)->queue));
    g_external_method_calls++;
    r = uc->ExternalMethod(selector, &args, nullptr, nullptr, nullptr);
  }
  OSSafeReleaseNULL(input);
  size_t got = args.structureOutput ? args.structureOutput->getLength() : 0;
  if (r == kIOReturnSuccess && out_len && got > *out_len) r = kIOReturnNoSpace;  // the caller's buffer is short
  if (r == kIOReturnSuccess && out_len) {
    if (got) memcpy(out, args.structureOutput->getBytesNoCopy(), got);
    *out_len = got;
  }
  OSSafeReleaseNULL(args.structureOutput);
  return r;
}

extern "C" {
kern_return_t IOConnectCallStructMethod(mach_port_t connection, uint32_t selector, const void* in, size_t in_len,
                                        void* out, size_t* out_len) {
  return call_method(connection, selector, nullptr, in, in_len, out, out_len);
}

// The kernel makes an action for the call whose reference names the wake port (AsyncCompletion
// sends there); the driver retains it if it answers later. The kernel's own reference goes when the
// call returns.
kern_return_t IOConnectCallAsyncStructMethod(mach_port_t connection, uint32_t selector, mach_port_t wake_port,
                                             uint64_t* reference, uint32_t reference_count, const void* in,
                                             size_t in_len, void* out, size_t* out_len) {
  if (!wake_port || !reference || reference_count < 1 || reference_count > kOSAsyncRef64Count)
    return kIOReturnBadArgument;
  if (g_refuse_async) return kIOReturnUnsupported;  // as a driver that has no asynchronous selector
  OSAction* a = OSAction::make(nullptr, nullptr, sizeof(AsyncReference));
  auto* ref = static_cast<AsyncReference*>(a->GetReference());
  ref->wake_port = wake_port;
  memcpy(ref->words, reference, reference_count * sizeof(uint64_t));
  kern_return_t r = call_method(connection, selector, a, in, in_len, out, out_len);
  a->release();
  return r;
}

kern_return_t IOConnectMapMemory64(io_connect_t connect, uint32_t type, task_port_t, mach_vm_address_t* at,
                                   mach_vm_size_t* size, IOOptionBits) {
  IOUserClient* uc = user_client_of(connect);
  if (!uc || !at || !size) return kIOReturnBadArgument;
  IOMemoryDescriptor* md = nullptr;
  uint64_t opts = 0;
  kern_return_t r;
  {
    std::lock_guard<std::recursive_mutex> q(queue_lock(service_impl(uc)->queue));
    r = uc->CopyClientMemoryForType(type, &opts, &md);
  }
  if (r != kIOReturnSuccess) return r;
  if (!md) return kIOReturnError;
  Mapping m{md, nullptr, md->fake_length_};
  uint64_t addr;
  if (md->fake_device_) {
    // The task gets whole pages: the pages of BAR0 the descriptor touches, the returned address at
    // the descriptor's offset within the first (as IOKit maps a descriptor that does not start on a
    // page). BAR0 cannot be mapped into a Linux process, so zeroed pages stand for the window, and
    // a store anywhere in it reaches the BAR through mmio_store64, neighbours included.
    uint64_t page = melon::dkfake::task_page_size();
    m.win_off = md->fake_device_offset_ / page * page;
    m.win_len = (md->fake_device_offset_ + m.len + page - 1) / page * page - m.win_off;
    m.shadow = aligned_alloc(page, m.win_len);
    memset(m.shadow, 0, m.win_len);
    m.win_base = uint64_t(uintptr_t(m.shadow));
    addr = m.win_base + (md->fake_device_offset_ - m.win_off);
  } else {
    addr = uint64_t(uintptr_t(md->fake_base_));
  }
  std::lock_guard<std::mutex> l(g_reg_mu);
  connections()[connect].maps.emplace(addr, m);
  *at = addr;
  *size = m.len;
  return kIOReturnSuccess;
}

kern_return_t IOConnectUnmapMemory64(io_connect_t connect, uint32_t, task_port_t, mach_vm_address_t at) {
  Mapping m{};
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    auto c = connections().find(connect);
    if (c == connections().end()) return kIOReturnBadArgument;
    auto it = c->second.maps.find(at);
    if (it == c->second.maps.end()) return kIOReturnBadArgument;
    m = it->second;
    c->second.maps.erase(it);
  }
  free(m.shadow);
  m.md->release();
  return kIOReturnSuccess;
}
}

namespace melon::dkfake {
void fail_set_properties(int n) { g_fail_set_properties = n; }

// The BAR offset behind a device-memory mapping made by IOConnectMapMemory64 (-1 if not one).
long long device_offset_of(uint32_t connect, uint64_t addr) {
  std::lock_guard<std::mutex> l(g_reg_mu);
  auto c = connections().find(connect);
  if (c == connections().end()) return -1;
  auto it = c->second.maps.find(addr);
  if (it == c->second.maps.end() || !it->second.md->fake_device_) return -1;
  return (long long)it->second.md->fake_device_offset_;
}

bool mmio_store64(uint32_t connect, void* address, const void* bytes8) {
  uint64_t a = uint64_t(uintptr_t(address));
  Card* card = nullptr;
  uint64_t off = 0;
  {
    std::lock_guard<std::mutex> l(g_reg_mu);
    auto c = connections().find(connect);
    if (c == connections().end()) return false;
    for (auto& [base, m] : c->second.maps)
      if (m.md->fake_device_ && a >= m.win_base && a + 8 <= m.win_base + m.win_len) {
        card = static_cast<Card*>(m.md->fake_card_);
        off = m.win_off + (a - m.win_base);
      }
  }
  if (!card || off % 8) return false;
  uint64_t v;
  memcpy(&v, bytes8, 8);  // the bytes in memory order, as the store puts them on the bus
  memcpy(address, bytes8, 8);
  card->device().write64(off, v);
  return true;
}

long external_method_calls() { return g_external_method_calls; }
void refuse_async_calls(bool on) { g_refuse_async = on; }

uint32_t service_port(IOService* driver) {
  std::lock_guard<std::mutex> l(g_reg_mu);
  for (auto& [port, s] : services())
    if (s == driver) return port;
  return 0;
}

}  // namespace melon::dkfake
