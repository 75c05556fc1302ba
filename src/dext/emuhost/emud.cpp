// melon-emud's body: the device (emulator + EmuHal + core), the platform under CoreBackend (memfd
// queue memory, client windows), and the socket loop around uapi::Server.
#include "dext/emuhost/emud.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "dext/emuhost/client_dma.h"
#include "dext/emuhost/emu_hal.h"
#include "dext/emuhost/socket_request.h"
#include "dext/emuhost/uar_watcher.h"
#include "mlx5/core/hca.h"
#include "mlx5/emu/device.h"
#include "mlx5/emu/test_host.h"
#include "mlx5/emu/wire.h"
#include "mlx5/prm/doorbell.h"
#include "mlx5/core/uapi_backend.h"
#include "uapi/server.h"
#include "uapi/socket/protocol.h"

namespace melon::dext {

namespace {

using uapi::kMaxSocketMessage;
using uapi::SocketReply;
using uapi::SocketRequest;

int g_stop_fd = -1;  // eventfd the signal handler writes

std::string errstr(const char* what) { return std::string(what) + ": " + strerror(errno); }

struct Conn {
  int fd = -1;
  int event_fd = -1;
  std::shared_ptr<ClientProcess> proc;  // its process, for DMA into its MRs (client_dma.h)
  bool attached = false;  // false: over a client limit; refused at its first request with `refused`
  uapi::Status refused = uapi::Status::ok;
  std::unique_ptr<uapi::Client> client;
};

// Queue memory as memfds the device sees through the TestHost IOMMU and the client maps.
class Platform final : public mlx5::core::QueuePlatform {
 public:
  Platform(mlx5::emu::TestHost& host, ClientDma& dma, UarWatcher& watcher, int wake_fd)
      : host_(host), dma_(dma), watcher_(watcher), wake_fd_(wake_fd) {}
  ~Platform() {
    for (auto& [fd, m] : mems_) {
      munmap(m.va, m.size);
      close(fd);
    }
  }

  int queue_alloc(uint64_t size, Mem* out) override {
    int fd = memfd_create("melon-queue", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return mlx5::core::kHalNoMemory;
    void* va = MAP_FAILED;
    // The client gets this fd read-write. Sealed at its size before anyone else sees it: a client's
    // ftruncate() would otherwise make the daemon's next doorbell read or device DMA into the
    // memory take SIGBUS, and every client with it. Hole punching stays possible and only zeroes
    // pages the client could have written anyway.
    if (ftruncate(fd, off_t(size)) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
      va = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (va == MAP_FAILED) {
      close(fd);
      return mlx5::core::kHalNoMemory;
    }
    uint64_t iova = host_.map(va, size);
    if (!iova) {
      munmap(va, size);
      close(fd);
      return mlx5::core::kHalNoMemory;
    }
    out->memory = uint64_t(fd);
    out->iova = iova;
    out->va = va;
    out->size = size;
    mems_[fd] = M{va, size, iova};
    return mlx5::core::kHalOk;
  }
  void queue_free(const Mem& m) override { release(int(m.memory)); }

  // The client's UAR page is a memfd page the watcher forwards to the device's own UAR page
  // (uar_watcher.h; the protocol in uapi/doorbell.h).
  int uar_map(const mlx5::core::Uar& u, uapi::MapRegion* out) override {
    Mem m;
    if (int r = queue_alloc(mlx5::prm::kUarPageBytes, &m); r != mlx5::core::kHalOk) return r;
    uars_[u.index] = int(m.memory);
    const uint32_t bf[2] = {uint32_t(u.bf_off[0] - u.bar_off), uint32_t(u.bf_off[1] - u.bar_off)};
    watcher_.add(static_cast<uint8_t*>(m.va), u.bar_off, bf);
    *out = uapi::MapRegion{uint8_t(uapi::MapKind::uar), uapi::kMapWriteCombine | uapi::kMapWatched, m.memory, 0,
                           mlx5::prm::kUarPageBytes};
    return mlx5::core::kHalOk;
  }
  void uar_unmap(const mlx5::core::Uar& u) override {
    auto it = uars_.find(u.index);
    if (it == uars_.end()) return;
    watcher_.remove(static_cast<uint8_t*>(mems_[it->second].va));
    release(it->second);
    uars_.erase(it);
  }

  void doorbell_bind(const mlx5::core::Uar& u, uint8_t kind, uint32_t number, void* dbr) override {
    watcher_.bind(u.bar_off, kind, number, static_cast<uint8_t*>(dbr));
  }
  void doorbell_unbind(uint8_t kind, uint32_t number) override { watcher_.unbind(kind, number); }
  void doorbell_rewind(uint8_t kind, uint32_t number) override { watcher_.rewind(kind, number); }

  int pin_client(void* host, uint64_t addr, uint64_t len, bool writable, uint64_t* iova, uint64_t* token) override {
    const Conn* c = static_cast<const Conn*>(host);
    uint64_t w = dma_.open_window(c->proc, addr, len, writable);
    if (!w) return mlx5::core::kHalFault;
    *iova = *token = w;
    return mlx5::core::kHalOk;
  }
  void unpin_client(uint64_t token) override { dma_.close_window(token); }
  void events_pending() override {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }

  size_t memfds() const { return mems_.size(); }

  // The stable-driver gate (docs/gates.md): the emulated firmware's roce_en quirk on demand, and
  // the device's own page and IOMMU counts.
  void set_device(mlx5::emu::Device* d) { dev_ = d; }
  int set_roce_en_quirk(bool on) override {
    if (!dev_) return mlx5::core::kHalUnsupported;
    mlx5::emu::Faults f = dev_->faults();
    f.fw_14_22_roce_en_lost = on;
    dev_->set_faults(f);
    return 0;
  }
  bool device_counts(uint64_t* pages_held, uint64_t* iova_bytes) override {
    if (!dev_) return false;
    *pages_held = dev_->stats().fw_pages_held;
    *iova_bytes = host_.mapped_bytes();
    return true;
  }

 private:
  struct M {
    void* va;
    uint64_t size, iova;
  };
  void release(int fd) {
    auto it = mems_.find(fd);
    if (it == mems_.end()) return;
    host_.unmap(it->second.iova);
    munmap(it->second.va, it->second.size);
    close(fd);
    mems_.erase(it);
  }
  mlx5::emu::TestHost& host_;
  ClientDma& dma_;
  UarWatcher& watcher_;
  int wake_fd_;
  std::map<int, M> mems_;
  std::map<uint32_t, int> uars_;
  mlx5::emu::Device* dev_ = nullptr;
};

// One request datagram, and the descriptor it carries (if any: the first; more are closed).
ssize_t recv_request(int fd, uint8_t* buf, size_t cap, int* passed) {
  iovec iov{buf, cap};
  alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t k = 0; k < nfd; k++) {
      int f;
      memcpy(&f, CMSG_DATA(c) + k * sizeof(int), sizeof f);
      if (*passed < 0)
        *passed = f;
      else
        close(f);
    }
  }
  return n;
}

bool send_reply(int fd, const SocketReply& rp, const void* body, uint32_t len, int pass_fd) {
  uint8_t buf[kMaxSocketMessage];
  memcpy(buf, &rp, sizeof rp);
  if (len) memcpy(buf + sizeof rp, body, len);
  iovec iov{buf, sizeof rp + len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  return sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == ssize_t(sizeof rp + len);
}

// The port's GID 0: the wire address, IPv4 as an IPv4-mapped RoCEv2 GID (IBA A17.9.1 / RoCEv2
// annex), IPv6 as itself.
bool wire_gid(const std::string& addr, uint8_t gid[16]) {
  in_addr a{};
  if (inet_pton(AF_INET, addr.c_str(), &a) == 1) {
    memset(gid, 0, 16);
    gid[10] = gid[11] = 0xff;
    memcpy(gid + 12, &a, 4);
    return true;
  }
  return inet_pton(AF_INET6, addr.c_str(), gid) == 1;
}

}  // namespace

void stop_emud() {
  if (g_stop_fd >= 0) {
    uint64_t one = 1;
    (void)!write(g_stop_fd, &one, sizeof one);
  }
}

int run_emud(const EmudOptions& opt, std::string* why) {
  if (opt.socket.empty() || opt.socket.size() >= sizeof(sockaddr_un::sun_path)) {
    *why = "socket path empty or too long";
    return kEmudUsage;
  }
  uint8_t gid[16];
  if (!wire_gid(opt.wire, gid)) {
    *why = "--wire " + opt.wire + " is not an IPv4 or IPv6 address";
    return kEmudUsage;
  }
  // One daemon per device: the lock is held for the process's life (and dropped by the kernel
  // when it dies, so a crash never blocks the next start).
  std::string lock_path = opt.socket + ".lock";
  int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    *why = errstr(("cannot open " + lock_path).c_str());
    return kEmudSocket;
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    *why = "another melon-emud already serves " + opt.socket;
    close(lock_fd);
    return kEmudAlreadyRunning;
  }
  // The lock file names the daemon (melonctl emud stop/status read it).
  if (ftruncate(lock_fd, 0) == 0) dprintf(lock_fd, "%d\n", int(getpid()));
  // The socket is bound under a name of its own and appears at its path only once the device is
  // up and its GUID published (below): whoever finds the socket finds a device to list.
  sockaddr_un sa{};
  const std::string bind_path = opt.socket.size() + 4 < sizeof sa.sun_path ? opt.socket + ".new" : opt.socket;
  unlink(opt.socket.c_str());  // a stale socket of a dead daemon (we hold the lock)
  unlink(bind_path.c_str());
  unlink((opt.socket + ".guid").c_str());
  int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, bind_path.c_str(), bind_path.size() + 1);
  // The socket is created with its mode (no window in which it has the umask's): owner and group
  // of the daemon by default; --socket-mode 0666 opens it to every user, as rdma-core's udev rule
  // opens /dev/infiniband/uverbs*, and the per-user limits (docs/uapi.md) then keep users apart.
  mode_t old_mask = umask(0777 & ~opt.socket_mode);
  bool bound = lfd >= 0 && bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  umask(old_mask);
  if (!bound || listen(lfd, 32) != 0) {
    *why = errstr(("cannot listen on " + opt.socket).c_str());
    if (lfd >= 0) close(lfd);
    close(lock_fd);
    return kEmudSocket;
  }
  // The port's wire: RoCEv2 over UDP 4791 at the wire address (the soft provider and rxe speak it).
  mlx5::emu::UdpWire wire(gid);  // port 4791
  wire.set_gso(opt.gso);
  if (int e = wire.open(); e != 0) {
    errno = e;
    *why = errstr(("cannot bind the wire " + opt.wire + " port 4791").c_str());
    close(lfd);
    unlink(bind_path.c_str());
    close(lock_fd);
    return kEmudSocket;
  }
  g_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);

  // The device and the driver core.
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  mlx5::emu::HostPorts ports;
  ports.dma = &dma;
  ports.irq = &host;
  ports.wire = &wire;
  auto dev = std::make_unique<mlx5::emu::Device>(ports, mlx5::emu::DeviceConfig{});
  EmuHalOptions ho;
  ho.host_page_size = 4096;
  ho.interrupts = true;
  ho.echo_log = true;  // warnings and errors to stderr; everything with --verbose
  ho.echo_level = opt.verbose ? mlx5::core::LogLevel::debug : mlx5::core::LogLevel::warn;
  EmuHal hal(*dev, host, nullptr, ho);
  dev->set_host_services(true);  // the watcher and wire_rx below run what they bring
  dev->start_worker();
  wire.attach(dev.get());
  std::atomic<bool> wire_stop{false};
  UarWatcher watcher(*dev, uint64_t(opt.spin_us) * 1000);
  watcher.set_poll([](void* w) { return static_cast<mlx5::emu::UdpWire*>(w)->poll_now() > 0; }, &wire);
  watcher.set_ack_hold(opt.ack_hold_us * 1000);
  std::thread wire_rx([&] {
    // Frames to the device, run on this thread (as the watcher runs doorbells): no hand-off to the
    // device's worker, which keeps the timers. While the doorbell watcher is awake it reads the
    // socket too (UarWatcher::set_poll), so a frame that comes while it polls is run at once; this
    // thread still waits on the socket, so one that comes while the watcher waits for a time slice
    // (a loaded machine) is not left for it. One reader at a time: UdpWire keeps the order.
    while (!wire_stop) {
      watcher.wait_not_polling(100);
      if (wire.poll(100))
        while (dev->service()) {}
    }
  });
  auto stop_wire = [&] {
    wire_stop = true;
    wire_rx.join();
  };
  mlx5::core::Hca hca;
  hca.attach(&hal);
  auto fail_device = [&](const char* what) {
    *why = std::string(what) + ": " + mlx5::core::stage_name(hca.last_failure().stage) + ", " +
           mlx5::core::err_name(hca.last_failure().err);
    stop_wire();
    dev->stop_worker();
    hca.detach();
    close(lfd);
    unlink(bind_path.c_str());
    close(lock_fd);
    return kEmudDevice;
  };
  if (hca.bring_up() != mlx5::core::Err::ok) return fail_device("device bring-up failed");
  mlx5::core::GidEntry g;
  memcpy(g.gid, gid, 16);
  memcpy(g.mac, hca.port().mac, 6);
  g.l3_type = (gid[10] == 0xff && gid[11] == 0xff) ? 0 : 1;
  if (hca.set_gid(0, g) != mlx5::core::Err::ok) return fail_device("setting GID 0 failed");
  // The same GID at index 1 too: MLX's JACCL connects with sgid_index 1 and publishes the first
  // IPv4-mapped GID, so both must be the wire address (docs/verbs.md).
  if (hca.set_gid(1, g) != mlx5::core::Err::ok) return fail_device("setting GID 1 failed");

  watcher.start();
  Platform plat(host, dma, watcher, wake_fd);
  plat.set_device(dev.get());
  mlx5::core::UapiBackend backend(hca, plat);
  // The node GUID beside the socket (<socket>.guid, written whole by a rename): the mlx5 provider
  // lists the device with it and connects only when a context is opened.
  std::string guid_path = opt.socket + ".guid";
  {
    uapi::DeviceAttr attr{};
    backend.query_device(&attr);
    std::string tmp = guid_path + ".tmp";
    if (FILE* f = fopen(tmp.c_str(), "we")) {
      fprintf(f, "%016llx\n", (unsigned long long)attr.node_guid);
      fclose(f);
      rename(tmp.c_str(), guid_path.c_str());
    }
  }
  if (bind_path != opt.socket) rename(bind_path.c_str(), opt.socket.c_str());
  uapi::Limits lim;
  backend.fill_limits(&lim);
  lim.clients = opt.clients < uapi::kMaxClients ? opt.clients : uapi::kMaxClients;
  if (opt.clients_per_user) lim.clients_per_user = opt.clients_per_user;
  lim.diagnostics = opt.diagnostics;
  for (auto [mib, q] : {std::pair{opt.queue_mib, &lim.queue_bytes}, {opt.pinned_mib, &lim.pinned_bytes}}) {
    if (mib[0]) q->client = mib[0] << 20;
    if (mib[1]) q->user = mib[1] << 20;
    if (mib[2]) q->device = mib[2] << 20;
  }
  uapi::Server srv(backend, lim);
  std::vector<std::unique_ptr<Conn>> conns;
  struct Notify final : uapi::EventNotify {
    std::vector<std::unique_ptr<Conn>>* conns;
    void event_queued(uapi::Client& c) override {
      for (auto& cn : *conns)
        if (cn->client.get() == &c) {
          uint64_t one = 1;
          (void)!write(cn->event_fd, &one, sizeof one);
        }
    }
  } notify;
  notify.conns = &conns;
  srv.set_notify(&notify);

  auto drop = [&](size_t i) {
    Conn& c = *conns[i];
    if (c.attached) srv.detach(*c.client);
    close(c.fd);
    close(c.event_fd);
    conns.erase(conns.begin() + long(i));
  };
  bool running = true;
  while (running) {
    std::vector<pollfd> pf;
    pf.push_back({g_stop_fd, POLLIN, 0});
    pf.push_back({wake_fd, POLLIN, 0});
    pf.push_back({lfd, POLLIN, 0});
    for (auto& c : conns) pf.push_back({c->fd, POLLIN, 0});
    // The health poller and page requests want service() now and then.
    int n = poll(pf.data(), pf.size(), 200);
    if (n < 0 && errno != EINTR) break;
    while (hal.take_service_request()) hca.service();
    if (pf[0].revents) running = false;
    if (pf[1].revents) {
      uint64_t v;
      (void)!read(wake_fd, &v, sizeof v);
    }
    backend.drain_events(srv);
    size_t polled = pf.size() - 3;  // connections accepted below were not polled this round
    if (pf[2].revents & POLLIN) {
      for (;;) {
        int cfd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (cfd < 0) break;
        auto c = std::make_unique<Conn>();
        c->fd = cfd;
        ucred cr{};
        cr.uid = uid_t(-1);  // no credentials: a user of its own that no real one shares
        socklen_t crl = sizeof cr;
        getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &crl);
        c->proc = ClientProcess::open(cr.pid);  // at once: the process that connected is alive
        c->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        c->client = std::make_unique<uapi::Client>();
        c->refused = srv.attach(c->client.get(), c.get(), uint32_t(cr.uid));
        c->attached = c->refused == uapi::Status::ok;
        conns.push_back(std::move(c));
      }
    }
    // Requests (back to front, so a dropped connection does not shift the ones still to serve).
    for (size_t i = polled; i-- > 0;) {
      short re = pf[3 + i].revents;
      if (!re) continue;
      Conn& c = *conns[i];
      uint8_t buf[kMaxSocketMessage];
      int passed_in = -1;  // a descriptor with the request (protocol.h: Open's memory file)
      ssize_t got = (re & POLLIN) ? recv_request(c.fd, buf, sizeof buf, &passed_in) : 0;
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got <= 0) {  // closed or died: everything it owned goes now
        drop(i);
        continue;
      }
      uint8_t out[kMaxSocketBody];
      SocketAnswer a =
          answer_request(srv, c.attached ? c.client.get() : nullptr, c.refused, buf, size_t(got), c.event_fd, out);
      if (a.took_memory && c.proc && passed_in >= 0) c.proc->set_memory(passed_in), passed_in = -1;
      if (passed_in >= 0) close(passed_in);
      if (!send_reply(c.fd, a.reply, out, a.reply.out_len, a.pass_fd) || !c.attached) drop(i);
    }
  }

  // Clean stop: clients' objects, the device, the socket.
  while (!conns.empty()) drop(conns.size() - 1);
  backend.drain_events(srv);
  watcher.stop();
  UarWatcher::Stats ws = watcher.stats();
  fprintf(stderr,
          "melon-emud: stopped; doorbells: %llu forwarded (%llu from doorbell records), %llu kicks, %llu sleeps, "
          "%llu found without a kick\n",
          (unsigned long long)ws.forwarded, (unsigned long long)ws.from_records, (unsigned long long)ws.kicks,
          (unsigned long long)ws.sleeps, (unsigned long long)ws.unkicked);
  mlx5::emu::Device::Stats ds = dev->stats();
  fprintf(stderr,
          "melon-emud: device: frames %llu sent, %llu received, %llu dropped; %llu doorbells ignored; %llu bad ICRC "
          "on the wire; %llu GSO sends (GSO %s)\n",
          (unsigned long long)ds.frames_tx, (unsigned long long)ds.frames_rx, (unsigned long long)ds.frames_dropped,
          (unsigned long long)ds.doorbells_ignored, (unsigned long long)wire.bad_icrc(),
          (unsigned long long)wire.gso_sends(), wire.gso() ? "on" : "off");
  mlx5::core::Err te = hca.teardown();
  // Queues and pins of objects destroyed while the device was fatal: the teardown reset it, so the
  // device no longer writes them (the watcher stopped reading their doorbell records at the destroy).
  backend.release_dead();
  stop_wire();
  dev->stop_worker();
  hca.detach();
  close(lfd);
  unlink(guid_path.c_str());
  unlink(opt.socket.c_str());
  close(wake_fd);
  close(g_stop_fd);
  g_stop_fd = -1;
  close(lock_fd);
  if (te != mlx5::core::Err::ok) {
    *why = std::string("teardown: ") + mlx5::core::err_name(te);
    return kEmudDevice;
  }
  return kEmudOk;
}

}  // namespace melon::dext
