// Stand-in: mach_absolute_time and its timebase (here: nanoseconds, 1/1).
#pragma once

#include <stdint.h>

struct mach_timebase_info {
  uint32_t numer;
  uint32_t denom;
};
typedef struct mach_timebase_info mach_timebase_info_data_t;
extern "C" uint64_t mach_absolute_time(void);
extern "C" int mach_timebase_info(mach_timebase_info_data_t* info);
