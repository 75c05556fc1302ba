// librdmacm's inside: event channels, ids, devices and the CM agent's per-id connection state.
// One lock (Lib::mu) guards all of it; the agent thread (agent.cpp) takes it for each MAD and
// timer, the rdma_* calls (cma.cpp) for their work, and no one blocks while holding it.
#pragma once
#include <rdma/rdma_cma.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cm/messages.h"
#include "rdmacm/mad_port.h"

namespace melon::rdmacm {

struct Id;

// One event handed to the application: rdma_cm_event first, then room for its private data.
struct Event {
  rdma_cm_event ev{};
  uint8_t private_data[256] = {};
};

// An event channel's descriptor counts queued events. Linux: one eventfd in semaphore mode, so a
// thread blocked reading it when the application destroys the channel stays blocked, as on a
// closed rdma_cm device file, instead of reading end-of-file (rping's CM thread does exactly
// that). Elsewhere a pipe (one byte per event; its write end is kept until then).
struct Channel {
  rdma_event_channel ch{};  // first: the application's pointer
  int write_fd = -1;  // == ch.fd with an eventfd
  std::deque<Event*> queue;  // one count per queued event
  bool sync = false;  // the private channel of an id created without one
  // The ids using it. An application may destroy a channel its ids still use (perftest does on
  // its error paths): it is then closed (their later events dropped) and freed with its last id.
  int users = 0;
  bool closed = false;
};
Channel* make_channel(bool sync);
void channel_put(Channel* ch);  // an id stops using it
void channel_signal(Channel* ch);
int channel_wait(Channel* ch);  // takes one count: 0, or errno (EAGAIN on a non-blocking fd)

struct Device {
  ibv_context* ctx = nullptr;
  uint64_t guid = 0;  // node GUID, host order
  ibv_port_attr port{};
  ibv_device_attr attr{};
  ibv_pd* pd = nullptr;  // device_pd()
  std::unique_ptr<MadPort> mad;  // QP1, opened on first CM use
  int mad_err = 0;  // why it could not be opened
};

// The device's own PD, made on first use: every id on the device shows it as `id->pd`, as rdma-core's
// librdmacm does (UCX's rdmacm transport makes a QP on `id->pd`), and QPs made without a PD use it.
ibv_pd* device_pd(Device* d);

// The IBA 12.9.6 communication states an id's connection goes through (passive and active side,
// plus SIDR, 12.11). rdma_cm's own progress (address, route, listening) is IdState.
enum class CmState {
  idle,
  req_sent,
  mra_rcvd,  // our REQ or REP was MRAed: waiting the peer's service timeout
  rep_rcvd,  // REP in, no QP of ours to move: CONNECT_RESPONSE, waiting for rdma_establish
  req_rcvd,
  rep_sent,
  established,
  dreq_sent,
  timewait,
  sidr_req_sent,
  sidr_req_rcvd,
};

enum class IdState { idle, addr_resolved, route_resolved, listen, connecting, connected, disconnected };

struct Id {
  rdma_cm_id id{};  // first: the application's pointer
  Channel* chan = nullptr;
  Device* dev = nullptr;
  uint8_t gid_index = 0;
  IdState state = IdState::idle;
  bool bound = false;
  int backlog = 0;
  Id* listener = nullptr;  // for a connection request's id
  ibv_sa_path_rec path{};
  int unacked = 0;  // events handed out for this id and not yet acknowledged
  bool destroying = false;
  // options (rdma_set_option)
  uint8_t tos = 0;
  bool afonly = false, reuseaddr = false;
  uint8_t ack_timeout = 0;  // 0: the default (kAckTimeout)
  // rdma_create_qp made these
  ibv_cq* own_send_cq = nullptr;
  ibv_cq* own_recv_cq = nullptr;
  ibv_comp_channel* own_send_ch = nullptr;
  ibv_comp_channel* own_recv_ch = nullptr;
  bool has_qp_init = false;  // rdma_create_ep of a passive id: QP attributes for its requests
  ibv_qp_init_attr qp_init{};
  ibv_pd* ep_pd = nullptr;

  // The connection (agent.cpp).
  CmState cm = CmState::idle;
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint64_t tid = 0;
  uint64_t remote_guid = 0;
  // PSNs as the REQ/REP carry them: each side's Starting PSN is the one it receives from.
  uint32_t remote_qpn = 0, remote_psn = 0, local_qpn = 0, local_psn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;  // ours, as sent
  uint8_t peer_responder_resources = 0, peer_initiator_depth = 0;  // from the peer's REQ/REP
  uint8_t retry_count = 7, rnr_retry_count = 7, path_mtu = IBV_MTU_1024;
  uint8_t peer_cm_timeout = 20;  // the peer's CM response timeout exponent
  uint32_t qkey = RDMA_UDP_QKEY;
  MadAddress peer;
  uint8_t last_mad[cm::kMadSize] = {};  // what a timeout resends
  bool has_last = false;
  int retries_left = 0;
  uint64_t deadline_ns = 0;  // 0: no timer
  uint64_t retry_ns = 0;
  bool disconnect_reported = false;

  static Id* from(rdma_cm_id* id) { return reinterpret_cast<Id*>(id); }
  rdma_cm_id* cm_id() { return &id; }
};

struct Lib {
  std::mutex mu;
  std::condition_variable acked;  // an event was acknowledged (rdma_destroy_id waits)
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<Id*> ids;
  bool init_done = false;
  int init_err = 0;
  std::thread agent;
  int wake[2] = {-1, -1};
  bool agent_running = false;
};
Lib& lib();

// Timing (IBA 12.7.34: a CM timeout exponent t means 4.096 us * 2^t).
constexpr uint8_t kCmResponseTimeout = 20;  // what we advertise, as Linux does (~4.3 s)
constexpr uint8_t kMaxCmRetries = 15;
constexpr uint8_t kAckTimeout = 19;  // the QP's local ACK timeout when none is set (~2.1 s)
constexpr uint8_t kTargetAckDelay = 15;
uint64_t cm_timeout_ns(uint8_t exponent);
uint64_t now_ns();

// With lib().mu held.
int ensure_init();  // devices opened, agent thread running
Device* device_of(ibv_context* ctx);
int open_mad_port(Device* d);  // errno value
// route_mtu.cpp: a route's path MTU (ibv_mtu), the port's active MTU capped so that a packet with its
// RoCEv2 headers fits the MTU of the interface holding `local`; cap_mtu does the arithmetic.
uint8_t route_mtu(const Device* d, const sockaddr* local);
uint8_t cap_mtu(uint8_t ib_mtu, unsigned if_mtu);
void queue_event(Id* id, rdma_cm_event_type type, int status, const void* pdata = nullptr, size_t plen = 0,
                 Id* listen = nullptr);
void wake_agent();
void start_agent();  // agent.cpp: the thread that receives MADs and runs timers
Id* new_id(Channel* chan, void* context, rdma_port_space ps, ibv_qp_type qpt);
void free_id(Id* id);
uint32_t random32();

// The agent's part of the rdma_* calls, with lib().mu held; errno values.
int cm_send_req(Id* id, const rdma_conn_param& p);
int cm_send_sidr_req(Id* id, const rdma_conn_param& p);
int cm_send_rep(Id* id, const rdma_conn_param& p);
int cm_send_sidr_rep(Id* id, uint8_t status, uint32_t qpn, uint32_t qkey, const void* pdata, size_t plen);
int cm_send_rej(Id* id, uint16_t reason, const void* pdata, size_t plen);
int cm_send_rtu(Id* id);
int cm_send_dreq(Id* id);
void cm_teardown(Id* id);  // rdma_destroy_id: leave the peer in a known state

// QP transitions the library makes (cma.cpp), with lib().mu held.
int qp_to_rtr_rts(Id* id);
void qp_to_error(Id* id);
int fill_qp_attr(Id* id, ibv_qp_attr* attr, int* mask);

}  // namespace melon::rdmacm
