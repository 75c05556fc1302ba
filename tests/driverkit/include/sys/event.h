// Stand-in: the kqueue calls of Apple's <sys/event.h> the IOKit transport makes, with Apple's
// values. Only the stand-in build sees this file (Linux has no <sys/event.h>; the macOS cross build
// finds Apple's first, the stand-in folder being searched after the system's). The fake
// (tests/driverkit/fake/fake_mach.cpp) waits on EVFILT_READ descriptors and on the fake's mach
// ports with poll().
#pragma once

#include <stdint.h>
#include <time.h>

struct kevent {
  uintptr_t ident;
  int16_t filter;
  uint16_t flags;
  uint32_t fflags;
  intptr_t data;
  void* udata;
};

#define EVFILT_READ (-1)
#define EVFILT_MACHPORT (-8)
#define EV_ADD 0x0001
#define EV_DELETE 0x0002
#define EV_ENABLE 0x0004
#define EV_ERROR 0x4000

#define EV_SET(kevp, a, b, c, d, e, f) \
  do {                                 \
    struct kevent* __kevp = (kevp);    \
    __kevp->ident = (a);               \
    __kevp->filter = (b);              \
    __kevp->flags = (c);               \
    __kevp->fflags = (d);              \
    __kevp->data = (e);                \
    __kevp->udata = (f);               \
  } while (0)

#ifdef __cplusplus
extern "C" {
#endif
int kqueue(void);
int kevent(int kq, const struct kevent* changelist, int nchanges, struct kevent* eventlist, int nevents,
           const struct timespec* timeout);
#ifdef __cplusplus
}
#endif
