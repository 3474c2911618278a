/* The public header compiles as strict C99 (-Wpedantic -Werror) and a C program links against libselscan the
 * ordinary way. Checks the calls that need no tensors: version agreement, status strings, build info, errors,
 * and that the initialiser macros compile warning-free in C and give zeroed structs of the right size. */
#include <selscan/selscan.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

int main(void) {
  char expected[32];
  const char* info;
  int32_t count = -1;
  selscan_exec_t exec = SELSCAN_EXEC_INIT;
  selscan_fwd_args_t fwd;
  const selscan_fwd_args_t fwd_init = SELSCAN_FWD_ARGS_INIT;
  const selscan_bwd_args_t bwd_init = SELSCAN_BWD_ARGS_INIT;
  static const selscan_bwd_args_t bwd_zero; /* static: every byte zero */
  const selscan_state_update_args_t su_init = SELSCAN_STATE_UPDATE_ARGS_INIT;
  size_t bytes = 12345;
  int s;

  CHECK(selscan_version() == SELSCAN_VERSION);
  snprintf(expected, sizeof expected, "%d.%d.%d", SELSCAN_VERSION_MAJOR, SELSCAN_VERSION_MINOR,
           SELSCAN_VERSION_PATCH);
  CHECK(strcmp(selscan_version_string(), expected) == 0);
  CHECK(strcmp(SELSCAN_VERSION_STRING, expected) == 0);

  CHECK(fwd_init.struct_size == sizeof fwd_init && fwd_init.u.data == NULL && fwd_init.flags == 0 &&
        fwd_init.last_state.data == NULL);
  CHECK(bwd_init.struct_size == sizeof bwd_init);
  CHECK(memcmp((const char*)&bwd_init + sizeof(size_t), (const char*)&bwd_zero + sizeof(size_t),
               sizeof bwd_init - sizeof(size_t)) == 0);
  CHECK(exec.struct_size == sizeof exec && exec.reserved == 0);
  CHECK(su_init.struct_size == sizeof su_init && su_init.pad_slot_id == -1 && su_init.flags == 0 &&
        su_init.dt_softplus == 0 && su_init.x.data == NULL && su_init.state.data == NULL && su_init.out.data == NULL);

  /* Every status has a short, non-empty string; an out-of-range one still gets a string. */
  for (s = SELSCAN_STATUS_SUCCESS; s < SELSCAN_STATUS_COUNT; ++s) {
    const char* text = selscan_status_string((selscan_status_t)s);
    CHECK(text != NULL && text[0] != '\0');
  }
  CHECK(selscan_status_string((selscan_status_t)999) != NULL);
  CHECK(strcmp(selscan_status_string(SELSCAN_STATUS_COUNT), "unknown status") == 0);

  info = selscan_build_info();
  CHECK(info != NULL && strstr(info, expected) != NULL);

  CHECK(selscan_cuda_device_count(&count) == SELSCAN_STATUS_SUCCESS);
  CHECK(count >= 0);

  /* NULL arguments are reported, never crash, and leave a message naming what was wrong. */
  CHECK(selscan_fwd(NULL, &exec) == SELSCAN_STATUS_INVALID_ARGUMENT);
  CHECK(selscan_last_error()[0] != '\0');
  CHECK(selscan_state_update(NULL, &exec) == SELSCAN_STATUS_INVALID_ARGUMENT);

  /* struct_size below the first version of the struct is its own status. */
  memset(&fwd, 0, sizeof fwd);
  fwd.struct_size = 8;
  CHECK(selscan_fwd_workspace_size(&fwd, &exec, &bytes) == SELSCAN_STATUS_BAD_STRUCT_SIZE);
  CHECK(selscan_last_error()[0] != '\0');

  printf("%s\n%s\n", selscan_version_string(), info);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  return 0;
}
