#include "dext/emuhost/socket_request.h"

#include <string.h>

namespace melon::dext {

SocketAnswer answer_request(uapi::Server& srv, uapi::Client* client, uapi::Status refused, const uint8_t* req,
                            size_t len, int event_fd, uint8_t* body) {
  SocketAnswer a;
  if (len < sizeof(uapi::SocketRequest) || len > uapi::kMaxSocketMessage) {
    a.reply.status = uint32_t(uapi::Status::truncated);
    return a;
  }
  if (!client) {
    a.reply.status = uint32_t(refused);
    return a;
  }
  uapi::SocketRequest rq;
  memcpy(&rq, req, sizeof rq);
  uint32_t cap = rq.out_cap < kMaxSocketBody ? rq.out_cap : kMaxSocketBody;
  uint32_t in_len = uint32_t(len - sizeof rq);
  const uint8_t* in = in_len ? req + sizeof rq : nullptr;
  uapi::Reply r = srv.handle(*client, rq.selector, in, in_len, body, cap);
  a.reply.status = uint32_t(r.status);
  a.reply.out_len = r.out_len;
  if (r.status == uapi::Status::ok && rq.selector == uint32_t(uapi::Selector::map)) {
    // The answer names no fd (map shows no host object); the region behind it does.
    uapi::MapReq mq{};
    memcpy(&mq, in, in_len < sizeof mq ? in_len : sizeof mq);
    uapi::MapRegion region;
    if (srv.mapping(*client, uapi::map_type(uapi::MapKind(mq.kind), mq.handle), &region) == uapi::Status::ok)
      a.pass_fd = int(region.memory);
  } else if (r.status == uapi::Status::ok && rq.selector == uint32_t(uapi::Selector::open)) {
    a.pass_fd = event_fd;
    a.took_memory = true;
  }
  a.reply.has_fd = a.pass_fd >= 0;
  return a;
}

}  // namespace melon::dext
