# Read after CMake's Darwin platform file (CMAKE_USER_MAKE_RULES_OVERRIDE, set by zig-macos.cmake):
# what that file would have set on a Mac, where `sw_vers` reports the macOS version. With the rpath
# flag, CMake gives dylibs @rpath install names (policy CMP0042) and programs their rpaths.
set(CMAKE_SHARED_LIBRARY_RUNTIME_C_FLAG "-Wl,-rpath,")
