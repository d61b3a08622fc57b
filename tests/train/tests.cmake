# MPI tests of train/ (ctest label `mpi`): train/*_mpitest.cc run under mpirun at 2 ranks with
# comm's MPI test main (tests/comm/tests.cmake defines oases_mpitest_main); those named in
# OASES_TRAIN_FOUR_RANK_TESTS also at 4.
#
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

set(OASES_TRAIN_FOUR_RANK_TESTS zero_mpitest partition_activations_mpitest moe_mpitest)
file(GLOB OASES_TRAIN_MPI_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/train/*_mpitest.cc)
foreach(test_source ${OASES_TRAIN_MPI_TEST_SOURCES})
  get_filename_component(test_name ${test_source} NAME_WE)
  add_executable(${test_name} ${test_source})
  target_include_directories(${test_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                                                   ${CMAKE_CURRENT_SOURCE_DIR}/comm)
  target_link_libraries(${test_name} PRIVATE oases_mpitest_main oases_warnings)
  add_test(NAME train.${test_name}.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${OASES_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 2
            $<TARGET_FILE:${test_name}>)
  set_tests_properties(train.${test_name}.np2 PROPERTIES
    LABELS "mpi;train" TIMEOUT ${OASES_MPI_TEST_TIMEOUT} PROCESSORS 2
    ENVIRONMENT_MODIFICATION ${OASES_MPI_ASAN_ENVIRONMENT})
  if(test_name IN_LIST OASES_TRAIN_FOUR_RANK_TESTS)
    add_test(NAME train.${test_name}.np4
      COMMAND ${MPIEXEC_EXECUTABLE} ${OASES_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 4
              $<TARGET_FILE:${test_name}>)
    set_tests_properties(train.${test_name}.np4 PROPERTIES
      LABELS "mpi;train" TIMEOUT ${OASES_MPI_TEST_TIMEOUT} PROCESSORS 2
      ENVIRONMENT_MODIFICATION ${OASES_MPI_ASAN_ENVIRONMENT})
  endif()
endforeach()
