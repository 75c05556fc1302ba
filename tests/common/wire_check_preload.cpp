// Preloaded into a stock tool (LD_PRELOAD) that runs on our soft provider: every datagram the
// provider hands the kernel through sendmmsg() is judged by datagram_oracle.h (one RoCE packet, its
// ICRC right), then sent. At exit the process appends one line to $MELON_WIRE_CHECK_LOG:
//   wire-check pid <pid>: datagrams <n> gso_sends <g> bad <b>
// and before it, a line for each of the first bad datagrams. The stock tests read it (issue 19: no
// datagram ever holds two packets, for any workload they run).
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "common/datagram_oracle.h"

namespace {

std::atomic<uint64_t> g_datagrams{0}, g_gso_sends{0}, g_bad{0};
std::mutex g_log_mu;

// One line "wire-check pid <pid>: <text>" appended to the log.
void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_line(const char* fmt, ...) {
  const char* path = getenv("MELON_WIRE_CHECK_LOG");
  if (!path) return;
  std::lock_guard<std::mutex> g(g_log_mu);
  FILE* f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "wire-check pid %d: ", int(getpid()));
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

void judge(int fd, const msghdr& h) {
  const std::vector<melon::test::Datagram> ds = melon::test::kernel_datagrams(fd, h);
  if (ds.size() > 1) g_gso_sends++;
  for (const auto& d : ds) {
    if (d.dport != 4791) continue;  // not RoCE (the tools' own TCP goes through send/write)
    g_datagrams++;
    const std::string why = melon::test::check_datagram(d, 0);
    if (!why.empty() && g_bad++ < 10)
      log_line("bad datagram: %s (piece %u of a send with UDP_SEGMENT %u)", why.c_str(), unsigned(d.id),
               unsigned(d.seg));
  }
}

struct Summary {
  ~Summary() {
    if (!g_datagrams.load()) return;  // a process that sent no RoCE (timeout, ss, ...)
    log_line("datagrams %llu gso_sends %llu bad %llu", (unsigned long long)g_datagrams.load(),
             (unsigned long long)g_gso_sends.load(), (unsigned long long)g_bad.load());
  }
} g_summary;

}  // namespace

extern "C" int sendmmsg(int fd, struct mmsghdr* v, unsigned n, int flags) {
  static auto real = reinterpret_cast<int (*)(int, struct mmsghdr*, unsigned, int)>(dlsym(RTLD_NEXT, "sendmmsg"));
  return melon::test::send_snapshot(real, fd, v, n, flags, judge);
}
