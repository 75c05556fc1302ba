// Wires for the emulated device's Ethernet port (FramePort): an in-memory link between devices in
// one process (unit tests, benchmarks), and a UDP socket on port 4791 that speaks RoCEv2 with the
// soft provider and Linux rxe (only the UDP payload crosses the socket; the kernel adds IP/UDP).
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <netinet/udp.h>  // UDP_SEGMENT (Linux)
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "mlx5/emu/device.h"
#include "roce/ip_udp.h"

namespace melon::mlx5::emu {

// Every frame one port transmits is offered to every other port's device; each device keeps the
// frames addressed to its own GIDs (as a switch flooding to all ports would).
class MemoryLink {
 public:
  // A port for a device not built yet: give it in HostPorts::wire, then attach the device.
  FramePort* add_port();
  void attach(FramePort* port, Device* dev);
  // Frames that cross the link, and how many the drop hook threw away.
  uint64_t frames() const { return frames_; }
  // Optional loss: returns true to drop a frame (tests of retransmission).
  bool (*drop)(void* arg, const uint8_t* frame, size_t len) = nullptr;
  void* drop_arg = nullptr;
  uint64_t dropped() const { return dropped_; }

 private:
  struct Port : FramePort {
    MemoryLink* link = nullptr;
    Device* dev = nullptr;
    void transmit(const uint8_t* frame, size_t len) override;
  };
  std::vector<std::unique_ptr<Port>> ports_;
  std::atomic<uint64_t> frames_{0}, dropped_{0};
};

// One UDP socket bound to a local address (IPv4 or IPv6), port 4791. IPv6 frames go out with the
// kernel's UDP checksum, and datagrams with checksum 0 (as rxe sends them) are accepted.
//
// UDP GSO (Linux UDP_SEGMENT): in transmit_many, consecutive frames to one peer of one size (the last
// may be shorter) leave in one send, which the kernel cuts into the same datagrams, one RoCE packet
// each; the loopback delivers them to a GRO receiver (the soft provider) as one. The only thing a peer
// sees differ is the IPv4 identification: the kernel numbers a send's segments 0, 1, 2, ... (Linux
// inet_gso_segment), and the ICRC covers it, so segment i's ICRC is the one for identification i.
// The soft provider sends the same way. A kernel that refuses a GSO send (EIO: no checksum offload
// on the route; EINVAL) turns it off for the socket, and those frames leave one datagram each.
class UdpWire : public FramePort {
 public:
  explicit UdpWire(uint32_t ipv4_host_order, uint16_t port = 4791);
  // The address as a GID: IPv4-mapped binds an IPv4 socket, anything else an IPv6 one.
  explicit UdpWire(const uint8_t gid[16], uint16_t port = 4791);
  ~UdpWire() override;
  int open();  // binds; 0 or an errno value
  void attach(Device* dev) { dev_ = dev; }
  void transmit(const uint8_t* frame, size_t len) override;
  void transmit_many(std::vector<uint8_t>* frames, size_t n) override;
  uint16_t source_port() const override { return port_; }
  // Hands every datagram waiting (up to `timeout_ms` for the first) to the device; returns how many.
  int poll(int timeout_ms);
  // The same without waiting, and nothing if another thread is reading the socket right now (it
  // hands over what is waiting): for a thread that polls the wire between other work.
  int poll_now();
  // A thread that polls and services the device until stop().
  void start();
  void stop();
  uint64_t bad_icrc() const { return bad_icrc_; }
  // GSO on (the default where the kernel has UDP_SEGMENT) or off (melon-emud --no-gso: one
  // datagram per send, for comparison); gso() says whether it is still on.
  void set_gso(bool on) { gso_ = on && kGsoBuilt; }
  bool gso() const { return gso_; }
  uint64_t gso_sends() const { return gso_sends_; }  // sends that carried more than one datagram

 private:
  struct Datagram {
    sockaddr_storage to;
    socklen_t tl;
    uint8_t* data;
    size_t len;
    roce::IpUdp ip;  // the headers its ICRC covers as sent (source port and identification 0)
  };
  bool to_datagram(uint8_t* frame, size_t len, Datagram* d) const;
  int drain();

  uint8_t gid_[16];
  bool v6_;
  uint16_t port_;
  int fd_ = -1;
  Device* dev_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bad_icrc_{0};
#ifdef UDP_SEGMENT
  static constexpr bool kGsoBuilt = true;
#else
  static constexpr bool kGsoBuilt = false;
#endif
  std::atomic<bool> gso_{kGsoBuilt};
  std::atomic<uint64_t> gso_sends_{0};
  // transmit_many's ICRC changes for segment i of a GSO send of datagrams `len` long (one sender at
  // a time: the device's releasing thread, device.cpp). The change depends on the length and i
  // alone (the CRC is affine), so the first datagram of a length and index has its ICRC computed
  // afresh for identification i (one CRC) and the change is kept for the others; kept for the few
  // lengths a stream has (a READ's FIRST/LAST and MIDDLE differ by their AETH).
  void set_segment_id(Datagram& d, unsigned i);  // d's ICRC for identification i (from 0)
  void clear_segment_id(Datagram& d, unsigned i);  // and back to 0
  struct IdDeltas {
    size_t len = 0;
    uint64_t have = 0;  // bit i: d[i] is computed for len
    uint32_t d[roce::kMaxGsoSegments];
  };
  IdDeltas deltas_[4];
  unsigned next_delta_ = 0;  // the entry a new length takes
  std::mutex rx_mu_;  // one reader of the socket at a time, so frames keep their order
  // drain()'s datagram buffers (under rx_mu_): one recvmmsg takes several, and a short batch says
  // the socket is empty without another call that fails.
  static constexpr unsigned kRxBatch = 16;
  struct RxSlot;
  std::unique_ptr<RxSlot[]> rx_;
};

}  // namespace melon::mlx5::emu
