// The CM agent's only door to the wire: send a 256-byte MAD from QP1 to a peer's QP1, and receive
// the MADs that arrive there. Today the door is the device's GSI QP in this process (gsi_port.cpp,
// through the provider's create_gsi_qp); a per-address daemon would implement the same interface
// over its socket, and the agent's state machine (agent.cpp) would not change (docs/rdmacm.md).
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace melon::rdmacm {

// Where a MAD comes from or goes to: the peer's GID (RoCEv2: its IP address), our GID index, and
// the remote QP (1 for the CM) with its P_Key index. Everything an AH for QP1 needs.
struct MadAddress {
  ibv_gid peer_gid{};
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint32_t flow_label = 0;
  uint32_t remote_qpn = 1;
};

class MadPort {
 public:
  virtual ~MadPort() = default;
  // Queues one MAD (kMadSize bytes); errno value on failure. Never blocks for the network.
  virtual int send(const uint8_t* mad, const MadAddress& to) = 0;
  // A descriptor that is readable when receive() may return a MAD (poll it with the agent's timers).
  virtual int fd() const = 0;
  // The next received MAD (kMadSize bytes into `mad`) and its sender: 1, or 0 when none is waiting,
  // or -errno. Receive buffers are re-posted as they are consumed.
  virtual int receive(uint8_t* mad, MadAddress* from) = 0;
  // Waits up to `ms` milliseconds until every MAD queued by send() has left (its send completion);
  // MADs arriving meanwhile are dropped. For the process's exit: a device that sends on its own time
  // (melon-emud's mlx5_0) drops what it has not yet sent with the process's QP1, such as the DREP
  // that answered a peer's DREQ just before the application exited. Linux's ib_cm sends from the
  // kernel, which outlives the process.
  virtual void flush(int ms) = 0;
};

// The GSI QP of `ctx`'s port 1 as a MadPort, or nullptr with errno (EOPNOTSUPP: the provider keeps
// no QP1 in this process).
std::unique_ptr<MadPort> open_gsi_port(ibv_context* ctx);

}  // namespace melon::rdmacm
