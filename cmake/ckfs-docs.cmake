# SPDX-License-Identifier: MIT
# Run at build time (cmake -P): the ckfs binary writes its manual page and
# its bash completion script from its option tables (src/cli/manual.c).
#   cmake -DCKFS=bin -DMAN_PAGE=out.1 -DCOMPLETION=out -P ckfs-docs.cmake
# A sanitizer build runs here too: leak checks are for the tests, and
# LeakSanitizer cannot run where ptrace is forbidden.
set(ENV{ASAN_OPTIONS} "detect_leaks=0")
foreach(pair "--man;${MAN_PAGE}" "--bash-completion;${COMPLETION}")
  list(GET pair 0 what)
  list(GET pair 1 out)
  get_filename_component(dir ${out} DIRECTORY)
  file(MAKE_DIRECTORY ${dir})
  execute_process(COMMAND ${CKFS} help ${what} OUTPUT_FILE ${out}.tmp
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    file(REMOVE ${out}.tmp)
    message(FATAL_ERROR "'${CKFS} help ${what}' failed (${rc}): ${err}")
  endif()
  file(RENAME ${out}.tmp ${out})
endforeach()
