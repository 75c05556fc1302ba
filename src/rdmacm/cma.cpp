// The rdma_* calls of librdmacm.so.1 (rdma-core v44's API, include/rdma/rdma_cma.h): event
// channels, ids, address and route resolution, the id's QP and its transitions, and the calls
// that start CM exchanges (agent.cpp). An id created without a channel is synchronous: each call
// waits for its own event, as rdma-core's librdmacm does.
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "abi/gen/rdmacm_prototypes.h"
#include "rdmacm/internal.h"

#define MELON_CM_EXPORT extern "C" __attribute__((visibility("default")))

namespace melon::rdmacm {

Lib& lib() {
  static Lib* l = new Lib;  // never destroyed: the agent thread may still run at exit
  return *l;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// MELON_CM_TIMEOUT (an exponent) shortens every CM timer for tests of the retry paths.
uint64_t cm_timeout_ns(uint8_t exponent) {
  static const int forced = [] {
    const char* e = std::getenv("MELON_CM_TIMEOUT");
    return e ? std::atoi(e) : -1;
  }();
  if (forced >= 0 && forced < 31) exponent = uint8_t(forced);
  if (exponent > 31) exponent = 31;
  return 4096ull << exponent;
}

// Communication IDs, TIDs and PSNs nobody can predict (a forged REJ or DREQ needs them).
uint32_t random32() {
  uint32_t v = 0;
  static const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, &v, sizeof v) != ssize_t(sizeof v)) v = uint32_t(now_ns() * 2654435761u);
  return v;
}

// A big-endian 64-bit value (ibv_get_device_guid) in host order.
uint64_t from_be64(uint64_t v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = h << 8 | b[i];
  return h;
}

void wake_agent() {
  Lib& L = lib();
  if (L.wake[1] >= 0) {
    char c = 1;
    (void)!write(L.wake[1], &c, 1);
  }
}

int ensure_init() {
  Lib& L = lib();
  if (L.init_done) return L.init_err;
  L.init_done = true;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    auto d = std::make_unique<Device>();
    d->ctx = ctx;
    d->guid = from_be64(ibv_get_device_guid(list[i]));
    ibv_query_port(ctx, 1, &d->port);
    ibv_query_device(ctx, &d->attr);
    L.devices.push_back(std::move(d));
  }
  if (list) ibv_free_device_list(list);
  if (L.devices.empty()) return L.init_err = ENODEV;
  if (pipe(L.wake)) return L.init_err = errno;
  for (int fd : L.wake) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  start_agent();
  return 0;
}

Device* device_of(ibv_context* ctx) {
  for (auto& d : lib().devices)
    if (d->ctx == ctx) return d.get();
  return nullptr;
}

namespace {
pid_t flush_pid = 0;  // the process that registered flush_at_exit (a fork's child has not opened QP1)

// At exit, the CM MADs this process queued leave before it does (MadPort::flush): at most 250 ms
// per device. The agent thread may hold the lock for a moment; never wait on it for long.
void flush_at_exit() {
  if (getpid() != flush_pid) return;
  std::unique_lock<std::mutex> g(lib().mu, std::defer_lock);
  for (int i = 0; i < 100 && !g.try_lock(); ++i) usleep(1000);
  if (!g.owns_lock()) return;
  for (auto& d : lib().devices)
    if (d->mad) d->mad->flush(250);
}
}  // namespace

int open_mad_port(Device* d) {
  if (d->mad) return 0;
  if (d->mad_err) return d->mad_err;
  d->mad = open_gsi_port(d->ctx);
  if (!d->mad) {
    d->mad_err = errno ? errno : EOPNOTSUPP;
    if (std::getenv("MELON_CM_DEBUG"))
      fprintf(stderr, "librdmacm: %s: no QP1 (%s)\n", ibv_get_device_name(d->ctx->device), strerror(d->mad_err));
    return d->mad_err;
  }
  if (flush_pid != getpid()) {
    flush_pid = getpid();
    std::atexit(flush_at_exit);
  }
  wake_agent();  // the agent polls the new port
  return 0;
}

void queue_event(Id* id, rdma_cm_event_type type, int status, const void* pdata, size_t plen, Id* listen) {
  auto* e = new Event;
  e->ev.id = listen ? id->cm_id() : id->cm_id();
  e->ev.listen_id = listen ? listen->cm_id() : nullptr;
  e->ev.event = type;
  e->ev.status = status;
  if (pdata && plen) {
    if (plen > sizeof e->private_data) plen = sizeof e->private_data;
    std::memcpy(e->private_data, pdata, plen);
    e->ev.param.conn.private_data = e->private_data;
    e->ev.param.conn.private_data_len = uint8_t(plen);
  }
  Channel* ch = listen ? listen->chan : id->chan;  // a request is the listener's event
  if (ch->closed) {
    delete e;
    return;
  }
  ch->queue.push_back(e);
  channel_signal(ch);
}

Channel* make_channel(bool sync) {
  auto* ch = new Channel;
#ifdef __linux__
  ch->ch.fd = ch->write_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (ch->ch.fd < 0) {
    delete ch;
    return nullptr;
  }
#else
  int p[2];
  if (pipe(p)) {
    delete ch;
    return nullptr;
  }
  fcntl(p[0], F_SETFD, FD_CLOEXEC);
  fcntl(p[1], F_SETFD, FD_CLOEXEC);
  ch->ch.fd = p[0];
  ch->write_fd = p[1];
#endif
  ch->sync = sync;
  return ch;
}

void free_channel(Channel* ch) {
  for (Event* e : ch->queue) delete e;
  ch->queue.clear();
  close(ch->ch.fd);
  if (ch->write_fd != ch->ch.fd) close(ch->write_fd);
  delete ch;
}

void channel_put(Channel* ch) {
  if (--ch->users > 0 || (!ch->closed && !ch->sync)) return;
  free_channel(ch);
}

void channel_signal(Channel* ch) {
#ifdef __linux__
  const uint64_t one = 1;
  (void)!write(ch->write_fd, &one, sizeof one);
#else
  const char one = 1;
  (void)!write(ch->write_fd, &one, 1);
#endif
}

int channel_wait(Channel* ch) {
#ifdef __linux__
  uint64_t v;
#else
  char v;
#endif
  // EINTR only after a handler without SA_RESTART (the kernel restarts the read otherwise), as
  // rdma-core's rdma_get_cm_event fails with it.
  const ssize_t r = read(ch->ch.fd, &v, sizeof v);
  if (r == ssize_t(sizeof v)) return 0;
  return r < 0 ? errno : EIO;
}

Id* new_id(Channel* chan, void* context, rdma_port_space ps, ibv_qp_type qpt) {
  Id* i = new Id;
  i->chan = chan;
  chan->users++;
  i->id.channel = &chan->ch;
  i->id.context = context;
  i->id.ps = ps;
  i->id.qp_type = qpt;
  lib().ids.push_back(i);
  return i;
}

void free_id(Id* id) {
  auto& v = lib().ids;
  for (size_t k = 0; k < v.size(); ++k)
    if (v[k] == id) {
      v.erase(v.begin() + long(k));
      break;
    }
  channel_put(id->chan);
  delete id;
}

// An event leaves its channel's queue for the application: it now counts against its ids until
// acknowledged (rdma-core: rdma_destroy_id waits for exactly the events it has reported).
Event* take_event(Channel* ch) {
  if (ch->queue.empty()) return nullptr;
  Event* e = ch->queue.front();
  ch->queue.pop_front();
  Id::from(e->ev.id)->unacked++;
  if (e->ev.listen_id) Id::from(e->ev.listen_id)->unacked++;
  return e;
}

void release_event(Event* e) {
  Id::from(e->ev.id)->unacked--;
  if (e->ev.listen_id) Id::from(e->ev.listen_id)->unacked--;
  delete e;
  lib().acked.notify_all();
}

// Drops the events of `id` still queued on `ch` (never reported, so never to be acknowledged),
// taking their counts off the descriptor where they are still there.
void purge_events(Channel* ch, Id* id) {
  for (auto it = ch->queue.begin(); it != ch->queue.end();) {
    Event* e = *it;
    if (Id::from(e->ev.id) != id && Id::from(e->ev.listen_id) != id) {
      ++it;
      continue;
    }
    delete e;
    it = ch->queue.erase(it);
    pollfd p{ch->ch.fd, POLLIN, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
      const int fl = fcntl(ch->ch.fd, F_GETFL);
      fcntl(ch->ch.fd, F_SETFL, fl | O_NONBLOCK);
      channel_wait(ch);
      fcntl(ch->ch.fd, F_SETFL, fl);
    }
  }
}

ibv_pd* device_pd(Device* d) {
  if (!d->pd) d->pd = ibv_alloc_pd(d->ctx);
  return d->pd;
}

namespace {

// MELON_CM_DEBUG=1: each failing call says where it failed (stderr).
#define fail(e) fail_at(e, __func__, __LINE__)
int fail_at(int e, const char* fn, int line) {
  static const bool debug = std::getenv("MELON_CM_DEBUG") != nullptr;
  if (debug) fprintf(stderr, "librdmacm: %s:%d: %s\n", fn, line, strerror(e));
  errno = e;
  return -1;
}

bool valid_id(rdma_cm_id* cid) {
  if (!cid) return false;
  for (Id* i : lib().ids)
    if (i->cm_id() == cid) return true;
  return false;
}

socklen_t addr_len(const sockaddr* sa) {
  return sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sa->sa_family == AF_INET ? sizeof(sockaddr_in) : 0;
}

void set_port(sockaddr* sa, uint16_t port) {
  if (sa->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(sa)->sin_port = htons(port);
  if (sa->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = htons(port);
}

uint16_t get_port(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

bool addr_is_any(const sockaddr* sa) {
  static const uint8_t zero[16] = {};
  if (sa->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr == 0;
  return !std::memcmp(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, zero, 16);
}

void gid_of(const sockaddr* sa, ibv_gid* gid) {
  std::memset(gid, 0, sizeof *gid);
  if (sa->sa_family == AF_INET) {
    gid->raw[10] = gid->raw[11] = 0xff;
    std::memcpy(gid->raw + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else {
    std::memcpy(gid->raw, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
  }
}

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  return sa->sa_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
}

// The device and RoCEv2 GID index that own IP address `sa` (IPv4 as its IPv4-mapped GID).
Device* device_for(const sockaddr* sa, uint8_t* gid_index) {
  ibv_gid want;
  gid_of(sa, &want);
  for (auto& d : lib().devices) {
    for (int i = 0; i < d->port.gid_tbl_len; ++i) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(d->ctx, 1, uint32_t(i), &e, 0)) continue;
      if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
      if (!std::memcmp(e.gid.raw, want.raw, 16)) {
        *gid_index = uint8_t(i);
        return d.get();
      }
    }
  }
  return nullptr;
}

// The local address the kernel would send from to reach `dst` (a connected UDP socket's name).
int source_for(const sockaddr* dst, sockaddr_storage* src) {
  int fd = socket(dst->sa_family, SOCK_DGRAM, 0);  // closed below, before any exec could matter
  if (fd < 0) return errno;
  sockaddr_storage d{};
  std::memcpy(&d, dst, addr_len(dst));
  if (get_port(dst) == 0) set_port(reinterpret_cast<sockaddr*>(&d), 4791);
  int e = 0;
  socklen_t len = sizeof *src;
  if (connect(fd, reinterpret_cast<sockaddr*>(&d), addr_len(dst)) ||
      getsockname(fd, reinterpret_cast<sockaddr*>(src), &len))
    e = errno;
  close(fd);
  return e;
}

uint16_t ephemeral_port() { return uint16_t(32768 + random32() % (61000 - 32768)); }

// Binds the id to `sa` (a local address or the wildcard); port 0 draws one. A loopback address is
// the wildcard to rdma_bind_addr, as in Linux's rdma_cm (cma_any_addr): no device, and a listener
// there hears requests to every device's addresses. libfabric's verbs provider relies on it: its
// passive fi_getinfo binds "localhost" and, finding no device, offers the "any" domain. Only
// address resolution (`loopback_device`) puts a loopback source on the first device.
int bind_to(Id* id, const sockaddr* sa, bool loopback_device = false) {
  const socklen_t len = addr_len(sa);
  if (!len) return EAFNOSUPPORT;
  sockaddr_storage a{};
  std::memcpy(&a, sa, len);
  if (!get_port(sa)) set_port(reinterpret_cast<sockaddr*>(&a), ephemeral_port());
  if (!addr_is_any(sa) && (loopback_device || !is_loopback(sa))) {
    uint8_t gi = 0;
    Device* d = device_for(sa, &gi);
    if (!d && is_loopback(sa) && !lib().devices.empty()) d = lib().devices.front().get();
    if (!d) return EADDRNOTAVAIL;
    id->dev = d;
    id->gid_index = gi;
    id->id.verbs = d->ctx;
    id->id.pd = device_pd(d);
    id->id.port_num = 1;
  }
  std::memcpy(&id->id.route.addr.src_storage, &a, len);
  id->bound = true;
  return 0;
}

// Waits for the next event of a synchronous id (the lock released meanwhile) and checks its type.
int wait_sync(Id* id, std::unique_lock<std::mutex>& g, rdma_cm_event_type want, rdma_cm_event** out = nullptr) {
  Channel* ch = id->chan;
  g.unlock();
  const int r = channel_wait(ch);
  g.lock();
  if (r) return r;
  Event* e = take_event(ch);
  if (!e) return EIO;
  const bool ok = e->ev.event == want && e->ev.status == 0;
  const int status = e->ev.status;
  const rdma_cm_event_type type = e->ev.event;
  if (out && ok) {
    *out = &e->ev;
    return 0;
  }
  release_event(e);
  if (ok) return 0;
  if (type == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  if (type == RDMA_CM_EVENT_UNREACHABLE) return ETIMEDOUT;
  return status < 0 ? -status : (status ? status : EIO);
}

rdma_conn_param defaults(const Device* d) {
  rdma_conn_param p{};
  p.responder_resources = RDMA_MAX_RESP_RES;
  p.initiator_depth = RDMA_MAX_INIT_DEPTH;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

uint8_t clamp(uint8_t want, int cap) { return want > cap ? uint8_t(cap) : want; }

}  // namespace

// ---- QP transitions ---------------------------------------------------------------------------------

int fill_qp_attr(Id* id, ibv_qp_attr* a, int* mask) {
  const ibv_qp_state want = a->qp_state;
  std::memset(a, 0, sizeof *a);
  a->qp_state = want;
  const bool ud = id->id.qp_type == IBV_QPT_UD;
  switch (want) {
    case IBV_QPS_INIT:
      a->pkey_index = 0;
      a->port_num = 1;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        a->qkey = id->qkey;
        *mask |= IBV_QP_QKEY;
      } else {
        a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                             (id->id.qp_type == IBV_QPT_RC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      if (ud) {
        *mask = IBV_QP_STATE;
        return 0;
      }
      if (!id->remote_qpn) return EINVAL;
      a->path_mtu = ibv_mtu(id->path_mtu);
      a->dest_qp_num = id->remote_qpn;
      // IBA 12.7.30: the Starting PSN a side puts in its REQ/REP is the PSN it expects to receive
      // (the peer's first send PSN), as the rping capture shows: the client SENDs from the REP's
      // PSN, the server READs from the REQ's.
      a->rq_psn = id->local_psn;
      a->ah_attr.is_global = 1;
      a->ah_attr.port_num = 1;
      a->ah_attr.grh.dgid = id->path.dgid;
      a->ah_attr.grh.sgid_index = id->gid_index;
      a->ah_attr.grh.hop_limit = 64;
      a->ah_attr.grh.traffic_class = id->tos;
      a->ah_attr.grh.flow_label = ntohl(id->path.flow_label) & 0xfffff;
      *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (id->id.qp_type == IBV_QPT_RC) {
        a->max_dest_rd_atomic = id->responder_resources;
        a->min_rnr_timer = 12;  // 0.64 ms, rdma_cm's default
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      a->sq_psn = ud ? 0 : id->remote_psn;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (id->id.qp_type == IBV_QPT_RC) {
        a->timeout = id->ack_timeout ? id->ack_timeout : kAckTimeout;
        a->retry_cnt = id->retry_count;
        a->rnr_retry = id->rnr_retry_count;
        a->max_rd_atomic = id->initiator_depth;
        *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default: return EINVAL;
  }
}

static int modify_to(Id* id, ibv_qp_state s) {
  ibv_qp_attr a{};
  a.qp_state = s;
  int mask = 0;
  if (int e = fill_qp_attr(id, &a, &mask)) return e;
  return ibv_modify_qp(id->id.qp, &a, mask);
}

int qp_to_rtr_rts(Id* id) {
  if (int e = modify_to(id, IBV_QPS_RTR)) return e;
  return modify_to(id, IBV_QPS_RTS);
}

void qp_to_error(Id* id) {
  if (!id->id.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(id->id.qp, &a, IBV_QP_STATE);
}

}  // namespace melon::rdmacm

using namespace melon::rdmacm;
namespace cm = melon::cm;

// ---- event channels ----------------------------------------------------------------------------------

MELON_CM_EXPORT struct rdma_event_channel* rdma_create_event_channel(void) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (int e = ensure_init()) {
    errno = e;
    return nullptr;
  }
  Channel* ch = make_channel(false);
  return ch ? &ch->ch : nullptr;
}

MELON_CM_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel* channel) {
  if (!channel) return;
  std::lock_guard<std::mutex> g(lib().mu);
  Channel* ch = reinterpret_cast<Channel*>(channel);
  ch->closed = true;
  if (ch->users > 0) {
    for (Event* e : ch->queue) delete e;  // never to be reported
    ch->queue.clear();
    return;
  }
  free_channel(ch);
}

MELON_CM_EXPORT int rdma_get_cm_event(struct rdma_event_channel* channel, struct rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  Channel* ch = reinterpret_cast<Channel*>(channel);
  for (;;) {
    // Blocks unless the application made the fd non-blocking. A count whose event was purged
    // (its id destroyed meanwhile) is passed over.
    if (int r = channel_wait(ch)) return fail(r);
    std::lock_guard<std::mutex> g(lib().mu);
    if (Event* e = take_event(ch)) {
      *event = &e->ev;
      return 0;
    }
  }
}

MELON_CM_EXPORT int rdma_ack_cm_event(struct rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  std::lock_guard<std::mutex> g(lib().mu);
  release_event(reinterpret_cast<Event*>(event));
  return 0;
}

MELON_CM_EXPORT const char* rdma_event_str(enum rdma_cm_event_type event) {
  static const char* const names[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",  "RDMA_CM_EVENT_ADDR_ERROR",      "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",    "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",  "RDMA_CM_EVENT_UNREACHABLE",     "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",    "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  const unsigned i = unsigned(event);
  return i < sizeof names / sizeof names[0] ? names[i] : "UNKNOWN EVENT";
}

// ---- ids ---------------------------------------------------------------------------------------------

namespace {
int create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps, ibv_qp_type qpt) {
  if (!out) return fail(EINVAL);
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_UDP:
    case RDMA_PS_IB:
    case RDMA_PS_IPOIB: break;
    default: return fail(EINVAL);
  }
  std::lock_guard<std::mutex> g(lib().mu);
  if (int e = ensure_init()) return fail(e);
  Channel* ch = channel ? reinterpret_cast<Channel*>(channel) : make_channel(true);
  if (!ch) return fail(errno);
  Id* i = new_id(ch, context, ps, qpt);
  if (!channel) i->id.channel = nullptr;  // synchronous: the application sees no channel
  *out = i->cm_id();
  return 0;
}
}  // namespace

// The request rdma_get_request kept for a synchronous id, released by accept/reject/destroy.
void drop_request_event(Id* id) {
  if (!id->id.event) return;
  release_event(reinterpret_cast<Event*>(id->id.event));
  id->id.event = nullptr;
}

MELON_CM_EXPORT int rdma_create_id(struct rdma_event_channel* channel, struct rdma_cm_id** id, void* context,
                                   enum rdma_port_space ps) {
  const ibv_qp_type qpt = (ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB) ? IBV_QPT_UD : IBV_QPT_RC;
  return create_id(channel, id, context, ps, qpt);
}

MELON_CM_EXPORT int rdma_destroy_id(struct rdma_cm_id* cid) {
  Lib& L = lib();
  std::unique_lock<std::mutex> g(L.mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  id->destroying = true;
  // rdma-core: wait until every event reported for this id has been acknowledged; those not yet
  // reported are dropped (a request still queued on the listener's channel too).
  drop_request_event(id);
  purge_events(id->chan, id);
  if (id->listener) purge_events(id->listener->chan, id);
  L.acked.wait(g, [&] { return id->unacked <= 0; });
  if (id->dev && id->dev->mad) cm_teardown(id);
  for (Id* other : L.ids)
    if (other->listener == id) other->listener = nullptr;
  free_id(id);
  return 0;
}

MELON_CM_EXPORT int rdma_migrate_id(struct rdma_cm_id* cid, struct rdma_event_channel* channel) {
  Lib& L = lib();
  std::unique_lock<std::mutex> g(L.mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  L.acked.wait(g, [&] { return id->unacked <= 0; });
  Channel* old = id->chan;
  Channel* ch = channel ? reinterpret_cast<Channel*>(channel) : make_channel(true);
  if (!ch) return fail(errno);
  id->chan = ch;
  ch->users++;
  id->id.channel = channel;
  channel_put(old);
  return 0;
}

MELON_CM_EXPORT int rdma_set_option(struct rdma_cm_id* cid, int level, int optname, void* optval, size_t optlen) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid) || !optval) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->tos = *static_cast<uint8_t*>(optval);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (optlen != sizeof(int)) return fail(EINVAL);
        id->reuseaddr = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (optlen != sizeof(int)) return fail(EINVAL);
        id->afonly = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->ack_timeout = *static_cast<uint8_t*>(optval) & 0x1f;
        return 0;
      default: return fail(ENOSYS);
    }
  }
  return fail(ENOSYS);  // RDMA_OPTION_IB_PATH: no subnet administrator paths on RoCE (docs/rdmacm.md)
}

// ---- addresses and routes ----------------------------------------------------------------------------

MELON_CM_EXPORT int rdma_bind_addr(struct rdma_cm_id* cid, struct sockaddr* addr) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid) || !addr) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (id->bound) return fail(EINVAL);
  if (int e = bind_to(id, addr)) {
    if (std::getenv("MELON_CM_DEBUG")) {
      char text[INET6_ADDRSTRLEN] = "?";
      const void* a = addr->sa_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(addr)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(addr)->sin_addr);
      inet_ntop(addr->sa_family, a, text, sizeof text);
      fprintf(stderr, "librdmacm: bind to %s (family %d): no device has it\n", text, addr->sa_family);
    }
    return fail(e);
  }
  return 0;
}

MELON_CM_EXPORT int rdma_resolve_addr(struct rdma_cm_id* cid, struct sockaddr* src_addr, struct sockaddr* dst_addr,
                                      int timeout_ms) {
  std::unique_lock<std::mutex> g(lib().mu);
  if (!valid_id(cid) || !dst_addr || !addr_len(dst_addr)) return fail(EINVAL);
  Id* id = Id::from(cid);
  int err = 0;
  if (!id->bound || !id->dev) {
    sockaddr_storage src{};
    if (src_addr && addr_len(src_addr) && !addr_is_any(src_addr)) {
      std::memcpy(&src, src_addr, addr_len(src_addr));
    } else if ((err = source_for(dst_addr, &src)) == 0) {
      set_port(reinterpret_cast<sockaddr*>(&src), id->bound ? get_port(&id->id.route.addr.src_addr) : 0);
    }
    if (!err) {
      id->bound = false;
      err = bind_to(id, reinterpret_cast<sockaddr*>(&src), true);
    }
  }
  if (!err) {
    std::memcpy(&id->id.route.addr.dst_storage, dst_addr, addr_len(dst_addr));
    rdma_ib_addr& ib = id->id.route.addr.addr.ibaddr;
    ibv_query_gid(id->dev->ctx, 1, id->gid_index, &ib.sgid);
    gid_of(dst_addr, &ib.dgid);
    ib.pkey = htons(0xffff);
    id->state = IdState::addr_resolved;
  }
  queue_event(id, err ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED, -err);
  if (id->chan->sync) {
    if (int e = wait_sync(id, g, RDMA_CM_EVENT_ADDR_RESOLVED)) return fail(e);
  }
  return 0;
}

MELON_CM_EXPORT int rdma_resolve_route(struct rdma_cm_id* cid, int timeout_ms) {
  std::unique_lock<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (id->state != IdState::addr_resolved || !id->dev) return fail(EINVAL);
  // RoCE has no subnet administrator: the path is the two GIDs, the MTU the port and the interface
  // both carry (route_mtu.cpp) and our defaults
  // (the neighbour's MAC is the provider's business when it builds the AV: docs/rdmacm.md).
  ibv_sa_path_rec& p = id->path;
  p = {};
  p.sgid = id->id.route.addr.addr.ibaddr.sgid;
  p.dgid = id->id.route.addr.addr.ibaddr.dgid;
  p.pkey = htons(0xffff);
  p.hop_limit = 64;
  p.traffic_class = id->tos;
  p.reversible = 1;
  p.numb_path = 1;
  p.mtu_selector = 2;
  p.mtu = route_mtu(id->dev, &id->id.route.addr.src_addr);
  p.rate_selector = 2;
  p.packet_life_time_selector = 2;
  p.packet_life_time = 18;
  p.flow_label = htonl(random32() & 0xfffff);
  id->path_mtu = p.mtu;
  id->id.route.path_rec = &id->path;
  id->id.route.num_paths = 1;
  id->state = IdState::route_resolved;
  queue_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  if (id->chan->sync) {
    if (int e = wait_sync(id, g, RDMA_CM_EVENT_ROUTE_RESOLVED)) return fail(e);
  }
  return 0;
}

MELON_CM_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id* cid) {
  if (!cid) return 0;
  const sockaddr* sa = &cid->route.addr.src_addr;
  return sa->sa_family == AF_INET6  ? cid->route.addr.src_sin6.sin6_port
         : sa->sa_family == AF_INET ? cid->route.addr.src_sin.sin_port
                                    : 0;
}

MELON_CM_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id* cid) {
  if (!cid) return 0;
  const sockaddr* sa = &cid->route.addr.dst_addr;
  return sa->sa_family == AF_INET6  ? cid->route.addr.dst_sin6.sin6_port
         : sa->sa_family == AF_INET ? cid->route.addr.dst_sin.sin_port
                                    : 0;
}

MELON_CM_EXPORT struct ibv_context** rdma_get_devices(int* num_devices) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (int e = ensure_init()) {
    errno = e;
    if (num_devices) *num_devices = 0;
    return nullptr;
  }
  auto& devs = lib().devices;
  auto** list = static_cast<ibv_context**>(calloc(devs.size() + 1, sizeof(ibv_context*)));
  if (!list) return nullptr;
  for (size_t k = 0; k < devs.size(); ++k) list[k] = devs[k]->ctx;
  if (num_devices) *num_devices = int(devs.size());
  return list;
}

MELON_CM_EXPORT void rdma_free_devices(struct ibv_context** list) { free(list); }

// ---- the id's QP -------------------------------------------------------------------------------------

namespace {
int create_qp_locked(Id* id, ibv_qp_init_attr_ex* attr) {
  if (!id->dev) return EINVAL;
  Device* d = id->dev;
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    if (!(attr->pd = device_pd(d))) return errno;
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (attr->pd->context != d->ctx) return EINVAL;
  // rdma-core's librdmacm: CQs the application did not give are made for the id, each with a
  // completion channel (rdma_get_send_comp / rdma_get_recv_comp wait on them).
  if (!attr->send_cq) {
    if (!(id->own_send_ch = ibv_create_comp_channel(d->ctx))) return errno;
    int n = int(attr->cap.max_send_wr ? attr->cap.max_send_wr : 1);
    if (!(id->own_send_cq = ibv_create_cq(d->ctx, n, id->cm_id(), id->own_send_ch, 0))) return errno;
    attr->send_cq = id->own_send_cq;
  }
  if (!attr->recv_cq) {
    if (!(id->own_recv_ch = ibv_create_comp_channel(d->ctx))) return errno;
    int n = int(attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1);
    if (!(id->own_recv_cq = ibv_create_cq(d->ctx, n, id->cm_id(), id->own_recv_ch, 0))) return errno;
    attr->recv_cq = id->own_recv_cq;
  }
  // The id's port space decides UD; an unset type (rdma_create_ep's callers leave it 0) is the id's.
  if (id->id.qp_type == IBV_QPT_UD || attr->qp_type == 0) attr->qp_type = id->id.qp_type;
  ibv_qp* qp = ibv_create_qp_ex(d->ctx, attr);
  if (!qp) return errno;
  id->id.qp = qp;
  id->id.qp_type = attr->qp_type;
  id->local_qpn = qp->qp_num;
  int err = modify_to(id, IBV_QPS_INIT);
  if (!err && attr->qp_type == IBV_QPT_UD) err = qp_to_rtr_rts(id);  // UD is ready at once (rdma-core)
  if (err) {
    ibv_destroy_qp(qp);
    id->id.qp = nullptr;
    return err;
  }
  if (!id->id.pd) id->id.pd = attr->pd;
  id->id.send_cq = attr->send_cq;
  id->id.recv_cq = attr->recv_cq;
  id->id.send_cq_channel = attr->send_cq == id->own_send_cq ? id->own_send_ch : attr->send_cq->channel;
  id->id.recv_cq_channel = attr->recv_cq == id->own_recv_cq ? id->own_recv_ch : attr->recv_cq->channel;
  id->id.srq = attr->srq;
  return 0;
}

void release_own_cqs(Id* id) {
  if (id->own_send_cq) ibv_destroy_cq(id->own_send_cq);
  if (id->own_recv_cq) ibv_destroy_cq(id->own_recv_cq);
  if (id->own_send_ch) ibv_destroy_comp_channel(id->own_send_ch);
  if (id->own_recv_ch) ibv_destroy_comp_channel(id->own_recv_ch);
  id->own_send_cq = id->own_recv_cq = nullptr;
  id->own_send_ch = id->own_recv_ch = nullptr;
}
}  // namespace

MELON_CM_EXPORT int rdma_create_qp_ex(struct rdma_cm_id* cid, struct ibv_qp_init_attr_ex* attr) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid) || !attr) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (id->id.qp) return fail(EINVAL);
  if (int e = create_qp_locked(id, attr)) {
    release_own_cqs(id);
    return fail(e);
  }
  return 0;
}

MELON_CM_EXPORT int rdma_create_qp(struct rdma_cm_id* cid, struct ibv_pd* pd, struct ibv_qp_init_attr* qp_init_attr) {
  if (!qp_init_attr) return fail(EINVAL);
  ibv_qp_init_attr_ex a{};
  std::memcpy(&a, qp_init_attr, sizeof *qp_init_attr);
  a.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
  a.pd = pd;
  if (int r = rdma_create_qp_ex(cid, &a)) return r;
  qp_init_attr->cap = a.cap;
  qp_init_attr->send_cq = a.send_cq;
  qp_init_attr->recv_cq = a.recv_cq;
  return 0;
}

MELON_CM_EXPORT void rdma_destroy_qp(struct rdma_cm_id* cid) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return;
  Id* id = Id::from(cid);
  if (id->id.qp) ibv_destroy_qp(id->id.qp);
  id->id.qp = nullptr;
  release_own_cqs(id);
}

MELON_CM_EXPORT int rdma_init_qp_attr(struct rdma_cm_id* cid, struct ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid) || !qp_attr || !qp_attr_mask) return fail(EINVAL);
  if (int e = fill_qp_attr(Id::from(cid), qp_attr, qp_attr_mask)) return fail(e);
  return 0;
}

// ---- connections -------------------------------------------------------------------------------------

MELON_CM_EXPORT int rdma_listen(struct rdma_cm_id* cid, int backlog) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (!id->bound) {  // rdma-core binds an unbound listener to the wildcard address
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (int e = bind_to(id, reinterpret_cast<sockaddr*>(&any))) return fail(e);
  }
  if (id->dev) {
    if (int e = open_mad_port(id->dev)) return fail(e);
  } else {
    int opened = 0, err = ENODEV;
    for (auto& d : lib().devices) {
      int e = open_mad_port(d.get());
      if (e)
        err = e;
      else
        ++opened;
    }
    if (!opened) return fail(err);
  }
  id->backlog = backlog;
  id->state = IdState::listen;
  return 0;
}

MELON_CM_EXPORT int rdma_connect(struct rdma_cm_id* cid, struct rdma_conn_param* conn_param) {
  std::unique_lock<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (id->state != IdState::route_resolved || !id->dev) return fail(EINVAL);
  if (int e = open_mad_port(id->dev)) return fail(e);
  rdma_conn_param p = conn_param ? *conn_param : defaults(id->dev);
  id->peer = MadAddress{};  // the peer's QP1, along the resolved path
  id->peer.peer_gid = id->path.dgid;
  id->peer.sgid_index = id->gid_index;
  id->peer.traffic_class = id->tos;
  int err;
  if (id->id.qp_type == IBV_QPT_UD) {
    err = cm_send_sidr_req(id, p);
  } else {
    id->local_qpn = id->id.qp ? id->id.qp->qp_num : p.qp_num;
    if (!id->local_qpn) return fail(EINVAL);
    id->local_psn = random32() & 0xffffff;
    id->responder_resources = clamp(p.responder_resources, id->dev->attr.max_qp_rd_atom);
    id->initiator_depth = clamp(p.initiator_depth, id->dev->attr.max_qp_init_rd_atom);
    if (id->id.qp && id->id.srq) p.srq = 1;
    err = cm_send_req(id, p);
  }
  if (err) return fail(err);
  id->state = IdState::connecting;
  if (id->chan->sync) {
    if (int e = wait_sync(id, g, RDMA_CM_EVENT_ESTABLISHED)) return fail(e);
  }
  return 0;
}

MELON_CM_EXPORT int rdma_establish(struct rdma_cm_id* cid) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (id->cm != CmState::rep_rcvd) return fail(EINVAL);
  if (id->id.qp) {
    if (int e = qp_to_rtr_rts(id)) return fail(e);
  }
  if (int e = cm_send_rtu(id)) return fail(e);
  return 0;
}

MELON_CM_EXPORT int rdma_get_request(struct rdma_cm_id* listen, struct rdma_cm_id** out) {
  std::unique_lock<std::mutex> g(lib().mu);
  if (!valid_id(listen) || !out) return fail(EINVAL);
  Id* l = Id::from(listen);
  if (!l->chan->sync || l->state != IdState::listen) return fail(EINVAL);
  rdma_cm_event* ev = nullptr;
  if (int e = wait_sync(l, g, RDMA_CM_EVENT_CONNECT_REQUEST, &ev)) return fail(e);
  Id* c = Id::from(ev->id);
  c->id.event = ev;  // kept until rdma_accept / rdma_reject, as rdma-core does
  // The passive endpoint of rdma_create_ep: the child gets the QP its attributes describe.
  if (l->has_qp_init) {
    ibv_qp_init_attr_ex a{};
    std::memcpy(&a, &l->qp_init, sizeof l->qp_init);
    a.comp_mask = l->ep_pd ? IBV_QP_INIT_ATTR_PD : 0;
    a.pd = l->ep_pd;
    if (l->ep_pd) c->id.pd = l->ep_pd;
    if (int e = create_qp_locked(c, &a)) {
      release_own_cqs(c);
      return fail(e);
    }
  }
  *out = c->cm_id();
  return 0;
}

MELON_CM_EXPORT int rdma_accept(struct rdma_cm_id* cid, struct rdma_conn_param* conn_param) {
  std::unique_lock<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  drop_request_event(id);
  if (id->cm == CmState::sidr_req_rcvd) {
    const uint32_t qpn = id->id.qp ? id->id.qp->qp_num : (conn_param ? conn_param->qp_num : 0);
    const void* pd = conn_param ? conn_param->private_data : nullptr;
    const size_t plen = conn_param ? conn_param->private_data_len : 0;
    if (int e = cm_send_sidr_rep(id, cm::kSidrOk, qpn, id->qkey, pd, plen)) return fail(e);
    id->state = IdState::connected;
    return 0;
  }
  if (id->cm != CmState::req_rcvd) return fail(EINVAL);
  rdma_conn_param p = conn_param ? *conn_param : defaults(id->dev);
  // RDMA_MAX_*: what the request offered, within the device's limits (rdma-core's librdmacm).
  uint8_t rr = p.responder_resources == RDMA_MAX_RESP_RES ? id->peer_initiator_depth : p.responder_resources;
  uint8_t id_ = p.initiator_depth == RDMA_MAX_INIT_DEPTH ? id->peer_responder_resources : p.initiator_depth;
  id->responder_resources = clamp(rr, id->dev->attr.max_qp_rd_atom);
  id->initiator_depth = clamp(id_, id->dev->attr.max_qp_init_rd_atom);
  id->rnr_retry_count = p.rnr_retry_count & 7;
  id->local_qpn = id->id.qp ? id->id.qp->qp_num : p.qp_num;
  if (!id->local_qpn) return fail(EINVAL);
  id->local_psn = random32() & 0xffffff;
  if (id->id.qp) {
    if (int e = qp_to_rtr_rts(id)) {
      cm_send_rej(id, cm::kRejNoQp, nullptr, 0);
      return fail(e);
    }
  }
  if (id->id.qp && id->id.srq) p.srq = 1;
  if (int e = cm_send_rep(id, p)) return fail(e);
  if (id->chan->sync) {
    if (int e = wait_sync(id, g, RDMA_CM_EVENT_ESTABLISHED)) return fail(e);
  }
  return 0;
}

MELON_CM_EXPORT int rdma_reject(struct rdma_cm_id* cid, const void* private_data, uint8_t private_data_len) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  drop_request_event(id);
  int e = EINVAL;
  if (id->cm == CmState::sidr_req_rcvd)
    e = cm_send_sidr_rep(id, cm::kSidrReject, 0, 0, private_data, private_data_len);
  else if (id->cm == CmState::req_rcvd)
    e = cm_send_rej(id, cm::kRejConsumer, private_data, private_data_len);
  return e ? fail(e) : 0;
}

MELON_CM_EXPORT int rdma_reject_ece(struct rdma_cm_id* cid, const void* private_data, uint8_t private_data_len) {
  return rdma_reject(cid, private_data, private_data_len);
}

MELON_CM_EXPORT int rdma_notify(struct rdma_cm_id* cid, enum ibv_event_type event) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  // IBA 12.9.6: traffic on the QP before the RTU is as good as the RTU (the COMM_EST async event).
  if (event == IBV_EVENT_COMM_EST && id->cm == CmState::rep_sent) {
    id->deadline_ns = 0;
    id->has_last = false;
    id->cm = CmState::established;
    id->state = IdState::connected;
    queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
  }
  return 0;
}

MELON_CM_EXPORT int rdma_disconnect(struct rdma_cm_id* cid) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid)) return fail(EINVAL);
  Id* id = Id::from(cid);
  qp_to_error(id);  // rdma-core: flush the QP first, so its work completes in error
  switch (id->cm) {
    case CmState::established:
      if (int e = cm_send_dreq(id)) return fail(e);
      return 0;
    case CmState::rep_sent:
    case CmState::req_sent:
    case CmState::mra_rcvd: cm_send_rej(id, cm::kRejConsumer, nullptr, 0); return 0;
    case CmState::dreq_sent:
    case CmState::timewait: return 0;  // already going (or the peer's DREQ was answered)
    default: return id->state == IdState::connected || id->state == IdState::disconnected ? 0 : fail(EINVAL);
  }
}

MELON_CM_EXPORT int rdma_set_local_ece(struct rdma_cm_id* cid, struct ibv_ece* ece) {
  return fail(ENOSYS);  // enhanced connection establishment: no vendor options to negotiate
}

MELON_CM_EXPORT int rdma_get_remote_ece(struct rdma_cm_id* cid, struct ibv_ece* ece) { return fail(ENOSYS); }

// ---- the sync endpoint helpers (rdma_create_ep) --------------------------------------------------------

MELON_CM_EXPORT int rdma_create_ep(struct rdma_cm_id** out, struct rdma_addrinfo* res, struct ibv_pd* pd,
                                   struct ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  rdma_cm_id* cid = nullptr;
  const ibv_qp_type qpt = res->ai_qp_type ? ibv_qp_type(res->ai_qp_type) : IBV_QPT_RC;
  rdma_port_space ps =
      res->ai_port_space ? rdma_port_space(res->ai_port_space) : (qpt == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP);
  if (create_id(nullptr, &cid, nullptr, ps, qpt)) return -1;
  int r;
  if (res->ai_flags & RAI_PASSIVE) {
    r = res->ai_src_addr ? rdma_bind_addr(cid, res->ai_src_addr) : 0;
    if (!r && qp_init_attr) {
      std::lock_guard<std::mutex> g(lib().mu);
      Id* id = Id::from(cid);
      id->has_qp_init = true;
      id->qp_init = *qp_init_attr;
      id->ep_pd = pd;
      id->id.pd = pd;
    }
  } else {
    r = rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (!r) r = rdma_resolve_route(cid, 2000);
    if (!r && qp_init_attr) r = rdma_create_qp(cid, pd, qp_init_attr);
    if (!r && pd) cid->pd = pd;
  }
  if (r) {
    const int e = errno;
    rdma_destroy_id(cid);
    return fail(e);
  }
  *out = cid;
  return 0;
}

MELON_CM_EXPORT void rdma_destroy_ep(struct rdma_cm_id* cid) {
  if (!cid) return;
  rdma_destroy_qp(cid);
  rdma_destroy_id(cid);
}

// ---- shared receive queues for an id --------------------------------------------------------------------

MELON_CM_EXPORT int rdma_create_srq_ex(struct rdma_cm_id* cid, struct ibv_srq_init_attr_ex* attr) {
  std::lock_guard<std::mutex> g(lib().mu);
  if (!valid_id(cid) || !attr || !cid->verbs) return fail(EINVAL);
  Id* id = Id::from(cid);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    if (!device_pd(id->dev)) return fail(errno);
    attr->pd = id->id.pd ? id->id.pd : id->dev->pd;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  ibv_srq* srq = ibv_create_srq_ex(cid->verbs, attr);
  if (!srq) return fail(errno);
  cid->srq = srq;
  if (!cid->pd) cid->pd = attr->pd;
  return 0;
}

MELON_CM_EXPORT int rdma_create_srq(struct rdma_cm_id* cid, struct ibv_pd* pd, struct ibv_srq_init_attr* attr) {
  if (!attr) return fail(EINVAL);
  ibv_srq_init_attr_ex a{};
  a.srq_context = attr->srq_context;
  a.attr = attr->attr;
  a.srq_type = IBV_SRQT_BASIC;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | (pd ? IBV_SRQ_INIT_ATTR_PD : 0);
  a.pd = pd;
  if (int r = rdma_create_srq_ex(cid, &a)) return r;
  attr->attr = a.attr;
  return 0;
}

MELON_CM_EXPORT void rdma_destroy_srq(struct rdma_cm_id* cid) {
  if (!cid || !cid->srq) return;
  ibv_destroy_srq(cid->srq);
  cid->srq = nullptr;
}
