# Build helpers shared by every layer.

# The freestanding rule (DESIGN.md): these flags hold for every build of the library, not just a check,
# so the code the tests exercise is the code DriverKit gets.
set(MELON_FREESTANDING_FLAGS -fno-exceptions -fno-rtti -nostdinc++ -fno-threadsafe-statics)

# melon_freestanding_library(<name> <sources...>): a static library from a freestanding folder.
# It is also registered for tests/freestanding, which links all of them without the C++ library.
function(melon_freestanding_library name)
  add_library(${name} STATIC ${ARGN})
  target_compile_options(${name} PRIVATE ${MELON_FREESTANDING_FLAGS})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  set_property(GLOBAL APPEND PROPERTY MELON_FREESTANDING_LIBS ${name})
endfunction()

# melon_gtest(<name> SOURCES <files...> LIBS <libs...> [LABELS <labels...>] [NO_TEST]): one GoogleTest
# program, registered with ctest as a whole (one ctest entry per program keeps CI fast to schedule).
# Its main (tests/common/gtest_main.cpp) exits 77 when a test was skipped and none failed, so ctest
# shows the skip (SKIP_RETURN_CODE) rather than "Passed".
function(melon_gtest name)
  cmake_parse_arguments(T "NO_TEST" "" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT TARGET melon_gtest_main)
    add_library(melon_gtest_main STATIC ${CMAKE_SOURCE_DIR}/tests/common/gtest_main.cpp)
    target_link_libraries(melon_gtest_main PUBLIC GTest::gtest)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} melon_gtest_main GTest::gtest)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE MELON_TEST_DATA="${CMAKE_SOURCE_DIR}/tests/data")
  if(T_NO_TEST)
    return()
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
