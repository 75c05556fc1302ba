#include "providers/soft/setsockopt_spy.h"

#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace {

std::mutex g_mu;
std::set<std::pair<int, int>> g_seen;  // (level, name) of every call
std::map<std::pair<int, int>, int> g_fail;  // these fail with the errno given
int g_rcvbuf = 0;

}  // namespace

extern "C" int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  using Fn = int (*)(int, int, int, const void*, socklen_t);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "setsockopt"));
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_seen.insert({level, name});
    if (auto it = g_fail.find({level, name}); it != g_fail.end()) {
      errno = it->second;
      return -1;
    }
    if (level == SOL_SOCKET && name == SO_RCVBUF && g_rcvbuf) return real(fd, level, name, &g_rcvbuf, sizeof g_rcvbuf);
  }
  return real(fd, level, name, val, len);
}

namespace melon::test {

void sockopt_reset() {
  std::lock_guard<std::mutex> g(g_mu);
  g_seen.clear();
  g_fail.clear();
  g_rcvbuf = 0;
}
void sockopt_fail(int level, int name, int err) {
  std::lock_guard<std::mutex> g(g_mu);
  g_fail[{level, name}] = err;
}
bool sockopt_seen(int level, int name) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_seen.count({level, name}) > 0;
}
void sockopt_rcvbuf(int bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  g_rcvbuf = bytes;
}

}  // namespace melon::test
