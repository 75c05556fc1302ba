// melon-emud: the Linux host of the driver. It runs src/mlx5/core on the emulated ConnectX-4 Lx and
// serves the user-client ABI (src/uapi) to client processes over a Unix socket, passing memfds for
// queue memory and UAR pages and an eventfd per client for events (docs/uapi.md).
//
// One daemon per device: a second one on the same socket path refuses to start (an flock on
// <socket>.lock). Stops cleanly on SIGTERM/SIGINT or stop(): every client's objects released,
// the device torn down, the socket removed.
#pragma once

#include <stdint.h>

#include <string>

namespace melon::dext {

// The wire address when --wire is not given: a loopback address of its own, so the daemon's port
// 4791 does not collide with a soft device (which the quick start puts on 127.0.0.2 and .3).
inline constexpr const char* kDefaultWire = "127.0.0.4";

struct EmudOptions {
  std::string socket;  // the Unix socket path
  std::string wire = kDefaultWire;  // the RoCEv2 address (IPv4 or IPv6, UDP 4791) of this emulated port
  uint32_t clients = 16;  // at most uapi::kMaxClients
  uint32_t spin_us = 100;  // the doorbell watcher polls this long after the last doorbell, then sleeps
  // Limits (docs/uapi.md "Quotas"); 0 keeps uapi::Limits' default. MiB per client, user, device.
  uint32_t clients_per_user = 0;
  uint64_t queue_mib[3] = {}, pinned_mib[3] = {};
  uint32_t socket_mode = 0660;  // the socket's permission bits (docs/uapi.md: who may connect)
  bool verbose = false;
  bool diagnostics = false;  // serve diagnostic selectors (stable_cycle: re-init the device)
  uint32_t ack_hold_us = 20;  // a ping-pong's ACK waits this long for the next post (0: off; UarWatcher)
  bool gso = true;  // the wire's UDP GSO sends (emu::UdpWire); off: one datagram per send
};

// Exit codes of run().
enum : int { kEmudOk = 0, kEmudUsage = 2, kEmudAlreadyRunning = 3, kEmudSocket = 4, kEmudDevice = 5 };

// Runs until stopped. `why` says what failed.
int run_emud(const EmudOptions& opt, std::string* why);
// Asks a running run_emud() to stop (async-signal-safe).
void stop_emud();

}  // namespace melon::dext
