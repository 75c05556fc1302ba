// Placement new for the DEXT's freestanding C++ (no C++ library: DriverKit has none, and the
// stand-in build compiles the glue with -nostdinc++ to prove it). Where <new> exists it is used.
#pragma once

#include <stddef.h>

#if __has_include(<new>)
#include <new>
#else
inline void* operator new(size_t, void* where) noexcept { return where; }
#endif
