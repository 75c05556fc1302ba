# Cross-compiling for macOS from Linux with the Zig toolchain (`./melon deps` installs it under
# ~/.cache/melondma/zig/<version>): clang 16, libc++, Apple's libc headers and libSystem stubs (.tbd),
# no Apple SDK. Used by tests/macos_cross; nothing here runs on a Mac.
#
#   cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/zig-macos.cmake -DMELON_MACOS_ARCH=aarch64 ...
#
# MELON_MACOS_ARCH: aarch64 (default) or x86_64. MELON_MACOS_LINK_CXX=OFF links without the C++
# library, leaving its symbols to macOS's libc++ at run time: Zig builds libc++ from source for each
# target on first use (minutes), which a check of the dylibs alone can skip. MELON_MACOS_MIN: the oldest macOS the build targets
# (Zig 0.11 carries libSystem stubs for 11, 12 and 13; 12 because the IOKit transport uses
# kIOMainPortDefault, tests/macos_cross/apple_frameworks.txt). MELON_ZIG_ROOT: the unpacked toolchain.
set(MELON_MACOS_ARCH aarch64 CACHE STRING "aarch64 or x86_64")
set(MELON_MACOS_MIN 12.0 CACHE STRING "the deployment target")
set(MELON_ZIG_ROOT "$ENV{HOME}/.cache/melondma/zig/0.11.0" CACHE PATH "the Zig toolchain")
# try_compile projects re-read this file: hand them the choices.
set(MELON_MACOS_LINK_CXX ON CACHE BOOL "link Zig's libc++ (built once per target)")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES MELON_MACOS_ARCH MELON_MACOS_MIN MELON_ZIG_ROOT
     MELON_MACOS_LINK_CXX)

if(NOT EXISTS "${MELON_ZIG_ROOT}/zig")
  message(FATAL_ERROR "No Zig toolchain at ${MELON_ZIG_ROOT} (./melon deps installs it)")
endif()

set(CMAKE_SYSTEM_NAME Darwin)
set(CMAKE_SYSTEM_VERSION 20)  # Darwin 20 = macOS 11
if(MELON_MACOS_ARCH STREQUAL "aarch64")
  set(CMAKE_SYSTEM_PROCESSOR arm64)
else()
  set(CMAKE_SYSTEM_PROCESSOR x86_64)
endif()
set(_target ${MELON_MACOS_ARCH}-macos.${MELON_MACOS_MIN})

# zig is one program with subcommands; CMake and ccache want one program per tool. The wrappers live
# beside the toolchain, written only when they change, so their timestamps (ccache's compiler check)
# stay put across build trees and runs. Zig's own cache (the target's libc++, built once) too.
# The 2 is the wrappers' revision: worktrees whose toolchain file writes other text use other files,
# rather than rewriting these (and voiding ccache's compiler check) back and forth.
set(_wrap "${MELON_ZIG_ROOT}-wrap/2/${_target}")
set(_nolink "")
if(NOT MELON_MACOS_LINK_CXX)
  # Every link, CMake's compiler identification included, without libc++ (zig's -nostdlib++ also
  # drops the headers, so only where nothing is compiled).
  set(_wrap "${_wrap}-nolibcxx")
  set(_nolink "link=1; for a; do case $a in -c|-E|-S|-M|-MM|-fsyntax-only) link=0;; esac; done
[ $link = 1 ] && set -- \"$@\" -nostdlib++ -Wl,-undefined,dynamic_lookup
")
endif()
set(_cache "${MELON_ZIG_ROOT}-cache")
foreach(tool cc c++ ar ranlib)
  set(_args "${tool}")
  set(_pre "")
  if(tool STREQUAL "cc" OR tool STREQUAL "c++")
    set(_args "${tool} -target ${_target}")
    set(_pre "${_nolink}")
  endif()
  # zig's linker refuses -v, which CMake's compiler probe passes as -Wl,-v. zig's driver takes
  # -install_name but drops -current_version and -compatibility_version (the dylib gets 1.0.0,
  # seen with llvm-objdump --macho --dylib-id): they reach the linker as -Wl flags.
  file(CONFIGURE OUTPUT "${_wrap}/zig-${tool}" @ONLY CONTENT
"#!/bin/sh
v=
for a; do shift
  if [ -n \"$v\" ]; then set -- \"$@\" \"-Wl,$v,$a\"; v=; continue; fi
  case $a in -Wl,-v) ;; -current_version|-compatibility_version) v=$a ;; *) set -- \"$@\" \"$a\" ;; esac
done
${_pre}ZIG_GLOBAL_CACHE_DIR='${_cache}' ZIG_LOCAL_CACHE_DIR='${_cache}' exec '${MELON_ZIG_ROOT}/zig' ${_args} \"$@\"
")
  file(CHMOD "${_wrap}/zig-${tool}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
       GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()

set(CMAKE_C_COMPILER "${_wrap}/zig-cc")
set(CMAKE_CXX_COMPILER "${_wrap}/zig-c++")
set(CMAKE_AR "${_wrap}/zig-ar" CACHE FILEPATH "" FORCE)
set(CMAKE_RANLIB "${_wrap}/zig-ranlib" CACHE FILEPATH "" FORCE)
# No SDK, no -arch/-isysroot/-mmacosx-version-min of CMake's own: the target triple says it all.
set(CMAKE_OSX_SYSROOT "" CACHE PATH "" FORCE)
set(CMAKE_OSX_ARCHITECTURES "" CACHE STRING "" FORCE)
set(CMAKE_OSX_DEPLOYMENT_TARGET "" CACHE STRING "" FORCE)
set(CMAKE_INSTALL_NAME_TOOL /bin/true CACHE FILEPATH "" FORCE)
# CMake's Darwin platform file enables rpaths (and so @rpath install names) only when `sw_vers`, which
# Linux lacks, reports macOS 10.5 or later; without them every dylib's install name is its build
# path. zig-macos-rules.cmake, read after the platform file, turns them on.
set(CMAKE_USER_MAKE_RULES_OVERRIDE "${CMAKE_CURRENT_LIST_DIR}/zig-macos-rules.cmake")

# Zig 0.11's Mach-O linker has no -reexport_library (librdma.dylib re-exports libibverbs,
# src/verbs/CMakeLists.txt): LLVM's ld64.lld (Debian's lld) links that one dylib, against the same
# libSystem stub. CMake checks nothing of it, so it is found here, on the build machine.
find_program(MELON_LD64_LLD NAMES ld64.lld ld64.lld-14 ld64.lld-15 ld64.lld-16 ld64.lld-19 NO_CMAKE_FIND_ROOT_PATH)
if(NOT MELON_LD64_LLD)
  message(FATAL_ERROR "No ld64.lld (apt-get install lld): librdma.dylib's re-export needs it")
endif()
string(REGEX MATCH "^[0-9]+" _major "${MELON_MACOS_MIN}")
set(MELON_MACOS_REEXPORT_LINKER "${MELON_LD64_LLD};-arch;${CMAKE_SYSTEM_PROCESSOR};-platform_version;macos;${MELON_MACOS_MIN};${MELON_MACOS_MIN};${MELON_ZIG_ROOT}/lib/libc/darwin/libSystem.${_major}.tbd")

set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_FIND_ROOT_PATH "${MELON_ZIG_ROOT}/lib/libc")

# What the toolchain lacks, stood in for: IOKit's user-side header (tests/driverkit/include, searched
# after the real libc headers so it shadows nothing Apple's libc has) and the frameworks, as link
# stubs (.tbd) exporting exactly the functions tests/macos_cross/apple_frameworks.txt names.
get_filename_component(_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(_fw "${MELON_ZIG_ROOT}-wrap/frameworks")
file(STRINGS "${_root}/tests/macos_cross/apple_frameworks.txt" _lines REGEX "^[A-Za-z]")
set(_frameworks "")
foreach(line IN LISTS _lines)
  string(REGEX MATCH "^([A-Za-z]+)[ \t]+([A-Za-z0-9_]+)" _m "${line}")
  list(APPEND _frameworks ${CMAKE_MATCH_1})
  string(APPEND _syms_${CMAKE_MATCH_1} "_${CMAKE_MATCH_2}, ")
endforeach()
list(REMOVE_DUPLICATES _frameworks)
foreach(f IN LISTS _frameworks)
  string(REGEX REPLACE ", $" "" _s "${_syms_${f}}")
  file(CONFIGURE OUTPUT "${_fw}/${f}.framework/${f}.tbd" @ONLY CONTENT
"--- !tapi-tbd
tbd-version:     4
targets:         [ x86_64-macos, arm64-macos ]
install-name:    '/System/Library/Frameworks/${f}.framework/Versions/A/${f}'
exports:
  - targets:         [ x86_64-macos, arm64-macos ]
    symbols:         [ ${_s} ]
...
")
endforeach()
# (set, not appended: CMake reads a toolchain file more than once)
set(CMAKE_C_FLAGS_INIT "-idirafter ${_root}/tests/driverkit/include")
set(CMAKE_CXX_FLAGS_INIT "-idirafter ${_root}/tests/driverkit/include")
foreach(kind EXE SHARED MODULE)
  set(CMAKE_${kind}_LINKER_FLAGS_INIT "-F${_fw}")
endforeach()
if(NOT MELON_MACOS_LINK_CXX)
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # an executable cannot leave libc++ to run time
endif()
