// The user-client server: one per device. It owns the trust boundary's rules (docs/uapi.md):
// decode a request by size, check every field, handle, state and quota, and only then call the
// backend (the firmware). It keeps each client's objects in a handle table and releases all of
// them when the client closes or dies.
//
//   Server srv(backend, limits);
//   Client* c = ...;  srv.attach(c, host);          // at connect / IOUserClient::init
//   Reply r = srv.handle(*c, selector, in, in_len, out, out_cap);
//   srv.detach(*c);                                 // at disconnect / death: frees everything
//
// Threading: the host serializes calls into one Server (melon-emud's event loop; the DEXT's
// default dispatch queue, which is serial). Event delivery (deliver_*) goes through the same
// serialization.
//
// Freestanding: no allocation (the host provides the Client storage), no C++ library.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "uapi/abi.h"
#include "uapi/backend.h"

namespace melon::uapi {

// The device-wide object quotas' defaults (a backend sizes what it keeps per object, e.g. event
// routes, from them).
inline constexpr Quotas kDeviceQuotas{256, 1024, 1024, 2048, 128, 256, 64};

// Bytes a client can make the host spend, counted per client, per user (the uid the host names at
// attach) and per device.
struct ByteQuota {
  uint64_t client, user, device;
};

// Device limits the server checks requests against (the host fills them from the device's caps)
// and the device-wide object quotas.
struct Limits {
  uint32_t max_qp_wr = 16384, max_sge = 32, max_inline = 1024, max_cqe = 1u << 22;
  uint32_t max_srq_wr = 16384, max_srq_sge = 32, max_rd_atomic = 16, gid_tbl_len = 16;
  uint32_t comp_vectors = 1, ports = 1;
  uint64_t max_mr_size = 1ull << 40;
  Quotas client;  // per client
  Quotas device = kDeviceQuotas;  // across all clients
  uint32_t clients = kMaxClients;
  // Byte and connection limits (docs/uapi.md "Quotas"). Queue memory is what rings and doorbell
  // records take of the host; pinned memory is MR pages the device may reach (Linux charges these
  // to RLIMIT_MEMLOCK).
  ByteQuota queue_bytes{64ull << 20, 256ull << 20, 1ull << 30};
  ByteQuota pinned_bytes{256ull << 20, 1ull << 30, 4ull << 30};
  uint32_t clients_per_user = 12;  // of the device's 16: one user cannot lock the others out
  // Diagnostic selectors (stable_cycle) answer not_permitted unless the host allows them.
  bool diagnostics = false;
  uint64_t features = kFeatRc | kFeatRoceV2 | kFeatDirectPath | kFeatAsyncEvents | kFeatImmediate | kFeatInline |
                      kFeatAtomic | kFeatBlueFlame | kFeatCqEvents | kFeatUc | kFeatUd | kFeatSrq;
};

struct Reply {
  Status status;
  uint32_t out_len;  // bytes written to `out` (0 unless ok)
};

// One slot of a client's handle table.
struct Entry {
  uint16_t gen = 0;  // the slot's current generation; a token must carry it
  bool live = false;
  uint8_t state = 0;  // QP: ibv_qp_state; SRQ: armed
  uint8_t qp_type = 0;
  uint8_t gsi_port = 0;  // QP1 of this port (kQpGsi); 0 for any other object
  uint32_t refs = 0;  // live objects that depend on this one
  uint32_t parents[5] = {};  // tokens this object holds references on
  uint32_t id = 0;  // QPN / CQN, for event routing
  uint32_t srq_wrs = 0;  // SRQ: the WQEs it was given (a limit must stay below)
  uint32_t log_entries = 0;  // CQ: log2 of its ring's entries (resize_cq)
  uint64_t queue_bytes = 0, pinned_bytes = 0;  // charged at commit, given back at release
  void* obj = nullptr;  // the backend's object
  MapRegion maps[kMaxMaps];
};

// Per-client table sizes: the anchor's quotas are also the compiled capacity.
inline constexpr uint32_t kSlots[kObjTypes] = {0, 16, 4, 64, 64, 128, 8, 16};
struct SlotBases {
  uint32_t of[kObjTypes + 1];
};
inline constexpr SlotBases kSlotBases = [] {
  SlotBases b{};
  for (uint32_t i = 0; i < kObjTypes; i++) b.of[i + 1] = b.of[i] + kSlots[i];
  return b;
}();
inline constexpr uint32_t slot_base(uint32_t t) { return kSlotBases.of[t]; }  // a table: it is on every lookup
inline constexpr uint32_t kTotalSlots = slot_base(kObjTypes);

struct Client {
  bool attached = false, open = false;
  uint32_t id = 0;  // 1..kMaxClients
  void* host = nullptr;  // the platform's handle of this client's address space
  uint32_t serial = 0;  // which attach this is (never 0): event tags carry it
  uint32_t uid = 0;  // the user the host says it runs as
  uint32_t user = 0;  // its index in the server's user table
  uint64_t queue_bytes = 0, pinned_bytes = 0;
  uint32_t count[kObjTypes] = {};
  Entry entries[kTotalSlots];
  static constexpr uint32_t kEvents = 64;
  EventResp events[kEvents];
  uint32_t ev_head = 0, ev_count = 0, ev_dropped = 0;
  // The host is told of a queued event only while this is set; a get_event that finds the queue
  // empty sets it again. So one wake-up is outstanding at a time, and none is lost: the reader
  // drains until no_event, and an event queued after that finds the flag set.
  bool wake_armed = true;
};

struct ServerStats {
  uint64_t requests = 0, refused = 0, backend_calls = 0, cleanup_failures = 0, events_dropped = 0;
};

// Told when an event is queued for a client whose wake-up is armed (Client::wake_armed).
class EventNotify {
 public:
  virtual void event_queued(Client&) {}

 protected:
  ~EventNotify() = default;
};

class Server {
 public:
  Server(Backend& be, const Limits& lim) : be_(be), lim_(lim) {}
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // A new client of user `uid` (SO_PEERCRED on Linux, the audit token's uid on macOS):
  // quota_device when the device's clients are attached, quota_user_clients when the user's are.
  Status attach(Client* c, void* host, uint32_t uid = 0);
  // Releases every object the client owns (dependents first) and its client slot. Returns the
  // number of backend destroy calls that failed (their objects are dropped anyway).
  uint32_t detach(Client& c);

  Reply handle(Client& c, uint32_t selector, const void* in, uint32_t in_len, void* out, uint32_t out_cap);

  // Mapping lookup for the platform (CopyClientMemoryForType / the daemon's fd passing): the
  // region behind `map_type(kind, token)` of this client, or status bad_handle / invalid.
  Status mapping(Client& c, uint32_t memory_type, MapRegion* out);

  // Events from the device, tagged as the backend was told at creation (CqSpec::event_tag ...). The
  // backend binds an event to the tag live when the device posted it; a tag whose client has left
  // (even if its slot has a new client) or whose object is gone (even if its slot has a new one)
  // names nothing, and the event is dropped.
  void deliver_completion(uint64_t tag);
  void deliver_async(uint64_t tag, uint32_t ibv_event_type);
  // A device event (port active/down, fatal): to every open client, with handle 0.
  void deliver_device(uint32_t ibv_event_type);

  // Told when an event is queued for an armed client (the daemon wakes the client's event fd, the
  // DEXT sends its notification port a message).
  void set_notify(EventNotify* n) { notify_ = n; }

  // Objects of a type across all clients / for one client.
  uint32_t live(ObjType t) const { return dev_count_[uint8_t(t)]; }
  uint32_t clients() const { return nclients_; }
  const ServerStats& stats() const { return stats_; }
  const Limits& limits() const { return lim_; }

  // Event tags: the client's attach serial, its id and the object's token (with its generation).
  // Exposed for backends and tests.
  static uint64_t tag_of(const Client& c, uint32_t token) { return uint64_t(c.serial) << 32 | c.id << 24 | token; }

 private:
  Reply dispatch(Client& c, Selector s, const void* in, void* out);
  Client* client_of(uint64_t tag);
  Status open(Client& c, const OpenReq& rq, OpenResp* rp);
  Status alloc_pd(Client& c, HandleResp* rp);
  Status alloc_uar(Client& c, UarResp* rp);
  Status reg_mr(Client& c, const RegMrReq& rq, RegMrResp* rp);
  Status create_cq(Client& c, const CreateCqReq& rq, CreateCqResp* rp);
  Status resize_cq(Client& c, const ResizeCqReq& rq, ResizeCqResp* rp);
  Status create_srq(Client& c, const CreateSrqReq& rq, CreateSrqResp* rp);
  Status modify_srq(Client& c, const ModifySrqReq& rq);
  Status create_qp(Client& c, const CreateQpReq& rq, CreateQpResp* rp);
  Status modify_qp(Client& c, const ModifyQpReq& rq);
  Status query_qp(Client& c, const HandleReq& rq, QpAttr* rp);
  Status create_ah(Client& c, const CreateAhReq& rq, CreateAhResp* rp);
  Status destroy(Client& c, ObjType t, const HandleReq& rq);
  Status map(Client& c, const MapReq& rq, MapResp* rp);
  Status get_event(Client& c, EventResp* rp);
  Status check_av(const AddressReq& av) const;

  // Handle table.
  Entry* lookup(Client& c, uint32_t token, ObjType t);
  Status reserve(Client& c, ObjType t, uint32_t* slot);  // quotas; no state change
  Status afford(const Client& c, uint64_t queue_bytes, uint64_t pinned_bytes) const;  // byte quotas
  uint32_t commit(Client& c, ObjType t, uint32_t slot, void* obj, const uint32_t* parents, uint32_t nparents,
                  uint64_t queue_bytes = 0, uint64_t pinned_bytes = 0);
  void release(Client& c, ObjType t, uint32_t slot);
  Status backend_destroy(ObjType t, void* obj);
  uint32_t release_all(Client& c);
  void push_event(Client& c, const EventResp& e);

  Backend& be_;
  Limits lim_;
  Client* clients_[kMaxClients] = {};
  uint32_t nclients_ = 0;
  uint32_t serial_ = 0;
  uint32_t dev_count_[kObjTypes] = {};
  // Users with attached clients (at most one per client).
  struct User {
    uint32_t uid = 0, clients = 0;
    uint64_t queue_bytes = 0, pinned_bytes = 0;
  };
  User users_[kMaxClients];
  uint64_t queue_bytes_ = 0, pinned_bytes_ = 0;
  uint32_t gsi_ports_ = 0;  // bit p: port p's QP1 has an owner
  ServerStats stats_;
  EventNotify* notify_ = nullptr;
};

}  // namespace melon::uapi
