/* A C program built with pkg-config against an installed libselscan:
 *   cc main.c $(pkg-config --cflags --libs selscan) -o selscan_pc_consumer
 * (set PKG_CONFIG_PATH=<prefix>/lib/pkgconfig for a non-system prefix). */
#include <selscan/selscan.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  int32_t devices = -1;
  printf("libselscan %s: %s\n", selscan_version_string(), selscan_build_info());
  if (selscan_version() != SELSCAN_VERSION || strcmp(selscan_status_string(SELSCAN_STATUS_SUCCESS), "") == 0)
    return 1;
  if (selscan_cuda_device_count(&devices) != SELSCAN_STATUS_SUCCESS || devices < 0) return 1;
  printf("CUDA devices visible: %d\n", (int)devices);
  return 0;
}
