// Forward mode: many processes on one address without the kernel steering datagrams by QPN (macOS,
// where XNU has no program that picks a unicast datagram's socket; on Linux with MELON_SOFT_SHARE=
// forward). docs/verbs.md and docs/macos.md, "One address, many processes".
//
// One member of the address's registry (addr_registry.h), the owner, binds the port and receives
// every datagram. A datagram for a QPN bucket another member's socket slot claimed is copied into
// that slot's receive ring (share_ring.h, a file beside the registry) and the member is woken once per receive
// batch through a Unix datagram socket of its own (its wake fd); its own, and QPNs nobody claims, go
// on into the owner's receive path (which counts the unknown ones, rx_unknown_qpn). The others send
// from a socket of their own on an ephemeral port of the address (peers answer to the port whatever
// the source port; the ICRC is computed with the source port the socket has) and receive from
// their ring: their progress thread watches the wake fd, a busy poll reads the ring.
//
// Ownership passes on: an owner that closes names a successor and closes its socket under the
// registry lock, then wakes it ('h'); the successor binds the port at once. An owner that dies is
// found by any member's liveness sweep; the first member whose tick (every AddressRegistry::kTickNs)
// sees no owner binds the port. Datagrams arriving while nobody holds it are lost (ICMP port
// unreachable): RC retransmits them.
//
// Locks: none of its own. The transport's rx_mu_ guards everything here (every receive path holds
// it: the route table, the rings, the sockets' roles); open() and close() run before the transport's
// threads start and after they stopped. The registry takes its own locks.
#pragma once

#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <memory>
#include <string>
#include <vector>

#include "providers/soft/addr_registry.h"
#include "providers/soft/share_ring.h"
#include "providers/soft/soft_counters.h"

namespace melon::soft {

class ShareForward {
 public:
  // For socket slot `slot` of `registry` (the claim of a device's lane, AddressRegistry::claim).
  ShareForward(AddressRegistry* registry, int slot, const uint8_t gid[16], uint32_t scope_id, uint16_t port,
               TransportStats& stats);
  ~ShareForward();
  ShareForward(const ShareForward&) = delete;
  ShareForward& operator=(const ShareForward&) = delete;

  // Our ring and wake socket, then the socket we send from: the port's when we became the owner (no
  // live member was), else one on an ephemeral port. The send socket (ours to keep until close()),
  // or -1 with errno set, *why and *bind_failed as open_roce_socket says.
  int open(std::string* why, bool* bind_failed);
  // The owner hands over (if it is one); every socket and our ring closed and removed.
  void close();

  bool owner() const { return owner_; }
  uint16_t send_port() const { return send_port_; }
  // The socket to receive from: the port's while we own it, else -1 (our datagrams come by the ring).
  int rx_fd() const { return owner_ ? rx_fd_ : -1; }
  int wake_fd() const { return wake_fd_; }
  // Bumped when rx_fd() changed (a take-over): the progress thread rebuilds what it watches.
  uint32_t role_version() const { return role_version_; }

  // The owner, before a receive batch: the route table again if the registry's moved.
  void refresh_routes();
  // The owner, per datagram (`data` from the UDP payload on): true when it belonged to another
  // member, whose ring got it (or had no room: counted); false when it is ours or nobody's, and
  // the caller's receive path takes it.
  bool route(const uint8_t* data, size_t len, const RingMeta& meta);
  // The owner, after a batch (no transport lock held): one wake-up per member that got datagrams.
  void wake_routed();

  // Our ring (every member, the owner too: what was routed to us before we took over).
  RingConsumer& ring() { return ring_; }
  // Reads the wake socket empty; true if it said an owner handed the port to us ('h').
  bool drain_wake();
  // From the progress thread every tick (and at once after a hand-over): binds the port when no live
  // member owns it. True when we became the owner (rx_fd() is new).
  bool tick();

 private:
  int open_port_socket(std::string* why, bool* bind_failed);
  void wake(uint32_t member, char what);
  struct Peer {
    uint64_t nonce = 0;
    RingFile file;
    RingProducer ring;
    sockaddr_un wake{};
    socklen_t wake_len = 0;
    bool mapped = false, touched = false;
    void reset() {
      file.close();
      ring = RingProducer{};
      nonce = 0;
      wake_len = 0;
      mapped = touched = false;
    }
  };

  AddressRegistry* reg_;
  int slot_;
  uint8_t gid_[16];
  uint32_t scope_id_;
  uint16_t port_, send_port_ = 0;
  TransportStats& stats_;
  uint64_t nonce_ = 0;
  RingFile ring_file_;
  RingConsumer ring_;
  int wake_fd_ = -1;  // ours: bound to the registry's member_file(nonce_, "wake")
  int wake_tx_ = -1;  // the owner's, unbound: wakes the others
  int send_fd_ = -1;
  int rx_fd_ = -1;  // the port's socket (== send_fd_ when we owned it from the start)
  bool owner_ = false;
  uint32_t role_version_ = 0;
  uint32_t routes_seen_ = ~0u;
  std::unique_ptr<AddressRegistry::Routes> routes_;
  std::unique_ptr<Peer[]> peers_;  // by socket slot
  std::vector<uint32_t> touched_;
};

}  // namespace melon::soft
