// The receive ring of a member in forward mode (share_ring.h).
#include "providers/soft/share_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace melon::soft {

namespace {

constexpr char kRingMagic[8] = {'M', 'E', 'L', 'R', 'I', 'N', 'G', '1'};

// A slot: this header, then the datagram.
struct SlotHead {
  uint32_t len;
  uint16_t sport, likely_id;
  uint8_t v6, pad[7];
  uint8_t src[16];
};
constexpr size_t kSlotStride = sizeof(SlotHead) + kRingDatagram;
static_assert(sizeof(SlotHead) == 32 && kSlotStride % 8 == 0, "slots stay 8-byte aligned");

uint32_t load_acquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void store_release(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

}  // namespace

// The mapping's head: geometry and tag (written once by the member), then each side's index on a
// cache line of its own (free-running counts; slot = index % kRingSlots).
struct RingShared {
  char magic[8];
  uint32_t slots, slot_stride;
  uint64_t nonce;
  alignas(64) uint32_t head;  // written by the producer
  alignas(64) uint32_t tail;  // written by the consumer
  alignas(64) uint8_t slot[1];  // kRingSlots * kSlotStride bytes from here
};
constexpr size_t kSlotsAt = offsetof(RingShared, slot);

RingLayout ring_layout() {
  return {offsetof(RingShared, head), offsetof(RingShared, tail), kSlotsAt, kSlotStride, sizeof(SlotHead)};
}

size_t ring_bytes() { return kSlotsAt + size_t(kRingSlots) * kSlotStride; }

void ring_init(void* mem, uint64_t nonce) {
  auto* r = static_cast<RingShared*>(mem);
  std::memset(r, 0, kSlotsAt);
  r->slots = kRingSlots;
  r->slot_stride = uint32_t(kSlotStride);
  r->nonce = nonce;
  std::memcpy(r->magic, kRingMagic, sizeof kRingMagic);
}

static RingShared* check_ring(void* mem, size_t bytes, uint64_t nonce) {
  auto* r = static_cast<RingShared*>(mem);
  if (!r || bytes < ring_bytes() || std::memcmp(r->magic, kRingMagic, sizeof kRingMagic) || r->slots != kRingSlots ||
      r->slot_stride != kSlotStride || r->nonce != nonce)
    return nullptr;
  return r;
}

static uint8_t* slot_at(RingShared* r, uint32_t index) {
  return reinterpret_cast<uint8_t*>(r) + kSlotsAt + size_t(index % kRingSlots) * kSlotStride;
}

bool RingProducer::attach(void* mem, size_t bytes, uint64_t nonce) {
  ring_ = check_ring(mem, bytes, nonce);
  // Where the last producer stopped (a previous owner's datagrams may still wait to be read).
  if (ring_) head_ = load_acquire(&ring_->head);
  return ring_ != nullptr;
}

bool RingProducer::push(const uint8_t* data, size_t len, const RingMeta& meta) {
  if (len > kRingDatagram) {
    ++oversize_drops_;
    return false;
  }
  // head_ - tail above kRingSlots: a tail the consumer never had (ahead of head_); treated as full.
  if (!ring_ || head_ - load_acquire(&ring_->tail) >= kRingSlots) {
    ++full_drops_;
    return false;
  }
  uint8_t* s = slot_at(ring_, head_);
  SlotHead h{};
  h.len = uint32_t(len);
  h.sport = meta.sport;
  h.likely_id = meta.likely_id;
  h.v6 = meta.v6;
  std::memcpy(h.src, meta.src, 16);
  std::memcpy(s, &h, sizeof h);
  std::memcpy(s + sizeof h, data, len);
  store_release(&ring_->head, ++head_);  // published: the slot was written before
  return true;
}

bool RingConsumer::attach(void* mem, size_t bytes, uint64_t nonce) {
  ring_ = check_ring(mem, bytes, nonce);
  if (ring_) tail_ = load_acquire(&ring_->tail);
  return ring_ != nullptr;
}

bool RingConsumer::pending() const { return ring_ && load_acquire(&ring_->head) != tail_; }

bool RingConsumer::next(const uint8_t** data, size_t* len, RingMeta* meta) {
  if (!ring_) return false;
  for (;;) {
    const uint32_t head = load_acquire(&ring_->head);
    if (head == tail_) return false;
    if (head - tail_ > kRingSlots) {  // more than the ring holds: a forged or corrupted index
      ++bad_;
      tail_ = head;  // nothing before it can be trusted; the next datagrams start from it
      store_release(&ring_->tail, tail_);
      return false;
    }
    const uint8_t* s = slot_at(ring_, tail_);
    SlotHead h;
    std::memcpy(&h, s, sizeof h);  // read once: the other side may change it meanwhile
    if (h.len > kRingDatagram || h.v6 > 1) {
      ++bad_;
      release();
      continue;
    }
    *data = s + sizeof h;
    *len = h.len;
    std::memcpy(meta->src, h.src, 16);
    meta->sport = h.sport;
    meta->likely_id = h.likely_id;
    meta->v6 = h.v6 != 0;
    return true;
  }
}

void RingConsumer::release() { store_release(&ring_->tail, ++tail_); }

RingFile::~RingFile() { close(); }

void RingFile::close() {
  if (mem_) munmap(mem_, bytes_);
  mem_ = nullptr;
  bytes_ = 0;
}

int RingFile::create(const std::string& path, uint64_t nonce, std::string* why) {
  close();
  unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const size_t n = ring_bytes();
  int e = fd < 0 ? errno : ftruncate(fd, off_t(n)) != 0 ? errno : 0;
  void* m = e ? MAP_FAILED : mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!e && m == MAP_FAILED) e = errno;
  if (fd >= 0) ::close(fd);  // the mapping keeps the file
  if (e) {
    if (fd >= 0) unlink(path.c_str());
    *why = path + ": " + std::strerror(e);
    return e;
  }
  mem_ = m;
  bytes_ = n;
  ring_init(mem_, nonce);
  return 0;
}

int RingFile::open(const std::string& path, std::string* why) {
  close();
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  int e = fd < 0 ? errno : fstat(fd, &st) != 0 ? errno : 0;
  if (!e && (st.st_uid != geteuid() || size_t(st.st_size) != ring_bytes())) e = EPERM;  // not a ring of ours
  void* m = e ? MAP_FAILED : mmap(nullptr, ring_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!e && m == MAP_FAILED) e = errno;
  if (fd >= 0) ::close(fd);
  if (e) {
    *why = path + ": " + std::strerror(e);
    return e;
  }
  mem_ = m;
  bytes_ = ring_bytes();
  return 0;
}

}  // namespace melon::soft
