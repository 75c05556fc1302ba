/* A C program built against OUR <infiniband/verbs.h> and linked with OUR libibverbs.so.1: the
 * header's inline paths (ibv_query_port macro, ibv_reg_mr macro with an optional access bit,
 * ibv_query_device_ex, ibv_create_cq_ex, ibv_query_gid_ex, verbs_get_ctx_op) in C. The environment
 * (CMake) defines a soft device "c0" on 127.0.0.2. Exit code 0 = pass. */
#include <infiniband/verbs.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

int main(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  CHECK(list && n == 1);
  if (!list || n != 1) return 1;
  CHECK(strcmp(ibv_get_device_name(list[0]), "c0") == 0);
  struct ibv_context* ctx = ibv_open_device(list[0]);
  CHECK(ctx != NULL);
  if (!ctx) return 1;

  struct ibv_port_attr pa;
  memset(&pa, 0xff, sizeof(pa));
  CHECK(ibv_query_port(ctx, 1, &pa) == 0); /* the macro: vctx->query_port */
  CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET);
  CHECK(pa.port_cap_flags2 == 0); /* written by the 52-byte path */

  struct ibv_device_attr_ex dx;
  CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0);
  CHECK(dx.orig_attr.phys_port_cnt == 1 && dx.phys_port_cnt_ex == 1);

  struct ibv_gid_entry ge;
  CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0);
  CHECK(ge.gid_type == IBV_GID_TYPE_ROCE_V2 && ge.gid.raw[10] == 0xff && ge.gid.raw[15] == 2);
  CHECK(ibv_query_gid_ex(ctx, 1, 5, &ge, 0) == ENODATA);

  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  CHECK(pd != NULL);
  static char buf[4096];
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  CHECK(mr && mr->addr == buf && mr->length == sizeof(buf));

  struct ibv_cq_init_attr_ex ca;
  memset(&ca, 0, sizeof(ca));
  ca.cqe = 8;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  struct ibv_cq_ex* cqx = ibv_create_cq_ex(ctx, &ca);
  CHECK(cqx != NULL);
  struct ibv_poll_cq_attr poll_attr = {0};
  if (cqx) CHECK(ibv_start_poll(cqx, &poll_attr) == ENOENT);
  struct ibv_wc wc;
  if (cqx) CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cqx), 1, &wc) == 0);

  CHECK(verbs_get_ctx_op(ctx, query_device_ex) != NULL);
  CHECK(verbs_get_ctx_op(ctx, alloc_dm) == NULL);
  struct ibv_alloc_dm_attr dma = {4096, 0, 0};
  errno = 0;
  CHECK(ibv_alloc_dm(ctx, &dma) == NULL && errno == EOPNOTSUPP);

  if (cqx) CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0);
  if (mr) CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
  CHECK(ibv_close_device(ctx) == 0);
  ibv_free_device_list(list);
  if (failures)
    fprintf(stderr, "%d failure(s)\n", failures);
  else
    printf("c_api_test: all checks passed\n");
  return failures != 0;
}
