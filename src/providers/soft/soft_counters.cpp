#include "providers/soft/soft_counters.h"
#include "providers/soft/soft_config.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace melon::soft {

namespace {

constexpr char kMagic[8] = {'M', 'E', 'L', 'S', 'T', 'A', 'T', '1'};
constexpr size_t kHeader = 64, kNameSize = 32, kDeviceSize = 48;
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "counters are plain 64-bit words that another process reads");

void debug(const std::string& what) {
  if (soft_tunables().debug) std::fprintf(stderr, "melondma soft: counters: %s\n", what.c_str());
}

}  // namespace

bool CounterFile::make_private_directory(const std::string& d) {
  if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return lstat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022);
}

std::string CounterFile::directory() {
  const std::string d = soft_tunables().stats_dir;
  return make_private_directory(d) ? d : std::string();
}

CounterFile::CounterFile(const char* device) {
  if (!device) return;
  std::string dir = directory();
  if (dir.empty()) {
    debug("no private directory for the counter file; counters stay in the process");
    return;
  }
  std::string path = dir + "/" + device + "." + std::to_string(getpid());
  size_t size = kHeader + kCounterCount * (kNameSize + sizeof(uint64_t));
  unlink(path.c_str());  // a file left by an earlier process with this pid
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    debug(path + ": " + std::strerror(errno));
    return;
  }
  void* m = MAP_FAILED;
  if (ftruncate(fd, off_t(size)) == 0) m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (m == MAP_FAILED) {
    debug(path + ": " + std::strerror(err));
    unlink(path.c_str());
    return;
  }
  auto* p = static_cast<uint8_t*>(m);
  std::memcpy(p, kMagic, sizeof kMagic);
  uint32_t n = uint32_t(kCounterCount), pid = uint32_t(getpid());
  std::memcpy(p + 8, &n, 4);
  std::memcpy(p + 12, &pid, 4);
  std::snprintf(reinterpret_cast<char*>(p + 16), kDeviceSize, "%s", device);
  for (size_t i = 0; i < kCounterCount; ++i)
    std::snprintf(reinterpret_cast<char*>(p + kHeader + i * kNameSize), kNameSize, "%s", kCounters[i].name);
  static_assert(kHeader % 8 == 0 && kNameSize % 8 == 0, "the values are 8-byte aligned");
  stats_ = new (p + kHeader + kCounterCount * kNameSize) TransportStats;
  map_ = m;
  size_ = size;
  path_ = path;
  owner_ = getpid();
}

CounterFile::~CounterFile() {
  if (!map_) return;
  stats_->~TransportStats();
  munmap(map_, size_);
  if (getpid() == owner_) unlink(path_.c_str());  // a forked child leaves its parent's file alone
}

}  // namespace melon::soft
