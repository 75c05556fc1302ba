# The DEXT on macOS (included from CMakeLists.txt when APPLE). Never run by anyone yet: docs/macos.md.
#
#   check-dext  iig over each .iig, then a syntax-only arm64e compile of every DEXT source (the glue and
#               the freestanding layers it links) against Xcode's DriverKit SDK. Needs no signing.
#   dext        the bundle build/macos/src/dext/driverkit/<MLX_DEXT_ID>.dext: arm64e (a plain arm64
#               dext panics the kernel when spawned), signed with SIGN_ID for team MLX_TEAM_ID from the
#               environment, with MlxRDMA.entitlements; refuses to run without them.
# Not here yet: MelonDMA.app (src/dext/loader) with the dext inside (docs/macos.md).
execute_process(COMMAND xcrun --sdk driverkit --show-sdk-path OUTPUT_VARIABLE MELON_DK_SDK
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _dk_sdk_rc ERROR_QUIET)
execute_process(COMMAND xcrun --sdk driverkit --find iig OUTPUT_VARIABLE MELON_IIG OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET)
execute_process(COMMAND xcrun --sdk driverkit --find clang++ OUTPUT_VARIABLE MELON_DK_CXX
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
# The DriverKit version is Info.plist's (OSBundleLibraries), the one place; tests/macos/plist_test.py
# checks it against the newest call the glue makes.
file(READ ${CMAKE_CURRENT_SOURCE_DIR}/Info.plist _dk_plist)
string(REGEX MATCH "<key>com.apple.DriverKit</key>[ \t\r\n]*<string>([0-9.]+)</string>" _ "${_dk_plist}")
set(MELON_DK_TARGET "arm64e-apple-driverkit${CMAKE_MATCH_1}" CACHE STRING "clang target of the DEXT (arm64e, never arm64)")

if(NOT _dk_sdk_rc EQUAL 0 OR NOT MELON_DK_SDK OR NOT MELON_IIG)
  add_custom_target(check-dext COMMAND ${CMAKE_COMMAND} -E echo
                    "check-dext: Xcode's DriverKit SDK or iig not found (xcrun --sdk driverkit); install Xcode" COMMAND
                    ${CMAKE_COMMAND} -E false)
  return()
endif()

set(_gen ${CMAKE_CURRENT_BINARY_DIR}/iig)
set(_dk_fw ${MELON_DK_SDK}/System/DriverKit/System/Library/Frameworks)
set(_dk_flags -target ${MELON_DK_TARGET} -isysroot ${MELON_DK_SDK} -F${_dk_fw} -I${MELON_DK_SDK}/System/DriverKit/usr/include
              -std=gnu++20 ${MELON_FREESTANDING_FLAGS} -I${_gen} -I${CMAKE_SOURCE_DIR}/src "-DMLX_DEXT_ID=\"${MELON_MLX_DEXT_ID}\"")

# iig: each .iig gives <name>.h (what the glue includes) and <name>.iig.cpp (the RPC dispatch).
set(_iig_outputs)
set(_iig_impls)
foreach(iig IN LISTS MELON_DEXT_IIG)
  get_filename_component(n ${iig} NAME_WE)
  add_custom_command(
    OUTPUT ${_gen}/${n}.h ${_gen}/${n}.iig.cpp
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_gen}
    COMMAND ${MELON_IIG} --def ${iig} --header ${_gen}/${n}.h --impl ${_gen}/${n}.iig.cpp --framework-name
            ${MELON_MLX_DEXT_NAME} -- -x c++ -std=gnu++20 -D__IIG=1 -isysroot ${MELON_DK_SDK} -F${_dk_fw}
    DEPENDS ${iig}
    COMMENT "iig ${n}.iig"
    VERBATIM)
  list(APPEND _iig_outputs ${_gen}/${n}.h)
  list(APPEND _iig_impls ${_gen}/${n}.iig.cpp)
endforeach()

# Every source the dext is made of: the glue, iig's dispatch, and the freestanding layers DextDevice
# links (the same libraries tests/freestanding links without the C++ library).
set(_dext_sources ${MELON_DEXT_GLUE_SOURCES} ${_iig_impls})
foreach(lib melon_dext_device melon_mlx5_core_uapi melon_mlx5_core melon_mlx5_prm melon_uapi)
  get_target_property(_srcs ${lib} SOURCES)
  get_target_property(_dir ${lib} SOURCE_DIR)
  foreach(s IN LISTS _srcs)
    if(IS_ABSOLUTE ${s})
      list(APPEND _dext_sources ${s})
    else()
      list(APPEND _dext_sources ${_dir}/${s})
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _dext_sources)

set(_stamps)
foreach(src IN LISTS _dext_sources)
  string(MAKE_C_IDENTIFIER ${src} _id)
  set(_stamp ${CMAKE_CURRENT_BINARY_DIR}/check-dext/${_id}.ok)
  add_custom_command(
    OUTPUT ${_stamp}
    COMMAND ${MELON_DK_CXX} ${_dk_flags} -fsyntax-only ${src}
    COMMAND ${CMAKE_COMMAND} -E touch ${_stamp}
    DEPENDS ${src} ${_iig_outputs}
    COMMENT "check-dext: ${src}"
    VERBATIM)
  list(APPEND _stamps ${_stamp})
endforeach()
add_custom_target(check-dext DEPENDS ${_stamps})

# The signed bundle (shallow, as DriverKit bundles are): Info.plist, the executable, the signature.
set(_dext ${CMAKE_CURRENT_BINARY_DIR}/${MELON_MLX_DEXT_ID}.dext)
set(_objs)
foreach(src IN LISTS _dext_sources)
  string(MAKE_C_IDENTIFIER ${src} _id)
  set(_o ${CMAKE_CURRENT_BINARY_DIR}/dext-objs/${_id}.o)
  add_custom_command(OUTPUT ${_o} COMMAND ${MELON_DK_CXX} ${_dk_flags} -O2 -c ${src} -o ${_o}
                     DEPENDS ${src} ${_iig_outputs} VERBATIM)
  list(APPEND _objs ${_o})
endforeach()
add_custom_command(
  OUTPUT ${_dext}/${MELON_MLX_DEXT_NAME}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_dext}
  COMMAND ${MELON_DK_CXX} -target ${MELON_DK_TARGET} -isysroot ${MELON_DK_SDK} -F${_dk_fw} -framework DriverKit
          -framework PCIDriverKit ${_objs} -o ${_dext}/${MELON_MLX_DEXT_NAME}
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_CURRENT_SOURCE_DIR}/Info.plist ${_dext}/Info.plist
  DEPENDS ${_objs} ${CMAKE_CURRENT_SOURCE_DIR}/Info.plist
  COMMENT "link ${MELON_MLX_DEXT_ID}.dext (${MELON_DK_TARGET})"
  VERBATIM)
add_custom_target(
  dext
  COMMAND ${CMAKE_COMMAND} -DBUNDLE=${_dext} -DENTITLEMENTS=${CMAKE_CURRENT_SOURCE_DIR}/MlxRDMA.entitlements -P
          ${CMAKE_CURRENT_SOURCE_DIR}/sign.cmake
  DEPENDS ${_dext}/${MELON_MLX_DEXT_NAME}
  COMMENT "sign ${MELON_MLX_DEXT_ID}.dext with SIGN_ID for MLX_TEAM_ID")
