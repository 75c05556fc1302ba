// Soft provider: completion queues (plain and extended) and shared receive queues.
#include "providers/soft/soft.h"
#include "providers/soft/soft_qp.h"

#include <cerrno>
#include <cstring>

namespace melon::soft {

// ---- completion ring ------------------------------------------------------------------------------

bool SoftCq::push(const ibv_wc& wc, bool solicited) {
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (count == ring.size()) {
      if (ignore_overrun) {
        head = (head + 1) % ring.size();  // drop the oldest
        count--;
      } else {
        bool first = !overrun;
        overrun = true;
        if (first) {
          ibv_async_event ev{};
          ev.element.cq = cq();
          ev.event_type = IBV_EVENT_CQ_ERR;
          verbs::post_async_event(ibv.context, ev);
        }
        return false;
      }
    }
    ring[(head + count) % ring.size()] = wc;
    count++;
    ready.store(count, std::memory_order_release);
    // IBA 11.4.2.2: an armed CQ notifies on the next completion; armed for solicited
    // completions only, on a solicited one or on any error completion.
    if (armed && (!solicited_only || solicited || wc.status != IBV_WC_SUCCESS)) {
      armed = false;
      notify = true;
    }
  }
  if (notify) verbs::signal_comp_channel(cq());
  return true;
}

int SoftCq::poll(int n, ibv_wc* out) {
  if (n < 0 || (n > 0 && !out)) return -EINVAL;
  if (!ready.load(std::memory_order_acquire)) return 0;
  std::lock_guard<std::mutex> lock(mu);
  int got = 0;
  while (got < n && count) {
    out[got++] = ring[head];
    head = (head + 1) % ring.size();
    count--;
  }
  ready.store(count, std::memory_order_relaxed);
  return got;
}

// ---- extended-CQ polling (ibv_start_poll / ibv_next_poll / ibv_wc_read_*) --------------------------

namespace {

SoftCq* cqx(ibv_cq_ex* cq) { return SoftCq::from(ibv_cq_ex_to_cq(cq)); }

// Move to the next completion: it becomes `cur`, and status/wr_id are published in the ibv_cq_ex.
int advance(SoftCq* c) {
  std::lock_guard<std::mutex> lock(c->mu);
  if (!c->count) return ENOENT;
  c->position_on(c->ring[c->head]);
  c->head = (c->head + 1) % c->ring.size();
  c->count--;
  return 0;
}

int start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  SoftCq* c = cqx(cq);
  int r = advance(c);
  // An empty CQ, as in poll_cq: what posts left queued goes out now (the application waits for
  // it), and arrivals are received in this thread; a spin of such polls takes the busy-poll lease.
  // The ring is read again after that whatever was received (poll_cq says why).
  if (r == ENOENT)
    if (Hub* h = c->ctx->hub_if_started()) {
      const uint32_t lanes = c->lanes.load(std::memory_order_relaxed);
      h->each_lane(lanes, [](UdpTransport& l) { l.flush_held(); });
      h->poll_progress(lanes);
      if (c->ready.load(std::memory_order_acquire)) r = advance(c);
    }
  return r;
}
int next_poll(ibv_cq_ex* cq) { return advance(cqx(cq)); }
void end_poll(ibv_cq_ex*) {}

}  // namespace

// ---- CQ verbs -------------------------------------------------------------------------------------

ibv_cq_ex* SoftContext::create_cq(const ibv_cq_init_attr_ex* attr) {
  const uint32_t known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
  const uint32_t known_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  int err = 0;
  if (attr->cqe < 1 || attr->cqe > rc::kMaxCqe ||
      attr->comp_vector >= static_cast<uint32_t>(vctx.context.num_comp_vectors) || (attr->comp_mask & ~known_mask) ||
      ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~known_flags)))
    err = EINVAL;
  else if ((attr->wc_flags & ~static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS)) ||
           (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD))
    err = EOPNOTSUPP;  // no timestamps, VLAN, flow tags, tag matching, parent domains
  if (err) {
    errno = err;
    return nullptr;
  }

  auto* c = new SoftCq();  // value-initialised: unused ibv_cq_ex members (comp_mask, read_*) are zero
  c->ctx = this;
  c->wc_flags = attr->wc_flags;
  c->ignore_overrun =
      (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN);
  c->ring.resize(attr->cqe);
  verbs::init_cq_fields(c, &vctx.context, attr->channel, attr->cq_context, static_cast<int>(attr->cqe));
  ibv_cq_ex& x = c->ibv;
  x.start_poll = start_poll;
  x.next_poll = next_poll;
  x.end_poll = end_poll;
  verbs::init_cq_ex_readers(c);
  return &c->ibv;
}

int SoftContext::resize_cq(ibv_cq* cq, int cqe) {
  if (cq->context != &vctx.context || cqe < 1 || uint32_t(cqe) > rc::kMaxCqe) return EINVAL;
  SoftCq* c = SoftCq::from(cq);
  std::lock_guard<std::mutex> lock(c->mu);
  if (static_cast<size_t>(cqe) < c->count) return EINVAL;  // would lose completions
  std::vector<ibv_wc> ring(static_cast<size_t>(cqe));
  for (size_t i = 0; i < c->count; i++) ring[i] = c->ring[(c->head + i) % c->ring.size()];
  c->ring.swap(ring);
  c->head = 0;
  cq->cqe = cqe;
  return 0;
}

int SoftContext::destroy_cq(ibv_cq* cq) {
  if (cq->context != &vctx.context) return EINVAL;
  SoftCq* c = SoftCq::from(cq);
  if (c->users.load()) return EBUSY;  // still attached to a QP
  verbs::destroy_sync_fields(&cq->mutex, &cq->cond);
  delete c;
  return 0;
}

// ---- shared receive queues ------------------------------------------------------------------------
// The engine owns the receive WQEs (its responder takes them); these calls translate and check.

int SoftSrq::post(ibv_recv_wr* wr, ibv_recv_wr** bad) {
  static_assert(sizeof(ibv_sge) == sizeof(rc::Sge), "ibv_sge and rc::Sge share a layout");
  return hub->lane(lane).post_engine([&](rc::Engine& e) {
    for (; wr; wr = wr->next) {
      rc::RecvWr r;
      r.wr_id = wr->wr_id;
      r.sg_list = reinterpret_cast<const rc::Sge*>(wr->sg_list);
      r.num_sge = wr->num_sge;
      int err = (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge) ? EINVAL : e.post_srq_recv(engine, r);
      if (err) {
        if (bad) *bad = wr;
        return err;
      }
    }
    return 0;
  });
}

ibv_srq* SoftContext::create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  ibv_srq_attr& a = attr->attr;
  if (!owns(pd) || a.max_wr < 1 || a.max_wr > rc::kMaxSrqWr || a.max_sge > rc::kMaxSge || a.srq_limit > a.max_wr) {
    errno = EINVAL;
    return nullptr;
  }
  int err = 0;
  Hub* h = hub(&err);
  if (!h) {
    errno = err;
    return nullptr;
  }
  auto* s = new SoftSrq();
  s->ctx = this;
  s->hub = h;
  s->lane = h->choose_lane();
  s->max_wr = a.max_wr;
  s->max_sge = a.max_sge ? a.max_sge : 1;
  err = h->lane(s->lane).with_engine([&](rc::Engine& e) {
    return e.create_srq(pd->handle, s->max_wr, s->max_sge, a.srq_limit, &s->engine, &s->srqn);
  });
  if (err) {
    delete s;
    errno = err;
    return nullptr;
  }
  verbs::init_srq_fields(s, &vctx.context, pd, attr->srq_context);
  h->add_srq(s->srqn, &s->ibv);
  h->use(s->lane);
  a.max_wr = s->max_wr;  // report what was granted
  a.max_sge = s->max_sge;
  SoftPd::users(pd)++;
  return &s->ibv;
}

int SoftContext::modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  if (srq->context != &vctx.context) return EINVAL;
  SoftSrq* s = SoftSrq::from(srq);
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  // Resizing an SRQ is not supported (docs/verbs.md); asking for the current size is fine.
  if ((mask & IBV_SRQ_MAX_WR) && attr->max_wr != s->max_wr) return EOPNOTSUPP;
  if (!(mask & IBV_SRQ_LIMIT)) return 0;
  return s->hub->lane(s->lane).with_engine([&](rc::Engine& e) { return e.modify_srq(s->engine, attr->srq_limit); });
}

int SoftContext::query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (srq->context != &vctx.context) return EINVAL;
  SoftSrq* s = SoftSrq::from(srq);
  attr->max_wr = s->max_wr;
  attr->max_sge = s->max_sge;
  uint32_t limit = 0;
  int err = s->hub->lane(s->lane).with_engine([&](rc::Engine& e) { return e.query_srq(s->engine, &limit); });
  if (err) return err;
  attr->srq_limit = limit;
  return 0;
}

int SoftContext::destroy_srq(ibv_srq* srq) {
  if (srq->context != &vctx.context) return EINVAL;
  SoftSrq* s = SoftSrq::from(srq);
  int err = s->hub->lane(s->lane).with_engine([&](rc::Engine& e) { return e.destroy_srq(s->engine); });
  if (err) return err;  // EBUSY: a QP still uses it
  s->hub->remove_srq(s->srqn);
  s->hub->unuse(s->lane);
  SoftPd::users(srq->pd)--;
  verbs::destroy_sync_fields(&srq->mutex, &srq->cond);
  delete s;
  return 0;
}

}  // namespace melon::soft
