// libmelon_vfio_preload.so: presents emulated ConnectX functions (src/mlx5/emu) to an unmodified
// program as Linux VFIO PCI devices (docs/emulator.md "VFIO interposer"). LD_PRELOAD it (the
// launcher tests/vfio/melon-vfio-run does) with
//
//   MELON_VFIO_DEVICES  comma-separated PCI names, e.g. 0000:6d:00.0,0000:6d:00.1 (one device each)
//   MELON_VFIO_ROOT     a private directory: the fake sysfs entries and /dev/vfio nodes live here
//   MELON_VFIO_FAULTS   optional fault injection (see parse_faults)
//   MELON_VFIO_LOG      optional: 1 logs every VFIO call and fault to stderr
//
// What the program sees (all of it in this process, nothing of the machine's):
//   /sys/bus/pci/devices/<name>/{vendor,device,iommu_group ...}  redirected into MELON_VFIO_ROOT
//   /dev/vfio/vfio and /dev/vfio/<group>   fake descriptors (memfds) answering the VFIO ioctls
//   VFIO_GROUP_GET_DEVICE_FD               a device descriptor: region info, config-space pread/
//                                          pwrite, BAR0 mmap, IRQ info, SET_IRQS, RESET
//   BAR0                                   a PROT_NONE mapping trapped instruction by instruction
//                                          (mmio_trap.h): every load/store is one MMIO on the device
//   VFIO_IOMMU_MAP_DMA / UNMAP_DMA         the IOMMU the device's DMA goes through, by IOVA
//   MSI-X                                  vector n signals the eventfd SET_IRQS gave for n
// Paths that are not ours go to the real libc untouched; a real /dev/vfio is never opened.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mlx5/emu/device.h"
#include "mlx5/emu/wire.h"
#include "mmio_trap.h"

namespace emu = melon::mlx5::emu;

namespace {

// ---- the real libc ------------------------------------------------------------------------------

template <typename F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
#define REAL(name) static auto real_##name = real<decltype(&::name)>(#name)

bool g_log = false;

// Descriptors of our own (dups of the program's eventfds) close without passing our close().
void real_close_fd(int fd) {
  REAL(close);
  real_close(fd);
}
#define LOG(...)                                            \
  do {                                                      \
    if (g_log) fprintf(stderr, "melon-vfio: " __VA_ARGS__); \
  } while (0)

// ---- one emulated function ----------------------------------------------------------------------

constexpr int kGroupBase = 7000;  // IOMMU group numbers: high enough to differ from a real host's
constexpr uint64_t kConfigRegion = uint64_t(VFIO_PCI_CONFIG_REGION_INDEX) << 40;
constexpr uint64_t kRegionMask = (1ull << 40) - 1;

struct Function;

// The container's IOMMU: IOVA -> program memory, as VFIO type1 maps it.
class Iommu : public emu::DmaPort {
 public:
  struct Map {
    uint64_t iova, len;
    uint8_t* va;
    bool read, write;
  };
  int map(const vfio_iommu_type1_dma_map& m) {
    if (!m.size || (m.iova | m.size | m.vaddr) & 4095) return EINVAL;
    if (m.iova + m.size < m.iova || m.iova + m.size - 1 > kIovaMax) return EINVAL;
    // VFIO pins the pages: memory that is not mapped in the process fails here, not later.
    std::vector<unsigned char> vec((m.size + 4095) / 4096);
    if (mincore(reinterpret_cast<void*>(m.vaddr), m.size, vec.data()) != 0) return EFAULT;
    std::lock_guard<std::mutex> l(mu_);
    auto it = maps_.lower_bound(m.iova);
    if (it != maps_.end() && it->second.iova < m.iova + m.size) return EEXIST;
    if (it != maps_.begin() && std::prev(it)->second.iova + std::prev(it)->second.len > m.iova) return EEXIST;
    maps_[m.iova] = Map{m.iova, m.size, reinterpret_cast<uint8_t*>(m.vaddr), bool(m.flags & VFIO_DMA_MAP_FLAG_READ),
                        bool(m.flags & VFIO_DMA_MAP_FLAG_WRITE)};
    return 0;
  }
  // Type1v2: the range must cover whole mappings; returns the bytes unmapped.
  int unmap(vfio_iommu_type1_dma_unmap& u) {
    std::lock_guard<std::mutex> l(mu_);
    uint64_t end = u.iova + u.size;
    auto it = maps_.lower_bound(u.iova);
    if (it != maps_.begin() && std::prev(it)->second.iova + std::prev(it)->second.len > u.iova) return EINVAL;
    uint64_t done = 0;
    while (it != maps_.end() && it->second.iova < end) {
      if (it->second.iova + it->second.len > end) return EINVAL;
      done += it->second.len;
      it = maps_.erase(it);
    }
    u.size = done;
    return 0;
  }
  bool read(uint64_t iova, void* dst, size_t len) override { return move(iova, dst, len, false); }
  bool write(uint64_t iova, const void* src, size_t len) override {
    return move(iova, const_cast<void*>(src), len, true);
  }
  uint64_t faults() const { return faults_; }
  void clear() {
    std::lock_guard<std::mutex> l(mu_);
    maps_.clear();
  }
  static constexpr uint64_t kIovaMax = (1ull << 39) - 1;

 private:
  bool move(uint64_t iova, void* buf, size_t len, bool to_host) {
    std::lock_guard<std::mutex> l(mu_);  // held across the copy: UNMAP_DMA waits for DMA in flight
    auto* b = static_cast<uint8_t*>(buf);
    uint64_t a = iova;
    size_t left = len;
    // Check the whole range first: a fault moves nothing.
    while (left) {
      auto it = maps_.upper_bound(a);
      if (it == maps_.begin()) return fault(iova);
      --it;
      const Map& m = it->second;
      if (a >= m.iova + m.len || !(to_host ? m.write : m.read)) return fault(iova);
      size_t n = size_t(std::min<uint64_t>(left, m.iova + m.len - a));
      a += n;
      left -= n;
    }
    a = iova;
    left = len;
    while (left) {
      auto it = std::prev(maps_.upper_bound(a));
      const Map& m = it->second;
      size_t n = size_t(std::min<uint64_t>(left, m.iova + m.len - a));
      if (to_host)
        memcpy(m.va + (a - m.iova), b, n);
      else
        memcpy(b, m.va + (a - m.iova), n);
      a += n;
      b += n;
      left -= n;
    }
    return true;
  }
  bool fault(uint64_t iova) {
    ++faults_;
    LOG("IOMMU fault at IOVA 0x%llx\n", static_cast<unsigned long long>(iova));
    return false;
  }
  std::mutex mu_;
  std::map<uint64_t, Map> maps_;
  std::atomic<uint64_t> faults_{0};
};

// MSI-X: vector n writes the eventfd SET_IRQS gave for n (the kernel's eventfd_signal).
class Msix : public emu::IrqSink {
 public:
  void raise(uint16_t vector) override {
    std::lock_guard<std::mutex> l(mu_);
    if (vector >= fds_.size() || fds_[vector] < 0) return;
    uint64_t one = 1;
    ssize_t n = ::write(fds_[vector], &one, sizeof one);
    (void)n;
  }
  void set(unsigned vector, int fd) {
    std::lock_guard<std::mutex> l(mu_);
    if (vector >= fds_.size()) fds_.resize(vector + 1, -1);
    if (fds_[vector] >= 0) real_close_fd(fds_[vector]);
    fds_[vector] = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;  // the kernel holds its own reference
  }
  void clear() {
    std::lock_guard<std::mutex> l(mu_);
    for (int& fd : fds_) {
      if (fd >= 0) real_close_fd(fd);
      fd = -1;
    }
  }

 private:
  std::mutex mu_;
  std::vector<int> fds_;
};

// A function's wire: frames leaving the port come back into it (one port cabled to itself; two
// QPs of one function, as rdma-core's test builds, reach each other through it).
class Loopback : public emu::FramePort {
 public:
  emu::Device* dev = nullptr;
  void transmit(const uint8_t* frame, size_t len) override {
    if (dev) dev->receive_frame(frame, len);
  }
};

// The device's DMA goes through the IOMMU of whichever container its group is in now; with none,
// every DMA faults.
struct GroupDma : emu::DmaPort {
  std::atomic<Iommu*> iommu{nullptr};
  bool read(uint64_t iova, void* dst, size_t len) override {
    Iommu* m = iommu.load();
    return m && m->read(iova, dst, len);
  }
  bool write(uint64_t iova, const void* src, size_t len) override {
    Iommu* m = iommu.load();
    return m && m->write(iova, src, len);
  }
};

struct Function : melon::vfio::MmioTarget {
  std::string name;  // PCI name
  int group = 0;
  Iommu* iommu = nullptr;  // the container's, once the group is in one
  GroupDma dma;
  Msix msix;
  Loopback wire;
  std::unique_ptr<emu::Device> dev;
  void* bar = nullptr;
  size_t bar_len = 0;
  int device_fd = -1;

  void mmio_load(uint64_t off, void* dst, size_t len) override {
    auto* d = static_cast<uint8_t*>(dst);
    uint64_t a = off & ~3ull;
    uint8_t tmp[40];
    size_t span = ((off + len + 3) & ~3ull) - a;
    for (size_t i = 0; i < span; i += 4) {
      uint32_t v = dev->read32(a + i);
      memcpy(tmp + i, &v, 4);
    }
    memcpy(d, tmp + (off - a), len);
    if (g_log && (off < 0x1000 || off >= 0x2000)) {  // not the health page: polled
      uint64_t v = 0;
      memcpy(&v, d, len > 8 ? 8 : len);
      fprintf(stderr, "melon-vfio: MMIO load  %zu at 0x%llx = 0x%llx\n", len, (unsigned long long)off,
              (unsigned long long)v);
    }
  }
  void mmio_store(uint64_t off, const void* src, size_t len) override {
    if (g_log) {
      uint64_t v = 0;
      memcpy(&v, src, len > 8 ? 8 : len);
      fprintf(stderr, "melon-vfio: MMIO store %zu at 0x%llx = 0x%llx\n", len, (unsigned long long)off,
              (unsigned long long)v);
    }
    if (len == 4 && off % 4 == 0) {
      uint32_t v;
      memcpy(&v, src, 4);
      dev->write32(off, v);
    } else if (len == 8 && off % 8 == 0) {
      uint64_t v;
      memcpy(&v, src, 8);
      dev->write64(off, v);
    } else if (len >= 16) {
      dev->write_block(off, src, len);
    } else {
      // A narrow store: the device's registers are 32-bit; merge into the dword (read-modify-write
      // is what a root complex cannot do, so this is logged).
      LOG("narrow MMIO store of %zu bytes at 0x%llx\n", len, static_cast<unsigned long long>(off));
      uint64_t a = off & ~3ull;
      uint32_t v = dev->read32(a);
      memcpy(reinterpret_cast<uint8_t*>(&v) + (off - a), src, len);
      dev->write32(a, v);
    }
  }
};

// ---- state --------------------------------------------------------------------------------------

enum class Kind { kContainer, kGroup, kDevice };
struct Fd {
  Kind kind;
  Function* fn = nullptr;  // group, device
  Iommu* iommu = nullptr;  // container
  bool iommu_set = false;
};

struct TimedFault {
  std::string what;
  unsigned ms = 0;
};

// Everything in one object made on first use: libraries initialised before this one (libibverbs
// reads sysfs from its constructor) may call in before this library's static constructors run.
struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<Function>> fns;
  std::map<int, Fd> fds;
  std::string root;
  bool ready = false;
  std::vector<TimedFault> timed;
  emu::DeviceConfig cfg;
};
State& state() {
  static State* s = new State;  // never destroyed: calls may come during exit
  return *s;
}
#define g_mu state().mu
#define g_fns state().fns
#define g_fds state().fds
#define g_root state().root
#define g_ready state().ready
#define g_timed state().timed
#define g_cfg state().cfg

void write_file(const std::string& path, const std::string& text) {
  REAL(open);
  int fd = real_open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  REAL(close);
  ssize_t n = ::write(fd, text.data(), text.size());
  (void)n;
  real_close(fd);
}

void mkdirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
}

// MELON_VFIO_FAULTS: comma-separated, each optionally "@<ms>": armed that long after the device is
// opened (so the driver's bring-up can finish first); without it, armed at open.
//   cmd_timeout                      commands are taken and never completed
//   bad_status=<op>:<status>:<synd>  the next command with opcode <op> (hex, 0 = any) fails so
//   fatal=<synd>                     firmware reports a fatal syndrome (counter frozen too)
//   health_stall                     the health counter stops, nothing else shows it
void parse_faults(const char* s) {
  if (!s || !*s) return;
  std::string all(s);
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find(',', pos);
    if (end == std::string::npos) end = all.size();
    std::string f = all.substr(pos, end - pos);
    TimedFault t;
    size_t at = f.find('@');
    t.what = f.substr(0, at);
    if (at != std::string::npos) t.ms = unsigned(strtoul(f.c_str() + at + 1, nullptr, 0));
    g_timed.push_back(t);
    pos = end + 1;
  }
}

void apply_fault(emu::Device* dev, const std::string& what) {
  emu::Faults f = dev->faults();
  unsigned a = 0, b = 0, c = 0;
  if (what == "cmd_timeout") {
    f.cmd_timeout = true;
  } else if (sscanf(what.c_str(), "bad_status=%x:%x:%x", &a, &b, &c) == 3) {
    f.bad_status_opcode = uint16_t(a);
    f.bad_status = uint8_t(b);
    f.bad_status_syndrome = c;
  } else if (sscanf(what.c_str(), "fatal=%x", &a) == 1) {
    dev->inject_fatal(uint8_t(a));
    fprintf(stderr, "melon-vfio: fault injected: %s\n", what.c_str());
    return;
  } else if (what == "health_stall") {
    f.health_stall = true;
  } else {
    fprintf(stderr, "melon-vfio: unknown fault '%s'\n", what.c_str());
    return;
  }
  dev->set_faults(f);
  fprintf(stderr, "melon-vfio: fault injected: %s\n", what.c_str());
}

void init_once() {
  if (g_ready) return;
  g_ready = true;
  const char* log = getenv("MELON_VFIO_LOG");
  g_log = log && *log == '1';
  g_cfg.trace_commands = g_log;
  const char* devs = getenv("MELON_VFIO_DEVICES");
  const char* root = getenv("MELON_VFIO_ROOT");
  if (!devs || !root) return;
  g_root = root;
  if (const char* pt = getenv("MELON_VFIO_DEVICE_ID")) g_cfg.pci_device_id = uint16_t(strtoul(pt, nullptr, 0));
  parse_faults(getenv("MELON_VFIO_FAULTS"));
  std::string all(devs);
  size_t pos = 0;
  int i = 0;
  while (pos < all.size()) {
    size_t end = all.find(',', pos);
    if (end == std::string::npos) end = all.size();
    auto fn = std::make_unique<Function>();
    fn->name = all.substr(pos, end - pos);
    fn->group = kGroupBase + i++;
    std::string dir = g_root + "/sys/bus/pci/devices/" + fn->name;
    mkdirs(dir);
    char hex[16];
    snprintf(hex, sizeof hex, "0x%04x\n", emu::kPciVendorMellanox);
    write_file(dir + "/vendor", hex);
    snprintf(hex, sizeof hex, "0x%04x\n", g_cfg.pci_device_id);
    write_file(dir + "/device", hex);
    write_file(dir + "/class", "0x020000\n");
    std::string groups = g_root + "/sys/kernel/iommu_groups/" + std::to_string(fn->group);
    mkdirs(groups + "/devices");
    std::string link = dir + "/iommu_group";
    unlink(link.c_str());
    if (symlink(("../../../../kernel/iommu_groups/" + std::to_string(fn->group)).c_str(), link.c_str()) != 0) {}
    mkdirs(g_root + "/dev/vfio");
    write_file(g_root + "/dev/vfio/" + std::to_string(fn->group), "");
    write_file(g_root + "/dev/vfio/vfio", "");
    g_fns.push_back(std::move(fn));
    pos = end + 1;
  }
}

// A path of ours, rewritten into MELON_VFIO_ROOT; empty if it is not ours.
std::string ours(const char* path) {
  if (!path) return {};
  std::lock_guard<std::mutex> l(g_mu);
  init_once();
  if (g_root.empty()) return {};
  static const char kPci[] = "/sys/bus/pci/devices/";
  if (strncmp(path, kPci, sizeof kPci - 1) == 0) {
    const char* rest = path + sizeof kPci - 1;
    for (auto& fn : g_fns)
      if (strncmp(rest, fn->name.c_str(), fn->name.size()) == 0 &&
          (rest[fn->name.size()] == 0 || rest[fn->name.size()] == '/'))
        return g_root + path;
    return {};
  }
  if (strncmp(path, "/sys/kernel/iommu_groups/", 25) == 0) {
    int g = atoi(path + 25);
    for (auto& fn : g_fns)
      if (fn->group == g) return g_root + path;
    return {};
  }
  if (strcmp(path, "/dev/vfio/vfio") == 0) return g_root + path;
  if (strncmp(path, "/dev/vfio/", 10) == 0) {
    int g = atoi(path + 10);
    for (auto& fn : g_fns)
      if (fn->group == g) return g_root + path;
  }
  return {};
}

int new_fd(const char* name, Fd f) {
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  g_fds[fd] = f;
  return fd;
}

// open() of /dev/vfio/*: the container or a group.
int open_vfio(const char* path) {
  std::lock_guard<std::mutex> l(g_mu);
  if (strcmp(path, "/dev/vfio/vfio") == 0) {
    Fd f{Kind::kContainer};
    f.iommu = new Iommu;
    LOG("open container\n");
    return new_fd("melon-vfio-container", f);
  }
  int g = atoi(path + 10);
  for (auto& fn : g_fns)
    if (fn->group == g) {
      Fd f{Kind::kGroup};
      f.fn = fn.get();
      LOG("open group %d\n", g);
      return new_fd("melon-vfio-group", f);
    }
  errno = ENOENT;
  return -1;
}

bool is_dev_vfio(const char* path) { return path && strncmp(path, "/dev/vfio/", 10) == 0; }

void maybe_start_faults(Function* fn) {
  for (const TimedFault& t : g_timed) {
    if (!t.ms) {
      apply_fault(fn->dev.get(), t.what);
      continue;
    }
    emu::Device* dev = fn->dev.get();
    std::string what = t.what;
    unsigned ms = t.ms;
    std::thread([dev, what, ms] {
      usleep(ms * 1000u);
      apply_fault(dev, what);
    }).detach();
  }
}

// ---- device ioctls ------------------------------------------------------------------------------

int region_info(Function* fn, vfio_region_info* ri) {
  if (ri->argsz < sizeof *ri) return EINVAL;
  ri->cap_offset = 0;
  ri->flags = 0;
  ri->size = 0;
  ri->offset = uint64_t(ri->index) << 40;
  if (ri->index == VFIO_PCI_BAR0_REGION_INDEX) {
    ri->size = emu::kBar0Bytes;
    ri->flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP;
  } else if (ri->index == VFIO_PCI_CONFIG_REGION_INDEX) {
    ri->size = 4096;
    ri->flags = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
  } else if (ri->index >= VFIO_PCI_NUM_REGIONS) {
    return EINVAL;
  }
  return 0;
}

int set_irqs(Function* fn, vfio_irq_set* s) {
  if (s->argsz < sizeof *s || s->index != VFIO_PCI_MSIX_IRQ_INDEX) return EINVAL;
  if (s->start + s->count > g_cfg.msix_vectors) return EINVAL;
  uint32_t data = s->flags & VFIO_IRQ_SET_DATA_TYPE_MASK, action = s->flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
  if (action != VFIO_IRQ_SET_ACTION_TRIGGER) return EINVAL;
  if (data == VFIO_IRQ_SET_DATA_NONE && s->count == 0) {
    fn->msix.clear();
    return 0;
  }
  if (data != VFIO_IRQ_SET_DATA_EVENTFD) return EINVAL;
  if (s->argsz < sizeof *s + sizeof(int) * s->count) return EINVAL;
  const int* fds = reinterpret_cast<const int*>(s->data);
  for (uint32_t i = 0; i < s->count; ++i) fn->msix.set(s->start + i, fds[i]);
  LOG("SET_IRQS MSI-X %u..%u\n", s->start, s->start + s->count - 1);
  return 0;
}

int device_ioctl(Fd& f, unsigned long req, void* arg) {
  Function* fn = f.fn;
  switch (req) {
    case VFIO_DEVICE_GET_INFO: {
      auto* di = static_cast<vfio_device_info*>(arg);
      di->flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
      di->num_regions = VFIO_PCI_NUM_REGIONS;
      di->num_irqs = VFIO_PCI_NUM_IRQS;
      return 0;
    }
    case VFIO_DEVICE_GET_REGION_INFO: return region_info(fn, static_cast<vfio_region_info*>(arg));
    case VFIO_DEVICE_GET_IRQ_INFO: {
      auto* ii = static_cast<vfio_irq_info*>(arg);
      if (ii->argsz < sizeof *ii) return EINVAL;
      ii->flags = 0;
      ii->count = 0;
      if (ii->index == VFIO_PCI_MSIX_IRQ_INDEX) {
        ii->flags = VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE;
        ii->count = g_cfg.msix_vectors;
      } else if (ii->index >= VFIO_PCI_NUM_IRQS) {
        return EINVAL;
      }
      return 0;
    }
    case VFIO_DEVICE_SET_IRQS: return set_irqs(fn, static_cast<vfio_irq_set*>(arg));
    case VFIO_DEVICE_RESET:
      fn->dev->flr();
      fn->dev->enumerate();
      return 0;
  }
  return ENOTTY;
}

int group_ioctl(Fd& f, unsigned long req, void* arg) {
  Function* fn = f.fn;
  switch (req) {
    case VFIO_GROUP_GET_STATUS: {
      auto* st = static_cast<vfio_group_status*>(arg);
      st->flags = VFIO_GROUP_FLAGS_VIABLE | (fn->iommu ? VFIO_GROUP_FLAGS_CONTAINER_SET : 0);
      return 0;
    }
    case VFIO_GROUP_SET_CONTAINER: {
      int cfd = *static_cast<int*>(arg);
      auto it = g_fds.find(cfd);
      if (it == g_fds.end() || it->second.kind != Kind::kContainer) return EINVAL;
      if (fn->iommu) return EBUSY;
      fn->iommu = it->second.iommu;
      fn->dma.iommu = fn->iommu;
      return 0;
    }
    case VFIO_GROUP_UNSET_CONTAINER:
      fn->iommu = nullptr;
      fn->dma.iommu = nullptr;
      return 0;
  }
  return ENOTTY;
}

int container_ioctl(Fd& f, unsigned long req, unsigned long arg) {
  switch (req) {
    case VFIO_SET_IOMMU:
      if (arg != VFIO_TYPE1v2_IOMMU && arg != VFIO_TYPE1_IOMMU) return EINVAL;
      f.iommu_set = true;
      return 0;
    case VFIO_IOMMU_GET_INFO: {
      auto* info = reinterpret_cast<vfio_iommu_type1_info*>(arg);
      if (!f.iommu_set) return EINVAL;
      // One IOVA-range capability with two ranges, as an x86 host's VT-d reports around the MSI
      // window (0xfee00000..0xfeefffff), here with a 39-bit aperture.
      size_t cap_sz = sizeof(vfio_iommu_type1_info_cap_iova_range) + 2 * sizeof(vfio_iova_range);
      size_t need = sizeof(vfio_iommu_type1_info) + cap_sz;
      uint32_t argsz = info->argsz;
      info->flags = VFIO_IOMMU_INFO_PGSIZES | VFIO_IOMMU_INFO_CAPS;
      info->iova_pgsizes = 0x40201000ull;  // 4 KiB, 2 MiB, 1 GiB
      if (argsz < need) {
        info->argsz = uint32_t(need);
        info->cap_offset = 0;
        return 0;
      }
      info->cap_offset = sizeof(vfio_iommu_type1_info);
      auto* cap =
          reinterpret_cast<vfio_iommu_type1_info_cap_iova_range*>(reinterpret_cast<uint8_t*>(info) + info->cap_offset);
      cap->header.id = VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE;
      cap->header.version = 1;
      cap->header.next = 0;
      cap->nr_iovas = 2;
      cap->iova_ranges[0] = {0, 0xfedfffffull};
      cap->iova_ranges[1] = {0xfef00000ull, Iommu::kIovaMax};
      return 0;
    }
    case VFIO_IOMMU_MAP_DMA: {
      if (!f.iommu_set) return EINVAL;
      auto* m = reinterpret_cast<vfio_iommu_type1_dma_map*>(arg);
      int e = f.iommu->map(*m);
      LOG("MAP_DMA iova 0x%llx size 0x%llx -> %d\n", (unsigned long long)m->iova, (unsigned long long)m->size, e);
      return e;
    }
    case VFIO_IOMMU_UNMAP_DMA: {
      if (!f.iommu_set) return EINVAL;
      auto* u = reinterpret_cast<vfio_iommu_type1_dma_unmap*>(arg);
      return f.iommu->unmap(*u);
    }
  }
  return ENOTTY;
}

Function* device_fn(int fd) {
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_fds.find(fd);
  return it != g_fds.end() && it->second.kind == Kind::kDevice ? it->second.fn : nullptr;
}

int get_device_fd(Fd& f, const char* name) {
  Function* fn = f.fn;
  if (!name || fn->name != name) return -EINVAL;
  if (!fn->iommu) return -EINVAL;
  if (fn->device_fd >= 0) return -EBUSY;
  if (!fn->dev) {
    emu::HostPorts ports;
    ports.dma = &fn->dma;
    ports.irq = &fn->msix;
    ports.wire = &fn->wire;
    fn->dev = std::make_unique<emu::Device>(ports, g_cfg);
    fn->wire.dev = fn->dev.get();
    fn->dev->start_worker();
  } else {
    // vfio-pci resets the function when it is opened (pci_try_reset_function) and restores its
    // configuration; a second program run in this process gets a fresh function, as on Linux.
    fn->dev->flr();
    fn->dev->enumerate();
  }
  maybe_start_faults(fn);
  Fd d{Kind::kDevice};
  d.fn = fn;
  int fd = new_fd("melon-vfio-device", d);
  fn->device_fd = fd;
  LOG("device fd %d for %s\n", fd, name);
  return fd;
}

}  // namespace

// ---- the interposed libc calls ------------------------------------------------------------------

extern "C" {

int open(const char* path, int flags, ...) {
  REAL(open);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  std::string p = ours(path);
  if (is_dev_vfio(path)) {
    if (p.empty()) {
      errno = ENOENT;  // never the machine's /dev/vfio
      return -1;
    }
    return open_vfio(path);
  }
  return real_open(p.empty() ? path : p.c_str(), flags, mode);
}
int open64(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  return open(path, flags, mode);
}
int __open_2(const char* path, int flags) { return open(path, flags); }
int __open64_2(const char* path, int flags) { return open(path, flags); }

int openat(int dirfd, const char* path, int flags, ...) {
  REAL(openat);
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  if (path[0] == '/') {
    if (is_dev_vfio(path)) return open(path, flags, mode);
    std::string p = ours(path);
    if (!p.empty()) return real_openat(dirfd, p.c_str(), flags, mode);
  }
  return real_openat(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  return openat(dirfd, path, flags, mode);
}

#define REDIRECT_STAT(fn, st_t)                         \
  int fn(const char* path, struct st_t* st) {           \
    REAL(fn);                                           \
    std::string p = ours(path);                         \
    if (p.empty() && is_dev_vfio(path)) {               \
      errno = ENOENT;                                   \
      return -1;                                        \
    }                                                   \
    return real_##fn(p.empty() ? path : p.c_str(), st); \
  }
REDIRECT_STAT(stat, stat)
REDIRECT_STAT(lstat, stat)
REDIRECT_STAT(stat64, stat64)
REDIRECT_STAT(lstat64, stat64)

int access(const char* path, int mode) {
  REAL(access);
  std::string p = ours(path);
  return real_access(p.empty() ? path : p.c_str(), mode);
}

ssize_t readlink(const char* path, char* buf, size_t len) {
  REAL(readlink);
  std::string p = ours(path);
  return real_readlink(p.empty() ? path : p.c_str(), buf, len);
}

DIR* opendir(const char* path) {
  REAL(opendir);
  std::string p = ours(path);
  return real_opendir(p.empty() ? path : p.c_str());
}

char* realpath(const char* path, char* resolved) {
  REAL(realpath);
  std::string p = ours(path);
  return real_realpath(p.empty() ? path : p.c_str(), resolved);
}

int close(int fd) {
  REAL(close);
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_fds.find(fd);
    if (it != g_fds.end()) {
      Fd f = it->second;
      g_fds.erase(it);
      if (f.kind == Kind::kDevice) {
        // vfio-pci's release: interrupts off, the function reset; its DMA stops here.
        f.fn->msix.clear();
        f.fn->device_fd = -1;
        f.fn->dev->flr();
        f.fn->dev->enumerate();
      } else if (f.kind == Kind::kGroup) {
        f.fn->iommu = nullptr;
        f.fn->dma.iommu = nullptr;
      } else if (f.kind == Kind::kContainer) {
        // The container's mappings die with it (the Iommu object stays: the device may hold it).
        f.iommu->clear();
      }
      LOG("close fd %d\n", fd);
    }
  }
  return real_close(fd);
}

int ioctl(int fd, unsigned long req, ...) {
  REAL(ioctl);
  va_list ap;
  va_start(ap, req);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  std::unique_lock<std::mutex> l(g_mu);
  auto it = g_fds.find(fd);
  if (it == g_fds.end()) {
    l.unlock();
    return real_ioctl(fd, req, arg);
  }
  Fd& f = it->second;
  int r = 0;
  switch (f.kind) {
    case Kind::kContainer:
      if (req == VFIO_GET_API_VERSION) return VFIO_API_VERSION;
      if (req == VFIO_CHECK_EXTENSION) {
        unsigned long ext = reinterpret_cast<unsigned long>(arg);
        return ext == VFIO_TYPE1v2_IOMMU || ext == VFIO_TYPE1_IOMMU;
      }
      r = container_ioctl(f, req, reinterpret_cast<unsigned long>(arg));
      break;
    case Kind::kGroup:
      if (req == VFIO_GROUP_GET_DEVICE_FD) {
        int d = get_device_fd(f, static_cast<const char*>(arg));
        if (d < 0) {
          errno = -d;
          return -1;
        }
        return d;
      }
      r = group_ioctl(f, req, arg);
      break;
    case Kind::kDevice: r = device_ioctl(f, req, arg); break;
  }
  if (g_log) fprintf(stderr, "melon-vfio: ioctl fd %d 0x%lx -> %d\n", fd, req, r);
  if (r) {
    errno = r;
    return -1;
  }
  return 0;
}

static ssize_t config_io(Function* fn, void* buf, size_t n, off_t off, bool write) {
  uint64_t region = uint64_t(off) & ~kRegionMask, o = uint64_t(off) & kRegionMask;
  auto* b = static_cast<uint8_t*>(buf);
  if (region == kConfigRegion) {
    if (o >= 4096) return 0;
    if (o + n > 4096) n = 4096 - o;
    size_t i = 0;
    while (i < n) {
      unsigned w = ((o + i) % 4 == 0 && n - i >= 4) ? 4 : ((o + i) % 2 == 0 && n - i >= 2) ? 2 : 1;
      uint32_t v = 0;
      if (write) {
        memcpy(&v, b + i, w);
        fn->dev->config_write(uint32_t(o + i), w, v);
      } else {
        v = fn->dev->config_read(uint32_t(o + i), w);
        memcpy(b + i, &v, w);
      }
      i += w;
    }
    return ssize_t(n);
  }
  if (region == 0) {  // BAR0 by read/write (vfio-pci allows it): 32-bit accesses
    if (o % 4 || n % 4 || o + n > emu::kBar0Bytes) {
      errno = EINVAL;
      return -1;
    }
    for (size_t i = 0; i < n; i += 4) {
      if (write)
        fn->mmio_store(o + i, b + i, 4);
      else
        fn->mmio_load(o + i, b + i, 4);
    }
    return ssize_t(n);
  }
  errno = EINVAL;
  return -1;
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  REAL(pread);
  if (Function* fn = device_fn(fd)) return config_io(fn, buf, n, off, false);
  return real_pread(fd, buf, n, off);
}
ssize_t pread64(int fd, void* buf, size_t n, off_t off) { return pread(fd, buf, n, off); }
ssize_t __pread_chk(int fd, void* buf, size_t n, off_t off, size_t buflen) {
  if (n > buflen) abort();  // glibc's __chk_fail
  return pread(fd, buf, n, off);
}
ssize_t __pread64_chk(int fd, void* buf, size_t n, off_t off, size_t buflen) {
  return __pread_chk(fd, buf, n, off, buflen);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite);
  if (Function* fn = device_fn(fd)) return config_io(fn, const_cast<void*>(buf), n, off, true);
  return real_pwrite(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  REAL(mmap);
  Function* fn = fd >= 0 ? device_fn(fd) : nullptr;
  if (!fn) return real_mmap(addr, len, prot, flags, fd, off);
  if (off != 0 || len > emu::kBar0Bytes || fn->bar) {
    errno = EINVAL;
    return MAP_FAILED;
  }
  // BAR0: no access at all, so every load and store traps into the device (mmio_trap.h).
  void* p = real_mmap(addr, len, PROT_NONE, (flags & ~MAP_SHARED) | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return p;
  fn->bar = p;
  fn->bar_len = len;
  melon::vfio::mmio_trap_register(p, len, fn);
  LOG("BAR0 mapped at %p (%zu bytes)\n", p, len);
  return p;
}
void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}

int munmap(void* addr, size_t len) {
  REAL(munmap);
  {
    std::lock_guard<std::mutex> l(g_mu);
    for (auto& fn : g_fns)
      if (fn->bar == addr) {
        melon::vfio::mmio_trap_unregister(addr);
        fn->bar = nullptr;
      }
  }
  return real_munmap(addr, len);
}

}  // extern "C"

__attribute__((destructor)) static void melon_vfio_fini() {
  for (auto& fn : g_fns)
    if (fn->dev) fn->dev->stop_worker();
  if (g_log) {
    auto s = melon::vfio::mmio_trap_stats();
    fprintf(stderr, "melon-vfio: MMIO loads %llu stores %llu stepped %llu\n", (unsigned long long)s.emulated_loads,
            (unsigned long long)s.emulated_stores, (unsigned long long)s.stepped_loads);
  }
}
