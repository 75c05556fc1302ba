// Soft provider: the operating system's random source.
#include "providers/soft/random.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdio>

#if defined(__linux__)
#include <sys/random.h>
#endif

namespace melon::soft {

void random_bytes(void* buf, size_t len) {
#if defined(__linux__)
  auto* p = static_cast<unsigned char*>(buf);
  while (len) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // No entropy source is no way to hand out keys: stop rather than hand out guessable ones.
      std::perror("melondma soft: getrandom");
      abort();
    }
    p += n;
    len -= size_t(n);
  }
#else
  arc4random_buf(buf, len);
#endif
}

uint32_t random_u32() {
  uint32_t v;
  random_bytes(&v, sizeof v);
  return v;
}

}  // namespace melon::soft
