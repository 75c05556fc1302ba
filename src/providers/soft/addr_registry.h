// Many processes on one address: the registry of an address's SO_REUSEPORT group, shared by every
// process of the user that uses this library on that address (docs/verbs.md, "One address, many
// processes").
//
// A small file, mapped by each member, one per (address, scope, port, network namespace) in
// /tmp/melondma-<euid> (mode 0700), holds:
//   - the members (processes), each alive while it holds a POSIX record lock on a byte of its own;
//     the kernel drops the lock when the process dies, however it dies, so a member whose byte is
//     free is dead and its claims are reclaimed by whoever looks next (every member looks every
//     kTickNs, from a progress thread);
//   - the sockets in the kernel's group (one per lane of a member's device), each with the index the
//     kernel gave it (join order; when one leaves, the last moves into its slot) and the generation in
//     which that index was last known for sure;
//   - the QPN buckets (steering.h) each socket claimed: packets for a bucket go to its socket;
//   - a secret for probes, the generation, and gsi_socket: the hook for QP1 (below).
// Every change happens under a write lock on byte 0 of the file (and this process's mutex): a join
// binds the socket under it, so the kernel's join order is the registry's, and its index is the
// count of sockets before it; a member that leaves closes its sockets under it and the registry
// moves the last one, as the kernel does. Only a death moves sockets unseen (its sockets leave in an
// order nobody knows): the member that finds it bumps the generation and sends a probe to each index
// (steering.h); each socket learns its index from the probe it receives and rebuilds the program.
// Until then packets for a moved socket reach another one, which drops and counts them
// (rx_unknown_qpn; RC retransmits them), and a second round of probes one tick later catches
// sockets that closed after the first.
//
// Forward mode (share_forward.h) keeps three more things in the file: the socket slot that owns the
// port, the slot an owner that left named to take over, each slot's ring nonce, and `routes`, a
// counter bumped whenever a bucket, QP1 or a ring changes hands.
//
// Locks: mu_ (this process's threads) -> the file's byte-0 lock (other processes). Everything in
// the mapped file is written only under both and read under both, except `routes` and the owner,
// which a receive path loads without them (an atomic load: a hint to take the locks and look);
// our_fds_ under mu_.
#pragma once

#include <stdint.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "providers/soft/steering.h"

namespace melon::soft {

constexpr uint32_t kShareMaxMembers = 64;  // processes on one address
constexpr uint32_t kShareMaxSockets = 64;  // sockets in one group (lanes of all members)

class AddressRegistry {
 public:
  // How often each member looks for dead members and unanswered probes (its lane 0 progress thread).
  static constexpr uint64_t kTickNs = 25000000;

  // The registry of `gid` (IPv4-mapped or IPv6), scope and port for this process: one per file, shared
  // by this process's devices on the address. nullptr with *why when the file cannot be used.
  static std::shared_ptr<AddressRegistry> open(const uint8_t gid[16], uint32_t scope_id, uint16_t port,
                                               std::string* why);
  ~AddressRegistry();
  AddressRegistry(const AddressRegistry&) = delete;
  AddressRegistry& operator=(const AddressRegistry&) = delete;

  // Claims QPN buckets for a device of `lanes` lanes on every registry in `regs` (a device's
  // addresses: a QP's packets may come to any of them, so its bucket is claimed on each) and a
  // socket slot per lane on each: (*slots)[r][lane]. (*buckets)[lane] lists that lane's buckets.
  // EADDRINUSE (with *why) when the address has no free bucket or slot left.
  static int claim(const std::vector<AddressRegistry*>& regs, uint32_t lanes,
                   std::vector<std::vector<uint8_t>>* buckets, std::vector<std::vector<int>>* slots, std::string* why);
  // Binds `fd` (SO_REUSEPORT set) to the address for socket `slot`, under the lock, and attaches
  // the program rebuilt with it. 0, or errno of the bind (or of the attach).
  int join(int slot, int fd, const void* addr, unsigned addr_len);
  // Closes `fd` (joined, or -1 for a slot that never joined) and frees the slot and its buckets.
  void leave(int slot, int fd);
  // From a progress thread every kTickNs: reclaims dead members, probes sockets of unknown index.
  void tick();
  // A probe socket `slot` received (rx path, outside the engine lock): its index, if the probe is
  // of this generation, and the program rebuilt.
  void probe_arrived(int slot, const uint8_t* pkt, size_t len);
  // The secret probes carry (for the receive path's check).
  void secret(uint32_t out[2]) const { out[0] = secret_[0], out[1] = secret_[1]; }

  // For tests and melonctl: what the file holds now.
  struct View {
    uint32_t members = 0, sockets = 0, buckets_claimed = 0, generation = 0, unknown = 0, rebuilds = 0, reclaimed = 0;
    uint32_t owner_pid = 0, rings = 0;  // forward mode: the process holding the port (0: none); members with a ring
  };
  View view();
  const std::string& path() const { return path_; }

  // QP1 (the GSI, used by the connection manager): steered to one member's socket, the one whose
  // process created QP1 (librdmacm's CM agent: docs/rdmacm.md). claim_gsi: 0, or EADDRINUSE while a
  // live socket of another member has it. It goes with the socket (sweep, leave).
  static constexpr uint8_t kGsiUnclaimed = 0;
  int claim_gsi(int slot);

  // Forward mode (share_forward.h): one socket slot's process, the owner, binds the port and receives
  // for all; every other slot's datagrams go to a receive ring (share_ring.h) tagged by a nonce of
  // its own. Slots, not processes: two devices of one process on the address have a ring each.
  static constexpr uint8_t kNoSlot = 0xff;
  // The file of kind `kind` ("ring", "wake") of the ring tagged `nonce`, beside the registry.
  std::string member_file(uint64_t nonce, const char* kind) const;
  // Our slot's ring nonce (0: none), published for the owner. 0, or EINVAL for a slot not ours.
  int set_ring(int slot, uint64_t nonce);
  // Bumped whenever a bucket, QP1 or a ring changes hands: the owner refreshes its routes when it
  // moved (one load, no lock).
  uint32_t routes_version() const;
  struct Routes {
    uint8_t slot_of_bucket[kQpnBuckets];  // kNoSlot: unclaimed, or reserved
    uint8_t gsi_slot = kNoSlot;  // QP1's
    uint64_t ring[kShareMaxSockets];  // each slot's ring (0: none)
  };
  void routes(Routes* out);
  // Slot `slot` becomes the owner if no live slot is: bind() (binding the port) is called under the
  // lock, so no two bind at once. 0: owner now (or already); EBUSY: another live slot is; EINVAL:
  // not our slot; else bind's errno.
  int own(int slot, const std::function<int()>& bind);
  // Whether any slot owns the port now (one load, no lock; a dead owner counts until a sweep).
  bool owned() const;
  // The owner leaves: close() (closing its socket) under the lock, then no owner, and the slot to
  // take over named. The successor's ring nonce, 0 when no slot with a ring is left.
  uint64_t disown(int slot, const std::function<void()>& close);

 private:
  AddressRegistry() = default;
  struct Layout;
  struct Locked;
  bool lock_file(bool wait);
  void unlock_file();
  bool sweep_locked();  // reclaims dead members; true if any
  int rebuild_locked();  // the program from the file, attached on one of our sockets; 0 or errno
  void probe_locked();  // a probe to every index, the generation bumped before
  void move_out_locked(int slot);  // the kernel's reuseport_detach_sock, for a socket we close
  uint32_t live_sockets_locked() const;
  bool ours_locked(int slot) const;
  void free_socket_locked(uint32_t s);  // its ring files removed, its ownership ended

  std::mutex mu_;
  int fd_ = -1;
  Layout* map_ = nullptr;
  int member_ = -1;  // our member slot
  uint32_t secret_[2] = {0, 0};
  std::string path_;
  uint8_t gid_[16] = {};
  uint32_t scope_id_ = 0;
  uint16_t port_ = 0;
  std::vector<std::pair<int, int>> our_fds_;  // (slot, fd) of our joined sockets: any may attach
};

}  // namespace melon::soft
