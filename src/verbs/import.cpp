// The command descriptor of a context (ibv_context::cmd_fd) and context import.
//
// rdma-core's cmd_fd is the open uverbs device: applications dup() it, hand it to another part of
// the process (or another process) and ibv_import_device() it there, getting a second context on
// the same kernel state. Ours is the read end of a pipe nobody writes to: a real descriptor that can
// be dup()ed, polled and passed on, which identifies the context's shared state by its inode.
// ibv_import_device() on any descriptor of that pipe returns a new context that shares the provider
// context of the original: objects made through either work with both, and the provider context
// lives until the last of them is closed. PDs and MRs import by handle (below); device memory
// does not (EOPNOTSUPP).
#include "verbs/internal.h"

#include <sys/stat.h>

#include <cstring>
#include <map>
#include <utility>

namespace melon::verbs {

// One provider context and every context that shares it (the original and its imports).
struct ContextShare {
  ContextBase* owner = nullptr;  // the provider's context object; freed with the last reference
  int refs = 1;
  std::pair<dev_t, ino_t> key{};
};

namespace {

std::mutex g_mu;
std::map<std::pair<dev_t, ino_t>, ContextShare*>& shares() {
  static auto* m = new std::map<std::pair<dev_t, ino_t>, ContextShare*>;  // outlives static destructors
  return *m;
}

bool fd_key(int fd, std::pair<dev_t, ino_t>* key) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  *key = {st.st_dev, st.st_ino};
  return true;
}

// An imported context: the library's own object, forwarding to the owner's provider context.
struct ImportedContext : ContextBase {};

}  // namespace

int open_command_fd(ContextBase* base) {
  int p[2];
  if (pipe(p) != 0) return errno;
  ::close(p[1]);  // nothing is ever written: reads see end-of-file, poll() sees a hang-up
  fcntl(p[0], F_SETFD, FD_CLOEXEC);
  auto* share = new (std::nothrow) ContextShare;
  if (!share || !fd_key(p[0], &share->key)) {
    int rc = share ? errno : ENOMEM;
    delete share;
    ::close(p[0]);
    return rc;
  }
  share->owner = base;
  base->share = share;
  base->vctx.context.cmd_fd = p[0];
  std::lock_guard<std::mutex> lock(g_mu);
  shares()[share->key] = share;
  return 0;
}

bool release_context(ContextBase* base) {
  ContextShare* share = base->share;
  int fd = base->vctx.context.cmd_fd;
  bool last = true;
  if (share) {
    std::lock_guard<std::mutex> lock(g_mu);
    last = --share->refs == 0;
    if (last) shares().erase(share->key);
  }
  if (fd >= 0) ::close(fd);
  base->vctx.context.cmd_fd = -1;
  if (share && base != share->owner) {
    pthread_mutex_destroy(&base->vctx.context.mutex);
    delete static_cast<ImportedContext*>(base);
  }
  if (!last) return false;
  if (share) share->owner->share = nullptr;
  delete share;
  return true;
}

}  // namespace melon::verbs

using namespace melon::verbs;

MELON_EXPORT ibv_context* ibv_import_device(int cmd_fd) {
  std::pair<dev_t, ino_t> key;
  if (!fd_key(cmd_fd, &key)) return nullptr;  // errno from fstat: EBADF
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = shares().find(key);
  if (it == shares().end()) {
    errno = EINVAL;  // a descriptor, but not the command descriptor of a context of this process
    return nullptr;
  }
  ContextShare* share = it->second;
  auto* imp = new (std::nothrow) ImportedContext;
  if (!imp) {
    errno = ENOMEM;
    return nullptr;
  }
  ContextBase* owner = share->owner;
  // The same ops, slots and async queue as the original; its own mutex and command descriptor
  // (ownership of cmd_fd passes to the new context, as in rdma-core: ibv_close_device closes it).
  std::memcpy(static_cast<void*>(&imp->vctx), &owner->vctx, sizeof(imp->vctx));
  pthread_mutex_init(&imp->vctx.context.mutex, nullptr);
  imp->vctx.context.cmd_fd = cmd_fd;
  imp->ops = owner->ops;
  imp->device = owner->device;
  imp->async = owner->async;
  imp->share = share;
  share->refs++;
  return imp->ibv();
}

// PDs and MRs by handle: the provider makes a new object naming the one with that handle in the
// shared provider context (any context sharing it may have made it); unimport frees only that
// object. Device memory has no importable form (EOPNOTSUPP); a missing context or PD is EINVAL.
MELON_EXPORT ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  if (!context) {
    errno = EINVAL;
    return nullptr;
  }
  return no_throw([&] { return ContextBase::from(context)->ops->import_pd(pd_handle); });
}
MELON_EXPORT ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (!pd) {
    errno = EINVAL;
    return nullptr;
  }
  return no_throw([&] { return ContextBase::from(pd->context)->ops->import_mr(pd, mr_handle); });
}
MELON_EXPORT ibv_dm* ibv_import_dm(ibv_context* context, uint32_t) {
  errno = context ? EOPNOTSUPP : EINVAL;
  return nullptr;
}
MELON_EXPORT void ibv_unimport_pd(ibv_pd* pd) {
  if (pd) ContextBase::from(pd->context)->ops->unimport_pd(pd);
}
MELON_EXPORT void ibv_unimport_mr(ibv_mr* mr) {
  if (mr) ContextBase::from(mr->context)->ops->unimport_mr(mr);
}
MELON_EXPORT void ibv_unimport_dm(ibv_dm*) {}  // nothing can have been imported
