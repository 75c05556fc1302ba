// Soft provider: memory registration and the key table the transport engine resolves keys with.
#include "providers/soft/soft.h"
#include "providers/soft/soft_qp.h"
#include "providers/soft/random.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace melon::soft {

// ---- key table ------------------------------------------------------------------------------------

void MrTable::new_keys(Entry& e, uint32_t slot) {
  lkeys_.erase(e.lkey);
  rkeys_.erase(e.rkey);
  auto fresh = [this](uint32_t other) {
    for (;;) {  // terminates: at most 2^24 of the 2^32 values are taken
      uint32_t k = random_u32();
      if (k && k != other && !lkeys_.count(k) && !rkeys_.count(k)) return k;
    }
  };
  e.lkey = fresh(e.lkey);
  e.rkey = fresh(e.lkey);
  lkeys_[e.lkey] = slot;
  rkeys_[e.rkey] = slot;
}

bool MrTable::add(ibv_pd* pd, uint64_t iova, uint64_t length, void* host, unsigned access, Keys* keys) {
  std::unique_lock lock(mu_);
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= (1u << 24)) return false;
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Entry& e = slots_[slot];
  e = Entry{};
  e.live = true;
  e.pd = pd;
  e.pd_handle = pd->handle;
  e.iova = iova;
  e.length = length;
  e.host = reinterpret_cast<uintptr_t>(host);
  e.access = access;
  new_keys(e, slot);
  *keys = {e.lkey, e.rkey, slot};
  gen_.fetch_add(1, std::memory_order_release);
  return true;
}

void MrTable::remove(uint32_t lkey) {
  std::unique_lock lock(mu_);
  auto it = lkeys_.find(lkey);
  if (it == lkeys_.end()) return;
  uint32_t slot = it->second;
  Entry& e = slots_[slot];
  lkeys_.erase(it);
  rkeys_.erase(e.rkey);
  e = Entry{};
  free_.push_back(slot);
  gen_.fetch_add(1, std::memory_order_release);
}

bool MrTable::update(uint32_t lkey, ibv_pd* pd, uint64_t iova, uint64_t length, void* host, unsigned access,
                     Keys* keys) {
  std::unique_lock lock(mu_);
  auto it = lkeys_.find(lkey);
  if (it == lkeys_.end()) return false;
  uint32_t slot = it->second;
  Entry& e = slots_[slot];
  e.pd = pd;
  e.pd_handle = pd->handle;
  e.iova = iova;
  e.length = length;
  e.host = reinterpret_cast<uintptr_t>(host);
  e.access = access;
  new_keys(e, slot);  // the old keys die with the old translation
  *keys = {e.lkey, e.rkey, slot};
  gen_.fetch_add(1, std::memory_order_release);
  return true;
}

const MrTable::Entry* MrTable::live_entry(KeyKind kind, uint32_t key) const {
  const auto& keys = kind == KeyKind::local ? lkeys_ : rkeys_;
  auto it = keys.find(key);
  return it == keys.end() ? nullptr : &slots_[it->second];
}

MrStatus MrTable::check(const Entry* e, uint64_t addr, uint64_t len, unsigned need, void** host) const {
  // [addr, addr+len) within [iova, iova+length), without overflow.
  if (addr < e->iova || addr - e->iova > e->length || len > e->length - (addr - e->iova)) return MrStatus::OutOfRange;
  if ((e->access & need) != need) return MrStatus::NoAccess;
  if (host) *host = reinterpret_cast<void*>(e->host + (addr - e->iova));
  return MrStatus::Ok;
}

MrStatus MrTable::resolve(KeyKind kind, uint32_t key, const ibv_pd* pd, uint64_t addr, uint64_t len, unsigned need,
                          void** host) const {
  std::shared_lock lock(mu_);
  const Entry* e = live_entry(kind, key);
  if (!e) return MrStatus::BadKey;
  if (e->pd != pd) return MrStatus::WrongPd;  // IBA 10.2.3: the MR and the QP must share the PD
  return check(e, addr, len, need, host);
}

MrStatus MrTable::resolve_by_pd_handle(KeyKind kind, uint32_t key, uint32_t pd_handle, uint64_t addr, uint64_t len,
                                       unsigned need, void** host) const {
  std::shared_lock lock(mu_);
  const Entry* e = live_entry(kind, key);
  if (!e) return MrStatus::BadKey;
  if (e->pd_handle != pd_handle) return MrStatus::WrongPd;
  return check(e, addr, len, need, host);
}

MrStatus MrTable::resolve_cached(Cache& cache, KeyKind kind, uint32_t key, uint32_t pd_handle, uint64_t addr,
                                 uint64_t len, unsigned need, void** host) const {
  const uint64_t gen = gen_.load(std::memory_order_acquire);
  const Entry* e = nullptr;
  for (const Cache::Line& l : cache.line)
    if (l.gen == gen && l.key == key && l.kind == kind) e = &l.e;
  if (!e) {
    std::shared_lock lock(mu_);
    const Entry* live = live_entry(kind, key);
    if (!live) return MrStatus::BadKey;
    Cache::Line& l = cache.line[cache.next];
    cache.next = (cache.next + 1) % Cache::kSize;
    l = {gen_.load(std::memory_order_relaxed), kind, key, *live};  // no change while we hold mu_
    e = &l.e;
  }
  if (e->pd_handle != pd_handle) return MrStatus::WrongPd;
  return check(e, addr, len, need, host);
}

size_t MrTable::live() const {
  std::shared_lock lock(mu_);
  return slots_.size() - free_.size();
}

// ---- registration ---------------------------------------------------------------------------------

namespace {

// Every page of [addr, addr+len) mapped? (A registration of unmapped memory would make the
// engine fault later, in another thread; reject it now, as pinning does in a kernel driver.)
bool range_mapped(const void* addr, size_t len) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~static_cast<uintptr_t>(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(addr) + len;
  constexpr size_t kChunkPages = 4096;
#if defined(__APPLE__)
  char vec[kChunkPages];
#else
  unsigned char vec[kChunkPages];
#endif
  for (uintptr_t p = start; p < end;) {
    size_t n = std::min<uintptr_t>((end - p + page - 1) / page, kChunkPages);
    if (mincore(reinterpret_cast<void*>(p), n * page, vec) != 0)
      return false;  // ENOMEM: part of the range is not mapped
    p += n * page;
  }
  return true;
}

}  // namespace

unsigned validate_mr_access(unsigned access, int* err) {
  access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);  // may be ignored (verbs.h)
  if (access & IBV_ACCESS_ON_DEMAND) {
    *err = EOPNOTSUPP;  // no on-demand paging
    return 0;
  }
  // IBA 10.6.3.1 / o10-?: remote write and remote atomic access require local write.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    *err = EINVAL;
    return 0;
  }
  *err = 0;
  return access;
}

ibv_mr* SoftContext::reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access) {
  int err = 0;
  unsigned acc = validate_mr_access(access, &err);
  if (!err && (!owns(pd) || !addr || length == 0 ||
               reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr)))
    err = EINVAL;
  if (!err && (acc & IBV_ACCESS_ZERO_BASED)) iova = 0;
  if (!err && iova + length < iova) err = EINVAL;
  if (!err && !range_mapped(addr, length)) err = EFAULT;
  if (err) {
    errno = err;
    return nullptr;
  }

  auto* mr = new SoftMr();
  MrTable::Keys keys;
  if (!dev_->mrs().add(pd, iova, length, addr, acc, &keys)) {
    delete mr;
    errno = ENOMEM;
    return nullptr;
  }
  mr->ibv.context = &vctx.context;
  mr->ibv.pd = pd;
  mr->ibv.addr = addr;
  mr->ibv.length = length;
  mr->ibv.handle = keys.slot;
  mr->ibv.lkey = keys.lkey;
  mr->ibv.rkey = keys.rkey;
  SoftMrState& st = *mr->state;
  st.pd = reinterpret_cast<SoftPd*>(pd)->state;
  st.pd->users++;
  st.lkey = keys.lkey;
  st.rkey = keys.rkey;
  st.addr = addr;
  st.length = length;
  st.iova = iova;
  st.access = acc;
  std::lock_guard<std::mutex> lock(import_mu_);
  mr_handles_[keys.slot] = mr->state;
  return &mr->ibv;
}

// Keys: every re-registration draws new ones and the old ones die at once (the man page's
// "deregister, then register"; Linux mlx5 does the same whenever it builds a new mkey, and
// rdma-core's own tests re-read mr->lkey/rkey after ibv_rereg_mr). The caller hands the new rkey to
// its peer; a request with the old one is a remote access error and touches nothing.
int SoftContext::rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, unsigned access) {
  if (mr->context != &vctx.context) return EINVAL;
  auto* m = reinterpret_cast<SoftMr*>(mr);
  SoftMrState& st = *m->state;
  if (!st.live) return EINVAL;
  ibv_pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd : mr->pd;
  void* new_addr = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? addr : st.addr;
  size_t new_len = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? length : st.length;
  uint64_t new_iova = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? reinterpret_cast<uintptr_t>(addr) : st.iova;
  unsigned new_access = st.access;
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    int err = 0;
    new_access = validate_mr_access(access, &err);
    if (err) return err;
  }
  // Validate everything before changing anything.
  if (!owns(new_pd) || !reinterpret_cast<SoftPd*>(new_pd)->state->live || !new_addr || new_len == 0 ||
      reinterpret_cast<uintptr_t>(new_addr) + new_len < reinterpret_cast<uintptr_t>(new_addr))
    return EINVAL;
  if (!range_mapped(new_addr, new_len)) return EFAULT;
  MrTable::Keys keys;
  if (!dev_->mrs().update(st.lkey, new_pd, new_iova, new_len, new_addr, new_access, &keys)) return EINVAL;
  if (Hub* h = hub_if_started()) h->drain();  // nothing queued still reads the old memory
  const std::shared_ptr<SoftPdState>& new_state = reinterpret_cast<SoftPd*>(new_pd)->state;
  if (new_state != st.pd) {
    st.pd->users--;
    new_state->users++;
    st.pd = new_state;
  }
  st.lkey = mr->lkey = keys.lkey;
  st.rkey = mr->rkey = keys.rkey;
  mr->pd = new_pd;
  st.addr = mr->addr = new_addr;
  st.length = mr->length = new_len;
  st.iova = new_iova;
  st.access = new_access;
  return 0;
}

int SoftContext::dereg_mr(ibv_mr* mr) {
  if (mr->context != &vctx.context) return EINVAL;
  auto* m = reinterpret_cast<SoftMr*>(mr);
  SoftMrState& st = *m->state;
  {
    std::lock_guard<std::mutex> lock(import_mu_);
    if (!st.live) return EINVAL;  // already deregistered through an import (or the original)
    st.live = false;
    mr_handles_.erase(mr->handle);
  }
  dev_->mrs().remove(st.lkey);
  // Packets already built from this region (READ responses) leave before the memory may go.
  if (Hub* h = hub_if_started()) h->drain();
  st.pd->users--;
  delete m;
  return 0;
}

// An import is a second SoftMr sharing the state, with the keys and range the MR has now. It must
// name the MR's own PD (an import of it): the MR serves QPs of that PD only.
ibv_mr* SoftContext::import_mr(ibv_pd* pd, uint32_t handle) {
  std::lock_guard<std::mutex> lock(import_mu_);
  auto it = mr_handles_.find(handle);
  if (!owns(pd) || it == mr_handles_.end() || it->second->pd != reinterpret_cast<SoftPd*>(pd)->state) {
    errno = EINVAL;
    return nullptr;
  }
  const SoftMrState& st = *it->second;
  auto* mr = new SoftMr();
  mr->state = it->second;
  mr->ibv.context = &vctx.context;
  mr->ibv.pd = pd;
  mr->ibv.addr = st.addr;
  mr->ibv.length = st.length;
  mr->ibv.handle = handle;
  mr->ibv.lkey = st.lkey;
  mr->ibv.rkey = st.rkey;
  return &mr->ibv;
}

void SoftContext::unimport_mr(ibv_mr* mr) {
  if (mr->context == &vctx.context) delete reinterpret_cast<SoftMr*>(mr);
}

}  // namespace melon::soft
