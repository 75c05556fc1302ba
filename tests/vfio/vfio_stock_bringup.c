/* rdma-core's userspace VFIO driver (mlx5_vfio.c inside Debian's stock libmlx5.so.1) brings up the
 * emulated ConnectX function that tests/vfio's interposer presents, and this program drives it
 * through the public API only: mlx5dv_get_vfio_device_list, ibv_open_device (the whole bring-up:
 * firmware wait, ENABLE_HCA, ISSI, boot/init pages, HCA caps, INIT_HCA, command EQ, RoCE on the
 * vport), PD, MR, DEVX general commands, the event path and a DEVX EQ on an MSI-X vector.
 *
 * Usage: vfio_stock_bringup <pci-name> [--open-only | --pd-refused | --events <seconds>]
 *   --pd-refused     ALLOC_PD is made to fail once (MELON_VFIO_FAULTS=bad_status=800:...): the
 *                    driver must report it and the next ALLOC_PD must work
 *   --events <s>     after bring-up only run the event path (and a PD now and then) for s seconds:
 *                    what the driver does when a fault is armed meanwhile (tests/vfio/oracle_faults.sh)
 * Command layouts come from the kernel's mlx5_ifc.h through rdma-core's DEVX_SET/DEVX_GET (the same
 * second encoder tests/mlx5/prm uses), not from src/mlx5/prm.
 * Exit: 0 pass, 1 fail, 77 skip (the stock libraries are not the ones loaded). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
#include <mlx5_ifc.h>

/* Kernel-only constants (include/linux/mlx5/device.h and driver.h, not includable here). */
#define MELON_REG_PAOS 0x5006 /* driver.h MELON_REG_PAOS */
#define MELON_EVENT_PORT_CHANGE 0x09 /* device.h MELON_EVENT_PORT_CHANGE */
#define MELON_CAP_ROCE 4 /* device.h MELON_CAP_ROCE */
#define MELON_STAT_BAD_OP 0x02 /* device.h MELON_STAT_BAD_OP */

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)
#define REQUIRE(cond, ...)    \
  do {                        \
    CHECK(cond, __VA_ARGS__); \
    if (!(cond)) return 1;    \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The library a symbol was found in: must be Debian's, not this build's. */
static int stock(void* sym, const char* what) {
  Dl_info info;
  if (!dladdr(sym, &info) || !info.dli_fname) {
    fprintf(stderr, "cannot tell where %s comes from\n", what);
    return 0;
  }
  char real[4096];
  if (!realpath(info.dli_fname, real)) snprintf(real, sizeof real, "%s", info.dli_fname);
  printf("%s from %s\n", what, real);
  return strncmp(real, "/usr/lib/", 9) == 0;
}

static int query_cap(struct ibv_context* ctx, int type, int mode, void* out, size_t outlen) {
  uint32_t in[DEVX_ST_SZ_DW(query_hca_cap_in)] = {0};
  DEVX_SET(query_hca_cap_in, in, opcode, MLX5_CMD_OP_QUERY_HCA_CAP);
  DEVX_SET(query_hca_cap_in, in, op_mod, (type << 1) | mode);
  memset(out, 0, outlen);
  int err = mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, outlen);
  if (err) return err;
  return DEVX_GET(query_hca_cap_out, out, status);
}

static int regular_pages_owed(struct ibv_context* ctx, int* npages) {
  uint32_t in[DEVX_ST_SZ_DW(query_pages_in)] = {0}, out[DEVX_ST_SZ_DW(query_pages_out)] = {0};
  DEVX_SET(query_pages_in, in, opcode, MLX5_CMD_OP_QUERY_PAGES);
  DEVX_SET(query_pages_in, in, op_mod, 0x3); /* MLX5_REGULAR_PAGES */
  int err = mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, sizeof out);
  if (err) return err;
  *npages = (int)DEVX_GET(query_pages_out, out, num_pages);
  return DEVX_GET(query_pages_out, out, status);
}

static int paos(struct ibv_context* ctx, int write, int admin, int* oper) {
  uint32_t in[DEVX_ST_SZ_DW(access_register_in) + DEVX_ST_SZ_DW(paos_reg)] = {0};
  uint32_t out[DEVX_ST_SZ_DW(access_register_out) + DEVX_ST_SZ_DW(paos_reg)] = {0};
  DEVX_SET(access_register_in, in, opcode, MLX5_CMD_OP_ACCESS_REG);
  DEVX_SET(access_register_in, in, op_mod, write ? 0 : 1);
  DEVX_SET(access_register_in, in, register_id, MELON_REG_PAOS);
  void* reg = DEVX_ADDR_OF(access_register_in, in, register_data);
  DEVX_SET(paos_reg, reg, local_port, 1);
  if (write) {
    DEVX_SET(paos_reg, reg, admin_status, admin);
    DEVX_SET(paos_reg, reg, ase, 1);
  }
  int err = mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, sizeof out);
  if (err) return err;
  if (oper) *oper = DEVX_GET(paos_reg, DEVX_ADDR_OF(access_register_out, out, register_data), oper_status);
  return DEVX_GET(access_register_out, out, status);
}

/* Runs the event path until `done` or the deadline: poll the events fd, then process_events. */
static int pump_events(struct ibv_context* ctx, int fd, double seconds, int (*done)(struct ibv_context*)) {
  double end = now_s() + seconds;
  while (now_s() < end) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, 20);
    if (n > 0) {
      int err = mlx5dv_vfio_process_events(ctx);
      if (err) return err;
    }
    if (done && done(ctx)) return 0;
  }
  return done ? ETIMEDOUT : 0;
}

static int no_pages_owed(struct ibv_context* ctx) {
  int n = -1;
  return regular_pages_owed(ctx, &n) == 0 && n == 0;
}

/* An EQ of the caller's on its own MSI-X vector, taking PORT_CHANGE events, as rdma-core's
 * test_mlx5vfio_async_event builds it. Returns 0 when a port change event arrived through it. */
static int port_change_through_devx_eq(struct ibv_context* ctx, int events_fd) {
  struct mlx5dv_devx_msi_vector* msi = mlx5dv_devx_alloc_msi_vector(ctx);
  REQUIRE(msi, "alloc_msi_vector: %s", strerror(errno));
  struct mlx5dv_devx_uar* uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC);
  REQUIRE(uar, "alloc_uar: %s", strerror(errno));
  uint32_t in[DEVX_ST_SZ_DW(create_eq_in)] = {0}, out[DEVX_ST_SZ_DW(create_eq_out)] = {0};
  DEVX_SET(create_eq_in, in, opcode, MLX5_CMD_OP_CREATE_EQ);
  DEVX_SET64(create_eq_in, in, event_bitmask[0], 1ull << MELON_EVENT_PORT_CHANGE);
  void* eqc = DEVX_ADDR_OF(create_eq_in, in, eq_context_entry);
  const int log_nent = 8;
  DEVX_SET(eqc, eqc, log_eq_size, log_nent);
  DEVX_SET(eqc, eqc, uar_page, uar->page_id);
  DEVX_SET(eqc, eqc, intr, msi->vector);
  struct mlx5dv_devx_eq* eq = mlx5dv_devx_create_eq(ctx, in, sizeof in, out, sizeof out);
  REQUIRE(eq, "devx_create_eq: %s (status 0x%x syndrome 0x%x)", strerror(errno), DEVX_GET(create_eq_out, out, status),
          DEVX_GET(create_eq_out, out, syndrome));
  uint32_t eqn = DEVX_GET(create_eq_out, out, eq_number);
  uint8_t* eqes = eq->vaddr;
  for (int i = 0; i < (1 << log_nent); ++i) eqes[i * 64 + 63] = 1; /* owner: hardware's first pass is 0 */
  volatile uint32_t* arm = (volatile uint32_t*)((uint8_t*)uar->base_addr + 0x40);
  *arm = htobe32(eqn << 24); /* arm at consumer index 0 */

  int oper = -1;
  REQUIRE(paos(ctx, 1, 2, NULL) == 0, "PAOS admin down");
  REQUIRE(paos(ctx, 1, 1, NULL) == 0, "PAOS admin up");
  double end = now_s() + 5;
  int got = 0;
  while (!got && now_s() < end) {
    struct pollfd p[2] = {{.fd = msi->fd, .events = POLLIN}, {.fd = events_fd, .events = POLLIN}};
    if (poll(p, 2, 20) <= 0) continue;
    if (p[1].revents & POLLIN) mlx5dv_vfio_process_events(ctx);
    if (p[0].revents & POLLIN) {
      uint64_t u;
      if (read(msi->fd, &u, sizeof u) != sizeof u) break;
      uint8_t* e = eqes; /* entry 0 */
      if ((e[63] & 1) == 0) {
        __sync_synchronize();
        got = e[1] == MELON_EVENT_PORT_CHANGE;
        printf("DEVX EQ %u: event 0x%x subtype 0x%x through MSI-X vector %d\n", eqn, e[1], e[3], msi->vector);
      }
    }
  }
  CHECK(got, "no PORT_CHANGE event through the DEVX EQ on vector %d", msi->vector);
  CHECK(paos(ctx, 0, 0, &oper) == 0 && oper == 1, "PAOS oper_status %d after admin up", oper);
  CHECK(mlx5dv_devx_destroy_eq(eq) == 0, "destroy_eq");
  mlx5dv_devx_free_uar(uar);
  CHECK(mlx5dv_devx_free_msi_vector(msi) == 0, "free_msi_vector");
  return got ? 0 : 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: %s <pci-name> [--open-only]\n", argv[0]);
    return 2;
  }
  int open_only = argc > 2 && strcmp(argv[2], "--open-only") == 0;
  int pd_refused = argc > 2 && strcmp(argv[2], "--pd-refused") == 0;
  double events_for = argc > 3 && strcmp(argv[2], "--events") == 0 ? atof(argv[3]) : 0;
  if (!stock((void*)mlx5dv_get_vfio_device_list, "mlx5dv_get_vfio_device_list") ||
      !stock((void*)ibv_alloc_pd, "ibv_alloc_pd")) {
    fprintf(stderr, "SKIP: the loader did not take Debian's stock libibverbs/libmlx5\n");
    return 77;
  }

  struct mlx5dv_vfio_context_attr attr = {.pci_name = argv[1]};
  struct ibv_device** list = mlx5dv_get_vfio_device_list(&attr);
  REQUIRE(list && list[0], "mlx5dv_get_vfio_device_list(%s): %s", argv[1], strerror(errno));
  printf("device %s\n", ibv_get_device_name(list[0]));
  double t0 = now_s();
  struct ibv_context* ctx = ibv_open_device(list[0]);
  REQUIRE(ctx, "ibv_open_device (mlx5_vfio bring-up): %s", strerror(errno));
  printf("bring-up done in %.1f ms\n", (now_s() - t0) * 1e3);
  if (open_only) {
    CHECK(ibv_close_device(ctx) == 0, "close");
    ibv_free_device_list(list);
    return failures ? 1 : 0;
  }
  int events_fd = mlx5dv_vfio_get_events_fd(ctx);
  REQUIRE(events_fd >= 0, "mlx5dv_vfio_get_events_fd");
  if (pd_refused) {
    errno = 0;
    struct ibv_pd* bad = ibv_alloc_pd(ctx);
    int e = errno;
    printf("ALLOC_PD with an injected bad status: %s, errno %d (%s)\n", bad ? "succeeded" : "refused", e, strerror(e));
    CHECK(!bad && e != 0, "a failed ALLOC_PD was not reported");
    struct ibv_pd* good = ibv_alloc_pd(ctx);
    CHECK(good, "ALLOC_PD after the one-shot failure: %s", strerror(errno));
    if (good) ibv_dealloc_pd(good);
    CHECK(ibv_close_device(ctx) == 0, "close");
    ibv_free_device_list(list);
    printf(failures ? "FAILED (%d)\n" : "PASS\n", failures);
    return failures ? 1 : 0;
  }
  if (events_for > 0) {
    double end = now_s() + events_for, next_pd = now_s() + 0.5;
    while (now_s() < end) {
      struct pollfd p = {.fd = events_fd, .events = POLLIN};
      poll(&p, 1, 50);
      int err = mlx5dv_vfio_process_events(ctx); /* also runs the driver's health poll */
      if (err) printf("process_events: %s\n", strerror(err));
      if (now_s() >= next_pd) {
        next_pd += 0.5;
        struct ibv_pd* pd = ibv_alloc_pd(ctx);
        printf("t+%.1fs ALLOC_PD %s\n", events_for - (end - now_s()), pd ? "ok" : strerror(errno));
        if (pd) ibv_dealloc_pd(pd);
      }
    }
    printf("survived %.0f s of events\n", events_for);
    return 0;
  }

  /* The regular page demand the device announces by PAGE_REQUEST once the command EQ takes it: the
   * driver satisfies it from mlx5dv_vfio_process_events (MANAGE_PAGES on its page slot). */
  CHECK(pump_events(ctx, events_fd, 5, no_pages_owed) == 0, "PAGE_REQUEST not satisfied through the event path");

  uint32_t cap_out[DEVX_ST_SZ_DW(query_hca_cap_out)];
  REQUIRE(query_cap(ctx, 0, 1, cap_out, sizeof cap_out) == 0, "QUERY_HCA_CAP general/cur");
  void* cap = DEVX_ADDR_OF(query_hca_cap_out, cap_out, capability);
  printf(
      "caps: port_type %u roce %u log_max_qp %u log_max_cq %u log_max_eq %u umem_uid_0 %u log_uar_page_sz %u "
      "num_ports %u\n",
      DEVX_GET(cmd_hca_cap, cap, port_type), DEVX_GET(cmd_hca_cap, cap, roce), DEVX_GET(cmd_hca_cap, cap, log_max_qp),
      DEVX_GET(cmd_hca_cap, cap, log_max_cq), DEVX_GET(cmd_hca_cap, cap, log_max_eq),
      DEVX_GET(cmd_hca_cap, cap, umem_uid_0), DEVX_GET(cmd_hca_cap, cap, log_uar_page_sz),
      DEVX_GET(cmd_hca_cap, cap, num_ports));
  CHECK(DEVX_GET(cmd_hca_cap, cap, cmdif_checksum) == 0, "cmdif_checksum not what SET_HCA_CAP asked (0)");
  CHECK(DEVX_GET(cmd_hca_cap, cap, log_uar_page_sz) == (unsigned)__builtin_ctz(sysconf(_SC_PAGESIZE)) - 12,
        "log_uar_page_sz not what SET_HCA_CAP asked");
  uint32_t roce_out[DEVX_ST_SZ_DW(query_hca_cap_out)];
  if (DEVX_GET(cmd_hca_cap, cap, roce)) {
    CHECK(query_cap(ctx, MELON_CAP_ROCE, 1, roce_out, sizeof roce_out) == 0, "QUERY_HCA_CAP roce/cur");
  }

  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  REQUIRE(pd, "ibv_alloc_pd: %s", strerror(errno));
  struct mlx5dv_obj obj = {0};
  struct mlx5dv_pd dvpd = {0};
  obj.pd.in = pd;
  obj.pd.out = &dvpd;
  CHECK(mlx5dv_init_obj(&obj, MLX5DV_OBJ_PD) == 0, "mlx5dv_init_obj(PD)");
  printf("pd %u\n", dvpd.pdn);

  size_t len = 1 << 20;
  void* buf = NULL;
  REQUIRE(posix_memalign(&buf, 4096, len) == 0, "memalign");
  memset(buf, 0x5a, len);
  struct ibv_mr* mr =
      ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
  printf("mr lkey 0x%x rkey 0x%x\n", mr->lkey, mr->rkey);
  /* An unaligned MR in the middle of a page, as applications register. */
  struct ibv_mr* mr2 = ibv_reg_mr(pd, (char*)buf + 100, 5000, IBV_ACCESS_LOCAL_WRITE);
  CHECK(mr2, "ibv_reg_mr (unaligned): %s", strerror(errno));

  /* QUERY_MKEY of the first one: the device holds what mlx5_vfio asked. */
  {
    uint32_t in[DEVX_ST_SZ_DW(query_mkey_in)] = {0}, out[DEVX_ST_SZ_DW(query_mkey_out)] = {0};
    DEVX_SET(query_mkey_in, in, opcode, MLX5_CMD_OP_QUERY_MKEY);
    DEVX_SET(query_mkey_in, in, mkey_index, mr->lkey >> 8);
    int err = mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, sizeof out);
    if (err == 0) {
      void* mkc = DEVX_ADDR_OF(query_mkey_out, out, memory_key_mkey_entry);
      CHECK(DEVX_GET64(mkc, mkc, len) == len, "QUERY_MKEY len %llu", (unsigned long long)DEVX_GET64(mkc, mkc, len));
      CHECK(DEVX_GET(mkc, mkc, pd) == dvpd.pdn, "QUERY_MKEY pd");
      CHECK(DEVX_GET(mkc, mkc, mkey_7_0) == (mr->lkey & 0xff), "QUERY_MKEY key byte");
    } else {
      printf("QUERY_MKEY: %s (status 0x%x syndrome 0x%x): not modelled\n", strerror(err),
             DEVX_GET(query_mkey_out, out, status), DEVX_GET(query_mkey_out, out, syndrome));
    }
  }

  /* A buffer across a 64 GiB boundary: mlx5_vfio's page for it spans 2^37 bytes, which it caps
   * at 2^31 (MLX5_MAX_PAGE_SHIFT), so the mkey has log_page_size 31 and two entries, the largest the
   * mkc's 5-bit field holds. Heap buffers land across such boundaries now and then (1 run in ~1000
   * of this program failed ibv_reg_mr with EINVAL while the emulator refused 31). */
  {
    const size_t span = 1 << 20;
    void* at = MAP_FAILED;
    for (uint64_t k = 1; k < 2048 && at == MAP_FAILED; ++k)
      at = mmap((void*)(uintptr_t)((k << 36) - span / 2), span, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    REQUIRE(at != MAP_FAILED, "no free address across a 64 GiB boundary");
    memset(at, 0x3c, span);
    struct ibv_mr* big = ibv_reg_mr(pd, at, span, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    CHECK(big, "ibv_reg_mr across %p's 64 GiB boundary: %s", at, strerror(errno));
    if (big) {
      uint32_t in[DEVX_ST_SZ_DW(query_mkey_in)] = {0}, out[DEVX_ST_SZ_DW(query_mkey_out)] = {0};
      DEVX_SET(query_mkey_in, in, opcode, MLX5_CMD_OP_QUERY_MKEY);
      DEVX_SET(query_mkey_in, in, mkey_index, big->lkey >> 8);
      if (mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, sizeof out) == 0) {
        void* mkc = DEVX_ADDR_OF(query_mkey_out, out, memory_key_mkey_entry);
        CHECK(DEVX_GET(mkc, mkc, log_page_size) == 31, "QUERY_MKEY log_page_size %u",
              DEVX_GET(mkc, mkc, log_page_size));
        CHECK(DEVX_GET64(mkc, mkc, len) == span, "QUERY_MKEY len (across 64 GiB)");
      }
      printf("mr across a 64 GiB boundary at %p: lkey 0x%x\n", at, big->lkey);
      CHECK(ibv_dereg_mr(big) == 0, "dereg_mr (across 64 GiB)");
    }
    munmap(at, span);
  }

  /* A bad command: DEVX hands back the device's status and syndrome, as the PRM says. */
  {
    uint32_t in[4] = {0}, out[4] = {0};
    DEVX_SET(general_obj_in_cmd_hdr, in, opcode, 0x7ff0);
    int err = mlx5dv_devx_general_cmd(ctx, in, sizeof in, out, sizeof out);
    CHECK(err != 0 && DEVX_GET(general_obj_out_cmd_hdr, out, status) == MELON_STAT_BAD_OP,
          "unknown opcode: err %d status 0x%x", err, DEVX_GET(general_obj_out_cmd_hdr, out, status));
  }

  CHECK(port_change_through_devx_eq(ctx, events_fd) == 0, "DEVX EQ port change event");

  if (mr2) CHECK(ibv_dereg_mr(mr2) == 0, "dereg_mr (unaligned)");
  CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
  CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
  CHECK(ibv_close_device(ctx) == 0, "ibv_close_device (teardown)");
  ibv_free_device_list(list);
  free(buf);
  printf(failures ? "FAILED (%d)\n" : "PASS\n", failures);
  return failures ? 1 : 0;
}
