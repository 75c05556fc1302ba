// The CM agent: IBA chapter 12's connection state machine over the MadPort of each device.
// rdma_* calls start exchanges (cm_send_*); the agent thread receives MADs, runs timers
// (resend the last message, up to max CM retries, then fail the exchange) and turns what
// happens into rdma_cm events. Linux's ib_cm is the peer it must agree with (docs/rdmacm.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cm/ip_cm.h"
#include "rdmacm/internal.h"

namespace melon::rdmacm {
namespace {

// MELON_CM_DEBUG=1: every MAD in and out on stderr.
bool debug() {
  static const bool on = std::getenv("MELON_CM_DEBUG") != nullptr;
  return on;
}

// rdma_cm's IP header bytes of an address: IPv4 in the last 4 of 16.
void ip_bytes(const sockaddr* sa, uint8_t out[16]) {
  std::memset(out, 0, 16);
  if (sa->sa_family == AF_INET)
    std::memcpy(out + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  else if (sa->sa_family == AF_INET6)
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
}

uint16_t port_of(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

bool is_any(const sockaddr* sa) {
  static const uint8_t zero[16] = {};
  if (sa->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr == 0;
  if (sa->sa_family == AF_INET6) return !std::memcmp(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, zero, 16);
  return true;
}

void fill_ip_header(Id* id, uint8_t out[cm::kIpCmHeaderSize]) {
  cm::IpCmHeader h;
  const sockaddr* src = &id->id.route.addr.src_addr;
  h.ip_version = src->sa_family == AF_INET6 ? 6 : 4;
  h.src_port = port_of(src);
  ip_bytes(src, h.src);
  ip_bytes(&id->id.route.addr.dst_addr, h.dst);
  cm::encode_ip_cm(h, out);
}

// The TID of an exchange: random high half, our communication ID low (as ib_cm forms it).
uint64_t new_tid(uint32_t comm_id) { return uint64_t(random32()) << 32 | comm_id; }

uint32_t new_comm_id() {
  uint32_t v;
  do v = random32();
  while (v == 0);
  return v;
}

int transmit(Id* id, cm::Message& m, bool keep) {
  uint8_t mad[cm::kMadSize];
  if (!cm::encode(m, mad)) return EINVAL;
  if (int e = open_mad_port(id->dev)) return e;
  if (debug())
    fprintf(stderr, "librdmacm: %llu ms: MAD out: %s tid %llx\n", (unsigned long long)(now_ns() / 1000000 % 100000),
            cm::attr_name(m.attr()), (unsigned long long)m.hdr.tid);
  if (keep) {
    std::memcpy(id->last_mad, mad, sizeof mad);
    id->has_last = true;
  }
  return id->dev->mad->send(mad, id->peer);
}

// Arms the retry timer for a message that expects an answer within the peer's response time.
void arm(Id* id, uint8_t peer_timeout) {
  id->retry_ns = cm_timeout_ns(peer_timeout);
  id->retries_left = kMaxCmRetries;
  id->deadline_ns = now_ns() + id->retry_ns;
  wake_agent();
}

void disarm(Id* id) {
  id->deadline_ns = 0;
  id->has_last = false;
}

void header(cm::Message& m, cm::Attr a, uint64_t tid) {
  m.hdr = cm::MadHeader{};
  m.hdr.attr_id = uint16_t(a);
  m.hdr.tid = tid;
}

// Replies that need no id (a DREP to a DREQ we do not know, a REJ to a REQ nobody listens for).
void reply_unbound(Device* d, const MadAddress& to, cm::Message& m) {
  uint8_t mad[cm::kMadSize];
  if (cm::encode(m, mad)) d->mad->send(mad, to);
}

Id* find_by_local(Device* d, uint32_t local_comm_id) {
  for (Id* i : lib().ids)
    if (i->dev == d && i->local_comm_id == local_comm_id && i->cm != CmState::idle) return i;
  return nullptr;
}

Id* find_by_remote(Device* d, uint32_t remote_comm_id, uint64_t remote_guid) {
  for (Id* i : lib().ids)
    if (i->dev == d && i->remote_comm_id == remote_comm_id && i->remote_guid == remote_guid && i->cm != CmState::idle)
      return i;
  return nullptr;
}

// The listener a request for `sid` to address `dst` reaches on device d.
Id* find_listener(Device* d, uint64_t sid, const uint8_t dst_ip[16], int ip_version) {
  if (!cm::is_ip_service(sid)) return nullptr;
  for (Id* i : lib().ids) {
    if (i->state != IdState::listen || i->destroying) continue;
    if (uint16_t(i->id.ps) != cm::service_port_space(sid)) continue;
    const sockaddr* src = &i->id.route.addr.src_addr;
    if (port_of(src) != cm::service_port(sid)) continue;
    if (i->dev && i->dev != d) continue;
    const bool loopback =
        (src->sa_family == AF_INET &&
         (ntohl(reinterpret_cast<const sockaddr_in*>(src)->sin_addr.s_addr) >> 24) == 127) ||
        (src->sa_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(src)->sin6_addr));
    if (!is_any(src) && !loopback) {
      uint8_t mine[16];
      ip_bytes(src, mine);
      if (std::memcmp(mine, dst_ip, 16)) continue;
    } else if (src->sa_family == AF_INET && ip_version != 4) {
      continue;
    } else if (src->sa_family == AF_INET6 && ip_version == 4 && i->afonly) {
      continue;
    }
    return i;
  }
  return nullptr;
}

// The child id of a connection request: the listener's channel (or a sync channel of its own),
// addresses from the request's IP header, the path from the REQ or the MAD's source.
Id* child_of(Id* l, Device* d, const cm::IpCmHeader& h, const MadAddress& from) {
  Channel* ch = l->chan;
  if (ch->sync && !(ch = make_channel(true))) return nullptr;
  Id* c = new_id(ch, l->id.context, l->id.ps, l->id.qp_type);
  c->listener = l;
  c->dev = d;
  c->id.verbs = d->ctx;
  c->id.pd = device_pd(d);
  c->id.port_num = 1;
  c->bound = true;
  c->tos = l->tos;
  c->ack_timeout = l->ack_timeout;
  c->peer = from;
  c->peer.remote_qpn = 1;
  c->gid_index = from.sgid_index;
  rdma_addr& a = c->id.route.addr;
  if (h.ip_version == 4) {
    sockaddr_in& s = a.src_sin;
    sockaddr_in& t = a.dst_sin;
    s.sin_family = t.sin_family = AF_INET;
    std::memcpy(&s.sin_addr, h.dst + 12, 4);
    std::memcpy(&t.sin_addr, h.src + 12, 4);
    s.sin_port = htons(port_of(&l->id.route.addr.src_addr));
    t.sin_port = htons(h.src_port);
  } else {
    sockaddr_in6& s = a.src_sin6;
    sockaddr_in6& t = a.dst_sin6;
    s.sin6_family = t.sin6_family = AF_INET6;
    std::memcpy(&s.sin6_addr, h.dst, 16);
    std::memcpy(&t.sin6_addr, h.src, 16);
    s.sin6_port = htons(port_of(&l->id.route.addr.src_addr));
    t.sin6_port = htons(h.src_port);
    if (l->id.route.addr.src_addr.sa_family == AF_INET6)
      s.sin6_scope_id = t.sin6_scope_id = l->id.route.addr.src_sin6.sin6_scope_id;
  }
  ibv_gid sgid{};
  ibv_query_gid(d->ctx, 1, c->gid_index, &sgid);
  a.addr.ibaddr.sgid = sgid;
  a.addr.ibaddr.dgid = from.peer_gid;
  a.addr.ibaddr.pkey = htons(0xffff);
  ibv_sa_path_rec& p = c->path;
  p.sgid = sgid;
  p.dgid = from.peer_gid;
  p.pkey = htons(0xffff);
  p.hop_limit = 64;
  p.traffic_class = c->tos;
  p.mtu = route_mtu(d, &a.src_addr);
  p.mtu_selector = 2;
  p.rate = 0;
  p.packet_life_time = 18;
  p.reversible = 1;
  p.numb_path = 1;
  c->id.route.path_rec = &c->path;
  c->id.route.num_paths = 1;
  c->state = IdState::connecting;
  return c;
}

// ---- one handler per received message ------------------------------------------------------------

void on_req(Device* d, const cm::Message& m, const MadAddress& from) {
  const cm::Req& r = m.req;
  if (Id* dup = find_by_remote(d, r.local_comm_id, r.local_ca_guid)) {
    // IBA 12.9.6: a repeated REQ. Still deciding: tell the peer to wait (MRA); REP already sent: resend it.
    if (dup->cm == CmState::req_rcvd) {
      cm::Message a;
      header(a, cm::Attr::mra, dup->tid);
      a.mra.local_comm_id = dup->local_comm_id;
      a.mra.remote_comm_id = dup->remote_comm_id;
      a.mra.message_mraed = cm::kRefReq;
      a.mra.service_timeout = kCmResponseTimeout;
      transmit(dup, a, false);
    } else if (dup->cm == CmState::rep_sent && dup->has_last) {
      d->mad->send(dup->last_mad, dup->peer);
    }
    return;
  }
  cm::IpCmHeader h;
  Id* l = nullptr;
  if (r.transport_service_type <= 1 && cm::decode_ip_cm(r.private_data, sizeof r.private_data, &h))
    l = find_listener(d, r.service_id, h.dst, h.ip_version);
  if (!l) {
    cm::Message a;
    header(a, cm::Attr::rej, m.hdr.tid);
    a.rej.remote_comm_id = r.local_comm_id;
    a.rej.message_rejected = cm::kRefReq;
    a.rej.reason = cm::kRejInvalidServiceId;
    reply_unbound(d, from, a);
    return;
  }
  Id* c = child_of(l, d, h, from);
  if (!c) return;
  c->cm = CmState::req_rcvd;
  c->local_comm_id = new_comm_id();
  c->remote_comm_id = r.local_comm_id;
  c->remote_guid = r.local_ca_guid;
  c->tid = m.hdr.tid;
  c->remote_qpn = r.local_qpn;
  c->remote_psn = r.starting_psn;
  c->peer_responder_resources = r.responder_resources;
  c->peer_initiator_depth = r.initiator_depth;
  c->retry_count = r.retry_count;
  c->rnr_retry_count = r.rnr_retry_count;
  c->peer_cm_timeout = r.local_cm_response_timeout;
  c->path_mtu = r.path_mtu && r.path_mtu < c->path.mtu ? r.path_mtu : c->path.mtu;
  c->path.mtu = c->path_mtu;
  c->path.flow_label = htonl(r.primary.flow_label);
  rdma_cm_event ev{};
  ev.param.conn.responder_resources = r.responder_resources;
  ev.param.conn.initiator_depth = r.initiator_depth;
  ev.param.conn.flow_control = r.end_to_end_flow_control;
  ev.param.conn.retry_count = r.retry_count;
  ev.param.conn.rnr_retry_count = r.rnr_retry_count;
  ev.param.conn.srq = r.srq;
  ev.param.conn.qp_num = r.local_qpn;
  queue_event(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, r.private_data + cm::kIpCmHeaderSize,
              sizeof r.private_data - cm::kIpCmHeaderSize, l);
  Event* e = l->chan->queue.back();
  uint8_t plen = e->ev.param.conn.private_data_len;
  const void* pdata = e->ev.param.conn.private_data;
  e->ev.param.conn = ev.param.conn;
  e->ev.param.conn.private_data = pdata;
  e->ev.param.conn.private_data_len = plen;
}

void on_rep(Device* d, const cm::Message& m) {
  const cm::Rep& r = m.rep;
  Id* id = find_by_local(d, r.remote_comm_id);
  if (!id) return;
  if (id->cm == CmState::established && id->remote_comm_id == r.local_comm_id) {
    cm_send_rtu(id);  // our RTU was lost: the peer resent its REP (IBA 12.9.6)
    return;
  }
  if (id->cm != CmState::req_sent && id->cm != CmState::mra_rcvd) return;
  disarm(id);
  id->remote_comm_id = r.local_comm_id;
  id->remote_guid = r.local_ca_guid;
  id->remote_qpn = r.local_qpn;
  id->remote_psn = r.starting_psn;
  id->peer_responder_resources = r.responder_resources;
  id->peer_initiator_depth = r.initiator_depth;
  id->rnr_retry_count = r.rnr_retry_count;
  rdma_cm_event_type type = RDMA_CM_EVENT_CONNECT_RESPONSE;
  int status = 0;
  if (id->id.qp) {
    status = qp_to_rtr_rts(id);
    if (status) {
      cm_send_rej(id, cm::kRejNoQp, nullptr, 0);
      queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -status);
      return;
    }
    cm_send_rtu(id);
    type = RDMA_CM_EVENT_ESTABLISHED;
  } else {
    id->cm = CmState::rep_rcvd;
  }
  queue_event(id, type, 0, r.private_data, sizeof r.private_data);
  Event* e = id->chan->queue.back();
  e->ev.param.conn.responder_resources = r.responder_resources;
  e->ev.param.conn.initiator_depth = r.initiator_depth;
  e->ev.param.conn.flow_control = r.end_to_end_flow_control;
  e->ev.param.conn.rnr_retry_count = r.rnr_retry_count;
  e->ev.param.conn.srq = r.srq;
  e->ev.param.conn.qp_num = r.local_qpn;
}

void on_rtu(Device* d, const cm::Message& m) {
  Id* id = find_by_local(d, m.rtu.remote_comm_id);
  if (!id || (id->cm != CmState::rep_sent && id->cm != CmState::mra_rcvd)) return;
  disarm(id);
  id->cm = CmState::established;
  id->state = IdState::connected;
  queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
}

void on_rej(Device* d, const cm::Message& m) {
  const cm::Rej& r = m.rej;
  Id* id = find_by_local(d, r.remote_comm_id);
  if (!id) return;
  switch (id->cm) {
    case CmState::req_sent:
    case CmState::mra_rcvd:
    case CmState::rep_sent:
    case CmState::rep_rcvd:
    case CmState::req_rcvd: break;
    default: return;
  }
  disarm(id);
  id->cm = CmState::idle;
  id->state = IdState::disconnected;
  qp_to_error(id);
  // rdma_cm reports the IBA reason as the status of RDMA_CM_EVENT_REJECTED.
  queue_event(id, RDMA_CM_EVENT_REJECTED, r.reason, r.private_data, sizeof r.private_data);
}

void on_mra(Device* d, const cm::Message& m) {
  const cm::Mra& r = m.mra;
  Id* id = find_by_local(d, r.remote_comm_id);
  if (!id) return;
  const bool ours = (r.message_mraed == cm::kRefReq && id->cm == CmState::req_sent) ||
                    (r.message_mraed == cm::kRefRep && id->cm == CmState::rep_sent);
  if (!ours) return;
  // IBA 12.6.6: the peer needs up to its service timeout more; wait that long before resending.
  id->cm = r.message_mraed == cm::kRefReq ? CmState::mra_rcvd : CmState::rep_sent;
  id->deadline_ns = now_ns() + cm_timeout_ns(r.service_timeout) + id->retry_ns;
}

void on_dreq(Device* d, const cm::Message& m, const MadAddress& from) {
  const cm::Dreq& r = m.dreq;
  Id* id = find_by_local(d, r.remote_comm_id);
  cm::Message a;
  header(a, cm::Attr::drep, m.hdr.tid);
  a.drep.local_comm_id = r.remote_comm_id;
  a.drep.remote_comm_id = r.local_comm_id;
  if (!id || id->remote_comm_id != r.local_comm_id) {
    reply_unbound(d, from, a);  // IBA 12.9.8.3: a DREQ for no connection is still answered
    return;
  }
  transmit(id, a, false);
  if (id->cm == CmState::established || id->cm == CmState::dreq_sent || id->cm == CmState::rep_sent) {
    disarm(id);
    id->cm = CmState::timewait;
    id->state = IdState::disconnected;
    id->deadline_ns = now_ns() + cm_timeout_ns(16);  // time wait: ignore stragglers (~0.27 s)
    if (!id->disconnect_reported) {
      id->disconnect_reported = true;
      queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
    }
  }
}

void on_drep(Device* d, const cm::Message& m) {
  Id* id = find_by_local(d, m.drep.remote_comm_id);
  if (!id || id->cm != CmState::dreq_sent) return;
  disarm(id);
  id->cm = CmState::timewait;
  id->deadline_ns = now_ns() + cm_timeout_ns(16);
  if (!id->disconnect_reported) {
    id->disconnect_reported = true;
    queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
  }
}

void on_sidr_req(Device* d, const cm::Message& m, const MadAddress& from) {
  const cm::SidrReq& r = m.sidr_req;
  for (Id* i : lib().ids)  // a repeated SIDR_REQ is the same request
    if (i->dev == d && i->cm == CmState::sidr_req_rcvd && i->remote_comm_id == r.request_id &&
        !std::memcmp(&i->peer.peer_gid, &from.peer_gid, 16))
      return;
  cm::IpCmHeader h;
  Id* l = nullptr;
  if (cm::decode_ip_cm(r.private_data, sizeof r.private_data, &h))
    l = find_listener(d, r.service_id, h.dst, h.ip_version);
  if (!l) {
    cm::Message a;
    header(a, cm::Attr::sidr_rep, m.hdr.tid);
    a.sidr_rep.request_id = r.request_id;
    a.sidr_rep.status = cm::kSidrUnsupportedService;
    a.sidr_rep.service_id = r.service_id;
    reply_unbound(d, from, a);
    return;
  }
  Id* c = child_of(l, d, h, from);
  if (!c) return;
  c->cm = CmState::sidr_req_rcvd;
  c->remote_comm_id = r.request_id;
  c->tid = m.hdr.tid;
  queue_event(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, r.private_data + cm::kIpCmHeaderSize,
              sizeof r.private_data - cm::kIpCmHeaderSize, l);
  Event* e = l->chan->queue.back();
  rdma_ud_param& ud = e->ev.param.ud;
  ud.ah_attr.is_global = 1;
  ud.ah_attr.port_num = 1;
  ud.ah_attr.grh.dgid = from.peer_gid;
  ud.ah_attr.grh.sgid_index = from.sgid_index;
  ud.ah_attr.grh.hop_limit = 64;
  ud.qp_num = 0;
  ud.qkey = 0;
}

void on_sidr_rep(Device* d, const cm::Message& m) {
  const cm::SidrRep& r = m.sidr_rep;
  Id* id = nullptr;
  for (Id* i : lib().ids)
    if (i->dev == d && i->cm == CmState::sidr_req_sent && i->local_comm_id == r.request_id) id = i;
  if (!id) return;
  disarm(id);
  id->cm = CmState::idle;
  if (r.status != cm::kSidrOk) {
    id->state = IdState::disconnected;
    queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ECONNREFUSED, r.private_data, sizeof r.private_data);
    return;
  }
  id->state = IdState::connected;
  queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, r.private_data, sizeof r.private_data);
  Event* e = id->chan->queue.back();
  rdma_ud_param& ud = e->ev.param.ud;
  ud.ah_attr.is_global = 1;
  ud.ah_attr.port_num = 1;
  ud.ah_attr.grh.dgid = id->path.dgid;
  ud.ah_attr.grh.sgid_index = id->gid_index;
  ud.ah_attr.grh.hop_limit = 64;
  ud.ah_attr.grh.traffic_class = id->tos;
  ud.qp_num = r.qpn;
  ud.qkey = r.qkey;
}

void on_mad(Device* d, const uint8_t* mad, const MadAddress& from) {
  cm::Message m;
  const cm::DecodeStatus st = cm::decode(mad, cm::kMadSize, &m);
  if (debug())
    fprintf(stderr, "librdmacm: %llu ms: MAD in: %s (%s) tid %llx\n", (unsigned long long)(now_ns() / 1000000 % 100000),
            cm::attr_name(m.attr()), cm::decode_status_name(st), (unsigned long long)m.hdr.tid);
  if (st != cm::DecodeStatus::ok) return;
  if (m.hdr.method != cm::kMethodSend) return;
  switch (m.attr()) {
    case cm::Attr::req: on_req(d, m, from); break;
    case cm::Attr::rep: on_rep(d, m); break;
    case cm::Attr::rtu: on_rtu(d, m); break;
    case cm::Attr::rej: on_rej(d, m); break;
    case cm::Attr::mra: on_mra(d, m); break;
    case cm::Attr::dreq: on_dreq(d, m, from); break;
    case cm::Attr::drep: on_drep(d, m); break;
    case cm::Attr::sidr_req: on_sidr_req(d, m, from); break;
    case cm::Attr::sidr_rep: on_sidr_rep(d, m); break;
    default: break;
  }
}

// A timer ran out: resend, or give the exchange up as IBA 12.9.6 says (REJ "timeout" to the peer).
void on_timeout(Id* id) {
  if (id->cm == CmState::timewait) {
    id->deadline_ns = 0;
    id->cm = CmState::idle;
    return;
  }
  if (id->has_last && id->retries_left > 0) {
    --id->retries_left;
    if (debug()) fprintf(stderr, "librdmacm: %llu ms: MAD resent\n", (unsigned long long)(now_ns() / 1000000 % 100000));
    id->dev->mad->send(id->last_mad, id->peer);
    id->deadline_ns = now_ns() + id->retry_ns;
    return;
  }
  const CmState was = id->cm;
  disarm(id);
  id->cm = CmState::idle;
  id->state = IdState::disconnected;
  switch (was) {
    case CmState::req_sent:
    case CmState::mra_rcvd:
    case CmState::rep_sent:
      cm_send_rej(id, cm::kRejTimeout, nullptr, 0);
      id->cm = CmState::idle;
      qp_to_error(id);
      queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      break;
    case CmState::sidr_req_sent: queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT); break;
    case CmState::dreq_sent:
      if (!id->disconnect_reported) {
        id->disconnect_reported = true;
        queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
      }
      break;
    default: break;
  }
}

void agent_loop() {
  Lib& L = lib();
  std::vector<pollfd> fds;
  std::vector<Device*> devs;
  uint8_t mad[cm::kMadSize];
  for (;;) {
    int timeout = -1;
    {
      std::lock_guard<std::mutex> g(L.mu);
      if (!L.agent_running) return;
      const uint64_t now = now_ns();
      for (size_t k = 0; k < L.ids.size(); ++k) {
        Id* i = L.ids[k];
        if (i->deadline_ns && i->deadline_ns <= now && i->dev && i->dev->mad) on_timeout(i);
      }
      uint64_t next = 0;
      for (Id* i : L.ids)
        if (i->deadline_ns && (!next || i->deadline_ns < next)) next = i->deadline_ns;
      if (next) timeout = int(next > now ? (next - now + 999999) / 1000000 : 0);
      fds.assign(1, pollfd{L.wake[0], POLLIN, 0});
      devs.assign(1, nullptr);
      for (auto& d : L.devices)
        if (d->mad) {
          fds.push_back(pollfd{d->mad->fd(), POLLIN, 0});
          devs.push_back(d.get());
        }
    }
    if (poll(fds.data(), nfds_t(fds.size()), timeout) < 0 && errno != EINTR) return;
    if (fds[0].revents) {
      char buf[64];
      while (read(L.wake[0], buf, sizeof buf) > 0) {}
    }
    std::lock_guard<std::mutex> g(L.mu);
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      MadAddress from;
      while (devs[k]->mad && devs[k]->mad->receive(mad, &from) == 1) on_mad(devs[k], mad, from);
    }
  }
}

}  // namespace

// ---- exchanges the rdma_* calls start ------------------------------------------------------------

int cm_send_req(Id* id, const rdma_conn_param& p) {
  cm::Message m;
  id->local_comm_id = new_comm_id();
  id->tid = new_tid(id->local_comm_id);
  header(m, cm::Attr::req, id->tid);
  cm::Req& r = m.req;
  r.local_comm_id = id->local_comm_id;
  r.service_id = cm::ip_service_id(uint16_t(id->id.ps), port_of(&id->id.route.addr.dst_addr));
  r.local_ca_guid = id->dev->guid;
  r.local_qpn = id->local_qpn;
  r.responder_resources = id->responder_resources;
  r.initiator_depth = id->initiator_depth;
  r.remote_cm_response_timeout = kCmResponseTimeout;
  r.transport_service_type = id->id.qp_type == IBV_QPT_UC ? 1 : 0;
  r.end_to_end_flow_control = p.flow_control ? 1 : 0;
  r.starting_psn = id->local_psn;
  r.local_cm_response_timeout = kCmResponseTimeout;
  r.retry_count = p.retry_count & 7;
  r.pkey = 0xffff;
  r.path_mtu = id->path_mtu;
  r.rnr_retry_count = p.rnr_retry_count & 7;
  r.max_cm_retries = kMaxCmRetries;
  r.srq = p.srq ? 1 : 0;
  // RoCE: no LIDs; Linux puts the permissive LID in both (as the capture shows).
  r.primary.local_lid = r.primary.remote_lid = 0xffff;
  std::memcpy(r.primary.local_gid, id->path.sgid.raw, 16);
  std::memcpy(r.primary.remote_gid, id->path.dgid.raw, 16);
  r.primary.flow_label = ntohl(id->path.flow_label) & 0xfffff;
  r.primary.traffic_class = id->tos;
  r.primary.hop_limit = 64;
  r.primary.local_ack_timeout = id->ack_timeout ? id->ack_timeout : kAckTimeout;
  fill_ip_header(id, r.private_data);
  if (p.private_data_len > sizeof r.private_data - cm::kIpCmHeaderSize) return EINVAL;
  if (p.private_data_len) std::memcpy(r.private_data + cm::kIpCmHeaderSize, p.private_data, p.private_data_len);
  id->retry_count = p.retry_count & 7;
  id->rnr_retry_count = p.rnr_retry_count & 7;
  if (int e = transmit(id, m, true)) return e;
  id->cm = CmState::req_sent;
  arm(id, kCmResponseTimeout);
  return 0;
}

int cm_send_sidr_req(Id* id, const rdma_conn_param& p) {
  cm::Message m;
  id->local_comm_id = new_comm_id();
  id->tid = new_tid(id->local_comm_id);
  header(m, cm::Attr::sidr_req, id->tid);
  cm::SidrReq& r = m.sidr_req;
  r.request_id = id->local_comm_id;
  r.pkey = 0xffff;
  r.service_id = cm::ip_service_id(uint16_t(id->id.ps), port_of(&id->id.route.addr.dst_addr));
  fill_ip_header(id, r.private_data);
  if (p.private_data_len > sizeof r.private_data - cm::kIpCmHeaderSize) return EINVAL;
  if (p.private_data_len) std::memcpy(r.private_data + cm::kIpCmHeaderSize, p.private_data, p.private_data_len);
  if (int e = transmit(id, m, true)) return e;
  id->cm = CmState::sidr_req_sent;
  arm(id, kCmResponseTimeout);
  return 0;
}

int cm_send_rep(Id* id, const rdma_conn_param& p) {
  cm::Message m;
  header(m, cm::Attr::rep, id->tid);
  cm::Rep& r = m.rep;
  r.local_comm_id = id->local_comm_id;
  r.remote_comm_id = id->remote_comm_id;
  r.local_qpn = id->local_qpn;
  r.starting_psn = id->local_psn;
  r.responder_resources = id->responder_resources;
  r.initiator_depth = id->initiator_depth;
  r.target_ack_delay = kTargetAckDelay;
  r.end_to_end_flow_control = p.flow_control ? 1 : 0;
  r.rnr_retry_count = p.rnr_retry_count & 7;
  r.srq = p.srq ? 1 : 0;
  r.local_ca_guid = id->dev->guid;
  if (p.private_data_len > sizeof r.private_data) return EINVAL;
  if (p.private_data_len) std::memcpy(r.private_data, p.private_data, p.private_data_len);
  if (int e = transmit(id, m, true)) return e;
  id->cm = CmState::rep_sent;
  arm(id, id->peer_cm_timeout);
  return 0;
}

int cm_send_sidr_rep(Id* id, uint8_t status, uint32_t qpn, uint32_t qkey, const void* pdata, size_t plen) {
  cm::Message m;
  header(m, cm::Attr::sidr_rep, id->tid);
  cm::SidrRep& r = m.sidr_rep;
  r.request_id = id->remote_comm_id;
  r.status = status;
  r.qpn = qpn;
  r.qkey = qkey;
  r.service_id = cm::ip_service_id(uint16_t(id->id.ps), port_of(&id->id.route.addr.src_addr));
  if (plen > sizeof r.private_data) return EINVAL;
  if (plen) std::memcpy(r.private_data, pdata, plen);
  if (int e = transmit(id, m, false)) return e;
  id->cm = CmState::idle;
  return 0;
}

int cm_send_rej(Id* id, uint16_t reason, const void* pdata, size_t plen) {
  cm::Message m;
  header(m, cm::Attr::rej, id->tid);
  cm::Rej& r = m.rej;
  r.local_comm_id = id->local_comm_id;
  r.remote_comm_id = id->remote_comm_id;
  const bool active = id->cm == CmState::req_sent || id->cm == CmState::mra_rcvd || id->cm == CmState::rep_rcvd;
  r.message_rejected = active ? (id->cm == CmState::rep_rcvd ? cm::kRefRep : cm::kRefOther) : cm::kRefReq;
  if (id->cm == CmState::rep_sent) r.message_rejected = cm::kRefOther;
  r.reason = reason;
  if (plen > sizeof r.private_data) return EINVAL;
  if (plen) std::memcpy(r.private_data, pdata, plen);
  int e = transmit(id, m, false);
  disarm(id);
  id->cm = CmState::idle;
  return e;
}

int cm_send_rtu(Id* id) {
  cm::Message m;
  header(m, cm::Attr::rtu, id->tid);
  m.rtu.local_comm_id = id->local_comm_id;
  m.rtu.remote_comm_id = id->remote_comm_id;
  int e = transmit(id, m, false);
  id->cm = CmState::established;
  id->state = IdState::connected;
  return e;
}

int cm_send_dreq(Id* id) {
  cm::Message m;
  header(m, cm::Attr::dreq, id->tid);
  m.dreq.local_comm_id = id->local_comm_id;
  m.dreq.remote_comm_id = id->remote_comm_id;
  m.dreq.remote_qpn = id->remote_qpn;
  if (int e = transmit(id, m, true)) return e;
  id->cm = CmState::dreq_sent;
  arm(id, id->peer_cm_timeout);
  return 0;
}

void cm_teardown(Id* id) {
  switch (id->cm) {
    case CmState::req_rcvd: cm_send_rej(id, cm::kRejConsumer, nullptr, 0); break;
    case CmState::req_sent:
    case CmState::mra_rcvd:
    case CmState::rep_sent:
    case CmState::rep_rcvd: cm_send_rej(id, cm::kRejTimeout, nullptr, 0); break;
    case CmState::established: {
      // A DREQ nobody will wait for (the id is going): sent once, not retried.
      cm::Message m;
      header(m, cm::Attr::dreq, id->tid);
      m.dreq.local_comm_id = id->local_comm_id;
      m.dreq.remote_comm_id = id->remote_comm_id;
      m.dreq.remote_qpn = id->remote_qpn;
      transmit(id, m, false);
      break;
    }
    case CmState::sidr_req_rcvd: cm_send_sidr_rep(id, cm::kSidrReject, 0, 0, nullptr, 0); break;
    default: break;
  }
  disarm(id);
  id->cm = CmState::idle;
}

// ---- the agent thread ------------------------------------------------------------------------------

void start_agent() {
  Lib& L = lib();
  if (L.agent_running) return;
  L.agent_running = true;
  L.agent = std::thread(agent_loop);
  L.agent.detach();  // lives as long as the process: a CM is never torn down under a consumer
}

}  // namespace melon::rdmacm
