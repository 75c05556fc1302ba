// Provider registry, device list, device open/close, the verbs_context set-up, and the two event
// queues every context has: the asynchronous event fd and the completion channels.
#include "verbs/abi_layout.h"
#include "verbs/internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace melon::verbs {

// ---- registry -------------------------------------------------------------------------------------

namespace {

struct Registry {
  std::mutex mu;
  std::vector<Provider*> providers;
  std::vector<std::unique_ptr<Device>> devices;  // every device ever listed; never shrinks
};

Registry& registry() {
  static Registry* r = new Registry;  // intentionally leaked: devices outlive static destructors
  return *r;
}

void fill_ibdev(Device* d) {
  ibv_device& ib = d->ibdev;
  std::memset(&ib, 0, sizeof(ib));
  ib.node_type = IBV_NODE_CA;
  ib.transport_type = IBV_TRANSPORT_IB;  // what RoCE devices report (rxe and mlx5 alike)
  std::snprintf(ib.name, sizeof(ib.name), "%s", d->name());
  std::snprintf(ib.dev_name, sizeof(ib.dev_name), "uverbs%d", d->index);
  std::snprintf(ib.dev_path, sizeof(ib.dev_path), "%s/class/infiniband_verbs/uverbs%d", kSysfsRoot, d->index);
  std::snprintf(ib.ibdev_path, sizeof(ib.ibdev_path), "%s/class/infiniband/%s", kSysfsRoot, d->name());
}

// Rediscover, keep devices whose identity is unchanged, return the current ones in order.
std::vector<Device*> current_devices() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<Device*> now;
  for (Provider* p : r.providers) {
    for (auto& fresh : p->discover()) {
      Device* kept = nullptr;
      for (auto& old : r.devices)
        if (old->identity() == fresh->identity()) kept = old.get();
      if (!kept) {
        fresh->index = static_cast<int>(r.devices.size());
        fill_ibdev(fresh.get());
        kept = fresh.get();
        r.devices.push_back(std::move(fresh));
      }
      if (std::find(now.begin(), now.end(), kept) == now.end()) now.push_back(kept);
    }
  }
  return now;
}

}  // namespace

void register_provider(Provider* provider) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.providers.push_back(provider);
}

Device* device_of(ibv_device* dev) {
  if (!dev) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& d : r.devices)
    if (&d->ibdev == dev) return d.get();
  return nullptr;
}

Device* device_by_name(const char* name) {
  current_devices();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& d : r.devices)
    if (std::strcmp(d->name(), name) == 0) return d.get();
  return nullptr;
}

// ---- context set-up -------------------------------------------------------------------------------

namespace {

int stub_poll_cq(ibv_cq*, int, ibv_wc*) { return -EOPNOTSUPP; }
int stub_req_notify_cq(ibv_cq*, int) { return EOPNOTSUPP; }
int stub_post_send(ibv_qp*, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (bad) *bad = wr;
  return EOPNOTSUPP;
}
int stub_post_recv(ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (bad) *bad = wr;
  return EOPNOTSUPP;
}
int stub_post_srq_recv(ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (bad) *bad = wr;
  return EOPNOTSUPP;
}
int stub_bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*) { return EOPNOTSUPP; }
int stub_dealloc_mw(ibv_mw*) { return EOPNOTSUPP; }
int stub_close_xrcd(ibv_xrcd*) { return EOPNOTSUPP; }

int ext_query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t len) {
  if (!ctx || !attr) return EINVAL;
  ibv_port_attr full{};
  int rc = ContextBase::from(ctx)->ops->query_port(port, &full);
  if (rc) return rc;
  // Callers pass 48 (old layout), 52 (v44) or more (newer headers): never write past `len`.
  size_t n = std::min(len, sizeof(full));
  std::memcpy(attr, &full, n);
  if (len > n) std::memset(reinterpret_cast<char*>(attr) + n, 0, len - n);
  return 0;
}

int ext_query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                        size_t attr_size) {
  if (!ctx || !attr || (input && input->comp_mask) || attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  int rc = ContextBase::from(ctx)->ops->query_device_ex(&full);
  if (rc) return rc;
  size_t n = std::min(attr_size, sizeof(full));
  std::memcpy(attr, &full, n);
  if (attr_size > n) std::memset(reinterpret_cast<char*>(attr) + n, 0, attr_size - n);
  return 0;
}

ibv_cq_ex* ext_create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  if (!ctx || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  ContextBase* base = ContextBase::from(ctx);
  if (attr->channel && attr->channel->context != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_cq_ex* cq = no_throw([&] { return base->ops->create_cq(attr); });
  if (cq && attr->channel) {
    std::lock_guard<std::mutex> lock(CompChannel::from(attr->channel)->queue->mu);
    attr->channel->refcnt++;
  }
  return cq;
}

ibv_qp* ext_create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr) {
  if (!ctx || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  return no_throw([&] { return ContextBase::from(ctx)->ops->create_qp(attr); });
}

ibv_srq* ext_create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr) {
  if (!ctx || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  const uint32_t basic = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
  if ((attr->comp_mask & ~basic) || ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC)) {
    errno = EOPNOTSUPP;  // XRC and tag-matching SRQs
    return nullptr;
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    errno = EINVAL;
    return nullptr;
  }
  return no_throw(
      [&] { return ContextBase::from(ctx)->ops->create_srq(attr->pd, reinterpret_cast<ibv_srq_init_attr*>(attr)); });
}

}  // namespace

int init_context(ContextBase* base, ContextOps* ops, Device* dev) {
  verbs_context& v = base->vctx;
  std::memset(&v, 0, sizeof(v));
  base->ops = ops;
  base->device = dev;

  auto* q = new (std::nothrow) AsyncQueue;
  if (!q) return ENOMEM;
  if (int rc = q->open()) {
    delete q;
    return rc;
  }
  base->async = q;

  ibv_context& c = v.context;
  c.device = &dev->ibdev;
  c.cmd_fd = -1;  // set last, by open_command_fd (import.cpp)
  c.async_fd = q->read_fd;
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  v.sz = sizeof(verbs_context);
  // Debugging aid: present a smaller extended context, as an older library would, so the
  // applications' fallback paths (exported ibv_query_port, ibv_query_device) can be exercised.
  if (const char* e = std::getenv("MELON_VERBS_CONTEXT_SZ")) {
    char* end = nullptr;
    unsigned long sz = std::strtoul(e, &end, 10);
    const size_t min_sz = sizeof(ibv_context) + sizeof(size_t);  // context + sz itself
    if (*e && !*end && sz <= sizeof(verbs_context)) v.sz = sz < min_sz ? min_sz : sz;
  }

  // Slots the applications call inline without a NULL check: never leave them empty.
  c.ops.poll_cq = stub_poll_cq;
  c.ops.req_notify_cq = stub_req_notify_cq;
  c.ops.post_send = stub_post_send;
  c.ops.post_recv = stub_post_recv;
  c.ops.post_srq_recv = stub_post_srq_recv;
  c.ops.bind_mw = stub_bind_mw;
  c.ops.dealloc_mw = stub_dealloc_mw;
  // alloc_mw stays NULL: ibv_alloc_mw checks it and reports EOPNOTSUPP.

  v.query_port = ext_query_port;
  v.query_device_ex = ext_query_device_ex;
  v.create_cq_ex = ext_create_cq_ex;
  v.create_qp_ex = ext_create_qp_ex;
  v.create_srq_ex = ext_create_srq_ex;
  v.close_xrcd = stub_close_xrcd;  // ibv_close_xrcd calls it unchecked
  if (int rc = open_command_fd(base)) {
    q->close();
    delete q;
    base->async = nullptr;
    pthread_mutex_destroy(&c.mutex);
    return rc;
  }
  return 0;
}

void init_cq_fields(CqBase* cq, ibv_context* ctx, ibv_comp_channel* channel, void* cq_context, int cqe) {
  ibv_cq_ex& c = cq->ibv;
  c.context = ctx;
  c.channel = channel;
  c.cq_context = cq_context;
  c.cqe = cqe;
  c.comp_events_completed = 0;
  c.async_events_completed = 0;
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
}

namespace {
CqBase* positioned(ibv_cq_ex* cq) { return CqBase::from(ibv_cq_ex_to_cq(cq)); }
}  // namespace

void init_cq_ex_readers(CqBase* cq) {
  ibv_cq_ex& x = cq->ibv;
  x.read_opcode = [](ibv_cq_ex* c) { return positioned(c)->cur.opcode; };
  x.read_vendor_err = [](ibv_cq_ex* c) { return positioned(c)->cur.vendor_err; };
  x.read_byte_len = [](ibv_cq_ex* c) { return positioned(c)->cur.byte_len; };
  x.read_imm_data = [](ibv_cq_ex* c) { return positioned(c)->cur.imm_data; };
  x.read_qp_num = [](ibv_cq_ex* c) { return positioned(c)->cur.qp_num; };
  x.read_src_qp = [](ibv_cq_ex* c) { return positioned(c)->cur.src_qp; };
  x.read_wc_flags = [](ibv_cq_ex* c) { return positioned(c)->cur.wc_flags; };
  x.read_slid = [](ibv_cq_ex* c) { return uint32_t(positioned(c)->cur.slid); };
  x.read_sl = [](ibv_cq_ex* c) { return positioned(c)->cur.sl; };
  x.read_dlid_path_bits = [](ibv_cq_ex* c) { return positioned(c)->cur.dlid_path_bits; };
}

void init_srq_fields(SrqBase* srq, ibv_context* ctx, ibv_pd* pd, void* srq_context) {
  srq->ibv.context = ctx;
  srq->ibv.pd = pd;
  srq->ibv.srq_context = srq_context;
  srq->ibv.events_completed = 0;
  pthread_mutex_init(&srq->ibv.mutex, nullptr);
  pthread_cond_init(&srq->ibv.cond, nullptr);
}

void init_qp_fields(QpBase* qp, ibv_context* ctx, const ibv_qp_init_attr_ex* attr) {
  ibv_qp& q = qp->ibv.qp_base;
  q.context = ctx;
  q.qp_context = attr->qp_context;
  q.pd = attr->pd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.srq = attr->srq;
  q.state = IBV_QPS_RESET;
  q.qp_type = attr->qp_type;
  q.events_completed = 0;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
}

void record_qp_init(QpBase* qp, const ibv_qp_init_attr_ex* attr, const ibv_qp_cap& granted) {
  ibv_qp_init_attr& i = qp->init;
  i.qp_context = attr->qp_context;
  i.send_cq = attr->send_cq;
  i.recv_cq = attr->recv_cq;
  i.srq = attr->srq;
  i.cap = granted;
  i.qp_type = attr->qp_type;
  i.sq_sig_all = attr->sq_sig_all;
}

void destroy_sync_fields(pthread_mutex_t* mutex, pthread_cond_t* cond) {
  pthread_cond_destroy(cond);
  pthread_mutex_destroy(mutex);
}

void post_async_event(ibv_context* ctx, const ibv_async_event& event) { ContextBase::from(ctx)->async->push(event); }

namespace {
// The channel this thread waits on in ibv_get_cq_event (during ContextOps::wait_channel), and the
// first event its own work signalled there. A provider receiving in the waiter's thread would
// otherwise send the channel's byte to itself and read it back: two syscalls on the wake-up path.
struct ChannelWait {
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
};
thread_local ChannelWait tls_wait;
}  // namespace

void signal_comp_channel(ibv_cq* cq) {
  if (!cq->channel) return;
  if (cq->channel == tls_wait.channel && !tls_wait.cq) {
    // This thread returns it from ibv_get_cq_event: no other thread can miss it. It counts as
    // delivered from here, so an ibv_destroy_cq meanwhile (which cannot see the slot) waits for its
    // acknowledgement instead of freeing the CQ under the waiter.
    pthread_mutex_lock(&cq->mutex);
    CqBase::from(cq)->comp_events_delivered++;
    pthread_mutex_unlock(&cq->mutex);
    tls_wait.cq = cq;
    return;
  }
  CompChannel::from(cq->channel)->queue->push(cq);
}

bool channel_event_taken() { return tls_wait.cq != nullptr; }

bool read_restarts_after_signal() {
  sigset_t blocked;
  if (pthread_sigmask(SIG_BLOCK, nullptr, &blocked) != 0) return true;
  for (int s = 1; s < NSIG; s++) {
    // Faults (a crash handler's, ASan's) arrive only from the faulting instruction, never in a wait.
    if (s == SIGSEGV || s == SIGBUS || s == SIGFPE || s == SIGILL || s == SIGTRAP || s == SIGSYS) continue;
    struct sigaction sa;
    if (sigismember(&blocked, s) == 1 || sigaction(s, nullptr, &sa) != 0) continue;
    const bool handler =
        (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
    if (handler && !(sa.sa_flags & SA_RESTART)) return false;
  }
  return true;
}

void retire_async_events(ibv_context* ctx, const void* element) {
  ContextBase::from(ctx)->async->purge([element](const ibv_async_event& e) { return e.element.cq == element; });
}

}  // namespace melon::verbs

using namespace melon::verbs;

// ---- exported: devices ----------------------------------------------------------------------------

MELON_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  std::vector<Device*> devs;
  try {
    devs = current_devices();
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
    return nullptr;
  }
  auto** list = static_cast<ibv_device**>(calloc(devs.size() + 1, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < devs.size(); i++) list[i] = &devs[i]->ibdev;
  if (num_devices) *num_devices = static_cast<int>(devs.size());
  return list;
}

MELON_EXPORT void ibv_free_device_list(ibv_device** list) {
  free(list);  // the devices themselves stay valid (rdma-core keeps them too)
}

MELON_EXPORT const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

MELON_EXPORT int ibv_get_device_index(ibv_device* device) {
  Device* d = device_of(device);
  return d ? d->index : -1;
}

MELON_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  Device* d = device_of(device);
  if (!d) {
    errno = EINVAL;
    return 0;
  }
  return d->node_guid();
}

MELON_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  Device* d = device_of(device);
  if (!d) {
    errno = ENODEV;
    return nullptr;
  }
  ContextBase* base = no_throw([&] { return d->open(); });
  return base ? base->ibv() : nullptr;
}

MELON_EXPORT int ibv_close_device(ibv_context* context) {
  if (!context) return EINVAL;
  ContextBase* base = ContextBase::from(context);
  ContextOps* ops = base->ops;
  AsyncQueue* q = base->async;
  // Closes cmd_fd; an imported context is freed here. The provider context goes with the last
  // context sharing it (import.cpp).
  if (!release_context(base)) return 0;
  ops->close();  // frees the provider's context object
  if (q) {
    q->close();
    delete q;
  }
  return 0;
}

// ---- exported: asynchronous events ----------------------------------------------------------------

namespace {

enum class Element { Cq, Qp, Srq, Wq, Port };

Element element_kind(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR: return Element::Cq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED: return Element::Qp;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: return Element::Srq;
    case IBV_EVENT_WQ_FATAL: return Element::Wq;
    default: return Element::Port;
  }
}

}  // namespace

MELON_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!context || !event) {
    errno = EINVAL;
    return -1;
  }
  ibv_async_event e;
  if (int rc = ContextBase::from(context)->async->pop(&e)) {
    errno = rc;
    return -1;
  }
  switch (element_kind(e.event_type)) {
    case Element::Cq: {
      CqBase* cq = CqBase::from(e.element.cq);
      pthread_mutex_lock(&cq->ibv.mutex);
      cq->async_events_delivered++;
      pthread_mutex_unlock(&cq->ibv.mutex);
      break;
    }
    case Element::Qp: {
      QpBase* qp = QpBase::from(e.element.qp);
      pthread_mutex_lock(&qp->ibv.qp_base.mutex);
      qp->async_events_delivered++;
      pthread_mutex_unlock(&qp->ibv.qp_base.mutex);
      break;
    }
    case Element::Srq: {
      SrqBase* srq = SrqBase::from(e.element.srq);
      pthread_mutex_lock(&srq->ibv.mutex);
      srq->async_events_delivered++;
      pthread_mutex_unlock(&srq->ibv.mutex);
      break;
    }
    default: break;
  }
  *event = e;
  return 0;
}

MELON_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  if (!event) return;
  auto bump = [](pthread_mutex_t* m, pthread_cond_t* c, uint32_t* n) {
    pthread_mutex_lock(m);
    ++*n;
    pthread_cond_broadcast(c);
    pthread_mutex_unlock(m);
  };
  switch (element_kind(event->event_type)) {
    case Element::Cq: {
      ibv_cq* cq = event->element.cq;
      bump(&cq->mutex, &cq->cond, &cq->async_events_completed);
      break;
    }
    case Element::Qp: {
      ibv_qp* qp = event->element.qp;
      bump(&qp->mutex, &qp->cond, &qp->events_completed);
      break;
    }
    case Element::Srq: {
      ibv_srq* srq = event->element.srq;
      bump(&srq->mutex, &srq->cond, &srq->events_completed);
      break;
    }
    case Element::Wq: {
      ibv_wq* wq = event->element.wq;
      bump(&wq->mutex, &wq->cond, &wq->events_completed);
      break;
    }
    case Element::Port: break;
  }
}

// ---- exported: completion channels ----------------------------------------------------------------

MELON_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (!context) {
    errno = EINVAL;
    return nullptr;
  }
  auto* ch = new (std::nothrow) CompChannel{};
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  ch->queue = new (std::nothrow) EventFdQueue<ibv_cq*>;
  if (!ch->queue) {
    delete ch;
    errno = ENOMEM;
    return nullptr;
  }
  if (int rc = ch->queue->open()) {
    delete ch->queue;
    delete ch;
    errno = rc;
    return nullptr;
  }
  ch->ibv.context = context;
  ch->ibv.fd = ch->queue->read_fd;
  ch->ibv.refcnt = 0;
  return &ch->ibv;
}

MELON_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!channel) return EINVAL;
  CompChannel* ch = CompChannel::from(channel);
  {
    std::lock_guard<std::mutex> lock(ch->queue->mu);
    if (channel->refcnt) return EBUSY;  // CQs still attached
  }
  ch->queue->close();
  delete ch->queue;
  delete ch;
  return 0;
}

MELON_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq || !cq_context) {
    errno = EINVAL;
    return -1;
  }
  // The provider may do its receive work in this thread until an event comes (a blocking channel);
  // an event that work signalled on this channel comes back in tls_wait, not through the fd.
  tls_wait = {channel, nullptr};
  const int waited = ContextBase::from(channel->context)->ops->wait_channel(channel->fd);
  ibv_cq* got = tls_wait.cq;  // already counted as delivered (signal_comp_channel)
  tls_wait = {};
  if (!got && waited == EINTR && !read_restarts_after_signal()) {
    errno = EINTR;
    return -1;
  }
  if (!got) {
    if (int rc = CompChannel::from(channel)->queue->pop(&got)) {
      errno = rc;
      return -1;
    }
    pthread_mutex_lock(&got->mutex);
    CqBase::from(got)->comp_events_delivered++;
    pthread_mutex_unlock(&got->mutex);
  }
  *cq = got;
  *cq_context = got->cq_context;
  return 0;
}

MELON_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!cq) return;
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_broadcast(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}
