// Fuzzes melon-emud's socket protocol (uapi/socket/protocol.h) as the daemon answers it
// (dext::answer_request, the code its socket loop runs): a run is a sequence of datagrams from up
// to three connections, one of them refused at attach, each (connection, length, bytes) with the
// selector and handles steered toward known ones. Invariants: every reply has a known status, a
// body no longer than the client offered or the datagram holds (none unless ok), and passes a
// descriptor only for a Map or Open that succeeded: the mapping's own memory or the connection's
// event fd; once every client is detached, nothing is left alive in the server or the backend.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cstdlib>
#include <vector>

#include "dext/emuhost/socket_request.h"
#include "uapi/recording_backend.h"
#include "uapi/server.h"

using namespace melon;
using uapi::Selector;
using uapi::Status;

namespace {

constexpr uint32_t kSelectors[] = {
#define MELON_FUZZ_SEL(name, value, req, resp) value,
    MELON_UAPI_SELECTORS(MELON_FUZZ_SEL)
#undef MELON_FUZZ_SEL
};

void check(bool ok) {
  if (!ok) abort();
}

}  // namespace

// One server for every run (its clients are attached at the start of a run and detached at the
// end, which leaves it as new): the socket layer is cheap, and a million runs fit CI's smoke budget.
struct World {
  uapi::test::RecordingBackend be;
  uapi::Limits lim;
  uapi::Server srv{be, lim};
  uapi::Client clients[2];
};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* w = new World;
  uapi::test::RecordingBackend& be = w->be;
  uapi::Server& srv = w->srv;
  uapi::Client* clients = w->clients;
  be.calls.clear();
  be.forget_dead();
  for (int i = 0; i < 2; i++) check(srv.attach(&clients[i], nullptr, 1000) == Status::ok);
  constexpr int kEventFd[3] = {41, 42, 43};  // stand-ins: only compared, never used
  std::vector<uint32_t> handles;
  uint8_t dgram[uapi::kMaxSocketMessage + 16];
  uint8_t body[dext::kMaxSocketBody];

  size_t pos = 0;
  while (pos + 3 <= size) {
    uint8_t who = data[pos] % 3;
    size_t len = size_t(data[pos + 1]) | size_t(data[pos + 2] & 0x1f) << 8;  // up to 8 KiB: past the maximum
    pos += 3;
    size_t n = len > size - pos ? size - pos : len;
    size_t take = n < uapi::kMaxSocketMessage ? n : uapi::kMaxSocketMessage;
    memcpy(dgram, data + pos, take);
    memset(dgram + take, 0, 16);  // MapReq past a short request reads as zero, as the daemon's buffer
    pos += n;
    // Steering: a selector byte below 0xf0 picks a known selector; 0xfe 0xNN at a body dword puts a
    // handle an earlier answer gave there.
    if (take >= 4 && dgram[3] == 0) {
      uint32_t sel = dgram[0] < 0xf0 ? kSelectors[dgram[0] % (sizeof(kSelectors) / 4)] : 0x1000u + dgram[0];
      memcpy(dgram, &sel, 4);
    }
    for (size_t off = sizeof(uapi::SocketRequest); off + 4 <= take && off < 40; off += 4)
      if (dgram[off] == 0xfe && !handles.empty()) {
        uint32_t h = handles[dgram[off + 1] % handles.size()];
        memcpy(dgram + off, &h, 4);
      }
    uapi::SocketRequest rq{};
    memcpy(&rq, dgram, take < sizeof rq ? take : sizeof rq);
    uapi::Client* c = who < 2 ? &clients[who] : nullptr;  // connection 2 was refused at attach
    if (take >= sizeof rq && rq.out_cap < dext::kMaxSocketBody) body[rq.out_cap] = 0xcc;
    dext::SocketAnswer a = dext::answer_request(srv, c, Status::quota_user_clients, dgram, n, kEventFd[who], body);
    const uapi::SocketReply& rp = a.reply;
    check(rp.status < uapi::kStatusCount);
    check(rp.out_len <= dext::kMaxSocketBody);
    check(take < sizeof(uapi::SocketRequest) || rp.out_len <= rq.out_cap);
    if (rp.status != uint32_t(Status::ok)) check(rp.out_len == 0 && a.pass_fd < 0 && !a.took_memory);
    if (take >= sizeof rq && rq.out_cap < dext::kMaxSocketBody) check(body[rq.out_cap] == 0xcc);  // not past the cap
    check(bool(rp.has_fd) == (a.pass_fd >= 0));
    if (!c) check(rp.status == uint32_t(Status::quota_user_clients) || rp.status == uint32_t(Status::truncated));
    if (a.pass_fd >= 0) {
      check(rp.status == uint32_t(Status::ok));
      if (rq.selector == uint32_t(Selector::open)) {
        check(a.pass_fd == kEventFd[who] && a.took_memory);
      } else {
        check(rq.selector == uint32_t(Selector::map) && !a.took_memory);
        uapi::MapReq mq{};
        memcpy(&mq, dgram + sizeof rq, sizeof mq);
        uapi::MapRegion region;
        check(srv.mapping(*c, uapi::map_type(uapi::MapKind(mq.kind), mq.handle), &region) == Status::ok);
        check(a.pass_fd == int(region.memory));
        uapi::MapResp m;
        memcpy(&m, body, sizeof m);
        check(m.memory == 0);  // the answer itself names no host object
      }
    }
    if (rp.status == uint32_t(Status::ok) && rp.out_len >= 4) {
      uint32_t h;
      memcpy(&h, body, 4);
      if (h && handles.size() < 64) handles.push_back(h);
    }
  }
  for (int i = 0; i < 2; i++) srv.detach(clients[i]);
  check(be.live_total() == 0);
  check(be.violations.empty());
  check(srv.clients() == 0);
  for (uint32_t t = 0; t < uapi::kObjTypes; t++) check(srv.live(uapi::ObjType(t)) == 0);
  return 0;
}
