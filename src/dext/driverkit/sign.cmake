# cmake -DBUNDLE=<x.dext> -DENTITLEMENTS=<file> -P sign.cmake: signs the dext with $SIGN_ID and checks the
# signature's team is $MLX_TEAM_ID. Nothing is hard-coded and nothing is signed ad hoc: the kernel rejects
# com.apple.developer.* entitlements without a team (docs/macos.md, "Install").
foreach(v SIGN_ID MLX_TEAM_ID)
  if("$ENV{${v}}" STREQUAL "")
    message(FATAL_ERROR "dext: ${v} is not set. Export SIGN_ID (an Apple Development or Developer ID "
                        "Application identity) and MLX_TEAM_ID (its team) to sign ${BUNDLE}.")
  endif()
endforeach()
execute_process(COMMAND codesign --force --sign "$ENV{SIGN_ID}" --entitlements ${ENTITLEMENTS} --options runtime
                        --timestamp=none ${BUNDLE} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dext: codesign failed (${rc})")
endif()
execute_process(COMMAND codesign -dv ${BUNDLE} ERROR_VARIABLE info RESULT_VARIABLE rc)
string(REGEX MATCH "TeamIdentifier=([A-Z0-9]+)" _ "${info}")
if(NOT rc EQUAL 0 OR NOT CMAKE_MATCH_1 STREQUAL "$ENV{MLX_TEAM_ID}")
  message(FATAL_ERROR "dext: signed by team '${CMAKE_MATCH_1}', expected MLX_TEAM_ID=$ENV{MLX_TEAM_ID}")
endif()
message(STATUS "dext: ${BUNDLE} signed for team $ENV{MLX_TEAM_ID}")
