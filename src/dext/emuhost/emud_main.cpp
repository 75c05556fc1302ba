// melon-emud [--socket PATH] [--wire ADDR] [--clients N] [--clients-per-user N] [--queue-mib C,U,D] [--pinned-mib C,U,D] [--socket-mode OCTAL] [--spin-us N] [--ack-hold-us N] [--no-gso] [--verbose] [--diagnostics]
#include <inttypes.h>
#ifdef __linux__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dext/emuhost/emud.h"
#include "uapi/socket/protocol.h"

int main(int argc, char** argv) {
#ifdef __linux__
  // The data path allocates and frees a frame and a staging buffer per packet on two threads. With
  // glibc's default trim threshold each thread's arena gave those pages back (madvise) and faulted
  // them in again on the next window: a tenth of the daemon's CPU under ib_write_bw. Keep them.
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
  melon::dext::EmudOptions opt;
  const char* env = getenv("MELON_EMUD_SOCKET");
  opt.socket = env ? env : melon::uapi::kDefaultSocket;
  for (int i = 1; i < argc; i++) {
    auto arg = [&](const char* name) { return !strcmp(argv[i], name) && i + 1 < argc; };
    if (arg("--socket"))
      opt.socket = argv[++i];
    else if (arg("--wire"))
      opt.wire = argv[++i];
    else if (arg("--clients"))
      opt.clients = uint32_t(atoi(argv[++i]));
    else if (arg("--clients-per-user"))
      opt.clients_per_user = uint32_t(atoi(argv[++i]));
    else if (arg("--queue-mib") || arg("--pinned-mib")) {
      uint64_t* v = !strcmp(argv[i], "--queue-mib") ? opt.queue_mib : opt.pinned_mib;
      if (sscanf(argv[++i], "%" SCNu64 ",%" SCNu64 ",%" SCNu64, &v[0], &v[1], &v[2]) != 3) {
        fprintf(stderr, "melon-emud: %s takes CLIENT,USER,DEVICE in MiB\n", argv[i - 1]);
        return melon::dext::kEmudUsage;
      }
    } else if (arg("--socket-mode"))
      opt.socket_mode = uint32_t(strtoul(argv[++i], nullptr, 8)) & 0777;
    else if (arg("--spin-us"))
      opt.spin_us = uint32_t(atoi(argv[++i]));
    else if (arg("--ack-hold-us"))
      opt.ack_hold_us = uint32_t(atoi(argv[++i]));
    else if (!strcmp(argv[i], "--no-gso"))
      opt.gso = false;
    else if (!strcmp(argv[i], "--verbose"))
      opt.verbose = true;
    else if (!strcmp(argv[i], "--diagnostics"))
      opt.diagnostics = true;
    else {
      fprintf(stderr,
              "usage: melon-emud [--socket PATH] [--wire ADDR] [--clients N] [--clients-per-user N] [--queue-mib "
              "C,U,D] [--pinned-mib C,U,D] [--socket-mode OCTAL] [--spin-us N] [--ack-hold-us N] [--no-gso] "
              "[--verbose] [--diagnostics]\n");
      return melon::dext::kEmudUsage;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { melon::dext::stop_emud(); };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::string why;
  int rc = melon::dext::run_emud(opt, &why);
  if (rc != 0) fprintf(stderr, "melon-emud: %s\n", why.c_str());
  return rc;
}
