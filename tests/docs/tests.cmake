# The README's quick start, executed as written (tests/docs/readme_quickstart_test.sh). Included
# from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.
add_test(NAME docs.readme_quick_start
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs/readme_quickstart_test.sh ${PROJECT_SOURCE_DIR}
    ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/readme_quick_start)
set_tests_properties(docs.readme_quick_start PROPERTIES LABELS "docs;cli" TIMEOUT 600)
