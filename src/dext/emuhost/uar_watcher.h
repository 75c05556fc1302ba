// The MMIO trap of melon-emud: client UAR pages are shared memory, and this thread plays the bus
// between them and the emulated device's BAR0. It compares each page's doorbell words (the CQ arm
// doorbell and the two BlueFlame buffers' first 8 bytes) with the values it saw last and writes each
// new one to the device at the same offset of the object's own UAR page, so the device checks, as
// hardware does, that a doorbell comes through the UAR its QP or CQ was created with. Because a
// polled word keeps only its last value, it also follows the doorbell records of the QPs and CQs
// bound to each page and rings (arms) any whose record moved (uapi/doorbell.h).
//
// It polls while doorbells come, then sleeps on the pages' futex words after the handshake of
// uapi/doorbell.h (sleeping flag, fence, one more scan), so a client posting to a sleeping device
// wakes it, and an idle daemon costs nothing.
#pragma once

#include <stdint.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "mlx5/emu/device.h"

namespace melon::dext {

class UarWatcher {
 public:
  // `spin_ns`: how long the watcher keeps polling after the last doorbell before it sleeps.
  explicit UarWatcher(mlx5::emu::Device& dev, uint64_t spin_ns = 100'000) : dev_(dev), spin_ns_(spin_ns) {}
  ~UarWatcher() { stop(); }
  UarWatcher(const UarWatcher&) = delete;
  UarWatcher& operator=(const UarWatcher&) = delete;

  void start();
  void stop();

  // Watches `page` (4 KiB, the daemon's mapping of a client's UAR page) for the device UAR page at
  // BAR0 `bar_off`, whose BlueFlame buffers sit at `bf_in_page[0..1]` within the page.
  void add(uint8_t* page, uint64_t bar_off, const uint32_t bf_in_page[2]);
  // Stops watching `page`; when this returns the thread no longer touches it (it may be unmapped).
  void remove(uint8_t* page);
  // A CQ (kind 1) or QP (kind 2) rings through the UAR page at BAR0 `bar_off`; its doorbell record
  // is at `dbr` (the daemon's mapping) until unbind() returns. A CQ's arm word is set to
  // uapi::kCqArmNone here.
  void bind(uint64_t bar_off, uint8_t kind, uint32_t number, uint8_t* dbr);
  void unbind(uint8_t kind, uint32_t number);
  // The QP went to RESET: the client counts from 0 again, so the first post after it may write the
  // very words and record the watcher saw before. The send counter of its record is set to 0 here
  // (the client clears it too, rdma-core's qp.c) and 0 becomes the baseline, so any post after the
  // RESET's response rings. Called before that response is sent.
  void rewind(uint8_t kind, uint32_t number);

  // Other polling the watcher does between its scans while it is awake; set before start()
  // (melon-emud: the wire's datagrams, UdpWire::poll_now). A ping-pong's reply is then run by the
  // thread already polling, with no wake-up of the wire's thread. `poll` returns whether it brought
  // work; the watcher then runs the device and stays awake, as after a doorbell.
  void set_poll(bool (*poll)(void*), void* arg) {
    poll_ = poll;
    poll_arg_ = arg;
  }
  // For the other reader of what set_poll polls (melon-emud's wire thread): returns when the watcher
  // is not polling it (asleep, stopped, or without a poll), or after `timeout_ms`. While the watcher
  // polls, a second reader woken by every datagram only meets it at the socket's lock: on two cores a
  // ping-pong step paid that thread's wake-up, two futex calls and an empty receive.
  void wait_not_polling(int timeout_ms);
  // While awake, the device holds a ping-pong's ACK up to `ns` for the client's next post
  // (emu::Device::set_ack_hold); the watcher sends what is due as it polls and everything before it
  // sleeps. 0: off. Set before start().
  void set_ack_hold(uint32_t ns) { ack_hold_ns_ = ns; }

  struct Stats {
    uint64_t forwarded = 0;  // doorbells written to BAR0
    uint64_t from_records = 0;  // of which a doorbell record's change stood for (the UAR word was overwritten)
    uint64_t kicks = 0;  // futex kicks seen
    uint64_t sleeps = 0;  // times the watcher went to sleep
    // Doorbells found after a sleep that timed out, on a page whose kick word had not moved: a client
    // that did not kick (a kick whose wake-up met the timeout is not counted).
    uint64_t unkicked = 0;
  };
  Stats stats() const;

 private:
  static constexpr int kWords = 3;  // CQ arm doorbell, BlueFlame buffer 0, BlueFlame buffer 1
  static constexpr uint8_t kCq = 1, kQp = 2;
  struct Bound {
    uint8_t kind;
    uint32_t number;
    uint8_t* dbr;
    uint32_t last;  // record dword 1 (as stored) last rung or armed with
  };
  struct Page {
    uint8_t* va;
    uint64_t bar_off;
    uint32_t off[kWords];
    uint64_t last[kWords];
    uint32_t kick;
    std::vector<Bound> bound;
  };
  void run();
  bool scan_locked(bool timed_out = false);
  bool scan_page(Page& p, bool timed_out);
  bool scan_records(Page& p);
  Bound* find(Page& p, uint8_t kind, uint32_t number);
  void set_sleeping_locked(uint32_t v);
  void wake_thread();

  mlx5::emu::Device& dev_;
  const uint64_t spin_ns_;
  mutable std::mutex mu_;
  std::vector<Page> pages_;
  bool asleep_ = false;
  Stats stats_;
  uint32_t ctl_ = 0;  // futex word: bumped on add/remove/stop so a sleeping watcher re-reads the list
  uint32_t polling_ = 0;  // futex word: 1 while awake with a poll (wait_not_polling)
  uint32_t ack_hold_ns_ = 0;
  void hold_acks(bool on) {
    if (ack_hold_ns_) dev_.set_ack_hold(on ? ack_hold_ns_ : 0);
  }
  void set_polling(uint32_t v);
  bool (*poll_)(void*) = nullptr;
  void* poll_arg_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace melon::dext
