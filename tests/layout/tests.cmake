# Checks of the source tree's layout (ctest label `layout`). Included from tests/CMakeLists.txt,
# so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

# The kernels' front door: nothing outside src/kernels/ includes a device's kernel header
# (tests/layout/kernel_includes_test.sh), and the check reports planted includes.
add_test(NAME layout.kernel_front_door
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/layout/kernel_includes_test.sh ${PROJECT_SOURCE_DIR})
add_test(NAME layout.kernel_front_door_self_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/layout/kernel_includes_test.sh --self-test)
set_tests_properties(layout.kernel_front_door layout.kernel_front_door_self_test PROPERTIES
  LABELS layout TIMEOUT 60)
