// Forward mode: the owner's routing into the members' rings, the members' wake-ups, and the
// hand-over of the port (share_forward.h).
#include "providers/soft/share_forward.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

#include "providers/soft/random.h"
#include "providers/soft/steering.h"
#include "providers/soft/udp_socket.h"

namespace melon::soft {

namespace {

// A Unix datagram socket, non-blocking and closed on exec (set one by one: macOS has no SOCK_NONBLOCK).
int unix_dgram(std::string* why) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  if (fd < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
    *why = std::string("wake socket: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool unix_address(const std::string& path, sockaddr_un* a, socklen_t* len) {
  *a = sockaddr_un{};
  if (path.size() >= sizeof a->sun_path) return false;
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path, path.c_str(), path.size() + 1);
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

}  // namespace

ShareForward::ShareForward(AddressRegistry* registry, int slot, const uint8_t gid[16], uint32_t scope_id, uint16_t port,
                           TransportStats& stats)
    : reg_(registry),
      slot_(slot),
      scope_id_(scope_id),
      port_(port),
      stats_(stats),
      routes_(new AddressRegistry::Routes),
      peers_(new Peer[kShareMaxSockets]) {
  std::memcpy(gid_, gid, 16);
}

ShareForward::~ShareForward() { close(); }

int ShareForward::open_port_socket(std::string* why, bool* bind_failed) {
  return open_roce_socket(gid_, scope_id_, port_, why, bind_failed);
}

int ShareForward::open(std::string* why, bool* bind_failed) {
  *bind_failed = false;
  do random_bytes(&nonce_, sizeof nonce_);
  while (!nonce_);
  // The ring and the wake socket first: the owner routes to us from the moment we are registered.
  if (int e = ring_file_.create(reg_->member_file(nonce_, "ring"), nonce_, why)) return errno = e, -1;
  ring_.attach(ring_file_.mem(), ring_file_.bytes(), nonce_);
  sockaddr_un a;
  socklen_t alen;
  const std::string wake_path = reg_->member_file(nonce_, "wake");
  if ((wake_fd_ = unix_dgram(why)) < 0 || (wake_tx_ = unix_dgram(why)) < 0) return close(), -1;
  if (!unix_address(wake_path, &a, &alen)) {
    *why = wake_path + ": too long for a Unix socket";
    close();
    return errno = ENAMETOOLONG, -1;
  }
  unlink(wake_path.c_str());
  if (bind(wake_fd_, reinterpret_cast<sockaddr*>(&a), alen) != 0) {
    const int e = errno;
    *why = wake_path + ": bind: " + std::strerror(e);
    close();
    return errno = e, -1;
  }
  if (int e = reg_->set_ring(slot_, nonce_)) {
    *why = "registry: " + std::string(std::strerror(e));
    close();
    return errno = e, -1;
  }
  // The port, if no live member holds it (bound under the registry's lock); else an ephemeral port.
  std::string w;
  bool bf = false;
  int fd = -1;
  const int e = reg_->own(slot_, [&] {
    fd = open_port_socket(&w, &bf);
    return fd < 0 ? errno : 0;
  });
  if (e == 0) {
    owner_ = true;
    rx_fd_ = send_fd_ = fd;
    send_port_ = port_;
    return send_fd_;
  }
  if (e != EBUSY) {  // the port is held by a program that is not this library, or the host refuses
    *why = w.empty() ? std::string("registry: ") + std::strerror(e) : w;
    *bind_failed = bf;
    close();
    return errno = e, -1;
  }
  send_fd_ = open_roce_socket(gid_, scope_id_, 0, why, bind_failed);
  if (send_fd_ < 0) {
    const int err = errno;
    close();
    return errno = err, -1;
  }
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(send_fd_, reinterpret_cast<sockaddr*>(&ss), &sl);
  send_port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return send_fd_;
}

void ShareForward::close() {
  if (owner_) {
    // The port's socket closes under the registry's lock, so the successor's bind (under the same
    // lock, share_forward.h) never finds it still bound; then the successor is woken.
    const uint64_t next = reg_->disown(slot_, [&] {
      if (rx_fd_ >= 0) ::close(rx_fd_);
      if (send_fd_ == rx_fd_) send_fd_ = -1;
      rx_fd_ = -1;
    });
    owner_ = false;
    sockaddr_un a;
    socklen_t alen;
    if (next && wake_tx_ >= 0 && unix_address(reg_->member_file(next, "wake"), &a, &alen))
      (void)!sendto(wake_tx_, "h", 1, 0, reinterpret_cast<sockaddr*>(&a), alen);
  }
  for (int* fd : {&send_fd_, &rx_fd_, &wake_fd_, &wake_tx_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  for (uint32_t m = 0; m < kShareMaxSockets; ++m) peers_[m].reset();
  touched_.clear();
  if (nonce_) {
    reg_->set_ring(slot_, 0);
    unlink(reg_->member_file(nonce_, "ring").c_str());
    unlink(reg_->member_file(nonce_, "wake").c_str());
    nonce_ = 0;
  }
  ring_ = RingConsumer{};
  ring_file_.close();
}

void ShareForward::refresh_routes() {
  const uint32_t v = reg_->routes_version();
  if (v == routes_seen_) return;
  routes_seen_ = v;
  reg_->routes(routes_.get());
  for (uint32_t m = 0; m < kShareMaxSockets; ++m) {
    Peer& p = peers_[m];
    const uint64_t nonce = int(m) == slot_ ? 0 : routes_->ring[m];
    if (p.nonce == nonce) continue;
    p.reset();  // unmapped: the member left, or its slot has a new member
    p.nonce = nonce;
    if (!nonce) continue;
    std::string why;
    if (p.file.open(reg_->member_file(nonce, "ring"), &why) == 0 &&
        p.ring.attach(p.file.mem(), p.file.bytes(), nonce) &&
        unix_address(reg_->member_file(nonce, "wake"), &p.wake, &p.wake_len))
      p.mapped = true;
    else
      p.file.close();  // its datagrams are counted as ring drops; tried again when routes move
  }
}

bool ShareForward::route(const uint8_t* data, size_t len, const RingMeta& meta) {
  if (len < 8) return false;  // no BTH: the receive path counts it
  const uint32_t qpn = uint32_t(data[5]) << 16 | uint32_t(data[6]) << 8 | data[7];  // BTH: destination QP
  const uint8_t m = qpn == 1 ? routes_->gsi_slot : routes_->slot_of_bucket[bucket_of_qpn(qpn)];
  if (m == AddressRegistry::kNoSlot || int(m) == slot_) return false;
  Peer& p = peers_[m];
  if (!p.mapped || !p.ring.push(data, len, meta)) {
    stats_.rx_ring_drops++;
    return true;
  }
  stats_.rx_forwarded++;
  if (!p.touched) {
    p.touched = true;
    touched_.push_back(m);
  }
  return true;
}

void ShareForward::wake_routed() {
  for (uint32_t m : touched_) {
    Peer& p = peers_[m];
    p.touched = false;
    // A full wake queue means the member has wake-ups to read already.
    (void)!sendto(wake_tx_, "w", 1, 0, reinterpret_cast<sockaddr*>(&p.wake), p.wake_len);
  }
  touched_.clear();
}

bool ShareForward::drain_wake() {
  bool handed = false;
  char buf[64];
  for (ssize_t n; (n = recv(wake_fd_, buf, sizeof buf, 0)) > 0;) handed |= buf[0] == 'h';
  return handed;
}

bool ShareForward::tick() {
  if (owner_ || send_fd_ < 0 || reg_->owned()) return false;  // a dead owner is no owner after the tick's sweep
  std::string why;
  bool bind_failed = false;
  int fd = -1;
  // EBUSY while a live member owns the port (one lock per tick); a bind that fails (the old owner's
  // socket not yet gone, a program that is not ours) is tried again at the next tick.
  if (reg_->own(slot_, [&] {
        fd = open_port_socket(&why, &bind_failed);
        return fd < 0 ? errno : 0;
      }) != 0)
    return false;
  rx_fd_ = fd;
  owner_ = true;
  routes_seen_ = ~0u;
  role_version_++;
  stats_.share_takeovers++;
  // A thread blocked on our wake fd (a completion-channel waiter) looks again, at the port too.
  sockaddr_un a;
  socklen_t alen;
  if (unix_address(reg_->member_file(nonce_, "wake"), &a, &alen))
    (void)!sendto(wake_tx_, "w", 1, 0, reinterpret_cast<sockaddr*>(&a), alen);
  return true;
}

}  // namespace melon::soft
