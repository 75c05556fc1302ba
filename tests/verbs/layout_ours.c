/* Layout rows of OUR <infiniband/verbs.h>; also proves the header compiles as C11 with the
 * library's static layout pins. */
#include <infiniband/verbs.h>
#include "verbs/abi_layout.h"
#include "layout_table.h"
#define MELON_LAYOUT_TABLE melon_layout_ours
#define MELON_LAYOUT_COUNT melon_layout_ours_count
#include "layout_rows.inc"
