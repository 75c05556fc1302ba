/* Layout rows of the STOCK rdma-core <infiniband/verbs.h> (libibverbs-dev). Built without our
 * include directory, so the system header is the one found. */
#include <infiniband/verbs.h>
#include "layout_table.h"
#define MELON_LAYOUT_TABLE melon_layout_stock
#define MELON_LAYOUT_COUNT melon_layout_stock_count
#include "layout_rows.inc"
