#include "dext/emuhost/uar_watcher.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mlx5/prm/doorbell.h"
#include "mlx5/prm/wqe.h"
#include "uapi/doorbell.h"

namespace melon::dext {

namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

// How long a sleep lasts with no kick: a client that breaks the protocol is served late, not never.
constexpr uint64_t kSleepNs = 200'000'000;

// One 8-byte doorbell as the client stored it (one aligned 64-bit store in rdma-core's qp.c/cq.c).
uint64_t load_word(const uint8_t* p) { return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE); }
// Dword 1 of a doorbell record (QP: send counter; CQ: arm word), as stored.
uint32_t load_record(const uint8_t* dbr) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(dbr + 4), __ATOMIC_ACQUIRE);
}
// An arm word (as stored) without its two reserved top bits, so a record written field by field
// over uapi::kCqArmNone compares equal to the UAR doorbell's arm word.
uint32_t arm_bits(uint32_t as_stored) {
  uint8_t b[4];
  memcpy(b, &as_stored, 4);
  b[0] &= 0x3f;
  memcpy(&as_stored, b, 4);
  return as_stored;
}

// The doorbells a record change stands for: a send doorbell naming the QP (the device takes only
// the QPN from it and reads WQEs up to the record), and a CQ arm doorbell: the record's arm word,
// then the CQN (the same 8 bytes rdma-core's mlx5_arm_cq writes to the UAR).
uint64_t send_doorbell(uint32_t qpn) {
  uint8_t b[8] = {};
  mlx5::prm::set(b, mlx5::prm::wqe_ctrl_seg::qpn, qpn);
  uint64_t v;
  memcpy(&v, b, 8);
  return v;
}
uint64_t arm_doorbell(uint32_t arm_word_as_stored, uint32_t cqn) {
  uint8_t b[8] = {};
  memcpy(b, &arm_word_as_stored, 4);
  mlx5::prm::set(b, mlx5::prm::cq_uar_db::cqn, cqn);
  uint64_t v;
  memcpy(&v, b, 8);
  return v;
}

long futex_wake(uint32_t* addr) { return syscall(SYS_futex, addr, FUTEX_WAKE, 1, nullptr, nullptr, 0); }

}  // namespace

void UarWatcher::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { run(); });
}

void UarWatcher::stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  wake_thread();
  thread_.join();
}

void UarWatcher::wake_thread() {
  __atomic_fetch_add(&ctl_, 1u, __ATOMIC_SEQ_CST);
  futex_wake(&ctl_);
}

void UarWatcher::add(uint8_t* page, uint64_t bar_off, const uint32_t bf_in_page[2]) {
  {
    std::lock_guard<std::mutex> g(mu_);
    Page p{};
    p.va = page;
    p.bar_off = bar_off;
    p.off[0] = mlx5::prm::kUarCqDoorbell;
    p.off[1] = bf_in_page[0];
    p.off[2] = bf_in_page[1];
    for (int i = 0; i < kWords; i++) p.last[i] = load_word(page + p.off[i]);
    uapi::UarWatch* w = uapi::uar_watch(page);
    p.kick = __atomic_load_n(&w->kick, __ATOMIC_RELAXED);
    __atomic_store_n(&w->sleeping, asleep_ ? 1u : 0u, __ATOMIC_SEQ_CST);
    pages_.push_back(p);
  }
  wake_thread();  // a sleeping watcher must sleep on this page's kick word too
}

void UarWatcher::bind(uint64_t bar_off, uint8_t kind, uint32_t number, uint8_t* dbr) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (kind == kCq) __atomic_store_n(reinterpret_cast<uint32_t*>(dbr + 4), uapi::kCqArmNone, __ATOMIC_RELEASE);
    for (Page& p : pages_)
      if (p.bar_off == bar_off)
        p.bound.push_back(Bound{kind, number, dbr, kind == kCq ? arm_bits(uapi::kCqArmNone) : load_record(dbr)});
  }
  wake_thread();
}

void UarWatcher::unbind(uint8_t kind, uint32_t number) {
  std::lock_guard<std::mutex> g(mu_);
  for (Page& p : pages_)
    for (size_t i = 0; i < p.bound.size(); i++)
      if (p.bound[i].kind == kind && p.bound[i].number == number) p.bound.erase(p.bound.begin() + long(i--));
}

// The record is cleared here, before the RESET's response reaches the client, rather than waited
// for: the client may clear it and post again (back to the value seen before the reset) between two
// scans, and a scan could not tell that from a record not yet cleared.
void UarWatcher::rewind(uint8_t kind, uint32_t number) {
  std::lock_guard<std::mutex> g(mu_);
  for (Page& p : pages_)
    if (Bound* b = find(p, kind, number)) {
      __atomic_store_n(reinterpret_cast<uint32_t*>(b->dbr + 4), 0u, __ATOMIC_RELEASE);
      b->last = 0;
    }
}

UarWatcher::Bound* UarWatcher::find(Page& p, uint8_t kind, uint32_t number) {
  for (Bound& b : p.bound)
    if (b.kind == kind && b.number == number) return &b;
  return nullptr;
}

void UarWatcher::remove(uint8_t* page) {
  {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < pages_.size(); i++)
      if (pages_[i].va == page) {
        pages_.erase(pages_.begin() + long(i));
        break;
      }
  }
  wake_thread();  // its futex word leaves the sleeping set
}

UarWatcher::Stats UarWatcher::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

// The kick word first, then the doorbells: a kick bumped before this read follows its doorbell
// store, so the doorbell is seen below (uapi/doorbell.h). `timed_out`: the scan after a sleep that
// ended by itself; what it finds on a page whose kick word did not move came without a kick.
bool UarWatcher::scan_page(Page& p, bool timed_out) {
  uapi::UarWatch* w = uapi::uar_watch(p.va);
  uint32_t k = __atomic_load_n(&w->kick, __ATOMIC_SEQ_CST);
  bool kicked = k != p.kick;
  p.kick = k;
  if (kicked) stats_.kicks++;
  const uint64_t forwarded_before = stats_.forwarded;
  bool changed = false;
  for (int i = 0; i < kWords; i++) {
    uint64_t v = load_word(p.va + p.off[i]);
    if (v == p.last[i]) continue;
    p.last[i] = v;
    uint8_t b[8];
    memcpy(b, &v, 8);
    // The object it names, if bound here, counts as rung (armed) with its record as it is now; an
    // arm already made from the record is not made twice. Anything else goes to the device as
    // written: it judges (and ignores) foreign and garbage doorbells.
    if (i == 0) {
      if (Bound* c = find(p, kCq, uint32_t(mlx5::prm::get(b, mlx5::prm::cq_uar_db::cqn)))) {
        uint32_t arm;
        memcpy(&arm, b, 4);
        if (arm_bits(arm) == c->last) continue;
        c->last = arm_bits(arm);
      }
    } else if (Bound* q = find(p, kQp, uint32_t(mlx5::prm::get(b, mlx5::prm::wqe_ctrl_seg::qpn)))) {
      q->last = load_record(q->dbr);
    }
    dev_.write64(p.bar_off + p.off[i], v);  // memory order in, memory order out (Device::write64)
    stats_.forwarded++;
    changed = true;
  }
  changed |= scan_records(p);
  if (timed_out && !kicked) stats_.unkicked += stats_.forwarded - forwarded_before;
  if (kicked && !changed) {
    // A kick, and every word and record reads as before: the same bytes were written again (a QP
    // reset to counter 0 posting the same first WQE). Ring every QP of the page; the device reads
    // WQEs only up to each record, so a ring with nothing new is a no-op.
    for (Bound& b : p.bound)
      if (b.kind == kQp) dev_.write64(p.bar_off + p.off[1], send_doorbell(b.number));
  }
  return changed || kicked;
}

// QPs whose send counter moved and CQs whose arm word changed since last rung: the doorbells a
// busier UAR page overwrote before this scan saw them.
bool UarWatcher::scan_records(Page& p) {
  bool any = false;
  for (Bound& b : p.bound) {
    uint32_t r = load_record(b.dbr);
    if (b.kind == kCq) {
      if (r == uapi::kCqArmNone) continue;
      r = arm_bits(r);
    }
    if (r == b.last) continue;
    b.last = r;
    if (b.kind == kQp)
      dev_.write64(p.bar_off + p.off[1], send_doorbell(b.number));
    else
      dev_.write64(p.bar_off + p.off[0], arm_doorbell(r, b.number));
    stats_.forwarded++;
    stats_.from_records++;
    any = true;
  }
  return any;
}

bool UarWatcher::scan_locked(bool timed_out) {
  bool any = false;
  for (Page& p : pages_) any |= scan_page(p, timed_out);
  return any;
}

void UarWatcher::set_sleeping_locked(uint32_t v) {
  asleep_ = v != 0;
  for (Page& p : pages_) __atomic_store_n(&uapi::uar_watch(p.va)->sleeping, v, __ATOMIC_SEQ_CST);
}

void UarWatcher::set_polling(uint32_t v) {
  if (!poll_ || __atomic_load_n(&polling_, __ATOMIC_RELAXED) == v) return;
  __atomic_store_n(&polling_, v, __ATOMIC_SEQ_CST);
  if (!v) syscall(SYS_futex, &polling_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

void UarWatcher::wait_not_polling(int timeout_ms) {
  timespec t{timeout_ms / 1000, long(timeout_ms % 1000) * 1'000'000};
  if (__atomic_load_n(&polling_, __ATOMIC_SEQ_CST))
    syscall(SYS_futex, &polling_, FUTEX_WAIT_PRIVATE, 1u, &t, nullptr, 0);
}

void UarWatcher::run() {
  set_polling(1);
  hold_acks(true);
  uint64_t last_work = now_ns();
  std::vector<futex_waitv> waiters;
  bool have_waitv = true;
  while (!stop_) {
    bool any;
    {
      std::lock_guard<std::mutex> g(mu_);
      any = scan_locked();
    }
    if (poll_ && poll_(poll_arg_)) any = true;
    if (any) {
      // Run the doorbells now, on this thread that is awake anyway, rather than hand them to the
      // device's worker (one thread wake-up less per post; the device is locked inside).
      while (dev_.service()) {}
      last_work = now_ns();
      continue;
    }
    if (now_ns() - last_work < spin_ns_) {
      dev_.release_due_acks();
      sched_yield();  // two cores shared with the device worker and the clients: poll politely
      continue;
    }
    hold_acks(false);  // what is held leaves now: nobody polls for it while the watcher sleeps
    // Going to sleep: announce it, fence, scan once more, then sleep on every page's kick word
    // (and ctl_, which add/remove/stop bump) with the values just read. A scan that forwards doorbells is followed by running the device, here as in the loop above:
    // the device wakes no worker for them (Device::set_host_services), so a doorbell this scan or
    // the timed-out one below forwarded and left queued waited for an unrelated frame or timer --
    // forever in a ping-pong (the mlx5_0 rping / rc_pingpong -e hangs, uar_watcher_test).
    uint32_t ctl = __atomic_load_n(&ctl_, __ATOMIC_SEQ_CST);
    bool found;
    {
      std::lock_guard<std::mutex> g(mu_);
      set_sleeping_locked(1);
      set_polling(0);  // the wire's own thread reads the socket from here on
      __atomic_thread_fence(__ATOMIC_SEQ_CST);
      found = scan_locked();
      if (found) {
        set_sleeping_locked(0);
        set_polling(1);
      } else {
        waiters.clear();
        for (Page& p : pages_)
          waiters.push_back(futex_waitv{p.kick, uint64_t(uintptr_t(&uapi::uar_watch(p.va)->kick)), FUTEX_32, 0});
        waiters.push_back(futex_waitv{ctl, uint64_t(uintptr_t(&ctl_)), FUTEX_32, 0});
        stats_.sleeps++;
      }
    }
    if (found) {
      hold_acks(true);
      while (dev_.service()) {}
      last_work = now_ns();
      continue;
    }
    timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += long(kSleepNs);
    until.tv_sec += until.tv_nsec / 1'000'000'000;
    until.tv_nsec %= 1'000'000'000;
    bool timed_out = false;
    if (have_waitv && waiters.size() <= FUTEX_WAITV_MAX) {
      long r = syscall(SYS_futex_waitv, waiters.data(), unsigned(waiters.size()), 0u, &until, CLOCK_MONOTONIC);
      if (r < 0 && errno == ENOSYS) have_waitv = false;
      timed_out = r < 0 && errno == ETIMEDOUT;
    }
    if (!have_waitv || waiters.size() > FUTEX_WAITV_MAX) {
      // No vectored wait (kernel before 5.16, or more pages than it takes): nap and poll.
      timespec nap{0, 1'000'000};
      nanosleep(&nap, nullptr);
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      set_sleeping_locked(0);
      set_polling(1);
      // A kick that met the timeout (bumped, its wake-up too late) is still a kick: scan_page tells.
      found = timed_out && scan_locked(/*timed_out=*/true);
    }
    hold_acks(true);
    if (found)
      while (dev_.service()) {}
    last_work = now_ns();
  }
  hold_acks(false);
  std::lock_guard<std::mutex> g(mu_);
  set_sleeping_locked(0);
  set_polling(0);
}

}  // namespace melon::dext
