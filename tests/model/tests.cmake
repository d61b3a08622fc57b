# PyTorch parity of the GPT model (DESIGN.md, "How we know it works"): parity_test.py builds a
# random GPT-2 in PyTorch, runs parity_engine on the same weights and batch, and compares
# logits, loss, every gradient, a 10-step AdamW trajectory and the final parameters.
#
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

set(OASES_PARITY_PYTHON /usr/bin/python3)  # the interpreter that sees Debian's python3-torch
set(OASES_PARITY_ENGINE_SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/model/parity_engine.cc)

if(EXISTS ${OASES_PARITY_ENGINE_SOURCE})
  add_executable(parity_engine ${OASES_PARITY_ENGINE_SOURCE})
  target_include_directories(parity_engine PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(parity_engine PRIVATE oases_lib oases_warnings)

  # Registered whether or not torch imports now: the test command installs python3-torch, and
  # if it is still missing the driver fails with a message saying so, rather than skipping.
  execute_process(COMMAND ${OASES_PARITY_PYTHON} -c "import torch, numpy"
    RESULT_VARIABLE oases_parity_torch_rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT oases_parity_torch_rc EQUAL 0)
    message(WARNING "oases: ${OASES_PARITY_PYTHON} cannot import torch and numpy; the model.torch_"
      "parity* tests will fail until Debian's python3-torch is installed")
  endif()

  function(oases_add_torch_parity_test name)
    set(workdir ${CMAKE_CURRENT_BINARY_DIR}/model/${name})
    add_test(NAME model.${name}
      COMMAND ${OASES_PARITY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/model/parity_test.py
        --engine $<TARGET_FILE:parity_engine> ${ARGN} --workdir ${workdir})
    set_tests_properties(model.${name} PROPERTIES LABELS "model;torch" TIMEOUT 900)
  endfunction()

  oases_add_torch_parity_test(torch_parity
    --layers 2 --hidden 64 --heads 4 --ffn-hidden 256 --vocab-size 256 --seq-len 32
    --micro-batch 4 --steps 10)
  # Sizes no kernel can round to: vocab not a multiple of 64, seq_len not a power of two,
  # head_dim 16 with 3 heads, an odd micro-batch.
  oases_add_torch_parity_test(torch_parity_odd_shapes
    --layers 3 --hidden 48 --heads 3 --ffn-hidden 192 --vocab-size 197 --seq-len 37
    --micro-batch 3 --steps 10)
else()
  message(STATUS "oases: ${OASES_PARITY_ENGINE_SOURCE} not written yet; "
    "PyTorch parity tests not registered")
endif()
