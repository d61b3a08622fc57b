# MPI tests of cluster/ (ctest label `mpi`): cluster/*_mpitest.cc run under mpirun at 4 ranks with
# comm's MPI test main (tests/comm/tests.cmake defines oases_mpitest_main).
#
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

file(GLOB OASES_CLUSTER_MPI_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/cluster/*_mpitest.cc)
foreach(test_source ${OASES_CLUSTER_MPI_TEST_SOURCES})
  get_filename_component(test_name ${test_source} NAME_WE)
  add_executable(${test_name} ${test_source})
  target_include_directories(${test_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                                                   ${CMAKE_CURRENT_SOURCE_DIR}/comm)
  target_compile_definitions(${test_name} PRIVATE OASES_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_link_libraries(${test_name} PRIVATE oases_mpitest_main oases_warnings)
  add_test(NAME cluster.${test_name}.np4
    COMMAND ${MPIEXEC_EXECUTABLE} ${OASES_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 4
            $<TARGET_FILE:${test_name}>)
  set_tests_properties(cluster.${test_name}.np4 PROPERTIES
    LABELS "mpi;cluster" TIMEOUT ${OASES_MPI_TEST_TIMEOUT} PROCESSORS 2
    ENVIRONMENT_MODIFICATION ${OASES_MPI_ASAN_ENVIRONMENT})
endforeach()
