// Fuzzes the user-client server's request decoder (the trust boundary): a run is a sequence of
// requests from up to three clients, each (client, selector, request length, response capacity,
// bytes). Selectors and handles are steered toward known ones so validation past the size checks is
// reached. Invariants: every answer carries a known status and writes no more than the capacity
// (nothing unless ok); the backend never sees a destroy with live dependents or of a dead object;
// once every client is detached, nothing is left alive in the server or the backend.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "uapi/recording_backend.h"
#include "uapi/server.h"

using namespace melon::uapi;

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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  test::RecordingBackend be;
  Limits lim;
  lim.device.qp = 40;  // reachable device quotas
  lim.device.mr = 100;
  Server srv(be, lim);
  auto clients = std::make_unique<Client[]>(3);
  for (int i = 0; i < 3; i++) check(srv.attach(&clients[i], nullptr) == Status::ok);
  std::vector<uint32_t> handles;  // answers' first dwords, reused as handles

  size_t pos = 0;
  while (pos + 4 <= size) {
    uint8_t who = data[pos] % 3, sel = data[pos + 1], len = data[pos + 2], cap = data[pos + 3];
    pos += 4;
    uint32_t selector = sel < 0xf0 ? kSelectors[sel % (sizeof(kSelectors) / 4)] : 0x1000u + sel;
    uint32_t n = len > size - pos ? uint32_t(size - pos) : len;
    uint8_t in[256] = {};
    memcpy(in, data + pos, n);
    pos += n;
    // Bytes 0xfe 0xNN at the start of the request: replace the first dword with a known handle.
    if (n >= 4 && in[0] == 0xfe && !handles.empty()) {
      uint32_t h = handles[in[1] % handles.size()];
      memcpy(in, &h, 4);
    }
    if (n >= 8 && in[4] == 0xfe && !handles.empty()) {
      uint32_t h = handles[in[5] % handles.size()];
      memcpy(in + 4, &h, 4);
    }
    uint8_t out[256];
    memset(out, 0xa5, sizeof(out));
    uint32_t out_cap = cap % 200;
    Reply r = srv.handle(clients[who], selector, n ? in : nullptr, n, out, out_cap);
    check(uint32_t(r.status) < kStatusCount);
    check(r.out_len <= out_cap);
    if (r.status != Status::ok) check(r.out_len == 0);
    for (uint32_t i = r.out_len; i < sizeof(out); i++) check(out[i] == 0xa5);
    if (r.status == Status::ok && r.out_len >= 4) {
      uint32_t h;
      memcpy(&h, out, 4);
      if (h && h <= 0xffffff) handles.push_back(h);
    }
    if (data[pos - 1] == 0xee)
      srv.deliver_completion(Server::tag_of(clients[who], handles.empty() ? 0 : handles.back()));
  }
  for (int i = 0; i < 3; i++) srv.detach(clients[i]);
  check(be.violations.empty());
  check(be.live_total() == 0);
  for (uint32_t t = 1; t < kObjTypes; t++) check(srv.live(ObjType(t)) == 0);
  check(srv.clients() == 0);
  return 0;
}
