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

# melon_gtest(<name> SOURCES <files...> LIBS <libs...> [LABELS <labels...>]): one GoogleTest program,
# registered with ctest as a whole (one ctest entry per program keeps CI fast to schedule).
function(melon_gtest name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE MELON_TEST_DATA="${CMAKE_SOURCE_DIR}/tests/data")
  add_test(NAME ${name} COMMAND ${name})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
