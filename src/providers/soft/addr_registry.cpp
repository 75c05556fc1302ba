#include "providers/soft/addr_registry.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "providers/soft/random.h"
#include "providers/soft/soft_counters.h"
#include "providers/soft/udp_socket.h"
#include "roce/ip_udp.h"

#if defined(__linux__)
#include <linux/filter.h>
static_assert(sizeof(sock_filter) == sizeof(melon::soft::CbpfInsn), "CbpfInsn is struct sock_filter");
#endif

namespace melon::soft {

namespace {

constexpr char kMagic[8] = {'M', 'E', 'L', 'S', 'H', 'R', '0', '2'};
constexpr uint8_t kBucketFree = 0, kBucketReserved = 0xff;  // else: socket slot + 1
constexpr off_t kMemberLockBase = 4096;  // member m holds a write lock on byte kMemberLockBase + m
enum SocketState : uint8_t { kFree = 0, kClaimed = 1, kJoined = 2 };

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

bool lock_byte(int fd, off_t at, short type, bool wait) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = at;
  l.l_len = 1;
  while (fcntl(fd, wait ? F_SETLKW : F_SETLK, &l) != 0)
    if (errno != EINTR) return false;
  return true;
}

// Whether another process holds member byte `m` (alive).
bool held_by_other(int fd, uint32_t m) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = kMemberLockBase + off_t(m);
  l.l_len = 1;
  if (fcntl(fd, F_GETLK, &l) != 0) return true;  // cannot tell: keep it
  return l.l_type != F_UNLCK;
}

std::string address_text(const uint8_t gid[16]) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (roce::gid_is_v4_mapped(gid))
    inet_ntop(AF_INET, gid + 12, buf, sizeof buf);
  else
    inet_ntop(AF_INET6, gid, buf, sizeof buf);
  return buf;
}

// The network namespace the address lives in: 127.0.0.1 of two namespaces are two groups.
unsigned long long netns_id() {
#if defined(__linux__)
  struct stat st;
  if (stat("/proc/self/ns/net", &st) == 0) return (unsigned long long)st.st_ino;
#endif
  return 0;
}

std::mutex g_open_mu;
std::map<std::string, std::weak_ptr<AddressRegistry>>& open_registries() {
  static auto* m = new std::map<std::string, std::weak_ptr<AddressRegistry>>;  // outlives statics
  return *m;
}

}  // namespace

struct AddressRegistry::Layout {
  char magic[8];
  uint32_t size;
  uint32_t secret[2];
  uint32_t generation;  // bumped when sockets may have moved unseen (a death)
  uint32_t verify_rounds;  // probe rounds still to send after a death
  uint32_t rebuilds, reclaimed;  // programs attached; dead members reclaimed (for people and tests)
  uint64_t probed_at;  // CLOCK_MONOTONIC of the last probe round
  uint8_t gsi_socket;  // QP1's socket slot + 1 (kGsiUnclaimed: none); the CM agent's hook
  uint8_t owner;  // forward mode: the socket slot holding the port + 1 (0: none)
  uint8_t handover_to;  // forward mode: the slot an owner that left named to take over + 1
  uint8_t pad[5];
  uint32_t routes;  // bumped when a bucket, QP1 or a ring changes hands (read without the lock)
  uint32_t pad2;
  struct Member {
    uint32_t in_use, pid;
  } members[kShareMaxMembers];
  struct Socket {
    uint8_t state, member, lane, pad;
    uint32_t index;  // in the kernel's group
    uint32_t index_gen;  // the generation in which index was known; older: believed, not known
    uint64_t ring;  // forward mode: the nonce of its receive ring (0: none)
  } sockets[kShareMaxSockets];
  uint8_t bucket[kQpnBuckets];
};

struct AddressRegistry::Locked {
  explicit Locked(AddressRegistry* r) : r(r), g(r->mu_) { ok = r->lock_file(true); }
  ~Locked() {
    if (ok) r->unlock_file();
  }
  AddressRegistry* r;
  std::lock_guard<std::mutex> g;
  bool ok;
};

bool AddressRegistry::lock_file(bool wait) { return lock_byte(fd_, 0, F_WRLCK, wait); }
void AddressRegistry::unlock_file() { lock_byte(fd_, 0, F_UNLCK, false); }

std::shared_ptr<AddressRegistry> AddressRegistry::open(const uint8_t gid[16], uint32_t scope_id, uint16_t port,
                                                       std::string* why) {
  const std::string dir = "/tmp/melondma-" + std::to_string(geteuid());
  if (!CounterFile::make_private_directory(dir)) {
    *why = dir + " is not a directory of this user only (mode 0700)";
    return nullptr;
  }
  const std::string path = dir + "/roce-" + address_text(gid) + "%" + std::to_string(scope_id) + "-" +
                           std::to_string(port) + "-net" + std::to_string(netns_id()) + ".share";
  std::lock_guard<std::mutex> g(g_open_mu);
  if (auto r = open_registries()[path].lock()) return r;
  std::shared_ptr<AddressRegistry> r(new AddressRegistry);
  r->path_ = path;
  std::memcpy(r->gid_, gid, 16);
  r->scope_id_ = scope_id;
  r->port_ = port;
  r->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  struct stat st;
  if (r->fd_ < 0 || fstat(r->fd_, &st) != 0 || st.st_uid != geteuid()) {
    *why = path + ": " + (r->fd_ < 0 ? std::strerror(errno) : "not this user's");
    return nullptr;
  }
  if (!r->lock_file(true)) {
    *why = path + ": lock: " + std::strerror(errno);
    return nullptr;
  }
  struct Unlock {
    AddressRegistry* r;
    ~Unlock() { r->unlock_file(); }
  } unlock{r.get()};
  if (size_t(st.st_size) < sizeof(Layout) && ftruncate(r->fd_, off_t(sizeof(Layout))) != 0) {
    *why = path + ": ftruncate: " + std::strerror(errno);
    return nullptr;
  }
  void* m = mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (m == MAP_FAILED) {
    *why = path + ": mmap: " + std::strerror(errno);
    return nullptr;
  }
  r->map_ = static_cast<Layout*>(m);
  Layout& l = *r->map_;
  if (std::memcmp(l.magic, kMagic, sizeof kMagic) || l.size != sizeof(Layout)) {
    // New, or left by a library of another layout: start afresh (its members cannot be ours).
    std::memset(&l, 0, sizeof l);
    std::memcpy(l.magic, kMagic, sizeof kMagic);
    l.size = sizeof(Layout);
    random_bytes(l.secret, sizeof l.secret);
    l.generation = 1;
    l.bucket[0] = kBucketReserved;  // QPN 0 (SMI) and 1 (GSI): gsi_socket steers QP1
  }
  std::memcpy(r->secret_, l.secret, sizeof r->secret_);
  r->sweep_locked();
  for (uint32_t i = 0; i < kShareMaxMembers && r->member_ < 0; ++i)
    if (!l.members[i].in_use && lock_byte(r->fd_, kMemberLockBase + off_t(i), F_WRLCK, false)) {
      l.members[i] = {1, uint32_t(getpid())};
      r->member_ = int(i);
    }
  if (r->member_ < 0) {
    *why = path + ": " + std::to_string(kShareMaxMembers) + " processes already share this address";
    return nullptr;
  }
  open_registries()[path] = r;
  return r;
}

AddressRegistry::~AddressRegistry() {
  if (map_ && member_ >= 0) {
    Locked g(this);
    Layout& l = *map_;
    for (uint32_t s = 0; s < kShareMaxSockets; ++s)
      if (l.sockets[s].state != kFree && l.sockets[s].member == member_) free_socket_locked(s);
    for (uint8_t& b : l.bucket)
      if (b != kBucketFree && b != kBucketReserved && l.sockets[b - 1].state == kFree) b = kBucketFree;
    l.members[member_] = {0, 0};
    l.routes++;
    lock_byte(fd_, kMemberLockBase + member_, F_UNLCK, false);
  }
  if (map_) munmap(map_, sizeof(Layout));
  if (fd_ >= 0) close(fd_);
  std::lock_guard<std::mutex> g(g_open_mu);
  auto it = open_registries().find(path_);
  if (it != open_registries().end() && it->second.expired()) open_registries().erase(it);
}

bool AddressRegistry::sweep_locked() {
  Layout& l = *map_;
  bool moved = false;  // a dead member's joined sockets left the group in an order nobody saw
  for (uint32_t m = 0; m < kShareMaxMembers; ++m) {
    if (!l.members[m].in_use || int(m) == member_ || held_by_other(fd_, m)) continue;
    for (uint32_t s = 0; s < kShareMaxSockets; ++s)
      if (l.sockets[s].state != kFree && l.sockets[s].member == m) {
        moved |= l.sockets[s].state == kJoined;
        free_socket_locked(s);
      }
    l.members[m] = {0, 0};
    l.reclaimed++;
    l.routes++;
  }
  // Whatever a member that died halfway through a change left: sockets of no member, buckets and
  // QP1 of no socket.
  for (uint32_t s = 0; s < kShareMaxSockets; ++s)
    if (l.sockets[s].state != kFree && !l.members[l.sockets[s].member % kShareMaxMembers].in_use) {
      moved |= l.sockets[s].state == kJoined;
      free_socket_locked(s);
    }
  for (uint8_t& b : l.bucket)
    if (b != kBucketFree && b != kBucketReserved && (b > kShareMaxSockets || l.sockets[b - 1].state == kFree)) {
      b = kBucketFree;
      l.routes++;
    }
  // A socket that joined (reuseport mode) or claimed (forward mode, where sockets never join) holds QP1.
  if (l.gsi_socket && (l.gsi_socket > kShareMaxSockets || l.sockets[l.gsi_socket - 1].state == kFree)) {
    l.gsi_socket = kGsiUnclaimed;
    l.routes++;
  }
  if (l.owner > kShareMaxSockets || (l.owner && l.sockets[l.owner - 1].state == kFree)) l.owner = 0;
  if (moved) {
    l.generation++;
    l.verify_rounds = 1;  // once more a tick later: sockets that closed after these probes
    rebuild_locked();  // the dead member's buckets go nowhere now
    probe_locked();
  }
  return moved;
}

uint32_t AddressRegistry::live_sockets_locked() const {
  uint32_t n = 0;
  for (const Layout::Socket& s : map_->sockets) n += s.state == kJoined;
  return n;
}

int AddressRegistry::rebuild_locked() {
  Layout& l = *map_;
  if (our_fds_.empty()) return 0;  // nothing of ours in the group: another member rebuilds
  SteeringTable t;
  t.secret[0] = l.secret[0];
  t.secret[1] = l.secret[1];
  for (uint32_t b = 0; b < kQpnBuckets; ++b) {
    const uint8_t v = l.bucket[b];
    if (v != kBucketFree && v != kBucketReserved && l.sockets[v - 1].state == kJoined)
      t.index_of_bucket[b] = l.sockets[v - 1].index;
  }
  if (l.gsi_socket) t.gsi_index = l.sockets[l.gsi_socket - 1].index;
#if defined(__linux__)
  std::vector<CbpfInsn> prog = build_steering_program(t);
  sock_fprog fp{static_cast<unsigned short>(prog.size()), reinterpret_cast<sock_filter*>(prog.data())};
  if (setsockopt(our_fds_.front().second, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fp, sizeof fp) != 0) return errno;
  l.rebuilds++;
  return 0;
#else
  (void)t;
  return EOPNOTSUPP;  // no steering program off Linux (docs/verbs.md: macOS)
#endif
}

void AddressRegistry::probe_locked() {
  Layout& l = *map_;
  l.probed_at = now_ns();
  const uint32_t n = live_sockets_locked();
  if (!n) return;
  sockaddr_storage ss{};
  const socklen_t sl = roce_sockaddr(gid_, scope_id_, port_, &ss);
  int fd = socket(ss.ss_family, SOCK_DGRAM, 0);  // closed again below (no SOCK_CLOEXEC on macOS)
  if (fd < 0) return;  // the next tick tries again
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t p[kProbeLen];
    write_probe(p, l.secret, {i, l.generation});
    (void)!sendto(fd, p, sizeof p, 0, reinterpret_cast<sockaddr*>(&ss), sl);
  }
  close(fd);
}

int AddressRegistry::claim(const std::vector<AddressRegistry*>& regs_in, uint32_t lanes,
                           std::vector<std::vector<uint8_t>>* buckets, std::vector<std::vector<int>>* slots,
                           std::string* why) {
  // Locked in path order, so two devices claiming on overlapping addresses never wait on each other.
  std::vector<AddressRegistry*> regs = regs_in;
  std::sort(regs.begin(), regs.end(), [](auto* a, auto* b) { return a->path_ < b->path_; });
  std::vector<std::unique_ptr<Locked>> held;
  for (AddressRegistry* r : regs) {
    held.emplace_back(new Locked(r));
    r->sweep_locked();
  }
  buckets->assign(lanes, {});
  slots->assign(regs_in.size(), std::vector<int>(lanes, -1));
  auto undo = [&] {
    for (size_t i = 0; i < regs_in.size(); ++i)
      for (int s : (*slots)[i])
        if (s >= 0) {
          Layout& l = *regs_in[i]->map_;
          regs_in[i]->free_socket_locked(uint32_t(s));
          for (uint8_t& b : l.bucket)
            if (b == uint8_t(s + 1)) b = kBucketFree;
        }
  };
  for (uint32_t lane = 0; lane < lanes; ++lane) {
    std::vector<uint8_t> free;
    for (uint32_t b = 0; b < kQpnBuckets; ++b) {
      bool ok = true;
      for (AddressRegistry* r : regs) ok &= r->map_->bucket[b] == kBucketFree;
      if (ok) free.push_back(uint8_t(b));
    }
    // A share that leaves room for the next ones: 1/32 of what is free, 1 to 8 buckets (random
    // ones, so QPNs stay hard to guess: at least 16 bits and the bucket).
    const size_t want = std::clamp<size_t>(free.size() / 32, 1, 8);
    for (size_t i = 0; i < regs_in.size(); ++i) {
      Layout& l = *regs_in[i]->map_;
      for (uint32_t s = 0; s < kShareMaxSockets && (*slots)[i][lane] < 0; ++s)
        if (l.sockets[s].state == kFree) {
          l.sockets[s] = {kClaimed, uint8_t(regs_in[i]->member_), uint8_t(lane), 0, 0, 0, 0};
          (*slots)[i][lane] = int(s);
        }
    }
    bool no_slot = false;
    for (size_t i = 0; i < regs_in.size(); ++i) no_slot |= (*slots)[i][lane] < 0;
    if (free.empty() || no_slot) {
      undo();
      *why = address_text(regs_in[0]->gid_) + " port " + std::to_string(regs_in[0]->port_) + ": " +
             (free.empty() ? "no free QPN range left" : "no free socket slot left") +
             " for another process (Address already in use)";
      return EADDRINUSE;
    }
    for (size_t k = 0; k < want && !free.empty(); ++k) {
      const size_t pick = random_u32() % free.size();
      const uint8_t b = free[pick];
      free.erase(free.begin() + long(pick));
      (*buckets)[lane].push_back(b);
      for (size_t i = 0; i < regs_in.size(); ++i) regs_in[i]->map_->bucket[b] = uint8_t((*slots)[i][lane] + 1);
    }
  }
  for (AddressRegistry* r : regs) r->map_->routes++;
  return 0;
}

int AddressRegistry::join(int slot, int fd, const void* addr, unsigned addr_len) {
  Locked g(this);
  sweep_locked();
  Layout& l = *map_;
  Layout::Socket& s = l.sockets[slot];
  // Under the lock, so the kernel's join order is ours: the new socket's index is the count before it.
  const uint32_t index = live_sockets_locked();
  if (bind(fd, static_cast<const sockaddr*>(addr), socklen_t(addr_len)) != 0) return errno;
  s.state = kJoined;
  s.index = index;
  s.index_gen = l.generation;
  our_fds_.push_back({slot, fd});
  const int e = rebuild_locked();
  if (e) {  // steering we cannot set is no group to be in (the caller closes fd)
    our_fds_.pop_back();
    move_out_locked(slot);
  }
  return e;
}

void AddressRegistry::move_out_locked(int slot) {
  // Linux reuseport_detach_sock: the last socket of the group takes the leaving one's index.
  Layout& l = *map_;
  const uint32_t n = live_sockets_locked();
  const uint32_t i = l.sockets[slot].index;
  bool known = true;
  for (const Layout::Socket& s : l.sockets) known &= s.state != kJoined || s.index_gen == l.generation;
  for (Layout::Socket& s : l.sockets)
    if (s.state == kJoined && s.index == n - 1 && &s != &l.sockets[slot]) s.index = i;
  free_socket_locked(uint32_t(slot));
  for (uint8_t& b : l.bucket)
    if (b == uint8_t(slot + 1)) b = kBucketFree;
  l.routes++;
  if (!known) {  // indices were still being learnt: learn them again after this one is gone
    l.generation++;
    l.verify_rounds = 1;
  }
}

void AddressRegistry::leave(int slot, int fd) {
  Locked g(this);
  Layout& l = *map_;
  if (slot < 0 || uint32_t(slot) >= kShareMaxSockets || l.sockets[slot].member != member_) {
    if (fd >= 0) close(fd);
    return;
  }
  if (l.sockets[slot].state != kJoined || fd < 0) {
    free_socket_locked(uint32_t(slot));
    for (uint8_t& b : l.bucket)
      if (b == uint8_t(slot + 1)) b = kBucketFree;
    if (l.gsi_socket == uint8_t(slot + 1)) l.gsi_socket = kGsiUnclaimed;
    l.routes++;
    if (fd >= 0) close(fd);
    return;
  }
  const uint32_t gen = l.generation;
  move_out_locked(slot);
  // The program for the group without it, attached on this socket while it is still a member (or
  // on another of ours), then the close: from then on the moved socket's packets reach it.
  rebuild_locked();
  our_fds_.erase(std::remove(our_fds_.begin(), our_fds_.end(), std::make_pair(slot, fd)), our_fds_.end());
  close(fd);
  if (l.generation != gen) probe_locked();
}

int AddressRegistry::claim_gsi(int slot) {
  Locked g(this);
  if (!g.ok) return EIO;
  sweep_locked();
  Layout& l = *map_;
  if (slot < 0 || uint32_t(slot) >= kShareMaxSockets || l.sockets[slot].member != member_) return EINVAL;
  if (l.gsi_socket && l.sockets[l.gsi_socket - 1].member != member_) return EADDRINUSE;
  l.gsi_socket = uint8_t(slot + 1);
  l.routes++;
  return rebuild_locked();
}

void AddressRegistry::tick() {
  Locked g(this);
  if (!g.ok || sweep_locked()) return;
  Layout& l = *map_;
  const uint64_t now = now_ns();
  if (now - l.probed_at < kTickNs) return;
  if (l.verify_rounds) {
    l.verify_rounds--;
    l.generation++;
    probe_locked();
    return;
  }
  for (const Layout::Socket& s : l.sockets)
    if (s.state == kJoined && s.index_gen != l.generation) {
      probe_locked();  // a probe was lost, or its socket was slow to read it: again
      return;
    }
}

void AddressRegistry::probe_arrived(int slot, const uint8_t* pkt, size_t len) {
  Probe p;
  if (!read_probe(pkt, len, secret_, &p)) return;
  Locked g(this);
  Layout& l = *map_;
  if (slot < 0 || uint32_t(slot) >= kShareMaxSockets || p.generation != l.generation || p.index >= kShareMaxSockets)
    return;
  Layout::Socket& s = l.sockets[slot];
  if (s.state != kJoined || s.member != member_) return;
  if (s.index_gen == l.generation && s.index != p.index) {
    // Two indices in one generation: one probe went by the kernel's hash (an index past the group's
    // end, when more sockets were counted than the group has). Unknown again; the next tick asks.
    s.index_gen = 0;
    return;
  }
  const bool changed = s.index != p.index || s.index_gen != l.generation;
  s.index = p.index;
  s.index_gen = l.generation;
  if (changed) rebuild_locked();
}

AddressRegistry::View AddressRegistry::view() {
  Locked g(this);
  sweep_locked();
  const Layout& l = *map_;
  View v;
  for (const auto& m : l.members) v.members += m.in_use != 0;
  for (const auto& s : l.sockets) {
    v.sockets += s.state != kFree;
    v.unknown += s.state == kJoined && s.index_gen != l.generation;
  }
  for (uint8_t b : l.bucket) v.buckets_claimed += b != kBucketFree && b != kBucketReserved;
  v.generation = l.generation;
  v.owner_pid =
      l.owner && l.owner <= kShareMaxSockets ? l.members[l.sockets[l.owner - 1].member % kShareMaxMembers].pid : 0;
  for (const auto& s : l.sockets) v.rings += s.state != kFree && s.ring;
  v.rebuilds = l.rebuilds;
  v.reclaimed = l.reclaimed;
  return v;
}

std::string AddressRegistry::member_file(uint64_t nonce, const char* kind) const {
  // Short, beside the registry: a Unix socket's path has 104 bytes on macOS.
  char name[40];
  std::snprintf(name, sizeof name, "/share-%016llx.%s", (unsigned long long)nonce, kind);
  return path_.substr(0, path_.rfind('/')) + name;
}

bool AddressRegistry::ours_locked(int slot) const {
  return slot >= 0 && uint32_t(slot) < kShareMaxSockets && map_->sockets[slot].state != kFree &&
         map_->sockets[slot].member == member_;
}

void AddressRegistry::free_socket_locked(uint32_t s) {
  Layout& l = *map_;
  Layout::Socket& k = l.sockets[s];
  k.state = kFree;
  if (k.ring) {  // its ring and wake socket: nobody reads them any more (a member that left removed them)
    unlink(member_file(k.ring, "ring").c_str());
    unlink(member_file(k.ring, "wake").c_str());
    k.ring = 0;
    l.routes++;
  }
  if (l.owner == s + 1) l.owner = 0;  // gone without disown(): another member's tick binds the port
  if (l.handover_to == s + 1) l.handover_to = 0;
}

int AddressRegistry::set_ring(int slot, uint64_t nonce) {
  Locked g(this);
  if (!g.ok) return EIO;
  if (!ours_locked(slot)) return EINVAL;
  map_->sockets[slot].ring = nonce;
  map_->routes++;
  return 0;
}

uint32_t AddressRegistry::routes_version() const { return __atomic_load_n(&map_->routes, __ATOMIC_ACQUIRE); }

void AddressRegistry::routes(Routes* out) {
  Locked g(this);
  sweep_locked();
  const Layout& l = *map_;
  for (uint32_t b = 0; b < kQpnBuckets; ++b) {
    const uint8_t v = l.bucket[b];
    out->slot_of_bucket[b] =
        v == kBucketFree || v == kBucketReserved || v > kShareMaxSockets || l.sockets[v - 1].state == kFree
            ? kNoSlot
            : uint8_t(v - 1);
  }
  out->gsi_slot = l.gsi_socket && l.gsi_socket <= kShareMaxSockets && l.sockets[l.gsi_socket - 1].state != kFree
                      ? uint8_t(l.gsi_socket - 1)
                      : kNoSlot;
  for (uint32_t s = 0; s < kShareMaxSockets; ++s) out->ring[s] = l.sockets[s].state != kFree ? l.sockets[s].ring : 0;
}

int AddressRegistry::own(int slot, const std::function<int()>& bind) {
  Locked g(this);
  if (!g.ok) return EIO;
  sweep_locked();  // a dead owner is no owner
  Layout& l = *map_;
  if (!ours_locked(slot)) return EINVAL;
  if (l.owner == uint8_t(slot + 1)) return 0;
  if (l.owner) return EBUSY;
  if (int e = bind()) return e;
  l.owner = uint8_t(slot + 1);
  if (l.handover_to == uint8_t(slot + 1)) l.handover_to = 0;
  return 0;
}

bool AddressRegistry::owned() const { return __atomic_load_n(&map_->owner, __ATOMIC_ACQUIRE) != 0; }

uint64_t AddressRegistry::disown(int slot, const std::function<void()>& close) {
  Locked g(this);
  Layout& l = *map_;
  close();
  if (!ours_locked(slot) || l.owner != uint8_t(slot + 1)) return 0;
  l.owner = 0;
  l.handover_to = 0;
  sweep_locked();
  for (uint32_t s = 0; s < kShareMaxSockets; ++s)  // the lowest slot with a ring: any would do
    if (int(s) != slot && l.sockets[s].state != kFree && l.sockets[s].ring) {
      l.handover_to = uint8_t(s + 1);
      return l.sockets[s].ring;
    }
  return 0;
}

}  // namespace melon::soft
