// A deliberate Linux-only call in a Mac build: the undefined-symbol check must refuse this object's
// dylib (macos_cross runs it first, so a check that passes everything fails the test).
#include <stddef.h>

struct mmsghdr;
int recvmmsg(int fd, struct mmsghdr* msgs, unsigned n, int flags, void* timeout);

int melon_fixture_batch(int fd) { return recvmmsg(fd, NULL, 0, 0, NULL); }
